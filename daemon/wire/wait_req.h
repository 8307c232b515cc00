/* WaitRequest (ckpt_wait_complete, ckptctl wait): wait until a step is
 * complete in storage. Every waiter of one (job, step) on this daemon
 * shares one poll of the step's listing, with backoff, so waiting costs
 * O(1) storage requests per node however many ranks wait
 * (docs/scale.md "Waiting for a step"). Loop thread only. */
#ifndef CKPTD_WAIT_REQ_H
#define CKPTD_WAIT_REQ_H

#include <stdint.h>

#include "ckpt.pb-c.h"

struct daemon;
struct session;

/* The first poll waits this long after the last, doubling after each
 * that finds the step incomplete, up to the cap. */
#define WAIT_POLL_FIRST_MS 50u
#define WAIT_POLL_MAX_MS 2000u
/* A step seen complete is answered from memory for this long (a step
 * removed since may be answered complete, as a listing just before the
 * removal would have; one removed through this daemon by ckptctl rm is
 * forgotten at once, retention's within the minute). */
#define WAIT_SEEN_MS 60000u
#define WAIT_SEEN_MAX 64
/* timeout_ms meaning "no limit". */
#define WAIT_FOREVER UINT32_MAX

/* At start (0, or -ENOMEM) and at the end (every group is gone by then:
 * wait_cancel_all ran when the drain began). */
int wait_init(struct daemon *d);
void wait_fini(struct daemon *d);
/* A step removed here (ckptctl rm): no longer answered from memory. */
void wait_forget(struct daemon *d, const char *job, uint64_t step);
/* The row of msgtab.c. */
void wait_start(struct session *s, uint64_t req_id, const Ckpt__WaitRequest *m);
/* A drain began: answer every waiter (status -errno, why) and stop
 * polling (a poll in flight ends first, counted as work the drain waits
 * for). */
void wait_cancel_all(struct daemon *d, int status, const char *why);
/* daemon.on_step_durable: a local rank's copy of (job, step) is durable;
 * if it was the last of the step's saves in flight here and the step has
 * waiters, look again soon (the backoff starts over). */
void wait_step_durable(struct daemon *d, const char *job, uint64_t step);

#endif
