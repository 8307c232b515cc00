#include "load.h"
#include "load_int.h"
#include "loadexec.h"
#include "catalog.h"
#include "crc32c.h"
#include "daemon.h"
#include "hostbuf.h"
#include "log.h"
#include "manifest.h"
#include "memtier.h"
#include "save.h"
#include "requester.h"
#include "tensor.h"
#include "wire.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void load_free(struct load *ld)
{
	for (size_t i = 0; i < ld->nreqs; i++) {
		free(ld->reqs[i].name);
		free(ld->reqs[i].applied);
		hostbuf_unref(ld->reqs[i].buf);
	}
	free(ld->reqs);
	free(ld->by_name);
	free(ld->extra);
	free(ld->pin_flags);
	explicit_bzero(ld->key, sizeof(ld->key));
	free(ld);
}

static int cmp_req(const void *a, const void *b)
{
	const struct load_req *x = *(struct load_req *const *)a, *y = *(struct load_req *const *)b;
	return strcmp(x->name, y->name);
}

/* The pinned memory-tier copy that is exactly this manifest's shard (a
 * durable one: a copy persisting now names its shard on another thread). */
static const struct save *held_copy(const struct load *ld, const Ckpt__Manifest *m)
{
	for (size_t i = 0; i < ld->npinned; i++) {
		const struct save *sv = ld->pinned[i];
		if (!(ld->pin_flags[i] & PIN_DURABLE))
			continue;
		/* The shard's name is fresh per save: a step deleted and saved
		 * again (on any node) names another shard than the copy held. */
		if (sv->step == m->step && sv->rank == m->rank && sv->world_size == m->world_size &&
		    sv->shard_bytes == m->shard_bytes && strcmp(sv->attempt, m->attempt_id) == 0 &&
		    strcmp(sv->shard_name, m->shard_name) == 0)
			return sv;
	}
	return NULL;
}

static bool all_covered(const struct load *ld)
{
	for (size_t i = 0; i < ld->nreqs; i++)
		if (ld->reqs[i].covered != box_volume(&ld->reqs[i].box))
			return false;
	return true;
}

/* The copy of manifest m's shard that a peer holds (a lost node's rank
 * whose step was replicated, then persisted), when this daemon holds none:
 * a load reads local memory, then peer memory, then storage, per shard.
 * Only the peers likeliest to hold it are asked (the one that last said
 * so, then this node's successors: 1 + K requests, no sweep of the ring),
 * and only that save's copy (attempt, size, every tensor's CRC32C:
 * peer_fetch.c checks before it reads the shard) is taken; NULL: storage. */
static struct save *fetch_one(struct load *ld, const struct peer_want *w);
static const struct save *peer_copy(struct load *ld, const Ckpt__Manifest *m)
{
	struct peer_want w = { .job = ld->job,
			       .step = m->step,
			       .rank = m->rank,
			       .world_size = m->world_size,
			       .expect = m,
			       .no_sweep = true,
			       .key = ld->has_key ? ld->key : NULL };
	return fetch_one(ld, &w);
}

/* Plan from rank's manifest (read once, kept in cs). */
static int plan_rank(struct exec *ex, struct catalog_step *cs, uint32_t rank, char (*key)[768])
{
	struct load *ld = ex->ld;
	const Ckpt__Manifest *m;
	char err[512];
	int r = catalog_read_manifest(daemon_store_of(ld->d, ld->job), ld->job, cs, rank, &m, err, sizeof(err));
	if (r < 0)
		return load_fail(ld, r, "step %" PRIu64 " of job '%s': %s", cs->step, ld->job,
				 r == -EBADMSG ? err : store_error(r));
	if (manifest_shard_of(m, *key, sizeof(*key)) < 0)
		return load_fail(ld, -EBADMSG, "rank %u's manifest names no shard of its own", rank);
	if (ld->no_copies)
		return plan_manifest(ex, m, *key, NULL);
	const struct save *held = held_copy(ld, m);
	return plan_manifest(ex, m, *key, held ? held : peer_copy(ld, m));
}

/* The requests not covered, as a failure. */
static void check_covered(struct load *ld, uint64_t step)
{
	for (size_t i = 0; i < ld->nreqs && ld->status == 0; i++) {
		struct load_req *q = &ld->reqs[i];
		if (q->covered != box_volume(&q->box))
			load_fail(ld, -ENOENT, "rank %u: tensor '%s': step %" PRIu64 " %s", ld->rank, q->name, step,
				  q->covered ? "covers only part of the requested box" : "has no such tensor");
	}
}

/* Room in pinned[] for one more copy. */
static int pin_room(struct load *ld)
{
	struct save **np = realloc(ld->pinned, (ld->npinned + 1) * sizeof(*np));
	if (np)
		ld->pinned = np;
	uint8_t *nf = np ? realloc(ld->pin_flags, ld->npinned + 1) : NULL;
	if (nf)
		ld->pin_flags = nf;
	return np && nf ? 0 : load_fail(ld, -ENOMEM, "out of memory");
}

/* The copy w names, brought back from the peers that hold it (peer.h)
 * into the pool and pinned for this load; NULL when it cannot come
 * (ld->peer_why says why). */
static struct save *fetch_one(struct load *ld, const struct peer_want *w)
{
	struct daemon *d = ld->d;
	if (d->peer_fetch == NULL || !ld->ask_peers || ld->storage_only || pin_room(ld) < 0)
		return NULL;
	struct save *sv = NULL;
	char why[400];
	if (d->peer_fetch(d, w, &sv, why, sizeof(why)) < 0) {
		snprintf(ld->peer_why, sizeof(ld->peer_why), "rank %u: %s", w->rank, why);
		return NULL;
	}
	ld->pinned[ld->npinned] = sv;
	ld->pin_flags[ld->npinned] = PIN_FETCHED;
	ld->npinned++;
	load_note_peer(ld, sv);
	return sv;
}

/* Whether the comma-separated list has name as one of its items (not a
 * part of one: "h:80" is not in "h:8080"). */
static bool listed(const char *list, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = list; *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		if (len == n && strncmp(p, name, n) == 0)
			return true;
		if (!end)
			break;
		p = end + 1;
	}
	return false;
}

void load_note_peer(struct load *ld, const struct save *sv)
{
	if (!listed(ld->peer, sv->peer)) {
		size_t n = strlen(ld->peer);
		snprintf(ld->peer + n, sizeof(ld->peer) - n, "%s%s", n ? "," : "", sv->peer);
	}
}

/* Saved rank r's copy (of world ws) of a step not in storage, from the
 * peers. */
static struct save *fetch_copy(struct load *ld, uint32_t r, uint32_t ws)
{
	return fetch_one(ld, &(struct peer_want){ .job = ld->job,
						  .step = ld->step,
						  .rank = r,
						  .world_size = ws,
						  .key = ld->has_key ? ld->key : NULL });
}

/* Saved rank r's copy of the step (world ws): held here, else from the
 * peers; NULL if neither. */
static struct save *copy_of(struct load *ld, uint32_t r, uint32_t ws)
{
	for (size_t i = 0; i < ld->npinned; i++) {
		struct save *sv = ld->pinned[i];
		if (sv->step == ld->step && sv->rank == r && sv->world_size == ws)
			return sv;
	}
	return fetch_copy(ld, r, ws);
}

/* The world size the step was saved at, as the peers know it: in the
 * common case (a replacement node, the same world size) this rank's copy
 * comes back at once; resharding, their lists of this rank's copies, or
 * of rank 0's (a world that grew), say it. 0: the peers have no copy of
 * the step. */
static uint32_t peer_world(struct load *ld)
{
	struct daemon *d = ld->d;
	if (d->peer_fetch == NULL || !ld->ask_peers || ld->storage_only)
		return 0;
	if (fetch_copy(ld, ld->rank, ld->world_size))
		return ld->world_size;
	uint32_t ws = 0;
	for (int k = 0; k < 2 && ws == 0 && d->peer_list && ld->status == 0; k++) {
		struct peer_copy *v = NULL;
		size_t n = 0;
		if (d->peer_list(d, ld->job, k == 0 ? ld->rank : 0, &v, &n) == 0)
			for (size_t i = 0; i < n; i++)
				/* A peer's word: only a world a save could have had. */
				if (v[i].step == ld->step && v[i].world_size > 0 &&
				    v[i].world_size <= MANIFEST_WORLD_MAX)
					ws = v[i].world_size;
		free(v);
	}
	return ws;
}

/* What planning the copies of a step found: their manifest views (one
 * per copy planned, freed by load_copies) and the keys naming them, own's
 * copy and the first copy planned. */
struct copies {
	Ckpt__Manifest *views;
	char (*keys)[200];
	size_t nviews;
	const struct save *own_copy, *first_copy;
};

/* Saved rank r has no copy here or at the peers: r added to the list in
 * missing (of size bytes, *len used); false once [peers]
 * max_missing_ranks ranks are missing (no more are asked for). */
static bool note_missing(struct load *ld, uint32_t r, char *missing, size_t size, size_t *len, unsigned *misses)
{
	*len += (size_t)snprintf(missing + *len, *len < size ? size - *len : 0, "%s%u", *len ? "," : "", r);
	/* A world size a peer claimed (peer_world) is not asked
	 * for rank after rank: a rank needs N/M + 1 copies. */
	if (++*misses == ld->d->cfg.peer_max_missing_ranks) {
		atomic_fetch_add_explicit(&ld->d->stats.peer_refused[PEER_LIMIT_MISSING], 1, memory_order_relaxed);
		*len += (size_t)snprintf(missing + *len, *len < size ? size - *len : 0,
					 " (no more asked: [peers] max_missing_ranks)");
		return false;
	}
	return true;
}

/* The copies of the step (world ws) planned into ex, saved rank first's
 * first, then the next ones until the request is covered; a request
 * left uncovered fails, naming the ranks missing. */
static void plan_copies(struct load *ld, uint32_t ws, uint32_t own, uint32_t first, struct exec *ex, struct copies *cp)
{
	char missing[160] = "";
	size_t nmissing = 0;
	unsigned misses = 0;
	for (uint32_t i = 0; i < ws && ld->status == 0 && (i == 0 || !all_covered(ld)); i++) {
		uint32_t r = (first + i) % ws;
		struct save *sv = copy_of(ld, r, ws);
		if (sv == NULL) {
			if (!note_missing(ld, r, missing, sizeof(missing), &nmissing, &misses))
				break;
			continue;
		}
		if (save_manifest_view(sv, &cp->views[cp->nviews], "", 0) < 0) {
			load_fail(ld, -ENOMEM, "out of memory");
			break;
		}
		cp->nviews++;
		if (cp->first_copy == NULL)
			cp->first_copy = sv;
		if (r == own)
			cp->own_copy = sv;
		snprintf(cp->keys[i], sizeof(cp->keys[i]), "%s step %" PRIu64 " rank %u (memory only)", ld->job,
			 ld->step, r);
		plan_manifest(ex, &cp->views[cp->nviews - 1], cp->keys[i], sv);
	}
	if (ld->status == 0 && !all_covered(ld)) {
		check_covered(ld, ld->step);
		char why[sizeof(ld->msg)];
		snprintf(why, sizeof(why),
			 "%s; step %" PRIu64 " is in memory only, and neither this ckptd nor %s holds "
			 "saved rank(s) %s of it%s%s%s",
			 ld->msg, ld->step, ld->ask_peers && ld->d->peer_fetch ? "its peers" : "(no peers asked)",
			 missing, ld->peer_why[0] ? " (" : "", ld->peer_why, ld->peer_why[0] ? ")" : "");
		snprintf(ld->msg, sizeof(ld->msg), "%s", why);
	}
}

/* Saved rank own's copy (world ws) among those pinned, or NULL. */
static const struct save *pinned_copy(const struct load *ld, uint32_t own, uint32_t ws)
{
	for (size_t i = 0; i < ld->npinned; i++)
		if (ld->pinned[i]->step == ld->step && ld->pinned[i]->rank == own && ld->pinned[i]->world_size == ws)
			return ld->pinned[i];
	return NULL;
}

/* The extra state: own_copy's, or without a copy of own, from the peers. */
static void copies_extra(struct load *ld, const struct save *own_copy, uint32_t own, uint32_t ws)
{
	if (own_copy && own_copy->extra_len) {
		ld->extra = malloc(own_copy->extra_len);
		if (ld->extra == NULL)
			load_fail(ld, -ENOMEM, "out of memory");
		else
			memcpy(ld->extra, own_copy->extra, own_copy->extra_len);
		ld->extra_len = ld->extra ? own_copy->extra_len : 0;
	} else if (own_copy == NULL) {
		char why[300];
		struct peer_want w = { .job = ld->job,
				       .step = ld->step,
				       .rank = own,
				       .world_size = ws,
				       .key = ld->has_key ? ld->key : NULL };
		int r = ld->d->peer_extra(ld->d, &w, &ld->extra, &ld->extra_len, why, sizeof(why));
		if (r < 0)
			load_fail(ld, r, "step %" PRIu64 " of job '%s': the extra state of rank %u: %s", ld->step,
				  ld->job, own, why);
	}
}

/* A step not in storage, restored from copies in memory (docs/tiers.md "Tiers"):
 * those held here, and those the peers hold (a replacement node's ranks,
 * or saved ranks of other nodes when resharding), brought back as
 * needed. Planned from the copies' own manifests, in the order load_run
 * reads manifests: the saved rank at this rank's place first, then the
 * next ones until the request is covered; read from the pool. No storage
 * request; peer requests per copy: each_holder (peer_fetch.c). The extra state
 * is own's (this rank's, or rank 0's for a rank the save did not have),
 * as from storage; from a peer's manifest alone when own's shard is not
 * needed. */
static void load_copies(struct load *ld, uint32_t ws)
{
	struct copies cp = { 0 };
	cp.views = calloc(ws, sizeof(*cp.views));
	cp.keys = calloc(ws, sizeof(*cp.keys));
	struct exec ex;
	exec_init(&ex, ld);
	if (ws == 0 || cp.views == NULL || cp.keys == NULL) {
		load_fail(ld, ws ? -ENOMEM : -ENOENT, ws ? "out of memory" : "no copy of the step is held");
		goto out;
	}
	ld->loaded_step = ld->step;
	uint32_t own = ld->rank < ws ? ld->rank : 0;
	uint32_t first = ws != ld->world_size && ld->rank < ld->world_size
				 ? (uint32_t)((uint64_t)ld->rank * ws / ld->world_size)
				 : own;
	plan_copies(ld, ws, own, first, &ex, &cp);
	if (ld->status == 0)
		execute(&ex, ld->d->cfg.copy_threads);
	const struct save *own_copy = cp.own_copy;
	if (ld->status == 0 && own_copy == NULL)
		own_copy = pinned_copy(ld, own, ws);
	/* Without peers to ask, own's or else the first copy's (as before). */
	if (own_copy == NULL && (ld->d->peer_extra == NULL || !ld->ask_peers))
		own_copy = cp.first_copy;
	if (ld->status == 0)
		copies_extra(ld, own_copy, own, ws);
out:
	exec_free(&ex);
	for (size_t i = 0; i < cp.nviews; i++)
		save_manifest_view_free(&cp.views[i]);
	free(cp.views);
	free(cp.keys);
}

/* Plan the pinned step cs from its manifests and execute the plan. The
 * manifest likeliest to hold what this rank asks for first, and
 * replicated tensors then need one read only: at the same world size its
 * own; resharding N -> M, the saved rank at the same place in the order
 * (rank * N / M), which holds this rank's share when the layout follows
 * the rank order (rows, flat FSDP shards, blocks along one dimension), so
 * a rank reads about N/M + 1 manifests, not every one before its share.
 * The others follow in order until all is covered. */
static void plan_stored(struct load *ld, struct catalog_step *cs)
{
	struct catalog_group *g = &cs->groups[cs->best];
	char(*keys)[768] = calloc(g->world_size, sizeof(*keys));
	struct exec ex;
	exec_init(&ex, ld);
	if (keys == NULL)
		load_fail(ld, -ENOMEM, "out of memory");
	uint32_t own = ld->rank < g->world_size ? ld->rank : 0;
	uint32_t first = own;
	if (ld->world_size != g->world_size && ld->rank < ld->world_size)
		first = (uint32_t)((uint64_t)ld->rank * g->world_size / ld->world_size);
	if (ld->status == 0)
		plan_rank(&ex, cs, first, &keys[0]);
	for (uint32_t i = 1; i < g->world_size && ld->status == 0 && !all_covered(ld); i++)
		plan_rank(&ex, cs, (first + i) % g->world_size, &keys[i]);
	check_covered(ld, cs->step);
	if (ld->status == 0)
		execute(&ex, ld->d->cfg.copy_threads);
	exec_free(&ex);
	free(keys);
}

/* The world size of the memory-only step this load reads (its own copies). */
static uint32_t memory_world(const struct load *ld)
{
	for (size_t i = 0; i < ld->npinned; i++)
		if (ld->pinned[i]->step == ld->step && !(ld->pin_flags[i] & PIN_DURABLE) && !ld->pinned[i]->replica &&
		    ld->pinned[i]->world_size)
			return ld->pinned[i]->world_size;
	return 0;
}

/* The step to load from st into cs: the latest complete one, or the one
 * named. 0; 1 when the named step is not in storage, or not complete
 * there, and the peers hold it (loaded from them: done); or the load's
 * failure. */
static int find_step(struct load *ld, struct store *st, struct catalog_step *cs)
{
	int r;
	if (ld->latest) {
		r = catalog_latest(st, ld->job, cs);
		if (r == -ENOENT)
			return load_fail(ld, -ENOENT, "job '%s' has no complete step in %s", ld->job, st->url);
		if (r < 0)
			return load_fail(ld, r, "deciding the latest step of job '%s' in %s: %s (%s)", ld->job, st->url,
					 store_error(r), catalog_no_fallback_hint(r));
		return 0;
	}
	r = catalog_resolve_step(st, ld->job, ld->step, cs);
	uint32_t ws = r == -ENOENT || (r == 0 && !catalog_step_complete(cs)) ? peer_world(ld) : 0;
	if (ws > 0) {
		if (r == 0)
			catalog_step_free(cs);
		load_copies(ld, ws);
		return 1;
	}
	if (r < 0)
		return load_fail(ld, r, "step %" PRIu64 " of job '%s': %s%s%.200s%s", ld->step, ld->job,
				 r == -ENOENT ? "not found" : store_error(r),
				 ld->peer_why[0] ? "; nor from the peers (" : "", ld->peer_why,
				 ld->peer_why[0] ? ")" : "");
	if (!catalog_step_complete(cs)) {
		struct catalog_group *g = &cs->groups[cs->best];
		load_fail(ld, -ENOENT, "step %" PRIu64 " of job '%s' is not complete: %u of %u ranks (attempt '%s')",
			  ld->step, ld->job, g->count, g->world_size, g->attempt);
		catalog_step_free(cs);
		return -ENOENT;
	}
	return 0;
}

/* A copy in memory (held here, or a peer's), or bytes a peer read for the
 * job's nodes, failed the check against the stored manifest: the copy is
 * dropped (load_done), and the step read from storage alone at once,
 * never from that copy or the peers again. */
static void plan_again_from_storage(struct load *ld, struct catalog_step *cs)
{
	const struct save *bad = ld->bad_held;
	if (bad) {
		log_warn("load: %s step %" PRIu64 " rank %u: %s (%s%s); reading the step from storage instead", ld->job,
			 cs->step, ld->rank, ld->msg, bad->from_peer ? "a copy from peer " : "a copy held here",
			 bad->from_peer ? bad->peer : "");
		atomic_fetch_add_explicit(&ld->d->stats.held_copies_failed, 1, memory_order_relaxed);
	} else { /* bytes a peer read for the job's nodes (peer_range.c) */
		log_warn("load: %s step %" PRIu64 " rank %u: %s (bytes from a peer that read them for the job's "
			 "nodes); reading the step from storage alone instead",
			 ld->job, cs->step, ld->rank, ld->msg);
		atomic_fetch_add_explicit(&ld->d->stats.range_fallbacks, 1, memory_order_relaxed);
	}
	ld->from_peer_reads = false;
	ld->no_shared = true;
	for (size_t i = 0; i < ld->npinned; i++)
		ld->pin_flags[i] &= (uint8_t)~PIN_READ_PEER;
	for (size_t i = 0; i < ld->nreqs; i++) {
		ld->reqs[i].covered = 0;
		ld->reqs[i].napplied = 0;
		ld->reqs[i].sources = 0;
	}
	ld->bytes = ld->bytes_memory = 0;
	ld->peer[0] = '\0';
	ld->status = 0;
	ld->msg[0] = '\0';
	ld->no_copies = true;
	plan_stored(ld, cs);
}

/* The step's extra state: rank own's (rank 0's for ranks the save did not
 * have), read here if the plan did not need its manifest. */
static void read_extra(struct load *ld, struct store *st, struct catalog_step *cs, uint32_t own)
{
	const Ckpt__Manifest *m = NULL;
	char err[512];
	int r = catalog_read_manifest(st, ld->job, cs, own, &m, err, sizeof(err));
	if (r < 0) {
		load_fail(ld, r, "step %" PRIu64 " of job '%s': %s", cs->step, ld->job,
			  r == -EBADMSG ? err : store_error(r));
		return;
	}
	if (m->extra_state.len == 0)
		return;
	ld->extra = malloc(m->extra_state.len);
	if (ld->extra == NULL) {
		load_fail(ld, -ENOMEM, "out of memory");
		return;
	}
	memcpy(ld->extra, m->extra_state.data, m->extra_state.len);
	ld->extra_len = m->extra_state.len;
}

/* Which step: "latest" is decided from listings and pinned (catalog.h);
 * a storage error fails the load, it never falls back to an older step.
 * Then this rank's own manifest, and its shard. Other ranks' manifests
 * are read only when the request is not covered by its own (resharding,
 * or tensors only some ranks saved): a restore at the same world size
 * costs this rank ceil(2W/1000) LIST pages (with "latest", per step
 * looked at), one commit GET or create, one manifest GET, and the
 * shard's ranged GETs. Manifests come through the daemon's cache
 * (mancache.h): a manifest several ranks of this node need is read once. */
static void load_run(uv_work_t *w)
{
	struct load *ld = w->data;
	if (ld->memory_only) {
		load_copies(ld, memory_world(ld));
		return;
	}
	struct store *st = daemon_store_of(ld->d, ld->job);
	struct catalog_step cs;
	store_clear_error();
	if (find_step(ld, st, &cs) != 0)
		return;
	/* Pinned now: other ranks' manifests come through the daemon's cache,
	 * so the ranks of this node read each one once between them. */
	cs.cache = ld->d->mancache;
	struct catalog_group *g = &cs.groups[cs.best];
	ld->loaded_step = cs.step;
	plan_stored(ld, &cs);
	if (ld->status == -EIO && (ld->bad_held || atomic_load(&ld->from_peer_reads)))
		plan_again_from_storage(ld, &cs);
	if (ld->status == 0)
		read_extra(ld, st, &cs, ld->rank < g->world_size ? ld->rank : 0);
	catalog_step_free(&cs);
}

static const char *source_name(unsigned src)
{
	return src == SRC_MEMORY ? "memory" : src == SRC_STORAGE ? "storage" : src == SRC_PEER ? "peer" : "mixed";
}

static void send_loaded(struct load *ld)
{
	unsigned all = 0;
	Ckpt__LoadedTensor *lt = calloc(ld->nreqs ? ld->nreqs : 1, sizeof(*lt));
	Ckpt__LoadedTensor **ltp = calloc(ld->nreqs ? ld->nreqs : 1, sizeof(*ltp));
	if (lt == NULL || ltp == NULL) {
		free(lt);
		free(ltp);
		ld->d->req_ops->close(ld->session, -ENOMEM, "out of memory");
		return;
	}
	for (size_t i = 0; i < ld->nreqs; i++) {
		ckpt__loaded_tensor__init(&lt[i]);
		lt[i].name = ld->reqs[i].name;
		lt[i].source = (char *)source_name(ld->reqs[i].sources);
		ltp[i] = &lt[i];
		all |= ld->reqs[i].sources;
	}
	Ckpt__Loaded ok = CKPT__LOADED__INIT;
	ok.step = ld->loaded_step;
	ok.bytes = ld->bytes;
	ok.bytes_from_memory = ld->bytes_memory;
	ok.extra_state.data = ld->extra;
	ok.extra_state.len = ld->extra_len;
	ok.source = (char *)source_name(all ? all : SRC_STORAGE);
	if (all & SRC_PEER)
		ok.peer = ld->peer;
	ok.n_tensors = ld->nreqs;
	ok.tensors = ltp;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_LOADED;
	f.loaded = &ok;
	log_info("load: %s step %" PRIu64 " rank %u: %" PRIu64 " bytes from %s", ld->job, ld->loaded_step, ld->rank,
		 ld->bytes, ok.source);
	ld->d->req_ops->send(ld->session, ld->req_id, &f);
	free(lt);
	free(ltp);
}

static void load_done(uv_work_t *w, int status)
{
	struct load *ld = w->data;
	struct daemon *d = ld->d;
	d->nloads--;
	TAILQ_REMOVE(&d->loads, ld, link);
	if (ld->bad_held) /* still pinned: freed by the unpin below */
		memtier_drop_corrupt(d, (struct save *)ld->bad_held);
	/* A peer's copy read by a load that succeeded is this node's now:
	 * later loads of it say "memory". */
	for (size_t i = 0; i < ld->npinned && ld->status == 0 && status == 0; i++)
		if (ld->pin_flags[i] & PIN_READ_PEER)
			ld->pinned[i]->peer_unread = false;
	memtier_unpin(ld->pinned, ld->npinned);
	if (ld->npinned)
		save_admit_waiting(d); /* copies dropped while pinned are free now */
	ld->pinned = NULL;
	ld->npinned = 0;
	if (status < 0 && ld->status == 0)
		load_fail(ld, -ECANCELED, "load cancelled");
	if (ld->status == 0) {
		d->stats.bytes_restored += ld->bytes;
		d->stats.bytes_restored_memory += ld->bytes_memory;
		if (ld->bytes_memory == ld->bytes && ld->bytes > 0)
			d->stats.restores_from_memory++;
		else
			d->stats.restores_from_storage++;
	}
	if (d->req_ops->release(ld->session)) {
		if (ld->status == 0) {
			send_loaded(ld);
		} else {
			Ckpt__LoadFailed bad = CKPT__LOAD_FAILED__INIT;
			bad.status = wire_status(ld->status);
			bad.message = ld->msg;
			Ckpt__Frame f = CKPT__FRAME__INIT;
			f.body_case = CKPT__FRAME__BODY_LOAD_FAILED;
			f.load_failed = &bad;
			log_warn("load: %s rank %u failed: %s", ld->job, ld->rank, ld->msg);
			d->req_ops->send(ld->session, ld->req_id, &f);
		}
	}
	load_free(ld);
	daemon_work_ended(d);
}

static int plan(struct load *ld, struct session *s, const Ckpt__Load *m, char *err, size_t errlen)
{
	const struct config *c = &ld->d->cfg;
	if (m->n_tensors > c->max_tensors) {
		snprintf(err, errlen, "%zu tensors, at most %u per load", m->n_tensors, c->max_tensors);
		return -E2BIG;
	}
	ld->reqs = calloc(m->n_tensors ? m->n_tensors : 1, sizeof(*ld->reqs));
	ld->by_name = calloc(m->n_tensors ? m->n_tensors : 1, sizeof(*ld->by_name));
	if (ld->reqs == NULL || ld->by_name == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < m->n_tensors; i++) {
		const Ckpt__TensorRef *tr = m->tensors[i];
		struct load_req *q = &ld->reqs[i];
		struct hostbuf *b = NULL;
		int r = ld->d->req_ops->tensor(s, tr, i, &q->box, &b, err, errlen);
		if (r < 0)
			return r;
		if ((q->name = strdup(tr->name)) == NULL)
			return -ENOMEM;
		ld->nreqs = i + 1;
		ld->by_name[i] = q;
		q->dtype = tr->dtype;
		q->buf = hostbuf_ref(b);
		q->buf_off = tr->offset;
		q->nbytes = tr->nbytes;
	}
	qsort(ld->by_name, ld->nreqs, sizeof(*ld->by_name), cmp_req);
	return 0;
}

void load_start(struct daemon *d, const struct requester *rq, const Ckpt__Load *m)
{
	assert(d && d->req_ops && rq && rq->s && m);
	const struct requester_ops *ops = d->req_ops;
	/* Draining and the session's cap were checked by its message row
	 * (msgtab.c). */
	if (rq->job[0] == '\0') {
		ops->load_refused(rq->s, rq->req_id, -EPERM,
				  "this session said no job in Hello (a control session); it cannot load");
		return;
	}
	struct load *ld = calloc(1, sizeof(*ld));
	if (ld == NULL) {
		ops->load_refused(rq->s, rq->req_id, -ENOMEM, "out of memory");
		return;
	}
	ld->d = d;
	ld->req_id = rq->req_id;
	snprintf(ld->job, sizeof(ld->job), "%s", rq->job);
	ld->rank = rq->rank;
	ld->world_size = rq->world_size;
	ld->latest = m->latest;
	ld->step = m->step;
	ld->storage_only = m->storage_only;
	if (rq->job_key) {
		memcpy(ld->key, rq->job_key, sizeof(ld->key));
		ld->has_key = true;
	}
	char err[512];
	int r = plan(ld, rq->s, m, err, sizeof(err));
	if (r < 0) {
		ops->load_refused(rq->s, rq->req_id, r, r == -ENOMEM ? "out of memory" : err);
		load_free(ld);
		return;
	}
	ld->session = rq->s;
	ops->hold(rq->s);
	ld->work.data = ld;
	d->nloads++;
	if (!m->storage_only)
		ld->npinned = memtier_pin(d, ld->job, &ld->pinned);
	/* Copies not held here may come from the peers (fetch_one). */
	ld->ask_peers = d->peer_fetch != NULL;
	ld->pin_flags = calloc(ld->npinned + 1, sizeof(*ld->pin_flags));
	if (ld->pin_flags == NULL) {
		memtier_unpin(ld->pinned, ld->npinned);
		ld->pinned = NULL;
		ld->npinned = 0;
	}
	for (size_t i = 0; i < ld->npinned; i++) {
		ld->pin_flags[i] = ld->pinned[i]->durable ? PIN_DURABLE : 0;
		/* Brought back from a peer by a show just before (ckpt.torch
		 * shows its rank's manifest first): read, its bytes are the
		 * peer's for this load too. */
		if (ld->pinned[i]->from_peer && ld->pinned[i]->peer_unread)
			ld->pin_flags[i] |= PIN_FETCHED;
		/* A named step held here in memory only, by a copy of this
		 * node's own: restored from there (a replica held for a peer
		 * never decides it: memtier.h). */
		ld->memory_only |= !m->latest && !ld->pinned[i]->durable && !ld->pinned[i]->replica &&
				   ld->pinned[i]->step == m->step;
	}
	r = uv_queue_work(d->loop, &ld->work, load_run, load_done);
	if (r == 0)
		TAILQ_INSERT_TAIL(&d->loads, ld, link);
	if (r < 0) {
		d->nloads--;
		memtier_unpin(ld->pinned, ld->npinned);
		if (ld->npinned)
			save_admit_waiting(d);
		ld->pinned = NULL;
		ld->npinned = 0;
		ops->release(rq->s);
		ops->load_refused(rq->s, rq->req_id, -EIO, "cannot queue the load");
		load_free(ld);
	}
}

size_t load_busy_jobs(struct daemon *d, char (*out)[JOB_BUF], size_t max)
{
	size_t n = 0;
	struct load *ld;
	TAILQ_FOREACH (ld, &d->loads, link)
		if (n < max)
			snprintf(out[n++], sizeof(out[0]), "%s", ld->job);
	return n;
}
