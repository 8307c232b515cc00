/* Admission (docs/tiers.md "Admission"): whether a save may start
 * (the caps on saves in flight, per rank and per tenant; one save of a
 * step at a time), whether it could ever fit (its job's and tenant's
 * quotas), and whether the pool has room for it now, reclaiming
 * memory-tier copies if that makes room. Decisions and words only:
 * save.c keeps the wait queue and fails or starts the save. Loop thread. */
#ifndef CKPTD_ADMIT_H
#define CKPTD_ADMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct daemon;
struct job_policy;
struct save;

/* Before the save's layout: -EBUSY with err saying which cap it meets
 * (jp: its job's policy), else 0. */
int admit_may_start(struct save *sv, const struct job_policy *jp, char *err, size_t errlen);
/* After its layout (shard_bytes known): -E2BIG when it exceeds its job's
 * or its tenant's whole quota and so could never be admitted, else 0. */
int admit_may_fit(struct save *sv, char *err, size_t errlen);
/* Reserve its pool chunks now: 0; -EDQUOT over its job's or tenant's
 * quota; -ENOSPC no room even after reclaiming memory-tier copies. */
int admit_try(struct save *sv);
/* Whether a save of job waits for room (FIFO within a job). */
bool admit_job_waiting(struct daemon *d, const char *job);
/* Why sv finds no room, for a refusal: "the pool holds N MiB not yet
 * durable, of which ..." (or the job's or tenant's quota). */
void admit_no_room(struct save *sv, char *buf, size_t len);

#endif
