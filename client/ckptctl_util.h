/* ckptctl's words and numbers (ckptctl_util.c), for every command. */
#ifndef CKPTCTL_UTIL_H
#define CKPTCTL_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <json-c/json.h>

#include "ckpt/ckpt.h"

/* Print "ckptctl: what: error (the daemon's message)" and exit 1. */
void die(const char *what, int err) __attribute__((noreturn));
void die_oom(void) __attribute__((noreturn));
/* "1.5 GiB" and friends. */
const char *human_bytes(uint64_t n, char *buf, size_t len);
/* "3m05s", "2h01m00s", "1d02h03m". */
const char *human_duration(uint64_t ns, char *buf, size_t len);
int64_t now_unix_ns(void);
/* "2026-11-24 10:00:00" (UTC), or "-" when unknown. */
const char *saved_time(int64_t ns, char *buf, size_t len);
/* Add key to o (exits when out of memory). */
void json_put(json_object *o, const char *key, json_object *v);
/* o, pretty, on stdout. */
void json_print(json_object *o);
/* An array of n rows, the ith made by row(arg, i) (exits when out of
 * memory): arg is what the rows are made from. */
json_object *json_rows(size_t n, json_object *(*row)(const void *arg, size_t i), const void *arg);
/* A step as --json prints it. */
json_object *json_step(const ckpt_step_info *v);
const char *tier_name(int t);
/* What a held copy is, in words. */
const char *held_what(const ckpt_held_info *h);

#endif
