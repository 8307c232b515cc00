/* The wire's request messages, one row each, indexed by the Frame body
 * case: name, handler and the rules the session applies before the handler
 * (msg_dispatch). Adding a request: the message in proto/ckpt.proto, one
 * row in msgtab.c, and its handler. Loop thread only. */
#ifndef CKPTD_MSGTAB_H
#define CKPTD_MSGTAB_H

#include <stdint.h>

#include "ckpt.pb-c.h"

struct daemon;
struct session;

enum msg_flag {
	MSG_NEEDS_HELLO = 1u << 0,     /* before Hello: the session closes (EPROTO) */
	MSG_REFUSE_DRAINING = 1u << 1, /* refused with ESHUTDOWN while ckptd drains */
	MSG_BACKGROUND = 1u << 2,      /* answered later (threadpool, or a persist's uploads); holds the session */
	MSG_CAPPED = 1u << 3,          /* counts toward max_inflight_loads of the session */
	MSG_NOT_REQUEST = 1u << 4,     /* a reply or event: only ckptd sends it */
};

struct msg_row {
	const char *name; /* the Frame field; the msg label of ckptd_requests_total */
	void (*handler)(struct session *s, const Ckpt__Frame *f);
	unsigned flags;
	/* How a refusal by the flags goes out: a Reply, or this body
	 * (CKPT__FRAME__BODY_LOAD_FAILED) for a request answered by one. */
	Ckpt__Frame__BodyCase refuse_as;
};

/* The row of a body case, or NULL when it has none. */
const struct msg_row *msg_row(int body_case);
/* Look up the row, apply its flags, count the request, call the handler.
 * An unknown body, or a reply or event, is answered EBADMSG. */
void msg_dispatch(struct session *s, const Ckpt__Frame *f);

/* Name the request messages in d's stats (ckptd_requests_total{msg}). */
void msgtab_init(struct daemon *d);

#endif
