/* The catalogue requests of ckptctl: list, show, verify, delete, and
 * garbage collection under the retention policy (on demand, and after
 * every durable step). All of them read storage on the threadpool. */
#include "catalog_req.h"
#include "journal.h"
#include "bgreq.h"
#include "catalog.h"
#include "daemon.h"
#include "gc.h"
#include "grow.h"
#include "load.h"
#include "log.h"
#include "manifest.h"
#include "retention.h"
#include "memtier.h"
#include "save.h"
#include "session.h"
#include "steplock.h"
#include "tenancy.h"
#include "tier_req.h"
#include "verify.h"
#include "wait_req.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- step summaries ---- */

static int step_info(Ckpt__StepInfo *si, const char *job, const struct catalog_step *cs)
{
	struct catalog_summary x;
	catalog_step_summary(cs, &x);
	ckpt__step_info__init(si);
	si->job = strdup(job);
	si->attempt_id = strdup(x.attempt);
	if (si->job == NULL || si->attempt_id == NULL) {
		free(si->job);
		free(si->attempt_id);
		si->job = si->attempt_id = NULL;
		return -ENOMEM;
	}
	si->step = cs->step;
	si->complete = x.complete;
	si->bytes = x.bytes;
	si->bytes_unlisted = x.bytes_unlisted;
	si->ranks_present = x.count;
	si->world_size = x.world_size;
	si->saved_unix_ns = x.saved_ns;
	return 0;
}

static void step_info_clear(Ckpt__StepInfo *si)
{
	free(si->job);
	free(si->attempt_id);
	if (si->where != protobuf_c_empty_string)
		free(si->where); /* list_held's */
}

struct infos {
	Ckpt__StepInfo *v;
	char **reasons;
	size_t n, cap, reasons_cap;
};

static int infos_add(struct infos *x, const char *job, const struct catalog_step *cs, const char *reason)
{
	if (GROW(x->v, x->cap, x->n + 1, 64) < 0 || GROW(x->reasons, x->reasons_cap, x->n + 1, 64) < 0)
		return -ENOMEM;
	int r = step_info(&x->v[x->n], job, cs);
	if (r < 0)
		return r;
	x->reasons[x->n] = reason ? strdup(reason) : NULL;
	x->n++;
	return 0;
}

static void infos_free(struct infos *x)
{
	for (size_t i = 0; i < x->n; i++) {
		step_info_clear(&x->v[i]);
		free(x->reasons[i]);
	}
	free(x->v);
	free(x->reasons);
}

static Ckpt__StepInfo **infos_ptrs(struct infos *x)
{
	Ckpt__StepInfo **p = calloc(x->n ? x->n : 1, sizeof(*p));
	for (size_t i = 0; p && i < x->n; i++)
		p[i] = &x->v[i];
	return p;
}

/* ---- list ---- */

struct list_req {
	struct bgreq base;
	char job[JOB_BUF];
	struct infos out;
};

static int list_job(struct list_req *l, struct store *st, const char *job)
{
	st = daemon_store_of(l->base.d, job);
	uint64_t *steps = NULL;
	size_t n = 0;
	int r = catalog_steps(st, job, &steps, &n);
	if (r < 0)
		return r;
	/* One LIST per step (ceil(objects / 1000) requests), no manifest
	 * read: 100 steps of 4096 ranks are about 900 requests. */
	for (size_t i = 0; i < n && r == 0; i++) {
		struct catalog_step cs;
		int e = catalog_list_step(st, job, steps[i], &cs);
		if (e == -ENOENT || e == -EBADMSG)
			continue;
		if (e < 0) {
			r = e;
			break;
		}
		const char *shown = tenancy_shown(&l->base.view, job);
		if (shown)
			r = infos_add(&l->out, shown, &cs, NULL);
		catalog_step_free(&cs);
	}
	free(steps);
	return r;
}

static void list_run(struct bgreq *b)
{
	struct list_req *l = (struct list_req *)b;
	struct store *st = b->d->store; /* each job's: list_job */
	int r;
	if (l->job[0]) {
		r = list_job(l, st, l->job);
		if (r == -ENOENT)
			r = 0;
	} else {
		char **jobs = NULL;
		size_t n = 0;
		r = tenancy_jobs(b->d, &b->view, &jobs, &n);
		for (size_t i = 0; i < n && r == 0; i++) {
			r = list_job(l, st, jobs[i]);
			if (r == -ENOENT || r == -ENOTDIR)
				r = 0;
		}
		store_names_free(jobs, n);
	}
	if (r < 0)
		bgreq_fail(b, r, "listing %s: %s", st->url, store_error(r));
}

static void list_reply(struct bgreq *b)
{
	struct list_req *l = (struct list_req *)b;
	/* Steps in this daemon's memory: where their copies are, and those
	 * in memory only (on the loop: the memory tier is the loop's). */
	size_t before = l->out.n;
	int r = list_held(b, l->job, &l->out.v, &l->out.n, &l->out.cap);
	if (l->out.n > before) {
		if (GROW(l->out.reasons, l->out.reasons_cap, l->out.n, 64) < 0) {
			for (size_t i = before; i < l->out.n; i++)
				step_info_clear(&l->out.v[i]);
			l->out.n = before;
			r = -ENOMEM;
		} else {
			for (size_t i = before; i < l->out.n; i++)
				l->out.reasons[i] = NULL;
		}
	}
	if (r < 0) {
		session_reply(b->session, b->req_id, -ENOMEM, "out of memory");
		return;
	}
	Ckpt__StepInfo **ptrs = infos_ptrs(&l->out);
	if (ptrs == NULL) {
		session_reply(b->session, b->req_id, -ENOMEM, "out of memory");
		return;
	}
	Ckpt__ListReply rep = CKPT__LIST_REPLY__INIT;
	rep.n_steps = l->out.n;
	rep.steps = ptrs;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_LIST_REPLY;
	f.list_reply = &rep;
	session_send(b->session, b->req_id, &f);
	free(ptrs);
}

static void list_destroy(struct bgreq *b)
{
	struct list_req *l = (struct list_req *)b;
	infos_free(&l->out);
	free(l);
}

/* The job a request names, as ckptd keeps it (tenancy_kept), in out ("" if
 * none and not required); false if refused (answered). */
static bool job_arg(struct session *s, uint64_t req_id, const char *job, bool required, char *out, size_t outlen)
{
	char why[512];
	out[0] = '\0';
	if (!required && job[0] == '\0')
		return true;
	struct viewer v = session_viewer(s);
	if (tenancy_kept(&v, job, out, outlen, why, sizeof(why)) < 0) {
		session_reply(s, req_id, -EINVAL, "%s", why);
		return false;
	}
	return true;
}

/* The name b's session knows job by (tenancy_shown); NULL after answering
 * ENOENT, as for a job that does not exist, when it does not see it. */
static const char *shown_or_reply(struct bgreq *b, const char *job)
{
	const char *shown = tenancy_shown(&b->view, job);
	if (shown == NULL)
		session_reply(b->session, b->req_id, -ENOENT, "no such job");
	return shown;
}

void list_start(struct session *s, uint64_t req_id, const Ckpt__ListRequest *m)
{
	char job[JOB_BUF];
	if (!job_arg(s, req_id, m->job, false, job, sizeof(job)))
		return;
	struct list_req *l = calloc(1, sizeof(*l));
	if (l == NULL) {
		session_reply(s, req_id, -ENOMEM, "out of memory");
		return;
	}
	snprintf(l->job, sizeof(l->job), "%s", job);
	l->base.run = list_run;
	l->base.reply = list_reply;
	l->base.destroy = list_destroy;
	bgreq_start(s, req_id, &l->base);
}

/* ---- show and verify: one step ---- */

struct step_req {
	struct bgreq base;
	char job[JOB_BUF];
	uint64_t step;
	struct catalog_step cs;
	bool have_cs;
	bool one_rank; /* show, verify: this rank's manifest only */
	uint32_t rank;
	char attempt[ATTEMPT_BUF]; /* verify of one rank: its manifest's name */
	uint32_t world_size;
	bool found;                /* verify of one rank: its manifest was there */
	uint32_t world_size_asked; /* show of one rank: the session's world size */
	struct save *fetched;      /* show of one rank: its copy from a peer (show_run), pinned */
	uint64_t shard_bytes;      /* ... and what it says */
	int64_t created_ns;
	struct verify v; /* verify */
};

/* One rank's manifest of the step's chosen attempt (pinned, as a load
 * would take it): 1 LIST page per 1000 objects and one GET. */
static int scan_rank(struct step_req *q)
{
	struct store *st = daemon_store_of(q->base.d, q->job);
	int r = catalog_resolve_step(st, q->job, q->step, &q->cs);
	if (r < 0) {
		bgreq_fail(&q->base, r, "step %" PRIu64 " of job '%s': %s", q->step, q->job,
			   r == -ENOENT ? "not found" : store_error(r));
		return r;
	}
	q->have_cs = true;
	q->cs.cache = q->base.d->mancache; /* the load that follows finds it there */
	const struct catalog_group *g = &q->cs.groups[q->cs.best];
	uint32_t rank = q->rank < g->world_size ? q->rank : 0;
	const Ckpt__Manifest *m;
	char err[512];
	r = catalog_read_manifest(st, q->job, &q->cs, rank, &m, err, sizeof(err));
	if (r < 0) {
		bgreq_fail(&q->base, r, "step %" PRIu64 " of job '%s': %s", q->step, q->job,
			   r == -EBADMSG || r == -ENOENT ? err : store_error(r));
		return r;
	}
	return 0;
}

/* Every manifest of the step. show (ckpt.dcp's read_metadata on every
 * rank) takes them through the daemon's cache once the step is pinned
 * (a GET of the commit confirms it): from the step's index object, one
 * GET per node, or, before anyone wrote it, from the manifests, which
 * the ranks of a node read once between them, and then it writes the
 * index; it never pins a step itself. verify reads
 * them from storage: it checks what storage holds, not a copy in memory,
 * and its shard reads dwarf W manifest GETs anyway. */
static int scan_one(struct step_req *q, bool cached)
{
	if (q->one_rank)
		return scan_rank(q);
	struct store *st = daemon_store_of(q->base.d, q->job);
	int r = catalog_list_step(st, q->job, q->step, &q->cs);
	if (r < 0) {
		bgreq_fail(&q->base, r, "step %" PRIu64 " of job '%s': %s", q->step, q->job,
			   r == -ENOENT ? "not found" : store_error(r));
		return r;
	}
	q->have_cs = true;
	if (cached && q->base.d->mancache) {
		r = catalog_confirm_pin(st, q->job, &q->cs);
		if (r < 0) {
			bgreq_fail(&q->base, r, "step %" PRIu64 " of job '%s': reading its commit: %s", q->step, q->job,
				   store_error(r));
			return r;
		}
		q->cs.cache = q->base.d->mancache;
	}
	r = cached ? catalog_read_all_indexed(st, q->job, &q->cs) : catalog_read_all(st, q->job, &q->cs);
	if (r < 0) {
		bgreq_fail(&q->base, r, "step %" PRIu64 " of job '%s': %s", q->step, q->job, store_error(r));
		return r;
	}
	return 0;
}

/* One rank of a step whose attempt and world size the caller knows (from
 * show): its manifest by name, with no listing (1 GET), then its shard. */
static void verify_rank(struct step_req *q)
{
	struct store *st = daemon_store_of(q->base.d, q->job);
	char key[768], why[256];
	if (manifest_key_attempt(key, sizeof(key), q->job, q->step, q->rank, q->world_size, q->attempt) < 0) {
		bgreq_fail(&q->base, -ENAMETOOLONG, "job and attempt names make too long a key");
		return;
	}
	void *mb = NULL;
	size_t ml = 0;
	store_clear_error();
	int r = st->ops->get_all(st, key, MANIFEST_MAX_BYTES, &mb, &ml);
	if (r == -ENOENT) {
		/* A format 1 step: its names carry no attempt (it is inside). */
		char legacy[768];
		if (manifest_key(legacy, sizeof(legacy), q->job, q->step, q->rank, q->world_size, "manifest") == 0 &&
		    st->ops->get_all(st, legacy, MANIFEST_MAX_BYTES, &mb, &ml) == 0)
			r = 0;
	}
	if (r == -ENOENT) {
		verify_problem(&q->v, "rank %u: manifest %s is missing", q->rank, key);
		return;
	}
	if (r < 0) {
		bgreq_fail(&q->base, r, "reading %s: %s", key, store_error(r));
		return;
	}
	Ckpt__Manifest *m = ckpt__manifest__unpack(NULL, ml, mb);
	free(mb);
	if (m == NULL) {
		verify_problem(&q->v, "rank %u: manifest %s does not parse", q->rank, key);
		return;
	}
	if (manifest_check(m, why, sizeof(why)) < 0)
		verify_problem(&q->v, "rank %u: manifest %s: %s", q->rank, key, why);
	else if (strcmp(m->job, q->job) != 0 || m->step != q->step || m->rank != q->rank ||
		 m->world_size != q->world_size || strcmp(m->attempt_id, q->attempt) != 0)
		verify_problem(&q->v, "rank %u: manifest %s is not the one its name says", q->rank, key);
	else {
		q->found = true;
		q->shard_bytes = m->shard_bytes;
		q->created_ns = (int64_t)m->created_unix_ns;
		verify_shard(&q->v, m);
	}
	ckpt__manifest__free_unpacked(m, NULL);
}

static void verify_run(struct bgreq *b)
{
	struct step_req *q = (struct step_req *)b;
	if (verify_init(&q->v, daemon_store_of(b->d, q->job)) < 0) {
		bgreq_fail(b, -ENOMEM, "out of memory");
		return;
	}
	if (q->one_rank) {
		verify_rank(q);
		return;
	}
	if (scan_one(q, false) < 0)
		return;
	struct catalog_group *g = &q->cs.groups[q->cs.best];
	if (!catalog_step_complete(&q->cs))
		verify_problem(&q->v, "step is not complete: %u of %u ranks (attempt '%s')", g->count, g->world_size,
			       g->attempt);
	if (q->cs.unreadable)
		verify_problem(&q->v, "%u manifest(s) could not be read or are invalid (see ckptd's log)",
			       q->cs.unreadable);
	for (uint32_t r = 0; r < g->world_size; r++)
		if (g->by_rank[r])
			verify_shard(&q->v, g->by_rank[r]);
}

static void verify_reply(struct bgreq *b)
{
	struct step_req *q = (struct step_req *)b;
	Ckpt__StepInfo si;
	const char *shown = shown_or_reply(b, q->job);
	if (shown == NULL)
		return;
	if (q->one_rank) { /* no listing: what the request named */
		ckpt__step_info__init(&si);
		si.job = strdup(shown);
		si.attempt_id = strdup(q->attempt);
		si.step = q->step;
		si.world_size = q->world_size;
		si.ranks_present = q->found ? 1 : 0;
		si.bytes = q->shard_bytes;
		si.saved_unix_ns = q->created_ns;
		if (si.job == NULL || si.attempt_id == NULL) {
			step_info_clear(&si);
			session_reply(b->session, b->req_id, -ENOMEM, "out of memory");
			return;
		}
	} else if (step_info(&si, shown, &q->cs) < 0) {
		session_reply(b->session, b->req_id, -ENOMEM, "out of memory");
		return;
	}
	Ckpt__VerifyReply rep = CKPT__VERIFY_REPLY__INIT;
	rep.ok = q->v.ok;
	rep.bytes_checked = q->v.bytes_checked;
	rep.n_problems = q->v.nproblems;
	rep.problems = q->v.problems;
	rep.info = &si;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_VERIFY_REPLY;
	f.verify_reply = &rep;
	session_send(b->session, b->req_id, &f);
	step_info_clear(&si);
	log_info("verify: %s step %" PRIu64 ": %s, %" PRIu64 " bytes checked, %zu problem(s)", q->job, q->step,
		 q->v.ok ? "ok" : "FAILED", q->v.bytes_checked, q->v.nproblems);
}

/* A show of one rank's manifest of a step that is not in storage: with
 * peer replication, this rank's copy is brought back from the peers that
 * hold this node's replicas (docs/tiers.md "Tiers"), and held here, so that the
 * load after the show reads it from memory. */
static void show_run(struct bgreq *b)
{
	struct step_req *q = (struct step_req *)b;
	if (scan_one(q, true) != -ENOENT || !q->one_rank || b->d->peer_fetch == NULL)
		return;
	char why[300];
	if (q->have_cs) {
		catalog_step_free(&q->cs);
		q->have_cs = false;
	}
	struct peer_want w = { .job = q->job,
			       .step = q->step,
			       .rank = q->rank,
			       .world_size = q->world_size_asked,
			       .key = b->session->has_job_key ? b->session->job_key : NULL };
	if (b->d->peer_fetch(b->d, &w, &q->fetched, why, sizeof(why)) == 0) {
		b->status = 0;
		b->msg[0] = '\0';
	} else {
		size_t n = strlen(b->msg);
		snprintf(b->msg + n, sizeof(b->msg) - n, "; nor from the peers (%.200s)", why);
	}
}

static void show_reply(struct bgreq *b)
{
	struct step_req *q = (struct step_req *)b;
	if (q->fetched) {
		if (!show_held(b->session, b->req_id, q->job, q->step, true, q->rank))
			session_reply(b->session, b->req_id, -ENOENT, "the copy from the peer is gone again");
		return;
	}
	const char *shown = shown_or_reply(b, q->job);
	if (shown == NULL)
		return;
	struct catalog_group *g = &q->cs.groups[q->cs.best];
	Ckpt__StepInfo si;
	Ckpt__Manifest **ms = calloc(g->world_size, sizeof(*ms));
	Ckpt__Manifest *copy = calloc(g->world_size, sizeof(*copy)); /* by_rank may be the cache's: read only */
	if (ms == NULL || copy == NULL || step_info(&si, shown, &q->cs) < 0) {
		free(ms);
		free(copy);
		session_reply(b->session, b->req_id, -ENOMEM, "out of memory");
		return;
	}
	size_t n = 0;
	for (uint32_t r = 0; r < g->world_size; r++) {
		if (g->by_rank[r] == NULL)
			continue;
		copy[n] = *g->by_rank[r];
		copy[n].extra_state.len = 0; /* the user's, and possibly large */
		ms[n] = &copy[n];
		n++;
		if (si.bytes_unlisted && !q->one_rank) /* layout spread: from the manifests */
			si.bytes += g->by_rank[r]->shard_bytes;
	}
	if (!q->one_rank)
		si.bytes_unlisted = false;
	Ckpt__ShowReply rep = CKPT__SHOW_REPLY__INIT;
	rep.info = &si;
	rep.n_manifests = n;
	rep.manifests = ms;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_SHOW_REPLY;
	f.show_reply = &rep;
	session_send(b->session, b->req_id, &f);
	step_info_clear(&si);
	free(ms);
	free(copy);
}

static void step_destroy(struct bgreq *b)
{
	struct step_req *q = (struct step_req *)b;
	if (q->fetched) { /* pinned by peer_fetch; held on */
		struct save **one = malloc(sizeof(*one));
		if (one) {
			one[0] = q->fetched;
			memtier_unpin(one, 1);
		} else if (--q->fetched->readers == 0 && q->fetched->drop_pending) {
			save_release(q->fetched);
		}
		save_admit_waiting(b->d);
	}
	if (q->have_cs)
		catalog_step_free(&q->cs);
	verify_free(&q->v);
	free(q);
}

/* A show or verify of one step; one_rank: only rank's manifest (a verify
 * of one rank names it by attempt and world_size, with no listing). */
static void step_start(struct session *s, uint64_t req_id, const char *name, uint64_t step, bool verify, bool one_rank,
		       uint32_t rank, const char *attempt, uint32_t world_size)
{
	char job[JOB_BUF];
	if (!job_arg(s, req_id, name, true, job, sizeof(job)))
		return;
	if (verify && one_rank &&
	    (!manifest_name_valid(attempt, ATTEMPT_MAX_LEN) || world_size == 0 || world_size > MANIFEST_WORLD_MAX ||
	     rank >= world_size)) {
		session_reply(s, req_id, -EINVAL, "verify of one rank: want a valid attempt id and rank < world size");
		return;
	}
	struct step_req *q = calloc(1, sizeof(*q));
	if (q == NULL) {
		session_reply(s, req_id, -ENOMEM, "out of memory");
		return;
	}
	snprintf(q->job, sizeof(q->job), "%s", job);
	snprintf(q->attempt, sizeof(q->attempt), "%s", attempt);
	q->step = step;
	q->one_rank = one_rank;
	q->rank = rank;
	q->world_size = world_size;
	q->world_size_asked = s->world_size;
	q->base.run = verify ? verify_run : show_run;
	q->base.reply = verify ? verify_reply : show_reply;
	q->base.destroy = step_destroy;
	bgreq_start(s, req_id, &q->base);
}

void show_start(struct session *s, uint64_t req_id, const Ckpt__ShowRequest *m)
{
	char job[JOB_BUF];
	if (!job_arg(s, req_id, m->job, true, job, sizeof(job)))
		return;
	/* A step held here in memory only is answered from the copies. */
	if (show_held(s, req_id, job, m->step, m->one_rank, m->rank))
		return;
	step_start(s, req_id, m->job, m->step, false, m->one_rank, m->rank, "", 0);
}

void verify_start(struct session *s, uint64_t req_id, const Ckpt__VerifyRequest *m)
{
	step_start(s, req_id, m->job, m->step, true, m->one_rank, m->one_rank ? m->rank : 0, m->attempt_id,
		   m->world_size);
}

/* ---- resolve: the one step every rank loads ---- */

struct resolve_req {
	struct bgreq base;
	char job[JOB_BUF];
	bool latest;
	uint64_t step;
	struct catalog_step cs;
	bool have_cs;
};

static void resolve_run(struct bgreq *b)
{
	struct resolve_req *q = (struct resolve_req *)b;
	struct store *st = daemon_store_of(b->d, q->job);
	store_clear_error();
	int r = q->latest ? catalog_latest(st, q->job, &q->cs) : catalog_resolve_step(st, q->job, q->step, &q->cs);
	if (r == -ENOENT) {
		if (q->latest)
			bgreq_fail(b, -ENOENT, "job '%s' has no complete step in %s", q->job, st->url);
		else
			bgreq_fail(b, -ENOENT, "step %" PRIu64 " of job '%s': not found", q->step, q->job);
		return;
	}
	if (r < 0) {
		bgreq_fail(b, r, "deciding %s of job '%s' in %s: %s (%s)", q->latest ? "the latest step" : "the step",
			   q->job, st->url, store_error(r), catalog_no_fallback_hint(r));
		return;
	}
	q->have_cs = true;
	if (!catalog_step_complete(&q->cs)) {
		const struct catalog_group *g = &q->cs.groups[q->cs.best];
		bgreq_fail(b, -ENOENT, "step %" PRIu64 " of job '%s' is not complete: %u of %u ranks (attempt '%s')",
			   q->step, q->job, g->count, g->world_size, g->attempt);
	}
}

static void resolve_reply(struct bgreq *b)
{
	struct resolve_req *q = (struct resolve_req *)b;
	Ckpt__StepInfo si;
	const char *shown = shown_or_reply(b, q->job);
	if (shown == NULL)
		return;
	if (step_info(&si, shown, &q->cs) < 0) {
		session_reply(b->session, b->req_id, -ENOMEM, "out of memory");
		return;
	}
	Ckpt__ResolveReply rep = CKPT__RESOLVE_REPLY__INIT;
	rep.info = &si;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_RESOLVE_REPLY;
	f.resolve_reply = &rep;
	session_send(b->session, b->req_id, &f);
	step_info_clear(&si);
}

static void resolve_destroy(struct bgreq *b)
{
	struct resolve_req *q = (struct resolve_req *)b;
	if (q->have_cs)
		catalog_step_free(&q->cs);
	free(q);
}

void resolve_start(struct session *s, uint64_t req_id, const Ckpt__ResolveRequest *m)
{
	char job[JOB_BUF];
	if (!session_request_job(s, req_id, m->job, "resolve", job, sizeof(job)))
		return;
	struct resolve_req *q = calloc(1, sizeof(*q));
	if (q == NULL) {
		session_reply(s, req_id, -ENOMEM, "out of memory");
		return;
	}
	snprintf(q->job, sizeof(q->job), "%s", job);
	q->latest = m->latest;
	q->step = m->step;
	q->base.run = resolve_run;
	q->base.reply = resolve_reply;
	q->base.destroy = resolve_destroy;
	bgreq_start(s, req_id, &q->base);
}

/* ---- delete ---- */

struct del_req {
	struct bgreq base;
	char job[JOB_BUF];
	uint64_t step;
	bool force;           /* ckptctl rm --force */
	uint64_t in_flight_s; /* the job's (catalog_in_flight_s) */
};

/* A step with no manifest may still have refs (a save that failed after
 * writing them) or be a removal that stopped for another step's
 * reference (KEPT_NAME; docs/architecture.md "References between
 * steps"). rm of it removes what is left; true if there was any. */
static bool leftovers(struct bgreq *b, struct store *st, const char *job, uint64_t step)
{
	uint64_t *t = NULL;
	size_t nt = 0;
	int r = catalog_refs_of(st, job, step, &t, &nt);
	free(t);
	if (r < 0 || (nt == 0 && !catalog_step_kept(st, job, step)))
		return false;
	if ((r = steplock_delete_begin(job, step)) < 0) {
		bgreq_fail(b, r, "step %" PRIu64 " of job '%s' is being written", step, job);
		return true;
	}
	const struct del_req *q = (const struct del_req *)b;
	r = gc_remove_step(b->d, st, job, step, q->force ? CATALOG_FORCE : CATALOG_REMOVE, q->in_flight_s);
	steplock_delete_end(job, step);
	if (r < 0 && r != -ENOENT)
		bgreq_fail(b, r, "removing what is left of step %" PRIu64 " of job '%s': %s", step, job,
			   store_error(r));
	else
		log_info("rm: %s step %" PRIu64 ": what was left of it removed (it has no manifest)", job, step);
	return true;
}

static void del_run(struct bgreq *b)
{
	struct del_req *q = (struct del_req *)b;
	struct store *st = daemon_store_of(b->d, q->job);
	struct catalog_step cs;
	int r = catalog_list_step(st, q->job, q->step, &cs);
	if (r == -EBADMSG)
		r = 0; /* only unreadable manifests: remove them too */
	else if (r == 0)
		catalog_step_free(&cs);
	if (r == -ENOENT && leftovers(b, st, q->job, q->step))
		return;
	if (r < 0) {
		bgreq_fail(b, r, "step %" PRIu64 " of job '%s': %s", q->step, q->job,
			   r == -ENOENT ? "not found" : store_error(r));
		return;
	}
	uint64_t by;
	r = catalog_referrer(st, q->job, q->step, &by);
	if (r == 0) {
		bgreq_fail(b, -EBUSY,
			   "step %" PRIu64 " of job '%s' holds bytes that step %" PRIu64
			   " refers to (incremental steps); remove step %" PRIu64 " first",
			   q->step, q->job, by, by);
		return;
	}
	if (r != -ENOENT) {
		bgreq_fail(b, r, "listing the references to step %" PRIu64 " of job '%s': %s", q->step, q->job,
			   store_error(r));
		return;
	}
	r = steplock_delete_begin(q->job, q->step);
	if (r < 0) {
		bgreq_fail(b, r, "step %" PRIu64 " of job '%s' is being written", q->step, q->job);
		return;
	}
	r = gc_remove_step(b->d, st, q->job, q->step, q->force ? CATALOG_FORCE : CATALOG_REMOVE, q->in_flight_s);
	steplock_delete_end(q->job, q->step);
	if (r < 0)
		bgreq_fail(b, r, "removing step %" PRIu64 " of job '%s': %s", q->step, q->job, store_error(r));
	else
		log_info("rm: %s step %" PRIu64 " removed", q->job, q->step);
}

static void del_reply(struct bgreq *b)
{
	session_reply(b->session, b->req_id, 0, NULL);
}

static void del_destroy(struct bgreq *b)
{
	struct del_req *q = (struct del_req *)b;
	if (b->status == 0) /* removed, whether or not its session is still there */
		wait_forget(b->d, q->job, q->step);
	free(b);
}

void delete_start(struct session *s, uint64_t req_id, const Ckpt__DeleteRequest *m)
{
	char job[JOB_BUF];
	if (!job_arg(s, req_id, m->job, true, job, sizeof(job)))
		return;
	struct busy b;
	if (busy_snapshot(s->d, &b) < 0) {
		session_reply(s, req_id, -ENOMEM, "out of memory");
		return;
	}
	bool busy = busy_has(&b, job, m->step);
	busy_free(&b);
	if (busy) {
		session_reply(s, req_id, -EBUSY, "step %" PRIu64 " of job '%s' is being written or read", m->step,
			      m->job);
		return;
	}
	struct del_req *q = calloc(1, sizeof(*q));
	if (q == NULL) {
		session_reply(s, req_id, -ENOMEM, "out of memory");
		return;
	}
	snprintf(q->job, sizeof(q->job), "%s", job);
	q->step = m->step;
	q->force = m->force;
	struct job_policy jp;
	config_job_policy(&s->d->cfg, job, s->d->pool.bytes, &jp);
	q->in_flight_s = catalog_in_flight_s(jp.retention.incomplete_grace_s);
	q->base.run = del_run;
	q->base.reply = del_reply;
	q->base.destroy = del_destroy;
	bgreq_start(s, req_id, &q->base);
}

/* ---- ckptctl gc: a retention pass (gc.c) the session asked for ---- */

struct gc_req {
	struct bgreq base;
	struct gc_pass pass;
	struct infos removed; /* by the names the session knows */
};

static void gc_req_removed(void *arg, const char *job, const struct catalog_step *cs, const char *reason)
{
	struct gc_req *g = arg;
	const char *shown = tenancy_shown(&g->base.view, job);
	if (shown)
		(void)infos_add(&g->removed, shown, cs, reason);
}

/* The job list, when the request named none, comes from storage, here in
 * the worker: every job the session sees. */
static void gc_req_run(struct bgreq *b)
{
	struct gc_req *g = (struct gc_req *)b;
	if (g->pass.njobs == 0) {
		char **names = NULL;
		size_t n = 0;
		int r = tenancy_jobs(b->d, &b->view, &names, &n);
		if (r < 0 && r != -ENOENT) {
			bgreq_fail(b, r, "listing jobs in %s: %s", b->d->store->url, store_error(r));
			return;
		}
		r = gc_pass_set_jobs(&g->pass, names, n);
		store_names_free(names, n);
		if (r < 0) {
			bgreq_fail(b, r, "out of memory");
			return;
		}
	}
	gc_pass_run(&g->pass);
}

static void gc_req_reply(struct bgreq *b)
{
	struct gc_req *g = (struct gc_req *)b;
	Ckpt__StepInfo **ptrs = infos_ptrs(&g->removed);
	char **reasons = calloc(g->removed.n ? g->removed.n : 1, sizeof(*reasons));
	if (ptrs == NULL || reasons == NULL) {
		free(ptrs);
		free(reasons);
		session_reply(b->session, b->req_id, -ENOMEM, "out of memory");
		return;
	}
	for (size_t i = 0; i < g->removed.n; i++)
		reasons[i] = g->removed.reasons[i] ? g->removed.reasons[i] : "";
	Ckpt__GcReply rep = CKPT__GC_REPLY__INIT;
	rep.n_removed = g->removed.n;
	rep.removed = ptrs;
	rep.n_reasons = g->removed.n;
	rep.reasons = reasons;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_GC_REPLY;
	f.gc_reply = &rep;
	session_send(b->session, b->req_id, &f);
	free(ptrs);
	free(reasons);
}

static void gc_req_destroy(struct bgreq *b)
{
	struct gc_req *g = (struct gc_req *)b;
	gc_pass_release(&g->pass);
	infos_free(&g->removed);
	free(g);
}

void gc_start(struct session *s, uint64_t req_id, const Ckpt__GcRequest *m)
{
	char job[JOB_BUF];
	if (!job_arg(s, req_id, m->job, false, job, sizeof(job)))
		return;
	const char *one = job;
	struct gc_req *g = calloc(1, sizeof(*g));
	if (g == NULL || gc_pass_init(&g->pass, s->d, job[0] ? &one : NULL, job[0] ? 1 : 0) < 0) {
		free(g);
		session_reply(s, req_id, -ENOMEM, "out of memory");
		return;
	}
	g->pass.dry_run = m->dry_run;
	g->pass.removed = gc_req_removed;
	g->pass.arg = g;
	g->base.run = gc_req_run;
	g->base.reply = gc_req_reply;
	g->base.destroy = gc_req_destroy;
	bgreq_start(s, req_id, &g->base);
}
