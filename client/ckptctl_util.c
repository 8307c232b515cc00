/* ckptctl's words and numbers: errors, sizes, durations, times, JSON
 * output, tiers (ckptctl_util.h). */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "ckpt/ckpt.h"
#include "ckptctl_util.h"

void die(const char *what, int err)
{
	const char *m = ckpt_errmsg();

	if (m && *m)
		fprintf(stderr, "ckptctl: %s: %s (%s)\n", what, ckpt_strerror(err), m);
	else
		fprintf(stderr, "ckptctl: %s: %s\n", what, ckpt_strerror(err));
	exit(1);
}

void die_oom(void)
{
	fprintf(stderr, "ckptctl: out of memory\n");
	exit(1);
}

/* "1.5 GiB" and friends. */
const char *human_bytes(uint64_t n, char *buf, size_t len)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double v = (double)n;
	size_t u = 0;

	while (v >= 1024.0 && u + 1 < sizeof(unit) / sizeof(unit[0])) {
		v /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%" PRIu64 " B", n);
	else
		snprintf(buf, len, "%.1f %s", v, unit[u]);
	return buf;
}

const char *human_duration(uint64_t ns, char *buf, size_t len)
{
	uint64_t s = ns / 1000000000u;

	if (s >= 86400)
		snprintf(buf, len, "%" PRIu64 "d%02" PRIu64 "h%02" PRIu64 "m", s / 86400, s / 3600 % 24, s / 60 % 60);
	else if (s >= 3600)
		snprintf(buf, len, "%" PRIu64 "h%02" PRIu64 "m%02" PRIu64 "s", s / 3600, s / 60 % 60, s % 60);
	else if (s >= 60)
		snprintf(buf, len, "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
	else
		snprintf(buf, len, "%" PRIu64 "s", s);
	return buf;
}

int64_t now_unix_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* "2026-11-24 10:00:00" (UTC), or "-" when unknown. */
const char *saved_time(int64_t ns, char *buf, size_t len)
{
	if (ns <= 0) {
		snprintf(buf, len, "-");
		return buf;
	}
	time_t t = (time_t)(ns / 1000000000);
	struct tm tm;
	gmtime_r(&t, &tm);
	strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm);
	return buf;
}

void json_put(json_object *o, const char *key, json_object *v)
{
	if (!v || json_object_object_add(o, key, v) != 0)
		die_oom();
}

void json_print(json_object *o)
{
	const char *s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);

	if (!s)
		die_oom();
	puts(s);
}

json_object *json_rows(size_t n, json_object *(*row)(const void *arg, size_t i), const void *arg)
{
	json_object *a = json_object_new_array();
	if (!a)
		die_oom();
	for (size_t i = 0; i < n; i++)
		if (json_object_array_add(a, row(arg, i)) != 0)
			die_oom();
	return a;
}

const char *tier_name(int t)
{
	return t == CKPT_TIER_MEMORY ? "memory" : t == CKPT_TIER_REPLICATED ? "replicated" : "durable";
}

/* What a held copy is, in words. */
const char *held_what(const ckpt_held_info *h)
{
	if (h->tier == CKPT_TIER_DURABLE)
		return "durable";
	if (h->durable)
		return h->tier == CKPT_TIER_MEMORY ? "memory, persisted" : "replicated, persisted";
	return h->tier == CKPT_TIER_MEMORY ? "memory only" : "replicated, not in storage";
}

json_object *json_step(const ckpt_step_info *v)
{
	json_object *o = json_object_new_object();
	if (!o)
		die_oom();
	json_put(o, "job", json_object_new_string(v->job));
	json_put(o, "step", json_object_new_uint64(v->step));
	json_put(o, "complete", json_object_new_boolean(v->complete));
	json_put(o, "bytes", json_object_new_uint64(v->bytes));
	json_put(o, "ranks_present", json_object_new_uint64(v->ranks_present));
	json_put(o, "world_size", json_object_new_uint64(v->world_size));
	json_put(o, "attempt_id", json_object_new_string(v->attempt_id));
	if (v->saved_unix_ns > 0)
		json_put(o, "saved_unix_ns", json_object_new_int64(v->saved_unix_ns));
	if (v->tier[0])
		json_put(o, "tier", json_object_new_string(v->tier));
	if (v->where[0])
		json_put(o, "where", json_object_new_string(v->where));
	return o;
}
