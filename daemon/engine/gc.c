/* Retention executed: see gc.h. */
#include "gc.h"
#include "catalog.h"
#include "daemon.h"
#include "grow.h"
#include "journal.h"
#include "load.h"
#include "log.h"
#include "save.h"
#include "steplock.h"
#include "store.h"
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- busy steps: never removed ---- */

int busy_snapshot(struct daemon *d, struct busy *b)
{
	memset(b, 0, sizeof(*b));
	b->steps = calloc(d->nsaves + 1, sizeof(*b->steps));
	b->jobs = calloc(d->nloads + 1, sizeof(*b->jobs));
	if (b->steps == NULL || b->jobs == NULL) {
		free(b->steps);
		free(b->jobs);
		return -ENOMEM;
	}
	struct save *sv;
	TAILQ_FOREACH (sv, &d->saves, link) {
		snprintf(b->steps[b->nsteps].job, sizeof(b->steps[0].job), "%s", sv->job);
		b->steps[b->nsteps++].step = sv->step;
	}
	b->njobs = load_busy_jobs(d, b->jobs, d->nloads + 1);
	return 0;
}

bool busy_has(const struct busy *b, const char *job, uint64_t step)
{
	for (size_t i = 0; i < b->njobs; i++)
		if (strcmp(b->jobs[i], job) == 0)
			return true;
	for (size_t i = 0; i < b->nsteps; i++)
		if (b->steps[i].step == step && strcmp(b->steps[i].job, job) == 0)
			return true;
	return false;
}

void busy_free(struct busy *b)
{
	free(b->steps);
	free(b->jobs);
	memset(b, 0, sizeof(*b));
}

int gc_remove_step(struct daemon *d, struct store *st, const char *job, uint64_t step, enum catalog_removal_mode mode,
		   uint64_t in_flight_s)
{
	uint64_t id = 0;
	int r = d->journal ? journal_remove_begin(d->journal, job, step, &id) : 0;
	if (r < 0)
		return r;
	r = catalog_delete_step(st, d->mancache, job, step, mode, in_flight_s);
	if ((r == 0 || r == -EBUSY || r == -ENOENT) && d->journal)
		(void)journal_remove_end(d->journal, id); /* else the next start finishes it */
	return r;
}

/* ---- one pass ---- */

/* A step with a removal's marker and no manifest (manifest.h KEPT_NAME):
 * the removal stopped for a step that referred to its shard, or left an
 * attempt a save may have been writing; what it took, and what is old by
 * now, goes. */
static void finish_kept(struct gc_pass *g, struct store *st, const char *job, uint64_t step, uint64_t in_flight_s)
{
	if (steplock_delete_begin(job, step) < 0)
		return;
	int r = gc_remove_step(g->d, st, job, step, CATALOG_FINISH, in_flight_s);
	steplock_delete_end(job, step);
	if (r == 0)
		log_info("gc: removed the rest of %s step %" PRIu64, job, step);
	else if (r != -EBUSY)
		log_warn("gc: removing the rest of %s step %" PRIu64 ": %s", job, step, store_error(r));
}

static int cmp_step(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Keep every step that a kept step refers to (manifest.h REFS_DIR), newest
 * first, so that a step kept for a newer one keeps what it refers to in
 * turn. Listed after the steps: a step seen complete there wrote its refs
 * before its manifests. 0, or a storage error (then nothing is removed). */
static int keep_referenced(struct store *st, const char *job, struct step_view *v, size_t k)
{
	uint64_t *refs = NULL;
	size_t nrefs = 0;
	int r = catalog_ref_steps(st, job, &refs, &nrefs);
	for (size_t i = k; i-- > 0 && r == 0;) {
		if (v[i].remove || !bsearch(&v[i].step, refs, nrefs, sizeof(*refs), cmp_step))
			continue;
		uint64_t *t = NULL;
		size_t nt = 0;
		r = catalog_refs_of(st, job, v[i].step, &t, &nt);
		for (size_t x = 0; x < i && r == 0; x++) {
			if (!v[x].remove || !bsearch(&v[x].step, t, nt, sizeof(*t), cmp_step))
				continue;
			v[x].remove = false;
			log_info("gc: %s step %" PRIu64 " kept: step %" PRIu64 " refers to its shard", job, v[x].step,
				 v[i].step);
		}
		free(t);
	}
	free(refs);
	return r;
}

static void gc_job_run(struct gc_pass *g, const char *job, const struct retention *rt, uint64_t now_ns)
{
	struct store *st = daemon_store_of(g->d, job);
	uint64_t *steps = NULL;
	size_t n = 0;
	if (!retention_active(rt) || catalog_steps(st, job, &steps, &n) < 0)
		return;
	struct step_view *v = calloc(n ? n : 1, sizeof(*v));
	struct catalog_step *cs = calloc(n ? n : 1, sizeof(*cs));
	bool *have = calloc(n ? n : 1, sizeof(*have));
	if (v == NULL || cs == NULL || have == NULL)
		goto out;
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		int lr = catalog_list_step(st, job, steps[i], &cs[k]);
		/* A removal's marker: a removal stopped, or left an attempt a
		 * save may be writing. Finished (as far as it can be) before
		 * the plan; a step that was incomplete then sits this pass out. */
		if ((lr == -ENOENT || (lr == 0 && !catalog_step_complete(&cs[k]))) && cs[k].marked && !g->dry_run &&
		    !busy_has(&g->busy, job, steps[i])) {
			finish_kept(g, st, job, steps[i], catalog_in_flight_s(rt->incomplete_grace_s));
			if (lr == 0)
				catalog_step_free(&cs[k]);
			continue;
		}
		if (lr < 0)
			continue;
		have[k] = true;
		struct catalog_group *grp = &cs[k].groups[cs[k].best];
		/* A manifest that could not be read may make a complete step
		 * look incomplete: keep such a step. */
		v[k] = (struct step_view){ .step = steps[i],
					   .complete = catalog_step_complete(&cs[k]),
					   .newest_ns = (uint64_t)grp->newest_ns,
					   .busy = busy_has(&g->busy, job, steps[i]) || cs[k].unreadable > 0 };
		k++;
	}
	retention_plan(rt, v, k, now_ns);
	store_clear_error(); /* a removal's message above is not this listing's */
	int kr = keep_referenced(st, job, v, k);
	if (kr < 0) {
		log_warn("gc: %s: listing the references between steps: %s; nothing removed", job, store_error(kr));
		goto out;
	}
	/* Newest first: a step this pass removes that refers to an older one
	 * it removes too takes its refs with it before the older one's turn
	 * (else that one's removal stops for it: catalog_delete_step). */
	for (size_t i = k; i-- > 0;) {
		if (!v[i].remove)
			continue;
		if (!g->dry_run) {
			/* A save of this step may have started since the plan. */
			if (steplock_delete_begin(job, v[i].step) < 0) {
				log_info("gc: %s step %" PRIu64 " is being written now; kept", job, v[i].step);
				continue;
			}
			/* An incomplete step goes as a finish does: an attempt that
			 * completed since the plan is not this pass's to take. */
			int r = gc_remove_step(g->d, st, job, v[i].step,
					       v[i].complete ? CATALOG_REMOVE : CATALOG_FINISH,
					       catalog_in_flight_s(rt->incomplete_grace_s));
			steplock_delete_end(job, v[i].step);
			if (r == -EBUSY) { /* a save in flight refers to it */
				log_info("gc: %s step %" PRIu64 ": manifests removed, %s", job, v[i].step,
					 store_error(r));
				continue;
			}
			if (r < 0) {
				log_warn("gc: removing %s step %" PRIu64 ": %s", job, v[i].step, store_error(r));
				continue;
			}
			log_info("gc: removed %s step %" PRIu64 " (%s)", job, v[i].step, v[i].reason);
		}
		if (g->removed)
			g->removed(g->arg, job, &cs[i], v[i].reason);
	}
out:
	for (size_t i = 0; i < n; i++)
		if (have && have[i])
			catalog_step_free(&cs[i]);
	free(have);
	free(cs);
	free(v);
	free(steps);
}

void gc_pass_run(struct gc_pass *g)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t now_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	for (size_t i = 0; i < g->njobs; i++)
		gc_job_run(g, g->jobs[i].name, &g->jobs[i].retention, now_ns);
}

int gc_pass_set_jobs(struct gc_pass *g, char *const *jobs, size_t njobs)
{
	struct gc_job *v = calloc(njobs ? njobs : 1, sizeof(*v));
	if (v == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < njobs; i++) {
		struct job_policy jp;
		config_job_policy(&g->cfg, jobs[i], g->d->pool.bytes, &jp);
		snprintf(v[i].name, sizeof(v[i].name), "%s", jobs[i]);
		v[i].retention = jp.retention;
	}
	free(g->jobs);
	g->jobs = v;
	g->njobs = njobs;
	return 0;
}

int gc_pass_init(struct gc_pass *g, struct daemon *d, const char *const *jobs, size_t njobs)
{
	memset(g, 0, sizeof(*g));
	g->d = d;
	g->cfg = d->cfg;
	if (busy_snapshot(d, &g->busy) < 0)
		return -ENOMEM;
	if (gc_pass_set_jobs(g, (char *const *)jobs, njobs) < 0) {
		busy_free(&g->busy);
		return -ENOMEM;
	}
	return 0;
}

void gc_pass_release(struct gc_pass *g)
{
	busy_free(&g->busy);
	free(g->jobs);
	g->jobs = NULL;
	g->njobs = 0;
}

/* ---- automatic gc after durable steps: one pass at a time ---- */

struct auto_gc {
	uv_work_t work;
	struct gc_pass pass;
};

static void auto_gc_kick(struct daemon *d);

static void auto_run(uv_work_t *w)
{
	struct auto_gc *a = w->data;
	if (a->pass.d->cfg.debug_gc_delay_ms)
		usleep((useconds_t)a->pass.d->cfg.debug_gc_delay_ms * 1000);
	gc_pass_run(&a->pass);
}

static void auto_done(uv_work_t *w, int status)
{
	struct auto_gc *a = w->data;
	struct daemon *d = a->pass.d;
	(void)status;
	d->gc_running = false;
	d->nloads--;
	gc_pass_release(&a->pass);
	free(a);
	auto_gc_kick(d);
	daemon_work_ended(d);
}

static void auto_gc_kick(struct daemon *d)
{
	if (d->gc_running || d->ngc_pending == 0 || d->draining)
		return;
	/* gc_pass_init copies the names: the list is free for the next ones. */
	struct auto_gc *a = calloc(1, sizeof(*a));
	int r = a ? gc_pass_init(&a->pass, d, (const char *const *)d->gc_pending, d->ngc_pending) : -ENOMEM;
	for (uint32_t i = 0; i < d->ngc_pending; i++)
		free(d->gc_pending[i]);
	d->ngc_pending = 0;
	if (r < 0) {
		free(a);
		return;
	}
	a->work.data = a;
	d->gc_running = true;
	d->nloads++;
	if (uv_queue_work(d->loop, &a->work, auto_run, auto_done) < 0) {
		d->gc_running = false;
		d->nloads--;
		gc_pass_release(&a->pass);
		free(a);
	}
}

void gc_after_durable(struct daemon *d, const char *job)
{
	struct job_policy jp;
	config_job_policy(&d->cfg, job, d->pool.bytes, &jp);
	if (!retention_active(&jp.retention))
		return;
	for (uint32_t i = 0; i < d->ngc_pending; i++)
		if (strcmp(d->gc_pending[i], job) == 0)
			goto kick;
	/* Every job waits its turn, however many finish a step while a
	 * retention pass runs; without memory its pass waits for its next
	 * durable step, and the log says so. */
	if (GROW(d->gc_pending, d->gc_pending_cap, d->ngc_pending + 1, 16) < 0 ||
	    (d->gc_pending[d->ngc_pending] = strdup(job)) == NULL)
		goto lost;
	d->ngc_pending++;
kick:
	auto_gc_kick(d);
	return;
lost:
	log_warn("out of memory: retention of job %s runs after its next durable step", job);
	auto_gc_kick(d);
}
