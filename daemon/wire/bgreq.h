/* A request answered from the libuv threadpool (list, show, verify, gc):
 * the session is held while the work runs, and the reply goes out only if
 * it is still there. Admission (draining, the session's cap) is the
 * message row's (msgtab.c), for loads too. */
#ifndef CKPTD_BGREQ_H
#define CKPTD_BGREQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "tenancy.h"

struct daemon;
struct session;

struct bgreq {
	struct daemon *d;
	struct session *session;
	uint64_t req_id;
	uv_work_t work;
	/* The session's view (tenancy.h), taken at start. */
	struct viewer view;
	int status; /* 0 or -errno */
	char msg[512];
	void (*run)(struct bgreq *r);     /* threadpool */
	void (*reply)(struct bgreq *r);   /* loop, if the session lives and status == 0 */
	void (*destroy)(struct bgreq *r); /* loop, always last */
};

/* Queue r (run, reply, destroy set). On failure the error has been
 * answered and r destroyed. */
void bgreq_start(struct session *s, uint64_t req_id, struct bgreq *r);
/* From run(): record a failure (status -errno), answered as a Reply. */
void bgreq_fail(struct bgreq *r, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
