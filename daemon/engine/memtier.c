/* The memory tier: after a save is durable its chunks stay in the pool as
 * the newest restorable copy of its (job, rank), until admission needs the
 * space (oldest first) or a newer durable save of the same (job, rank)
 * replaces it. Only durable data is ever held here, so dropping it loses
 * nothing. Loop thread only; loads pin what they read. */
#include "daemon.h"
#include "log.h"
#include "save.h"

#include <assert.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static void drop(struct daemon *d, struct save *sv, const char *why)
{
	TAILQ_REMOVE(&d->held, sv, link);
	d->nheld--;
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
	TAILQ_FOREACH (o, &d->held, link)
		if (o == sv) {
			log_warn("memtier: %s step %" PRIu64 " rank %u held in memory failed its crc check on restore; "
				 "dropped, so restores read storage",
				 sv->job, sv->step, sv->rank);
			drop(d, sv, "its crc did not match on restore");
			return;
		}
}

void memtier_hold(struct daemon *d, struct save *sv)
{
	assert(sv->state == SAVE_HELD && !sv->listed);
	struct save *o, *next;
	TAILQ_FOREACH (o, &d->held, link) {
		if (o->rank == sv->rank && strcmp(o->job, sv->job) == 0 && o->step > sv->step) {
			/* Out of order: a newer step is held already. */
			save_release(sv);
			return;
		}
	}
	for (o = TAILQ_FIRST(&d->held); o; o = next) {
		next = TAILQ_NEXT(o, link);
		if (o->rank == sv->rank && strcmp(o->job, sv->job) == 0 && o->step <= sv->step)
			drop(d, o, "a newer step of the same job and rank is durable");
	}
	if (d->cfg.debug_corrupt_held && sv->nchunks > 0 && sv->shard_bytes > 0)
		pool_span_ptr(&d->pool, sv->chunks[0])[0] ^= 0x5a; /* tests: the restore's crc must see it */
	TAILQ_INSERT_TAIL(&d->held, sv, link);
	d->nheld++;
}

void memtier_reclaim(struct daemon *d, uint32_t whole, uint32_t tail_slots)
{
	/* Drop nothing unless dropping every unpinned copy could make room. */
	uint64_t could = pool_free_slots(&d->pool);
	struct save *sv, *next;
	TAILQ_FOREACH (sv, &d->held, link)
		if (sv->readers == 0)
			could += sv->pool_bytes / d->pool.slot_bytes;
	if (could * d->pool.slot_bytes < pool_shape_bytes(&d->pool, whole, tail_slots))
		return;
	/* Oldest first, until the shape fits: room in slots may still be
	 * cut up, so fit is checked, not counted. */
	for (sv = TAILQ_FIRST(&d->held); sv && !pool_fits(&d->pool, whole, tail_slots); sv = next) {
		next = TAILQ_NEXT(sv, link);
		if (sv->readers > 0)
			continue;
		d->stats.reclaimed_bytes += sv->pool_bytes;
		drop(d, sv, "its space is needed for a new save");
	}
}

size_t memtier_pin(struct daemon *d, const char *job, struct save ***out)
{
	size_t n = 0;
	struct save *sv;
	TAILQ_FOREACH (sv, &d->held, link)
		if (strcmp(sv->job, job) == 0)
			n++;
	*out = NULL;
	if (n == 0)
		return 0;
	struct save **v = calloc(n, sizeof(*v));
	if (v == NULL)
		return 0; /* the load then reads storage only */
	size_t k = 0;
	TAILQ_FOREACH (sv, &d->held, link)
		if (strcmp(sv->job, job) == 0) {
			sv->readers++;
			v[k++] = sv;
		}
	*out = v;
	return k;
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

void memtier_clear(struct daemon *d)
{
	struct save *sv;
	while ((sv = TAILQ_FIRST(&d->held)) != NULL)
		drop(d, sv, "shutdown");
}
