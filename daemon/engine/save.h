/* A save: admission into the pool (with the job's policy and quota),
 * staging copies, the upload queue, events, and afterwards a place in the
 * memory tier. Every state change goes through save_set_state(), in
 * save.c. The save object itself is saveobj.h's. */
#ifndef CKPTD_SAVE_H
#define CKPTD_SAVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>
#include <uv.h>

#include "ckpt.pb-c.h"
#include "saveobj.h"

struct requester;
void save_start(struct daemon *d, const struct requester *rq, const Ckpt__Save *m);
/* The session is going away; the save goes on without it. */
void save_detach_session(struct save *sv);
/* Chunks were released: admit waiting saves that now fit. */
void save_admit_waiting(struct daemon *d);
/* Fail saves still waiting for admission (shutdown) with status, -errno. */
void save_cancel_waiting(struct daemon *d, int status, const char *why);
void save_on_admit_timer(uv_timer_t *t);

/* Upload a kept (memory-only) save as a durable one would be, on a
 * persist; it stays held. 0, or -errno (its step is being deleted). Its
 * end is told through daemon.on_persist_end. */
int save_persist(struct save *sv);

#endif
