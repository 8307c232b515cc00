/* Admission: see admit.h. Each question walks the saves in flight once:
 * per node, a few hundred at most (ranks on the node times
 * max_inflight_saves), whatever the job's size. */
#include "admit.h"
#include "config.h"
#include "daemon.h"
#include "memtier.h"
#include "saveobj.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static uint64_t job_inflight_bytes(struct daemon *d, const char *job)
{
	uint64_t n = 0;
	struct save *sv;
	TAILQ_FOREACH (sv, &d->saves, link)
		if (sv->have_chunks && !sv->persisting && strcmp(sv->job, job) == 0)
			n += sv->pool_bytes;
	return n;
}

/* Pool bytes held by the saves of tenant t's jobs, and how many are in
 * flight (docs/security.md "Tenants": its quota and max_inflight_saves). */
static uint64_t tenant_inflight(struct daemon *d, const struct tenant_config *t, uint32_t *count)
{
	uint64_t n = 0;
	uint32_t k = 0;
	struct save *sv;
	TAILQ_FOREACH (sv, &d->saves, link)
		if (!sv->persisting && config_tenant_of_job(&d->cfg, sv->job) == t) {
			k++;
			if (sv->have_chunks)
				n += sv->pool_bytes;
		}
	if (count)
		*count = k;
	return n;
}

/* Over the job's quota, or its tenant's: which, and what it holds. */
static const char *quota_hit(struct save *sv, uint64_t *held)
{
	struct daemon *d = sv->d;
	if (sv->quota_bytes < d->pool.bytes &&
	    (*held = job_inflight_bytes(d, sv->job)) + sv->pool_bytes > sv->quota_bytes)
		return "the job's quota";
	const struct tenant_config *t = config_tenant_of_job(&d->cfg, sv->job);
	if (t && t->quota_bytes && (*held = tenant_inflight(d, t, NULL)) + sv->pool_bytes > t->quota_bytes)
		return "the tenant's quota";
	*held = pool_used_bytes(&d->pool);
	return NULL;
}

/* Saves of one rank of job in flight (not yet durable or failed); a
 * persist's uploads are not the trainer's saves. */
static uint32_t rank_inflight_saves(struct daemon *d, const char *job, uint32_t rank)
{
	uint32_t n = 0;
	struct save *sv;
	TAILQ_FOREACH (sv, &d->saves, link)
		if (sv->rank == rank && !sv->persisting && strcmp(sv->job, job) == 0)
			n++;
	return n;
}

int admit_may_start(struct save *sv, const struct job_policy *jp, char *err, size_t errlen)
{
	struct daemon *d = sv->d;
	/* Per rank: a node holds as many ranks of a job as it has GPUs (or
	 * more), each with a save uploading and the next one staged. */
	if (rank_inflight_saves(d, sv->job, sv->rank) >= jp->max_inflight_saves) {
		snprintf(err, errlen, "%u saves of job '%s' rank %u are in flight (max_inflight_saves, per rank)",
			 jp->max_inflight_saves, sv->job, sv->rank);
		return -EBUSY;
	}
	const struct tenant_config *tc = config_tenant_of_job(&d->cfg, sv->job);
	uint32_t tn = 0;
	if (tc && tc->max_inflight_saves && (tenant_inflight(d, tc, &tn), tn >= tc->max_inflight_saves)) {
		snprintf(err, errlen, "tenant '%s' has %u saves in flight ([tenant.%s] max_inflight_saves)", tc->name,
			 tn, tc->name);
		return -EBUSY;
	}
	struct save *o;
	TAILQ_FOREACH (o, &d->saves, link)
		if (o->step == sv->step && o->rank == sv->rank && strcmp(o->job, sv->job) == 0) {
			snprintf(err, errlen, "step %" PRIu64 " of job '%s' rank %u is already being saved", sv->step,
				 sv->job, sv->rank);
			return -EBUSY;
		}
	return 0;
}

int admit_may_fit(struct save *sv, char *err, size_t errlen)
{
	if (sv->shard_bytes > sv->quota_bytes) {
		snprintf(err, errlen,
			 "save of %" PRIu64 " bytes exceeds the quota of job '%s' (%" PRIu64 " bytes); raise its quota",
			 sv->shard_bytes, sv->job, sv->quota_bytes);
		return -E2BIG;
	}
	const struct tenant_config *tc = config_tenant_of_job(&sv->d->cfg, sv->job);
	if (tc && tc->quota_bytes && sv->shard_bytes > tc->quota_bytes) {
		snprintf(err, errlen, "save of %" PRIu64 " bytes exceeds tenant '%s''s quota of %" PRIu64 " bytes",
			 sv->shard_bytes, tc->name, tc->quota_bytes);
		return -E2BIG;
	}
	return 0;
}

int admit_try(struct save *sv)
{
	struct daemon *d = sv->d;
	uint64_t held;
	if (quota_hit(sv, &held))
		return -EDQUOT;
	int r = pool_reserve(&d->pool, sv->whole, sv->tail_slots, sv->chunks);
	if (r == -ENOSPC) {
		/* Drop memory-tier copies (only if that can make room), then again. */
		memtier_reclaim(d, sv->whole, sv->tail_slots);
		r = pool_reserve(&d->pool, sv->whole, sv->tail_slots, sv->chunks);
	}
	if (r < 0)
		return -ENOSPC;
	sv->have_chunks = true;
	return 0;
}

bool admit_job_waiting(struct daemon *d, const char *job)
{
	struct save *sv;
	TAILQ_FOREACH (sv, &d->waitq, wlink)
		if (strcmp(sv->job, job) == 0)
			return true;
	return false;
}

void admit_no_room(struct save *sv, char *buf, size_t len)
{
	uint64_t held;
	const char *quota = quota_hit(sv, &held);
	/* What of the pool is memory-only copies, which are never dropped
	 * for space (memtier.c). */
	uint32_t n = 0;
	uint64_t kept = memtier_kept_bytes(sv->d, &n);
	int w = snprintf(buf, len, "%s holds %" PRIu64 " MiB not yet durable", quota ? quota : "the pool", held >> 20);
	if (n && w >= 0 && (size_t)w < len)
		snprintf(buf + w, len - (size_t)w,
			 ", of which %" PRIu64 " MiB are %u memory-only copies (never dropped while the newest of "
			 "their rank: persist them or save them durable)",
			 kept >> 20, n);
}
