/* One row per wire message (docs/architecture.md §4 validation order: the flags are the
 * checks every message of a kind shares; field ranges stay in handlers). */
#include "msgtab.h"
#include "catalog_req.h"
#include "load.h"
#include "log.h"
#include "metrics.h"
#include "save.h"
#include "session.h"
#include "status.h"
#include "tier_req.h"
#include "wait_req.h"
#include "macro.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <stdlib.h>

/* The handlers take the whole frame; these pass on its body. */
static void m_hello(struct session *s, const Ckpt__Frame *f)
{
	session_hello(s, f->req_id, f->hello);
}
static void m_register(struct session *s, const Ckpt__Frame *f)
{
	session_register(s, f->req_id, f->register_buffer);
}
static void m_unregister(struct session *s, const Ckpt__Frame *f)
{
	session_unregister(s, f->req_id, f->unregister);
}
static void m_declare_table(struct session *s, const Ckpt__Frame *f)
{
	session_declare_table(s, f->req_id, f->declare_table);
}
static void m_drop_table(struct session *s, const Ckpt__Frame *f)
{
	session_drop_table(s, f->req_id, f->drop_table);
}
static void m_save(struct session *s, const Ckpt__Frame *f)
{
	struct requester rq = session_requester(s, f->req_id);
	save_start(s->d, &rq, f->save);
}

static void m_load(struct session *s, const Ckpt__Frame *f)
{
	struct requester rq = session_requester(s, f->req_id);
	load_start(s->d, &rq, f->load);
}
static void m_list(struct session *s, const Ckpt__Frame *f)
{
	list_start(s, f->req_id, f->list);
}
static void m_show(struct session *s, const Ckpt__Frame *f)
{
	show_start(s, f->req_id, f->show);
}
static void m_verify(struct session *s, const Ckpt__Frame *f)
{
	verify_start(s, f->req_id, f->verify);
}
static void m_delete(struct session *s, const Ckpt__Frame *f)
{
	delete_start(s, f->req_id, f->delete_);
}
static void m_gc(struct session *s, const Ckpt__Frame *f)
{
	gc_start(s, f->req_id, f->gc);
}
static void m_resolve(struct session *s, const Ckpt__Frame *f)
{
	resolve_start(s, f->req_id, f->resolve);
}

static void m_held(struct session *s, const Ckpt__Frame *f)
{
	held_start(s, f->req_id, f->held);
}
static void m_persist(struct session *s, const Ckpt__Frame *f)
{
	persist_request(s, f->req_id, f->persist);
}
static void m_wait(struct session *s, const Ckpt__Frame *f)
{
	wait_start(s, f->req_id, f->wait);
}

/* What a tenant's session may see of the status (docs/security.md "Tenants"): its
 * own row, held copies and failed saves (under its own names; of the
 * node's last few failures, those of its jobs), no other tenant's, and no
 * names of files recovered at start. Node-wide numbers stay. Which jobs,
 * and by which names: tenancy.h. */
static void status_for_tenant(const struct session *s, struct status *st)
{
	if (s->tenant < 0)
		return; /* an admin, or a ckptd without tenants: everything */
	struct viewer view = session_viewer(s);
	const char *shown;
	uint32_t w = 0;
	for (uint32_t i = 0; i < st->nheld; i++)
		if ((shown = tenancy_shown(&view, st->held[i].job)) != NULL) {
			st->held[w] = st->held[i];
			st->held[w++].job = shown;
		}
	st->nheld = w;
	w = 0;
	for (uint32_t i = 0; i < st->nfailures; i++)
		if ((shown = tenancy_shown(&view, st->failures[i].job)) != NULL) {
			st->failures[w] = st->failures[i];
			st->failures[w++].job = shown;
		}
	st->nfailures = w;
	st->tenants[0] = st->tenants[s->tenant];
	st->ntenants = 1;
	st->nrecovered = 0;
}

static void m_status(struct session *s, const Ckpt__Frame *f)
{
	struct status st;
	Ckpt__StatusReply rep = CKPT__STATUS_REPLY__INIT;
	int r = status_snapshot(s->d, &st);
	if (r == 0)
		status_for_tenant(s, &st);
	if (r < 0 || status_reply_fill(&st, &rep) < 0) {
		status_release(&st);
		session_reply(s, f->req_id, -ENOMEM, "out of memory");
		return;
	}
	Ckpt__Frame out = CKPT__FRAME__INIT;
	out.body_case = CKPT__FRAME__BODY_STATUS_REPLY;
	out.status_reply = &rep;
	session_send(s, f->req_id, &out);
	status_reply_free(&rep);
	status_release(&st);
}

static void m_metrics(struct session *s, const Ckpt__Frame *f)
{
	char *text = NULL;
	size_t len = 0;
	/* A tenant's session sees what its status shows: its own row (the
	 * HTTP listener, the operator's, shows every tenant). */
	struct status st;
	int r = status_snapshot(s->d, &st);
	if (r == 0) {
		status_for_tenant(s, &st);
		r = metrics_format(&st, &text, &len);
	}
	status_release(&st);
	if (r < 0) {
		session_reply(s, f->req_id, -ENOMEM, "out of memory");
		return;
	}
	Ckpt__MetricsReply rep = CKPT__METRICS_REPLY__INIT;
	rep.text = text;
	Ckpt__Frame out = CKPT__FRAME__INIT;
	out.body_case = CKPT__FRAME__BODY_METRICS_REPLY;
	out.metrics_reply = &rep;
	session_send(s, f->req_id, &out);
	free(text);
}

/* Loads and catalogue requests (bgreq): on the threadpool, bounded per
 * session, refused while draining. A Save's refusal while draining is a
 * failed save (save_start: SaveFailed, counted in saves_failed). */
#define BG (MSG_NEEDS_HELLO | MSG_REFUSE_DRAINING | MSG_BACKGROUND | MSG_CAPPED)
#define NOT_REQUEST(n) \
	{ \
		.name = n, .flags = MSG_NOT_REQUEST \
	}

static const struct msg_row rows[] = {
	[CKPT__FRAME__BODY_HELLO] = { .name = "hello", .handler = m_hello },
	[CKPT__FRAME__BODY_REGISTER_BUFFER] = { .name = "register_buffer",
						.handler = m_register,
						.flags = MSG_NEEDS_HELLO },
	[CKPT__FRAME__BODY_UNREGISTER] = { .name = "unregister", .handler = m_unregister, .flags = MSG_NEEDS_HELLO },
	[CKPT__FRAME__BODY_DECLARE_TABLE] = { .name = "declare_table",
					      .handler = m_declare_table,
					      .flags = MSG_NEEDS_HELLO },
	[CKPT__FRAME__BODY_DROP_TABLE] = { .name = "drop_table", .handler = m_drop_table, .flags = MSG_NEEDS_HELLO },
	[CKPT__FRAME__BODY_SAVE] = { .name = "save", .handler = m_save, .flags = MSG_NEEDS_HELLO },
	[CKPT__FRAME__BODY_LOAD] = { .name = "load",
				     .handler = m_load,
				     .flags = BG,
				     .refuse_as = CKPT__FRAME__BODY_LOAD_FAILED },
	[CKPT__FRAME__BODY_STATUS] = { .name = "status", .handler = m_status, .flags = MSG_NEEDS_HELLO },
	[CKPT__FRAME__BODY_LIST] = { .name = "list", .handler = m_list, .flags = BG },
	[CKPT__FRAME__BODY_SHOW] = { .name = "show", .handler = m_show, .flags = BG },
	[CKPT__FRAME__BODY_VERIFY] = { .name = "verify", .handler = m_verify, .flags = BG },
	[CKPT__FRAME__BODY_DELETE] = { .name = "delete", .handler = m_delete, .flags = BG },
	[CKPT__FRAME__BODY_GC] = { .name = "gc", .handler = m_gc, .flags = BG },
	[CKPT__FRAME__BODY_METRICS] = { .name = "metrics", .handler = m_metrics, .flags = MSG_NEEDS_HELLO },
	[CKPT__FRAME__BODY_RESOLVE] = { .name = "resolve", .handler = m_resolve, .flags = BG },
	/* With peers, asked of them on the threadpool. */
	[CKPT__FRAME__BODY_HELD] = { .name = "held", .handler = m_held, .flags = BG },
	/* Answered when its uploads end; holds the session like a load. */
	[CKPT__FRAME__BODY_PERSIST] = { .name = "persist", .handler = m_persist, .flags = BG },
	/* Answered when the step is complete (one shared poll per step). */
	[CKPT__FRAME__BODY_WAIT] = { .name = "wait", .handler = m_wait, .flags = BG },

	[CKPT__FRAME__BODY_HELLO_REPLY] = NOT_REQUEST("hello_reply"),
	[CKPT__FRAME__BODY_REPLY] = NOT_REQUEST("reply"),
	[CKPT__FRAME__BODY_SAVE_STAGED] = NOT_REQUEST("save_staged"),
	[CKPT__FRAME__BODY_SAVE_DURABLE] = NOT_REQUEST("save_durable"),
	[CKPT__FRAME__BODY_SAVE_FAILED] = NOT_REQUEST("save_failed"),
	[CKPT__FRAME__BODY_LOADED] = NOT_REQUEST("loaded"),
	[CKPT__FRAME__BODY_LOAD_FAILED] = NOT_REQUEST("load_failed"),
	[CKPT__FRAME__BODY_STATUS_REPLY] = NOT_REQUEST("status_reply"),
	[CKPT__FRAME__BODY_LIST_REPLY] = NOT_REQUEST("list_reply"),
	[CKPT__FRAME__BODY_SHOW_REPLY] = NOT_REQUEST("show_reply"),
	[CKPT__FRAME__BODY_VERIFY_REPLY] = NOT_REQUEST("verify_reply"),
	[CKPT__FRAME__BODY_GC_REPLY] = NOT_REQUEST("gc_reply"),
	[CKPT__FRAME__BODY_METRICS_REPLY] = NOT_REQUEST("metrics_reply"),
	[CKPT__FRAME__BODY_RESOLVE_REPLY] = NOT_REQUEST("resolve_reply"),
	[CKPT__FRAME__BODY_SAVE_KEPT] = NOT_REQUEST("save_kept"),
	[CKPT__FRAME__BODY_SAVE_REPLICATED] = NOT_REQUEST("save_replicated"),
	[CKPT__FRAME__BODY_HELD_REPLY] = NOT_REQUEST("held_reply"),
};

_Static_assert(ELEMENTSOF(rows) <= STATS_MSG_SLOTS,
	       "struct stats counts requests per body case: raise STATS_MSG_SLOTS");

const struct msg_row *msg_row(int body_case)
{
	if (body_case < 0 || (size_t)body_case >= ELEMENTSOF(rows) || rows[body_case].name == NULL)
		return NULL;
	return &rows[body_case];
}

/* A refusal by the flags, as a Reply or as the row's failure body. */
static void refuse(struct session *s, const struct msg_row *m, uint64_t req_id, int status, const char *why)
{
	if (m->refuse_as != CKPT__FRAME__BODY_LOAD_FAILED) {
		session_reply(s, req_id, status, "%s", why);
		return;
	}
	session_send_load_failed(s, req_id, status, why);
}

void msg_dispatch(struct session *s, const Ckpt__Frame *f)
{
	const struct msg_row *m = msg_row(f->body_case);
	if (m != NULL && m->handler == NULL)
		m = NULL;
	if (!s->hello_done && (m == NULL || (m->flags & MSG_NEEDS_HELLO))) {
		session_close(s, -EPROTO, "the first frame must be Hello");
		return;
	}
	if (m == NULL) {
		session_reply(s, f->req_id, -EBADMSG, "unknown or unexpected message type %d", (int)f->body_case);
		return;
	}
	s->d->stats.requests[f->body_case]++;
	if ((m->flags & MSG_REFUSE_DRAINING) && s->d->draining) {
		refuse(s, m, f->req_id, -ESHUTDOWN, "ckptd is shutting down");
		return;
	}
	if ((m->flags & MSG_CAPPED) && s->refs >= s->d->cfg.max_inflight_loads) {
		s->d->stats.refused[LIMIT_INFLIGHT_LOADS]++;
		refuse(s, m, f->req_id, -EBUSY,
		       "too many loads and catalogue requests in flight on this session (max_inflight_loads)");
		return;
	}
	m->handler(s, f);
}

void msgtab_init(struct daemon *d)
{
	for (size_t m = 0; m < ELEMENTSOF(rows); m++)
		if (rows[m].name != NULL && !(rows[m].flags & MSG_NOT_REQUEST))
			d->stats.request_name[m] = rows[m].name;
}
