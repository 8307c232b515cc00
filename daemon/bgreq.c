#include "bgreq.h"
#include "daemon.h"
#include "session.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

int bgreq_admit(struct session *s, const char **why)
{
	if (s->d->draining) {
		*why = "ckptd is shutting down";
		return ESHUTDOWN;
	}
	if (s->refs >= s->d->cfg.max_inflight_loads) {
		*why = "too many loads and catalogue requests in flight on this session (max_inflight_loads)";
		return EBUSY;
	}
	return 0;
}

void bgreq_fail(struct bgreq *r, int status, const char *fmt, ...)
{
	if (r->status)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(r->msg, sizeof(r->msg), fmt, ap);
	va_end(ap);
	r->status = status;
}

static void on_run(uv_work_t *w)
{
	struct bgreq *r = w->data;
	r->run(r);
}

static void on_done(uv_work_t *w, int status)
{
	struct bgreq *r = w->data;
	struct daemon *d = r->d;
	d->nloads--;
	if (status < 0 && r->status == 0)
		bgreq_fail(r, ECANCELED, "cancelled");
	if (session_unref_alive(r->session)) {
		if (r->status)
			session_reply(r->session, r->req_id, r->status, "%s", r->msg);
		else
			r->reply(r);
	}
	r->destroy(r);
	daemon_work_ended(d);
}

void bgreq_start(struct session *s, uint64_t req_id, struct bgreq *r)
{
	const char *why;
	int busy = bgreq_admit(s, &why);
	if (busy) {
		session_reply(s, req_id, busy, "%s", why);
		r->destroy(r);
		return;
	}
	r->d = s->d;
	r->session = s;
	r->req_id = req_id;
	r->work.data = r;
	session_ref(s);
	s->d->nloads++;
	int e = uv_queue_work(s->d->loop, &r->work, on_run, on_done);
	if (e < 0) {
		s->d->nloads--;
		session_unref_alive(s);
		session_reply(s, req_id, EIO, "cannot queue the request: %s", uv_strerror(e));
		r->destroy(r);
	}
}
