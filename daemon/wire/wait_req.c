/* WaitRequest: every waiter of one (job, step) on this daemon is a member
 * of one group, and the group polls the step's listing on the threadpool
 * (catalog_resolve_step: one LIST page per 1000 objects, and the commit
 * object's create-only PUT once the step is complete), first at once,
 * then WAIT_POLL_FIRST_MS after, doubling to WAIT_POLL_MAX_MS. While this
 * node still saves the step, the backoff's looks are skipped (hold_poll).
 * When the last of the step's saves in flight on this node is durable,
 * the backoff starts over, so a job whose last rank is on this node is
 * answered within WAIT_POLL_FIRST_MS of it.
 * So the requests of a wait depend on how long the step takes to be
 * complete after this node's last rank, not on how many ranks wait: 48
 * ranks waiting 3 s on one node cost about 8 LISTs, where each rank
 * polling every 50 ms cost 2,880.
 *
 * One timer per group serves both its next poll and its waiters'
 * deadlines (the earliest of them). A waiter holds its session like a
 * load (session_ref) and counts against max_inflight_loads; a waiter
 * whose session closed is dropped at the group's next tick. */
#include "wait_req.h"
#include "catalog.h"
#include "daemon.h"
#include "log.h"
#include "saveobj.h"
#include "session.h"
#include "tenancy.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* What a poll found of a step (complete, or the best attempt so far). */
struct seen {
	char job[JOB_BUF];
	uint64_t step;
	struct catalog_summary sum;
	uint64_t at_ns; /* when (clock_now_ns); 0: a free slot */
};

struct waiter {
	TAILQ_ENTRY(waiter) link;
	struct session *s;
	uint64_t req_id;
	struct viewer view;
	uint64_t deadline_ns; /* UINT64_MAX: none */
	uint64_t came_ns;
	bool looked; /* a listing begun after it came has ended: its deadline holds */
};
TAILQ_HEAD(waiter_list, waiter);

struct group {
	TAILQ_ENTRY(group) link;
	struct daemon *d;
	char job[JOB_BUF];
	uint64_t step;
	struct waiter_list waiters;
	uv_timer_t timer;
	uv_work_t work;
	bool polling; /* work in flight */
	bool wake;    /* a local durable came during the poll: look again soon */
	bool ended;   /* no waiter is left: freed once no poll is in flight */
	uint64_t polled_ns, next_poll_ns;
	uint32_t delay_ms;
	/* A poll's result: res is written by the threadpool while polling,
	 * and copied to last (the loop's) when it ends. */
	struct look {
		uint64_t started_ns; /* when the listing began (on the threadpool) */
		int status;          /* 0: listed; -ENOENT: no manifest yet; else a storage error */
		bool complete;
		struct seen found; /* complete, or the best attempt so far */
		char why[256];     /* status's words */
	} res, last;
	bool looked;  /* last holds a poll's result */
	uint64_t gen; /* waits.forgets when this poll began */
};
TAILQ_HEAD(group_list, group);

struct waits {
	struct group_list groups;
	struct seen seen[WAIT_SEEN_MAX];
	uint32_t next_seen;
	/* Steps removed (wait_forget) so far: a poll that began before one
	 * may have listed it, so its answer is not kept, whether or not its
	 * group is still in groups (an ended group's poll runs on). */
	uint64_t forgets;
};

int wait_init(struct daemon *d)
{
	d->waits = calloc(1, sizeof(*d->waits));
	if (d->waits == NULL)
		return -ENOMEM;
	TAILQ_INIT(&d->waits->groups);
	return 0;
}

void wait_fini(struct daemon *d)
{
	free(d->waits); /* wait_cancel_all emptied it */
	d->waits = NULL;
}

/* ---- the steps lately seen complete ---- */

static const struct seen *seen_find(struct waits *w, const char *job, uint64_t step)
{
	uint64_t now = clock_now_ns();
	for (size_t i = 0; i < WAIT_SEEN_MAX; i++) {
		const struct seen *x = &w->seen[i];
		if (x->at_ns && now - x->at_ns < (uint64_t)WAIT_SEEN_MS * 1000000 && x->step == step &&
		    strcmp(x->job, job) == 0)
			return x;
	}
	return NULL;
}

static void seen_add(struct waits *w, const struct seen *x)
{
	w->seen[w->next_seen] = *x;
	w->seen[w->next_seen].at_ns = clock_now_ns();
	w->next_seen = (w->next_seen + 1) % WAIT_SEEN_MAX;
}

void wait_forget(struct daemon *d, const char *job, uint64_t step)
{
	if (d->waits == NULL)
		return;
	d->waits->forgets++;
	for (size_t i = 0; i < WAIT_SEEN_MAX; i++) {
		struct seen *x = &d->waits->seen[i];
		if (x->at_ns && x->step == step && strcmp(x->job, job) == 0)
			x->at_ns = 0;
	}
}

/* ---- answers ---- */

/* Answer w (ResolveReply with x, or Reply status), drop its hold on the
 * session and free it. */
static void answer(struct waiter *w, const struct seen *x, int status, const char *why)
{
	if (!session_unref_alive(w->s))
		goto out;
	const char *shown = status == 0 ? tenancy_shown(&w->view, x->job) : NULL;
	if (status == 0 && shown == NULL) {
		status = -ENOENT;
		why = "no such job";
	}
	if (status < 0) {
		session_reply(w->s, w->req_id, status, "%s", why);
		goto out;
	}
	Ckpt__StepInfo si = CKPT__STEP_INFO__INIT;
	si.job = (char *)shown;
	si.step = x->step;
	si.complete = true;
	si.bytes = x->sum.bytes;
	si.bytes_unlisted = x->sum.bytes_unlisted;
	si.ranks_present = x->sum.count;
	si.world_size = x->sum.world_size;
	si.attempt_id = (char *)x->sum.attempt;
	si.saved_unix_ns = x->sum.saved_ns;
	Ckpt__ResolveReply rep = CKPT__RESOLVE_REPLY__INIT;
	rep.info = &si;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_RESOLVE_REPLY;
	f.resolve_reply = &rep;
	session_send(w->s, w->req_id, &f);
out:
	free(w);
}

/* Why the step is not complete yet, for a timeout's message. */
static void not_yet(const struct group *g, const struct waiter *w, char *buf, size_t len)
{
	const struct look *l = &g->last;
	if (!w->looked)
		snprintf(buf, len, "storage has not answered the listing begun %.0f ms ago",
			 g->polling ? (double)(clock_now_ns() - g->polled_ns) / 1e6 : 0.0);
	else if (!g->looked)
		snprintf(buf, len, "not looked at yet");
	else if (l->status == -ENOENT)
		snprintf(buf, len, "no manifest in storage yet");
	else if (l->status < 0)
		snprintf(buf, len, "the last look failed: %s", l->why);
	else
		snprintf(buf, len, "%u of %u ranks of attempt '%s' in storage", l->found.sum.count,
			 l->found.sum.world_size, l->found.sum.attempt);
}

static void timed_out(struct group *g, struct waiter *w)
{
	char state[400], why[700];
	const char *shown = tenancy_shown(&w->view, g->job);
	not_yet(g, w, state, sizeof(state));
	snprintf(why, sizeof(why), "step %" PRIu64 " of job '%s' is not complete within the wait's timeout: %s",
		 g->step, shown ? shown : g->job, state);
	answer(w, NULL, -ETIMEDOUT, why);
}

/* ---- a group's life ---- */

static void group_free(uv_handle_t *h)
{
	free(h->data);
}

/* No waiter is left: the group goes (after its poll, if one runs). */
static void group_end(struct group *g)
{
	if (g->ended)
		return;
	g->ended = true;
	TAILQ_REMOVE(&g->d->waits->groups, g, link);
	uv_timer_stop(&g->timer);
	if (!g->polling)
		uv_close((uv_handle_t *)&g->timer, group_free);
}

static void answer_all(struct group *g, const struct seen *x, int status, const char *why)
{
	struct waiter *w;
	while ((w = TAILQ_FIRST(&g->waiters)) != NULL) {
		TAILQ_REMOVE(&g->waiters, w, link);
		answer(w, x, status, why);
	}
	group_end(g);
}

static void on_tick(uv_timer_t *t);

/* A waiter no listing has looked for yet (storage slow, or the threadpool
 * busy) is answered anyway this long past its deadline. */
#define WAIT_LOOK_GRACE_MS 5000u

static uint64_t past_grace(uint64_t deadline_ns)
{
	uint64_t g = (uint64_t)WAIT_LOOK_GRACE_MS * 1000000;
	return deadline_ns > UINT64_MAX - g ? UINT64_MAX : deadline_ns + g;
}

/* Arm the timer for the next poll or the earliest deadline that holds (a
 * waiter not yet looked for has its poll at or before its deadline:
 * wait_start). */
static void rearm(struct group *g)
{
	uint64_t at = g->polling ? UINT64_MAX : g->next_poll_ns;
	struct waiter *w;
	TAILQ_FOREACH (w, &g->waiters, link) {
		uint64_t due = w->looked ? w->deadline_ns : past_grace(w->deadline_ns);
		if (due < at)
			at = due;
	}
	if (at == UINT64_MAX) {
		uv_timer_stop(&g->timer);
		return;
	}
	uint64_t now = clock_now_ns();
	uint64_t ms = at > now ? (at - now + 999999) / 1000000 : 0;
	uv_timer_start(&g->timer, on_tick, ms, 0);
}

/* ---- the poll ---- */

static void seen_of(struct seen *x, const char *job, const struct catalog_step *cs)
{
	memset(x, 0, sizeof(*x));
	snprintf(x->job, sizeof(x->job), "%s", job);
	x->step = cs->step;
	catalog_step_summary(cs, &x->sum);
}

static void poll_run(uv_work_t *work)
{
	struct group *g = work->data;
	struct look *l = &g->res;
	struct store *st = daemon_store_of(g->d, g->job);
	struct catalog_step cs;
	l->started_ns = clock_now_ns();
	store_clear_error();
	int r = catalog_resolve_step(st, g->job, g->step, &cs);
	uint32_t delay_ms = g->d->cfg.debug_wait_delay_ms;
	if (delay_ms) { /* tests: a listing that answers late */
		struct timespec ts = { delay_ms / 1000, (long)(delay_ms % 1000) * 1000000 };
		nanosleep(&ts, NULL);
	}
	l->complete = false;
	l->why[0] = '\0';
	if (r == 0) {
		l->complete = catalog_step_complete(&cs);
		if (cs.best >= 0)
			seen_of(&l->found, g->job, &cs);
		catalog_step_free(&cs);
	} else if (r != -ENOENT) {
		snprintf(l->why, sizeof(l->why), "listing step %" PRIu64 " of job '%s' in %s: %s (%s)", g->step, g->job,
			 st->url, store_error(r), catalog_no_fallback_hint(r));
	}
	l->status = r;
}

/* Errors that asking again cannot mend: answered at once. Any other
 * (a timeout, a reset, throttling the store's retries did not outlast)
 * is polled through until the waiters' deadlines. */
static bool lasting(int status)
{
	return status == -EACCES || status == -EPERM || status == -EINVAL || status == -ENAMETOOLONG ||
	       status == -EBADMSG;
}

/* Drop the waiters whose session closed, and answer those past their
 * deadline that a poll has looked for (timeout 0: exactly one look). */
static void expire(struct group *g, uint64_t now)
{
	struct waiter *w, *next;
	for (w = TAILQ_FIRST(&g->waiters); w != NULL; w = next) {
		next = TAILQ_NEXT(w, link);
		if (w->s->closing) {
			TAILQ_REMOVE(&g->waiters, w, link);
			session_unref_alive(w->s);
			free(w);
		} else if ((w->looked ? w->deadline_ns : past_grace(w->deadline_ns)) <= now) {
			TAILQ_REMOVE(&g->waiters, w, link);
			timed_out(g, w);
		}
	}
}

static void poll_done(uv_work_t *work, int status)
{
	struct group *g = work->data;
	struct daemon *d = g->d;
	struct look *l = &g->last;
	g->polling = false;
	d->nloads--;
	g->last = g->res;
	g->looked = true;
	if (status < 0 && l->status == 0) {
		l->status = -ECANCELED;
		snprintf(l->why, sizeof(l->why), "cancelled");
	}
	if (l->status == 0 && l->complete && g->gen == d->waits->forgets)
		seen_add(d->waits, &l->found);
	if (g->ended) {
		uv_close((uv_handle_t *)&g->timer, group_free);
	} else if (l->status == 0 && l->complete) {
		answer_all(g, &l->found, 0, NULL);
	} else if (lasting(l->status)) {
		log_warn("wait: %s", l->why);
		answer_all(g, NULL, l->status, l->why);
	} else {
		uint64_t now = clock_now_ns();
		g->next_poll_ns = now + (uint64_t)(g->wake ? WAIT_POLL_FIRST_MS : g->delay_ms) * 1000000;
		g->delay_ms = g->wake ? WAIT_POLL_FIRST_MS : g->delay_ms * 2;
		if (g->delay_ms > WAIT_POLL_MAX_MS)
			g->delay_ms = WAIT_POLL_MAX_MS;
		g->wake = false;
		/* A waiter that came after this listing began is not looked
		 * for by it: the next look comes by its deadline. */
		struct waiter *w;
		TAILQ_FOREACH (w, &g->waiters, link) {
			if (w->came_ns <= l->started_ns)
				w->looked = true;
			else if (w->deadline_ns < g->next_poll_ns)
				g->next_poll_ns = w->deadline_ns;
		}
		expire(g, now);
		if (TAILQ_EMPTY(&g->waiters))
			group_end(g);
		else
			rearm(g);
	}
	daemon_work_ended(d);
}

static void poll_start(struct group *g)
{
	g->polling = true;
	g->gen = g->d->waits->forgets;
	g->polled_ns = clock_now_ns();
	g->d->stats.wait_polls++;
	g->work.data = g;
	g->d->nloads++;
	int e = uv_queue_work(g->d->loop, &g->work, poll_run, poll_done);
	if (e < 0) {
		g->polling = false;
		g->d->nloads--;
		char why[128];
		snprintf(why, sizeof(why), "cannot queue the wait's poll: %s", uv_strerror(e));
		answer_all(g, NULL, -EIO, why);
	}
}

/* Whether a save of (job, step) is still in flight here. */
static bool saving_here(struct daemon *d, const char *job, uint64_t step)
{
	struct save *sv;
	TAILQ_FOREACH (sv, &d->saves, link)
		if (sv->step == step && strcmp(sv->job, job) == 0)
			return true;
	return false;
}

/* The earliest deadline of a waiter not yet looked for (UINT64_MAX:
 * none): it gets its look then, whatever else holds the poll back. */
static uint64_t unlooked_deadline(const struct group *g)
{
	uint64_t at = UINT64_MAX;
	const struct waiter *w;
	TAILQ_FOREACH (w, &g->waiters, link)
		if (!w->looked && w->deadline_ns < at)
			at = w->deadline_ns;
	return at;
}

/* The backoff's next poll, taken without a look while this node still
 * saves the step: the step cannot be complete before its ranks here are,
 * and their last durable starts the backoff over (wait_step_durable). A
 * save that fails instead leaves the list, and the tick after it looks.
 * So a node's looks start when its own ranks are done, not when its first
 * rank waits: the looks of a wait are counted from the node's last rank,
 * however long the saves of the rest take. A step already complete in
 * another attempt while a rank here saves it again is seen once that save
 * ends; a waiter looked for before it and due meanwhile times out with
 * the count its look found. */
static bool hold_poll(struct group *g, uint64_t now)
{
	uint64_t due = unlooked_deadline(g);
	if (!saving_here(g->d, g->job, g->step) || due <= now)
		return false;
	g->next_poll_ns = now + (uint64_t)g->delay_ms * 1000000;
	if (due < g->next_poll_ns)
		g->next_poll_ns = due;
	return true;
}

static void on_tick(uv_timer_t *t)
{
	struct group *g = t->data;
	uint64_t now = clock_now_ns();
	expire(g, now);
	if (TAILQ_EMPTY(&g->waiters)) {
		group_end(g);
		return;
	}
	if (!g->polling && now >= g->next_poll_ns && !hold_poll(g, now))
		poll_start(g);
	if (!g->ended) /* else the poll could not be queued: answered */
		rearm(g);
}

static struct group *group_find(struct waits *ws, const char *job, uint64_t step)
{
	struct group *g;
	TAILQ_FOREACH (g, &ws->groups, link)
		if (g->step == step && strcmp(g->job, job) == 0)
			return g;
	return NULL;
}

static struct group *group_new(struct daemon *d, const char *job, uint64_t step)
{
	struct group *g = calloc(1, sizeof(*g));
	if (g == NULL)
		return NULL;
	g->d = d;
	snprintf(g->job, sizeof(g->job), "%s", job);
	g->step = step;
	g->delay_ms = WAIT_POLL_FIRST_MS;
	TAILQ_INIT(&g->waiters);
	uv_timer_init(d->loop, &g->timer);
	g->timer.data = g;
	TAILQ_INSERT_TAIL(&d->waits->groups, g, link);
	return g;
}

/* ---- the request ---- */

void wait_start(struct session *s, uint64_t req_id, const Ckpt__WaitRequest *m)
{
	struct daemon *d = s->d;
	char job[JOB_BUF];
	if (!session_request_job(s, req_id, m->job, "wait", job, sizeof(job)))
		return;
	struct waiter *w = calloc(1, sizeof(*w));
	if (w == NULL) {
		session_reply(s, req_id, -ENOMEM, "out of memory");
		return;
	}
	w->s = s;
	w->req_id = req_id;
	w->view = session_viewer(s);
	uint64_t now = clock_now_ns();
	w->came_ns = now;
	w->deadline_ns = m->timeout_ms == WAIT_FOREVER ? UINT64_MAX : now + (uint64_t)m->timeout_ms * 1000000;
	session_ref(s);
	const struct seen *x = seen_find(d->waits, job, m->step);
	if (x != NULL) {
		answer(w, x, 0, NULL);
		return;
	}
	struct group *g = group_find(d->waits, job, m->step);
	bool fresh = g == NULL;
	if (fresh && (g = group_new(d, job, m->step)) == NULL) {
		answer(w, NULL, -ENOMEM, "out of memory");
		return;
	}
	TAILQ_INSERT_TAIL(&g->waiters, w, link);
	/* Every waiter is looked for by its deadline: one with a short
	 * timeout brings the group's next poll forward. */
	if (fresh && !hold_poll(g, now))
		poll_start(g);
	else if (!fresh && !g->polling && w->deadline_ns < g->next_poll_ns)
		g->next_poll_ns = w->deadline_ns;
	if (!g->ended)
		rearm(g);
}

void wait_cancel_all(struct daemon *d, int status, const char *why)
{
	struct group *g;
	if (d->waits == NULL)
		return;
	while ((g = TAILQ_FIRST(&d->waits->groups)) != NULL)
		answer_all(g, NULL, status, why);
}

void wait_step_durable(struct daemon *d, const char *job, uint64_t step)
{
	struct group *g = d->waits ? group_find(d->waits, job, step) : NULL;
	/* Once per node and step: when its last local rank is durable (if
	 * the step's last rank is on this node, the step is complete now). */
	if (g == NULL || saving_here(d, job, step))
		return;
	if (g->polling) {
		g->wake = true;
		return;
	}
	uint64_t soon = g->polled_ns + (uint64_t)WAIT_POLL_FIRST_MS * 1000000;
	uint64_t now = clock_now_ns();
	if (soon < now)
		soon = now;
	if (soon < g->next_poll_ns) /* never later than a waiter's deadline brought it */
		g->next_poll_ns = soon;
	g->delay_ms = WAIT_POLL_FIRST_MS;
	rearm(g);
}
