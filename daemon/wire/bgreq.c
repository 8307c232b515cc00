#include "bgreq.h"
#include "daemon.h"
#include "session.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

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
		bgreq_fail(r, -ECANCELED, "cancelled");
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
	assert(s && r && r->run && r->reply && r->destroy);
	/* Draining and the session's cap were checked by its message row
	 * (msgtab.c). */
	r->d = s->d;
	r->session = s;
	r->req_id = req_id;
	r->view = session_viewer(s);
	r->work.data = r;
	session_ref(s);
	s->d->nloads++;
	int e = uv_queue_work(s->d->loop, &r->work, on_run, on_done);
	if (e < 0) {
		s->d->nloads--;
		session_unref_alive(s);
		session_reply(s, req_id, -EIO, "cannot queue the request: %s", uv_strerror(e));
		r->destroy(r);
	}
}
