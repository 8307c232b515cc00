/* What storage holds: steps, their manifests, the complete/latest rule.
 * A step is complete when all world_size manifests exist with the same
 * attempt id; latest is the highest complete step. Blocking: worker threads
 * only. */
#ifndef CKPTD_CATALOG_H
#define CKPTD_CATALOG_H

#include <stdbool.h>
#include <stdint.h>

#include "ckpt.pb-c.h"
#include "store.h"

#define CATALOG_MAX_GROUPS 64

struct catalog_group {
	char attempt[129];
	uint32_t world_size;
	uint32_t count;
	uint64_t bytes;
	uint64_t newest_ns;
	Ckpt__Manifest **by_rank; /* world_size entries, NULL where missing */
};

struct catalog_step {
	uint64_t step;
	size_t ngroups;
	struct catalog_group groups[CATALOG_MAX_GROUPS];
	int best; /* the complete group, else the newest; -1 if none */
	uint32_t unreadable; /* manifests listed but not read or not valid */
};

/* Read every manifest of job/step. -ENOENT if the step has none. Manifests
 * that fail their checks are skipped with a warning. */
int catalog_scan_step(struct store *s, const char *job, uint64_t step,
		      struct catalog_step *out);
void catalog_step_free(struct catalog_step *cs);
bool catalog_step_complete(const struct catalog_step *cs);
/* Steps of job, ascending, malloc'd. */
int catalog_steps(struct store *s, const char *job, uint64_t **steps, size_t *n);
/* Highest complete step of job: 0 with *out filled (caller frees), or
 * -ENOENT. */
int catalog_latest(struct store *s, const char *job, struct catalog_step *out);
/* Remove every object of job/step: manifests first, so the step stops
 * being complete before any shard goes, then the rest and the directory.
 * 0, or the first error. */
int catalog_delete_step(struct store *s, const char *job, uint64_t step);
/* Jobs under the root, malloc'd. */
int catalog_jobs(struct store *s, char ***jobs, size_t *n);

#endif
