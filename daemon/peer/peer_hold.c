/* What the peer threads do to the daemon's state (peer_int.h), run on the
 * loop through peer_loop_call: a replica's or a fetched copy's pool
 * space, holding it in the memory tier, and finding, pinning and listing
 * the copies a peer may see. */
#include "peer_int.h"
#include "clock.h"
#include "memtier.h"
#include "save.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the replicas held for peers hold now: bytes (of the pool, and of
 * extra state and tensor tables beside it) and how many. */
static uint64_t replica_bytes(struct daemon *d, uint32_t *count)
{
	*count = d->nreplicas;
	return d->replica_bytes;
}

static bool over_share(struct daemon *d, const struct save *sv, uint64_t share)
{
	uint32_t k;
	uint64_t n = replica_bytes(d, &k);
	return n + sv->pool_bytes + sv->meta_bytes > share || k + 1 > d->cfg.peer_max_replicas;
}

void hold_reserve(struct daemon *d, void *arg)
{
	struct reserve *rs = arg;
	struct save *sv = rs->sv;
	if (rs->replica) {
		uint64_t share = d->cfg.peer_share_bytes;
		if (share == 0)
			share = d->pool.bytes / 100 *
				(d->cfg.peer_share_pct ? d->cfg.peer_share_pct : DEFAULT_PEER_SHARE_PCT);
		/* Within the share and the count: the oldest replicas no load
		 * reads go first. */
		struct save *o, *next;
		for (o = TAILQ_FIRST(&d->held); o && over_share(d, sv, share); o = next) {
			next = TAILQ_NEXT(o, hlink);
			if (o->replica && o->readers == 0)
				memtier_drop(d, o, "the replica share is needed for a newer replica");
		}
		uint32_t k;
		uint64_t held = replica_bytes(d, &k);
		if (k + 1 > d->cfg.peer_max_replicas) {
			rs->status = -ENOSPC;
			count(&d->stats.peer_refused[PEER_LIMIT_REPLICAS], 1);
			snprintf(rs->msg, sizeof(rs->msg),
				 "%u replicas are held for peers ([peers] max_replicas), all of them being read", k);
			return;
		}
		if (held + sv->pool_bytes + sv->meta_bytes > share) {
			rs->status = -ENOSPC;
			snprintf(rs->msg, sizeof(rs->msg),
				 "the replica share of %" PRIu64 " MiB is full ([peers] share) with copies being read",
				 share >> 20);
			return;
		}
	}
	int r = pool_reserve(&d->pool, sv->whole, sv->tail_slots, sv->chunks);
	if (r == -ENOSPC) {
		memtier_reclaim(d, sv->whole, sv->tail_slots);
		r = pool_reserve(&d->pool, sv->whole, sv->tail_slots, sv->chunks);
	}
	if (r < 0) {
		rs->status = r;
		snprintf(rs->msg, sizeof(rs->msg), "no room in the pool for %" PRIu64 " bytes%s", sv->shard_bytes,
			 r == -E2BIG ? " (larger than the pool)" : "");
		return;
	}
	sv->have_chunks = true;
}

void hold_release(struct daemon *d, void *arg)
{
	save_release(arg);
	save_admit_waiting(d);
}

void hold_commit(struct daemon *d, void *arg)
{
	struct commit *c = arg;
	struct save *sv = c->sv;
	struct save *newer = memtier_newer(d, sv);
	if (newer && !c->pin) {
		c->status = -ESTALE;
		snprintf(c->msg, sizeof(c->msg), "step %" PRIu64 " of this rank is held here already", newer->step);
		save_release(sv);
		save_admit_waiting(d);
		return;
	}
	sv->state = c->durable ? SAVE_HELD : SAVE_KEPT;
	sv->durable = c->durable;
	sv->held_since_ns = clock_now_ns();
	if (c->pin)
		sv->readers++; /* trim may drop it: then it goes when the load unpins it */
	memtier_hold(d, sv);
}

/* Whether a peer may see held copy sv: a replica held for a peer; this
 * node's own copy of a replicated save of a job without a secret (its
 * bytes went to the successors in the clear, where any peer may read
 * them: served here too, a resharding load still finds it once the
 * successor holding its replica is lost), but not one of a job with a
 * secret (its replicas leave sealed) nor one brought back from a peer
 * (it may have come sealed); with [peers] serve_own, every own copy.
 * Never a tenant's (they leave the node sealed, as replicas, or not at
 * all). */
static bool served(const struct daemon *d, const struct save *sv)
{
	if (sv->replica)
		return true;
	if (config_sealed_only(&d->cfg, sv->job))
		return false;
	return d->cfg.peer_serve_own || (sv->tier == TIER_REPLICATED && !sv->has_key && !sv->from_peer);
}

void hold_find(struct daemon *d, void *arg)
{
	struct find *f = arg;
	struct save *sv = memtier_find(d, f->job, f->step, f->rank);
	if (sv && !served(d, sv))
		sv = NULL; /* this node's own copy: not a peer's to read */
	if (sv && sv->world_size == f->world_size && !sv->drop_pending) {
		sv->readers++;
		f->sv = sv;
	}
}

void hold_unpin(struct daemon *d, void *arg)
{
	struct save *sv = arg;
	if (--sv->readers == 0 && sv->drop_pending) {
		save_release(sv);
		save_admit_waiting(d);
	}
}

void hold_list(struct daemon *d, void *arg)
{
	struct listing *l = arg;
	size_t n = 0;
	struct save *sv;
	TAILQ_FOREACH (sv, &d->held, hlink)
		if ((l->all_ranks || sv->rank == l->rank) && strcmp(sv->job, l->job) == 0 && served(d, sv) &&
		    n < d->cfg.peer_max_list)
			n++;
	l->v = calloc(n ? n : 1, sizeof(*l->v));
	l->jobs = calloc(n ? n : 1, sizeof(*l->jobs));
	l->attempts = calloc(n ? n : 1, sizeof(*l->attempts));
	if (l->v == NULL || l->jobs == NULL || l->attempts == NULL)
		return;
	/* Newest first: what a load asks for, when there are more than
	 * [peers] max_list. */
	TAILQ_FOREACH_REVERSE(sv, &d->held, save_list, hlink)
	{
		if ((!l->all_ranks && sv->rank != l->rank) || strcmp(sv->job, l->job) != 0 || sv->drop_pending ||
		    !served(d, sv))
			continue;
		if (l->n == n)
			break;
		/* Copied: the reply is sent off the loop, when sv may be gone. */
		Ckpt__HeldCopy *h = &l->v[l->n];
		save_held_view(sv, h, sv->job);
		snprintf(l->jobs[l->n], sizeof(l->jobs[0]), "%s", sv->job);
		snprintf(l->attempts[l->n], sizeof(l->attempts[0]), "%s", sv->attempt);
		h->job = l->jobs[l->n];
		h->attempt_id = l->attempts[l->n];
		l->n++;
	}
}
