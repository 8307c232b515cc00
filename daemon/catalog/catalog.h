/* What storage holds: steps, their attempts, the complete/latest rule.
 *
 * A step is complete when one attempt holds all world_size manifests.
 * Manifest names carry their attempt, so one paginated LIST of the step's
 * directory decides it, with no manifest read: ceil(objects / 1000)
 * requests, about 2W/1000 for W ranks. The first reader that finds a step
 * complete pins that attempt with the step's create-only commit object;
 * from then on every reader on every node loads that attempt, and saves
 * into the step are refused. latest is the highest complete step; a
 * storage error while deciding it fails, never falls back to an older
 * step. Blocking: worker threads only. */
#ifndef CKPTD_CATALOG_H
#define CKPTD_CATALOG_H

#include <stdbool.h>
#include <stdint.h>

#include "ckpt.pb-c.h"
#include "mancache.h"
#include "manifest.h"
#include "store.h"

#define CATALOG_MAX_GROUPS 64

struct catalog_group {
	char attempt[ATTEMPT_BUF];
	uint32_t world_size;
	uint32_t count;         /* ranks with a manifest */
	uint64_t bytes;         /* of its shards, as listed */
	uint32_t shards_listed; /* 0 with manifests: the shards are elsewhere (layout spread) */
	int64_t newest_ns;      /* its newest manifest's time, as listed */
	bool legacy;            /* format 1 names: the attempt came from reading the manifests */
	bool *present;          /* world_size entries */
	struct catalog_listed {
		int64_t mtime_ns;
		uint64_t size;
	} * listed;                     /* world_size: each manifest as listed */
	Ckpt__Manifest **by_rank;       /* world_size entries, filled by catalog_read_all (and for format 1) */
	struct mancache_entry **cached; /* NULL, or world_size: by_rank[r] is the cache's, shared: read only */
	bool from_index;                /* by_rank points into the step's index (catalog_step.index_ref): read only */
};

struct catalog_step {
	uint64_t step;
	size_t ngroups;
	struct catalog_group groups[CATALOG_MAX_GROUPS];
	int best;            /* the complete group (the pinned one), else the newest; -1 if none */
	bool has_commit;     /* the commit object is there */
	bool pinned;         /* best is what the commit object names */
	bool stale_commit;   /* the commit names an attempt that is not complete: not complete */
	uint32_t unreadable; /* format 1 manifests that could not be read or were invalid */
	bool has_index;      /* the index object is there (listed) */
	bool marked;         /* a removal's marker is there (manifest.h KEPT_NAME): set on -ENOENT too */
	struct catalog_listed index_listed;
	struct mancache_entry *index_ref; /* the cache's decoded index, while by_rank points into it */
	/* Set by the caller: manifests of a pinned step are read through this
	 * daemon's cache (mancache.h), once per node. NULL: from storage. */
	struct mancache *cache;
};

/* One LIST of job/step (and, for a format 1 step only, a read of each of
 * its manifests). -ENOENT if the step has no manifest; any storage error
 * is returned, never taken for "missing". When several attempts are
 * complete, the commit object decides (one GET), else the one that
 * completed first. */
int catalog_list_step(struct store *s, const char *job, uint64_t step, struct catalog_step *out);
/* catalog_list_step, and pin a complete step: create its commit object
 * unless it exists. Then cs->best is the attempt every reader loads.
 * 0 (test catalog_step_complete), -ENOENT, or a storage error. */
int catalog_resolve_step(struct store *s, const char *job, uint64_t step, struct catalog_step *out);
void catalog_step_free(struct catalog_step *cs);
bool catalog_step_complete(const struct catalog_step *cs);
/* What a listing says of a step's best attempt (cs->best >= 0), in the
 * words a StepInfo answers with: one rule for every request that answers
 * one (catalog_req.c, wait_req.c). */
struct catalog_summary {
	char attempt[ATTEMPT_BUF];
	uint32_t world_size, count; /* ranks with a manifest */
	uint64_t bytes;
	bool bytes_unlisted; /* manifests but no shard listed: the shards are elsewhere (layout spread) */
	bool complete;
	int64_t saved_ns; /* its newest manifest's time */
};
void catalog_step_summary(const struct catalog_step *cs, struct catalog_summary *out);
/* A step listed with a commit object but not pinned by the listing (one
 * complete attempt): GET the commit, so that cs->pinned says whether best
 * is the attempt it names. 0, or a storage error. */
int catalog_confirm_pin(struct store *s, const char *job, struct catalog_step *cs);
/* Read and check the manifest of rank in cs's best group (kept in by_rank
 * until catalog_step_free). With cs->cache set and the step pinned (format
 * 2), through the cache: shared with every other reader on this daemon,
 * so *out must not be changed. 0, or -EBADMSG (err says why), or a
 * storage error. */
int catalog_read_manifest(struct store *s, const char *job, struct catalog_step *cs, uint32_t rank,
			  const Ckpt__Manifest **out, char *err, size_t errlen);
/* Every manifest of the best group (show, verify). Counts what fails in
 * cs->unreadable; returns the first storage error, if any. */
int catalog_read_all(struct store *s, const char *job, struct catalog_step *cs);
/* catalog_read_all for show of a whole pinned step, through cs->cache:
 * from the step's index object when it is there and valid (one GET per
 * daemon), else from the manifests, and then the index is written
 * create-only for the readers that come later. Any step that is not
 * pinned, complete and format 2, or without a cache: catalog_read_all. An
 * index that is damaged, too large or not the commit's attempt is
 * ignored (a warning once); a failure to write it never fails the show. */
int catalog_read_all_indexed(struct store *s, const char *job, struct catalog_step *cs);
/* One GET of rank's manifest (of world ws, attempt) of job/step, checked
 * (its contents match its name): 0, -ENOENT, -EBADMSG (err says why), or
 * a storage error. */
int catalog_get_manifest(struct store *s, const char *job, uint64_t step, uint32_t rank, uint32_t ws,
			 const char *attempt, Ckpt__Manifest **out, char *err, size_t errlen);
/* The commit object of job/step: 0 and attempt and ws filled, -ENOENT, -EBADMSG. */
int catalog_read_commit(struct store *s, const char *job, uint64_t step, char *attempt, size_t cap, uint32_t *ws);
/* Steps of job, ascending, malloc'd. */
int catalog_steps(struct store *s, const char *job, uint64_t **steps, size_t *n);
/* Highest complete step of job, pinned: 0 with *out filled (caller
 * frees), -ENOENT if none, or the storage error that stopped the search. */
int catalog_latest(struct store *s, const char *job, struct catalog_step *out);
/* What to tell the user after catalog_latest (or a resolve) failed with r:
 * a storage error is worth a retry; a damaged object (-EBADMSG: a commit
 * or format 1 manifest that does not parse) is not, until it is repaired
 * or its step removed. Either way no older step was taken. */
const char *catalog_no_fallback_hint(int r);
/* How a removal decides on each attempt of the step (removal.c). */
enum catalog_removal_mode {
	/* Retention, rm: complete attempts, and incomplete ones whose every
	 * object is older than the in-flight window. */
	CATALOG_REMOVE,
	/* Journal recovery, gc finish_kept: what a marker names (a removal
	 * took it before), and incomplete attempts older than the window;
	 * never a complete attempt no removal decided on. */
	CATALOG_FINISH,
	/* rm --force: every attempt. */
	CATALOG_FORCE,
};
/* Remove job/step's attempts that mode takes: manifests first, so the step
 * stops being complete before any shard goes, then the commit object and
 * the index (unless a complete attempt stays), the shards, the refs to
 * older steps (so that they protect those until the step is gone), and
 * the markers; and drop the step from cache (may be NULL). An incomplete
 * attempt with an object younger than in_flight_s (0: CATALOG_SPARE_S) may
 * be a save of the step in flight on another node: it is left. 0, or the
 * first error; -EBUSY when, once its manifests are gone, another step
 * refers to it (its shards stay), or when an attempt is left; a marker
 * (KEPT_NAME) then says the step is to be finished (gc.c finish_kept). */
int catalog_delete_step(struct store *s, struct mancache *cache, const char *job, uint64_t step,
			enum catalog_removal_mode mode, uint64_t in_flight_s);
/* The in-flight window when no job setting gives one: a save of one step
 * is done on every rank within an hour. */
#define CATALOG_SPARE_S 3600u
/* The window of a job: its [retention] incomplete_grace (the owner's word
 * for how long an incomplete step may still be written), else
 * CATALOG_SPARE_S. Saves use it too (upload.c recheck_refs). */
uint64_t catalog_in_flight_s(uint64_t incomplete_grace_s);
/* References between steps (manifest.h REFS_DIR). The steps of job that
 * refer to others: one listing of "<job>/refs/", ascending. */
int catalog_ref_steps(struct store *s, const char *job, uint64_t **steps, size_t *n);
/* The steps step refers to, ascending: one listing; none is 0 and n 0. */
int catalog_refs_of(struct store *s, const char *job, uint64_t step, uint64_t **targets, size_t *n);
/* Whether job/step holds a removal's marker (KEPT_NAME, or KEPT_NAME
 * ".<attempt>"; manifest.h): a removal to be finished. One LIST. */
bool catalog_step_kept(struct store *s, const char *job, uint64_t step);
/* The newest step of job, other than target, that refers to target (its
 * manifests there or not yet: a save writes its refs first): 0 with *by,
 * -ENOENT if none, or a storage error. For ckptctl rm: a listing of the
 * job's refs, and one per step that refers to any. */
int catalog_referrer(struct store *s, const char *job, uint64_t target, uint64_t *by);
/* Manifests read from storage by this process, any path: for metrics. */
uint64_t catalog_manifest_gets(void);
/* Step indexes: read from storage (GETs), and written (created). */
uint64_t catalog_index_gets(void);
uint64_t catalog_index_puts(void);
/* Jobs under the root (tenant NULL or ""), or a tenant's, named
 * TENANT/NAME (docs/security.md "Tenants"); malloc'd. One LIST (a page per 1000). */
int catalog_jobs(struct store *s, const char *tenant, char ***jobs, size_t *n);

#endif
