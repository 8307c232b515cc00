/* ckptctl verify: every rank's shard re-read and checked. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "ckpt/ckpt.h"
#include "ckptctl_cmd.h"
#include "ckptctl_util.h"

/* ---- verify: every rank's shard, several ranks at once ----
 * show names the step's attempt, world size and ranks (through the
 * daemon's manifest cache); then o->jobs threads, each with its own
 * session, verify one rank at a time (ckpt_verify_rank: the manifest by
 * name and the shard, read from storage), while this thread draws a
 * progress bar on a terminal. */
struct verify_run {
	pthread_mutex_t mu;
	const char *sock, *job, *attempt;
	uint64_t step;
	uint32_t world_size;
	uint32_t *ranks, nranks, next, done;
	uint64_t bytes_checked, bytes_total;
	bool ok;
	int err; /* the first request that failed (not a failed check) */
	char errmsg[512];
	char **problems;
	size_t nproblems;
};

static void add_problem(struct verify_run *v, const char *line)
{
	if (v->nproblems < 1000) {
		char *p = strdup(line);
		if (p)
			v->problems[v->nproblems++] = p;
	}
}

static void *verify_worker(void *arg)
{
	struct verify_run *v = arg;
	ckpt_client *c = NULL;
	int r = ckpt_connect(v->sock, NULL, &c);
	for (;;) {
		pthread_mutex_lock(&v->mu);
		if (v->next == v->nranks || v->err) {
			if (r < 0 && !v->err) {
				v->err = r;
				snprintf(v->errmsg, sizeof(v->errmsg), "connect %s: %s", v->sock, ckpt_errmsg());
			}
			pthread_mutex_unlock(&v->mu);
			break;
		}
		if (r < 0) {
			v->err = r;
			snprintf(v->errmsg, sizeof(v->errmsg), "connect %s: %s", v->sock, ckpt_errmsg());
			pthread_mutex_unlock(&v->mu);
			break;
		}
		uint32_t rank = v->ranks[v->next++];
		pthread_mutex_unlock(&v->mu);
		ckpt_verify_result *res = NULL;
		int e = ckpt_verify_rank(c, v->job, v->step, rank, v->world_size, v->attempt, &res);
		pthread_mutex_lock(&v->mu);
		if (e < 0 && !v->err) {
			v->err = e;
			snprintf(v->errmsg, sizeof(v->errmsg), "verify rank %u: %s", rank, ckpt_errmsg());
		} else if (e == 0) {
			v->done++;
			v->bytes_checked += res->bytes_checked;
			v->ok &= res->ok != 0;
			for (size_t i = 0; i < res->nproblems; i++)
				add_problem(v, res->problems[i]);
		}
		pthread_mutex_unlock(&v->mu);
		ckpt_verify_result_free(res);
	}
	if (c)
		ckpt_close(c);
	return NULL;
}

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void draw_progress(struct verify_run *v, double t0)
{
	char a[32], b[32], rate[32];
	pthread_mutex_lock(&v->mu);
	uint32_t done = v->done, n = v->nranks;
	uint64_t bytes = v->bytes_checked, total = v->bytes_total;
	pthread_mutex_unlock(&v->mu);
	double dt = mono_s() - t0;
	int width = 30, fill = n ? (int)((uint64_t)done * (uint64_t)width / n) : width;
	char bar[64];
	for (int i = 0; i < width; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[width] = 0;
	human_bytes(dt > 0 ? (uint64_t)((double)bytes / dt) : 0, rate, sizeof(rate));
	fprintf(stderr, "\r[%s] %u/%u ranks  %s of %s  %s/s ", bar, done, n, human_bytes(bytes, a, sizeof(a)),
		human_bytes(total, b, sizeof(b)), rate);
	fflush(stderr);
}

/* The ranks to verify of the step d describes (every rank of a complete
 * step; else those that are there, and the incompleteness a problem),
 * and the bytes the checks will read. */
static void verify_plan(struct verify_run *v, const ckpt_step_detail *d)
{
	bool *has = calloc(v->world_size ? v->world_size : 1, sizeof(*has));
	v->ranks = calloc(v->world_size ? v->world_size : 1, sizeof(*v->ranks));
	v->problems = calloc(1000, sizeof(*v->problems));
	if (!has || !v->ranks || !v->problems)
		die_oom();
	for (size_t i = 0; i < d->ntensors; i++) {
		if (d->tensors[i].rank < v->world_size)
			has[d->tensors[i].rank] = true;
		v->bytes_total += d->tensors[i].nbytes;
	}
	if (d->info.bytes > v->bytes_total && !d->info.bytes_unlisted)
		v->bytes_total = d->info.bytes; /* the shards as listed, what the checks read */
	/* A complete step: every rank (one may hold no tensors); else the ranks
	 * that are there, and the step's incompleteness is a problem. */
	for (uint32_t rk = 0; rk < v->world_size; rk++)
		if (d->info.complete || has[rk])
			v->ranks[v->nranks++] = rk;
	if (!d->info.complete) {
		char line[256];
		snprintf(line, sizeof(line), "step is not complete: %u of %u ranks (attempt '%s')",
			 d->info.ranks_present, d->info.world_size, d->info.attempt_id);
		add_problem(v, line);
		v->ok = false;
	}
	free(has);
}

/* The ranks verified by up to o->jobs threads (by this one if none
 * starts), a progress bar drawn meanwhile on a terminal; how many threads
 * started. */
static int verify_ranks(struct verify_run *v, const struct opts *o, double t0)
{
	int nthreads = o->jobs < (int)v->nranks ? o->jobs : (int)v->nranks;
	pthread_t th[64];
	int started = 0;
	for (int i = 0; i < nthreads; i++)
		if (pthread_create(&th[i], NULL, verify_worker, v) == 0)
			started++;
	if (started == 0 && v->nranks > 0)
		verify_worker(v);
	bool bar = isatty(STDERR_FILENO) && !o->json;
	for (;;) {
		pthread_mutex_lock(&v->mu);
		bool finished = v->done == v->nranks || (v->err && v->next == v->nranks) || v->err;
		pthread_mutex_unlock(&v->mu);
		if (bar)
			draw_progress(v, t0);
		if (finished)
			break;
		struct timespec pause = { 0, 50 * 1000000 };
		nanosleep(&pause, NULL);
	}
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	if (bar) {
		draw_progress(v, t0);
		fputc('\n', stderr);
	}
	return started;
}

/* The verdict: JSON (the step and the checks), or the problems and a
 * line. */
static void verify_report(const struct verify_run *v, const ckpt_step_detail *d, const struct opts *o, double dt,
			  int started)
{
	char sz[32], rate[32];
	human_bytes(dt > 0 ? (uint64_t)((double)v->bytes_checked / dt) : 0, rate, sizeof(rate));
	if (o->json) {
		json_object *j = json_step(&d->info), *a = json_object_new_array();
		if (!a)
			die_oom();
		json_put(j, "ok", json_object_new_boolean(v->ok));
		json_put(j, "bytes_checked", json_object_new_uint64(v->bytes_checked));
		json_put(j, "ranks_checked", json_object_new_uint64(v->done));
		json_put(j, "seconds", json_object_new_double(dt));
		for (size_t i = 0; i < v->nproblems; i++)
			if (json_object_array_add(a, json_object_new_string(v->problems[i])) != 0)
				die_oom();
		json_put(j, "problems", a);
		json_print(j);
		json_object_put(j);
	} else {
		for (size_t i = 0; i < v->nproblems; i++)
			printf("%s\n", v->problems[i]);
		printf("%s step %" PRIu64 ": %s (%s checked, %u of %u ranks, %.1f s, %s/s, %d at once)\n", v->job,
		       v->step, v->ok ? "OK" : "FAILED", human_bytes(v->bytes_checked, sz, sizeof(sz)), v->done,
		       v->world_size, dt, rate, started ? started : 1);
	}
}

int cmd_verify(ckpt_client *c, const char *job, uint64_t step, const struct opts *o)
{
	ckpt_step_detail *d = NULL;
	char what[400];
	int r = ckpt_show(c, job, step, &d);
	if (r < 0) {
		snprintf(what, sizeof(what), "verify %s %" PRIu64, job, step);
		die(what, r);
	}
	struct verify_run v = { .mu = PTHREAD_MUTEX_INITIALIZER,
				.sock = o->sock,
				.job = job,
				.step = step,
				.attempt = d->info.attempt_id,
				.world_size = d->info.world_size,
				.ok = true };
	verify_plan(&v, d);
	double t0 = mono_s();
	int started = verify_ranks(&v, o, t0);
	double dt = mono_s() - t0;
	if (v.err) {
		fprintf(stderr, "ckptctl: verify %s %" PRIu64 ": %s (%s)\n", job, step, ckpt_strerror(v.err), v.errmsg);
		exit(1);
	}
	verify_report(&v, d, o, dt, started);
	for (size_t i = 0; i < v.nproblems; i++)
		free(v.problems[i]);
	free(v.problems);
	free(v.ranks);
	ckpt_step_detail_free(d);
	return v.ok ? 0 : 1;
}
