/* The memory tier: the newest restorable copy of each (job, rank) stays in
 * the pool after its save ends, until a newer step of the same (job, rank)
 * replaces it or, for a durable copy, admission needs the space.
 *
 * Two kinds of copy are held (docs/tiers.md "Tiers"):
 * - durable ones (SAVE_HELD): also in storage, so dropping them loses
 *   nothing; admission reclaims them, oldest first;
 * - memory-only ones (SAVE_KEPT, a TIER_MEMORY or TIER_REPLICATED save):
 *   never dropped for space while they are their (job, rank)'s newest, so
 *   a save that needs their space waits or fails by its job's policy, and
 *   says why. Behind a memory-only newest, the newest copy before it is
 *   kept too (trim), reclaimable. A persist uploads a copy while it stays
 *   held (persisting: in daemon.saves too); it is not dropped until the
 *   upload ends.
 * Loop thread only; loads pin what they read. */
#include "daemon.h"
#include "log.h"
#include "memtier.h"
#include "saveobj.h"

#include <assert.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

static void drop(struct daemon *d, struct save *sv, const char *why)
{
	TAILQ_REMOVE(&d->held, sv, hlink);
	sv->in_held = false;
	d->nheld--;
	if (sv->replica) {
		d->nreplicas--;
		d->replica_bytes -= sv->pool_bytes + sv->meta_bytes;
	}
	if (sv->state == SAVE_KEPT)
		log_info("memtier: dropping memory-only %s step %" PRIu64 " rank %u: %s", sv->job, sv->step, sv->rank,
			 why);
	log_debug("memtier: dropping %s step %" PRIu64 " rank %u (%" PRIu64 " bytes): %s", sv->job, sv->step, sv->rank,
		  sv->shard_bytes, why);
	if (sv->readers > 0) {
		/* A load still reads it; free when that load ends. */
		sv->drop_pending = true;
		return;
	}
	save_release(sv);
}

void memtier_drop_corrupt(struct daemon *d, struct save *sv)
{
	if (sv->drop_pending)
		return; /* dropped already; freed when its readers end */
	struct save *o;
	TAILQ_FOREACH (o, &d->held, hlink)
		if (o == sv && !sv->persisting) {
			log_warn("memtier: %s step %" PRIu64 " rank %u held in memory failed its crc check on restore; "
				 "dropped, so restores read storage",
				 sv->job, sv->step, sv->rank);
			drop(d, sv, "its crc did not match on restore");
			return;
		}
}

/* Copies of one (job, rank) form two groups that never touch each other
 * (docs/tiers.md "Tiers", "Peers"): this node's own (saved here, or
 * brought back from a peer for a restore), and the replicas held for each
 * peer. A replica never replaces, evicts or outranks one of this node's
 * copies, whatever its step or attempt, and a replica from one peer never
 * one from another. */
struct group {
	char job[JOB_BUF];
	uint32_t rank;
	bool replica;
	char peer[128]; /* a replica's: the peer it is held for */
};

static void group_of(const struct save *sv, struct group *g)
{
	snprintf(g->job, sizeof(g->job), "%s", sv->job);
	g->rank = sv->rank;
	g->replica = sv->replica;
	snprintf(g->peer, sizeof(g->peer), "%s", sv->replica ? sv->peer : "");
}

static bool in_group(const struct save *sv, const struct group *g)
{
	return sv->rank == g->rank && sv->replica == g->replica && strcmp(sv->job, g->job) == 0 &&
	       (!g->replica || strcmp(sv->peer, g->peer) == 0);
}

/* Keep the newest copy of the group and, when that one is in memory
 * only, the newest before it: ranks that did not all finish the newest
 * step (a node lost mid-save) can still agree on the one before, from
 * memory (docs/tiers.md "Tiers"). That one is reclaimable; every older copy goes
 * (one a persist uploads, once its upload ends: memtier_settle). */
static void trim(struct daemon *d, const struct group *g)
{
	struct save *newest = NULL, *prev = NULL, *o, *next;
	TAILQ_FOREACH (o, &d->held, hlink)
		if (in_group(o, g) && (newest == NULL || o->step >= newest->step))
			newest = o; /* a step saved again: the later copy */
	if (newest == NULL)
		return;
	if (!newest->durable)
		TAILQ_FOREACH (o, &d->held, hlink)
			if (o->step < newest->step && in_group(o, g) && (prev == NULL || o->step >= prev->step))
				prev = o;
	for (o = TAILQ_FIRST(&d->held); o; o = next) {
		next = TAILQ_NEXT(o, hlink);
		if (o != newest && o != prev && !o->persisting && in_group(o, g))
			drop(d, o, "newer steps of the same job and rank are held");
	}
}

void memtier_hold(struct daemon *d, struct save *sv)
{
	assert((sv->state == SAVE_HELD || sv->state == SAVE_KEPT) && !sv->listed && !sv->in_held);
	if (d->cfg.debug_corrupt_held && sv->nchunks > 0 && sv->shard_bytes > 0)
		pool_span_ptr(&d->pool, sv->chunks[0])[0] ^= 0x5a; /* tests: the restore's crc must see it */
	TAILQ_INSERT_TAIL(&d->held, sv, hlink);
	sv->in_held = true;
	d->nheld++;
	if (sv->replica) {
		d->nreplicas++;
		d->replica_bytes += sv->pool_bytes + sv->meta_bytes;
	}
	struct group g;
	group_of(sv, &g); /* sv may go */
	trim(d, &g);
}

struct save *memtier_newer(struct daemon *d, const struct save *sv)
{
	struct save *o;
	struct group g;
	group_of(sv, &g);
	TAILQ_FOREACH (o, &d->held, hlink)
		if (o->step > sv->step && in_group(o, &g))
			return o;
	return NULL;
}

void memtier_settle(struct daemon *d, struct save *sv)
{
	assert(sv->in_held && !sv->persisting);
	struct group g;
	group_of(sv, &g); /* sv may go */
	trim(d, &g);
}

/* What admission may drop: a copy no load reads that is a replica held
 * for a peer, durable, or in memory only and not its rank's newest
 * (trim's "before" copy). */
static bool reclaimable(struct daemon *d, const struct save *sv)
{
	if (sv->readers > 0 || sv->persisting)
		return false;
	return sv->replica || sv->state == SAVE_HELD || (sv->state == SAVE_KEPT && memtier_newer(d, sv) != NULL);
}

void memtier_drop(struct daemon *d, struct save *sv, const char *why)
{
	assert(sv->in_held && !sv->persisting);
	drop(d, sv, why);
}

void memtier_reclaim(struct daemon *d, uint32_t whole, uint32_t tail_slots)
{
	/* Drop nothing unless dropping every unpinned copy could make room. */
	uint64_t could = pool_free_slots(&d->pool);
	struct save *sv, *next;
	TAILQ_FOREACH (sv, &d->held, hlink)
		if (reclaimable(d, sv))
			could += sv->pool_bytes / d->pool.slot_bytes;
	if (could * d->pool.slot_bytes < pool_shape_bytes(&d->pool, whole, tail_slots))
		return;
	/* Replicas held for peers first, then this node's own copies; oldest
	 * first within each, until the shape fits: room in slots may still
	 * be cut up, so fit is checked, not counted. */
	for (int pass = 0; pass < 2; pass++)
		for (sv = TAILQ_FIRST(&d->held); sv && !pool_fits(&d->pool, whole, tail_slots); sv = next) {
			next = TAILQ_NEXT(sv, hlink);
			if (sv->replica != (pass == 0) || !reclaimable(d, sv))
				continue;
			d->stats.reclaimed_bytes += sv->pool_bytes;
			drop(d, sv, "its space is needed for a new save");
		}
}

/* The ranks of job this node holds copies of its own of, at any step,
 * sorted (free it): those ranks are this node's, and no replica stands in
 * for them. NULL with *n 0 when none (or out of memory: then replicas are
 * not offered either). */
static uint32_t *own_ranks(struct daemon *d, const char *job, size_t *n, bool *ok)
{
	size_t k = 0;
	const struct save *o;
	*n = 0;
	*ok = true;
	TAILQ_FOREACH (o, &d->held, hlink)
		k += !o->replica && strcmp(o->job, job) == 0;
	if (k == 0)
		return NULL;
	uint32_t *v = malloc(k * sizeof(*v));
	if (v == NULL) {
		*ok = false;
		return NULL;
	}
	TAILQ_FOREACH (o, &d->held, hlink)
		if (!o->replica && strcmp(o->job, job) == 0)
			v[(*n)++] = o->rank;
	qsort(v, *n, sizeof(*v), cmp_u32);
	return v;
}

/* Whether a load of job may read sv, given own (own_ranks). A sealed
 * replica is ciphertext here: a load opens it only with its job's key
 * (peer_fetch). */
static bool loadable(const struct save *sv, const char *job, const uint32_t *own, size_t nown, bool own_ok)
{
	if (strcmp(sv->job, job) != 0)
		return false;
	if (!sv->replica)
		return true;
	return sv->seal == NULL && own_ok &&
	       (nown == 0 || bsearch(&sv->rank, own, nown, sizeof(*own), cmp_u32) == NULL);
}

size_t memtier_pin(struct daemon *d, const char *job, struct save ***out)
{
	size_t n = 0, nown;
	bool ok;
	uint32_t *own = own_ranks(d, job, &nown, &ok);
	struct save *sv;
	TAILQ_FOREACH (sv, &d->held, hlink)
		if (loadable(sv, job, own, nown, ok))
			n++;
	*out = NULL;
	struct save **v = n ? calloc(n, sizeof(*v)) : NULL;
	size_t k = 0;
	TAILQ_FOREACH (sv, &d->held, hlink)
		if (v && loadable(sv, job, own, nown, ok)) {
			sv->readers++;
			v[k++] = sv;
		}
	free(own);
	*out = v;
	return k; /* none when out of memory: the load then reads storage only */
}

bool memtier_loadable(struct daemon *d, const struct save *sv)
{
	size_t nown;
	bool ok;
	uint32_t *own = own_ranks(d, sv->job, &nown, &ok);
	bool r = loadable(sv, sv->job, own, nown, ok);
	free(own);
	return r;
}

void memtier_unpin(struct save **pinned, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct save *sv = pinned[i];
		if (--sv->readers == 0 && sv->drop_pending)
			save_release(sv);
	}
	free(pinned);
}

uint64_t memtier_kept_bytes(const struct daemon *d, uint32_t *count)
{
	uint64_t n = 0;
	uint32_t k = 0;
	const struct save *sv;
	TAILQ_FOREACH (sv, &d->held, hlink)
		if (!sv->durable && !sv->replica) {
			n += sv->pool_bytes;
			k++;
		}
	if (count)
		*count = k;
	return n;
}

struct save *memtier_find(struct daemon *d, const char *job, uint64_t step, uint32_t rank)
{
	struct save *sv, *own = NULL;
	TAILQ_FOREACH (sv, &d->held, hlink)
		if (sv->step == step && sv->rank == rank && strcmp(sv->job, job) == 0) {
			if (sv->replica)
				return sv;
			own = sv;
		}
	return own;
}

void memtier_clear(struct daemon *d)
{
	struct save *sv;
	while ((sv = TAILQ_FIRST(&d->held)) != NULL) {
		if (!sv->durable)
			log_warn("memtier: memory-only %s step %" PRIu64 " rank %u is lost: ckptd stops and it was "
				 "never persisted",
				 sv->job, sv->step, sv->rank);
		drop(d, sv, "shutdown");
	}
}
