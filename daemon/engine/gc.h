/* Retention executed (docs/using.md "Retention"): which steps of a job
 * go, by its policy (catalog/retention.c decides), their removal
 * (journaled, never of a step being written or read), and the automatic
 * pass after each durable step, one at a time. ckptctl gc and rm
 * (wire/catalog_req.c) run the same code.
 *
 * Requests per pass: per job, one LIST of its steps and one LIST per step
 * (catalog_list_step), then what a removal costs; per node, one pass at a
 * time, over the jobs whose steps became durable meanwhile: flat in the
 * job's rank count but for the step listings' pages. */
#ifndef CKPTD_GC_H
#define CKPTD_GC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "catalog.h"
#include "config.h"
#include "names.h"
#include "retention.h"

struct catalog_step;
struct daemon;
struct store;

/* What is being written or read now: never removed. Taken on the loop. */
struct busy {
	struct {
		char job[JOB_BUF];
		uint64_t step;
	} * steps;
	size_t nsteps;
	char (*jobs)[JOB_BUF]; /* jobs with loads in flight: all their steps */
	size_t njobs;
};

int busy_snapshot(struct daemon *d, struct busy *b);
bool busy_has(const struct busy *b, const char *job, uint64_t step);
void busy_free(struct busy *b);

/* Remove job's step from st as mode says (catalog_delete_step, with the
 * job's in-flight window in_flight_s), journaled (journal_remove_begin): a
 * crash part way is finished by the next start, so nothing of the step
 * stays behind unlisted. Not journaled, not removed. A removal that left
 * something (-EBUSY) is done as far as the journal goes: its marker
 * carries the rest. Threadpool. */
int gc_remove_step(struct daemon *d, struct store *st, const char *job, uint64_t step, enum catalog_removal_mode mode,
		   uint64_t in_flight_s);

struct gc_job {
	char name[JOB_BUF];
	struct retention retention;
};

/* One retention pass: prepared on the loop (gc_pass_init), run on the
 * threadpool (gc_pass_run), freed on the loop (gc_pass_release). Each step
 * removed (or, dry_run, that would be) is told to removed(arg, ...). */
struct gc_pass {
	struct daemon *d;
	struct config cfg; /* taken on the loop: SIGHUP may change d->cfg */
	bool dry_run;
	struct gc_job *jobs; /* none: ckptctl gc of every job (gc_pass_set_jobs names them) */
	size_t njobs;
	struct busy busy;
	void (*removed)(void *arg, const char *job, const struct catalog_step *cs, const char *reason);
	void *arg;
};

/* The jobs to collect, each with its policy, and what is busy now. 0 or
 * -ENOMEM. */
int gc_pass_init(struct gc_pass *g, struct daemon *d, const char *const *jobs, size_t njobs);
/* The pass over these jobs (kept names, ownership stays with the caller),
 * each with its policy. Threadpool. 0 or -ENOMEM. */
int gc_pass_set_jobs(struct gc_pass *g, char *const *jobs, size_t njobs);
void gc_pass_run(struct gc_pass *g);
void gc_pass_release(struct gc_pass *g);

/* A step of job became durable: run its retention policy soon (the
 * daemon's on_durable). */
void gc_after_durable(struct daemon *d, const char *job);

#endif
