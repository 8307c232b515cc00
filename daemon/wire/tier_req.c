/* The memory tier's requests: held, persist, and the memory-only steps in
 * show and list. The copies are the engine's (memtier.c); this file only
 * says what a session may see of them (its tenant's, under its own
 * names) and answers. */
#include "tier_req.h"
#include "bgreq.h"
#include "daemon.h"
#include "grow.h"
#include "persist.h"
#include "memtier.h"
#include "save.h"
#include "session.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const tier_word[] = {
	[TIER_DURABLE] = "durable", [TIER_MEMORY] = "memory", [TIER_REPLICATED] = "replicated"
};

/* Whether held copy sv is in a HeldReply of job: every copy, replicas
 * held for peers included, for all ranks (ckptctl); for one rank, those
 * its restore may read (memtier_loadable: a replica held for a peer never
 * stands in for this node's own copies of the rank). */
static bool listed(struct daemon *d, const struct save *sv, const char *job, bool all_ranks, uint32_t rank)
{
	if (strcmp(sv->job, job) != 0)
		return false;
	return all_ranks || (sv->rank == rank && memtier_loadable(d, sv));
}

/* The HeldReply: this daemon's copies of job (for rank, or all ranks),
 * then the peers' (peer_copy, each naming its peer). */
static void held_answer(struct session *s, uint64_t req_id, const char *job, bool all_ranks, uint32_t rank,
			const struct peer_copy *pc, size_t npc)
{
	struct daemon *d = s->d;
	size_t n = npc, k = 0;
	struct save *sv;
	TAILQ_FOREACH (sv, &d->held, hlink)
		if (listed(d, sv, job, all_ranks, rank))
			n++;
	Ckpt__HeldCopy *v = calloc(n ? n : 1, sizeof(*v));
	Ckpt__HeldCopy **p = calloc(n ? n : 1, sizeof(*p));
	if (v == NULL || p == NULL) {
		free(v);
		free(p);
		session_reply(s, req_id, -ENOMEM, "out of memory");
		return;
	}
	struct viewer view = session_viewer(s);
	const char *shown;
	TAILQ_FOREACH (sv, &d->held, hlink)
		if (listed(d, sv, job, all_ranks, rank) && (shown = tenancy_shown(&view, sv->job)) != NULL) {
			save_held_view(sv, &v[k], shown);
			p[k] = &v[k];
			k++;
		}
	for (size_t i = 0; i < npc; i++) {
		if ((shown = tenancy_shown(&view, pc[i].job)) == NULL)
			continue; /* a peer's answer about another job */
		Ckpt__HeldCopy *h = &v[k];
		ckpt__held_copy__init(h);
		h->job = (char *)shown;
		h->rank = pc[i].rank;
		h->world_size = pc[i].world_size;
		h->step = pc[i].step;
		h->bytes = pc[i].bytes;
		h->attempt_id = (char *)pc[i].attempt;
		h->tier = (Ckpt__Tier)pc[i].tier;
		h->durable = pc[i].durable;
		h->peer = (char *)pc[i].peer;
		p[k++] = h;
	}
	Ckpt__HeldReply rep = CKPT__HELD_REPLY__INIT;
	rep.n_held = k;
	rep.held = p;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_HELD_REPLY;
	f.held_reply = &rep;
	session_send(s, req_id, &f);
	free(v);
	free(p);
}

/* With peers: their copies are asked for on the threadpool. */
struct held_req {
	struct bgreq base;
	char job[JOB_BUF];
	uint32_t rank;
	struct peer_copy *pc;
	size_t npc;
};

static void held_run(struct bgreq *b)
{
	struct held_req *q = (struct held_req *)b;
	if (b->d->peer_list && b->d->peer_list(b->d, q->job, q->rank, &q->pc, &q->npc) < 0)
		q->npc = 0; /* peers that do not answer hold nothing we could restore */
}

static void held_reply(struct bgreq *b)
{
	struct held_req *q = (struct held_req *)b;
	held_answer(b->session, b->req_id, q->job, false, q->rank, q->pc, q->npc);
}

static void held_destroy(struct bgreq *b)
{
	struct held_req *q = (struct held_req *)b;
	free(q->pc);
	free(q);
}

void held_start(struct session *s, uint64_t req_id, const Ckpt__HeldRequest *m)
{
	char job[JOB_BUF];
	if (!session_request_job(s, req_id, m->job, "held", job, sizeof(job)))
		return;
	if (!m->all_ranks && s->job[0] == '\0') {
		session_reply(s, req_id, -EINVAL, "a control session has no rank: ask for all_ranks");
		return;
	}
	/* The peers hold nothing newer than the copies this node saved
	 * (theirs came from here): they are asked only by a rank with none
	 * (a node that lost its pool, or that only brought copies back). */
	bool own = false;
	struct save *sv;
	TAILQ_FOREACH (sv, &s->d->held, hlink)
		own |= !sv->durable && !sv->replica && !sv->from_peer && sv->rank == s->rank &&
		       strcmp(sv->job, job) == 0;
	if (m->all_ranks || s->d->peer_list == NULL || own) {
		held_answer(s, req_id, job, m->all_ranks, s->rank, NULL, 0);
		return;
	}
	struct held_req *q = calloc(1, sizeof(*q));
	if (q == NULL) {
		session_reply(s, req_id, -ENOMEM, "out of memory");
		return;
	}
	snprintf(q->job, sizeof(q->job), "%s", job);
	q->rank = s->rank;
	q->base.run = held_run;
	q->base.reply = held_reply;
	q->base.destroy = held_destroy;
	bgreq_start(s, req_id, &q->base);
}

void persist_request(struct session *s, uint64_t req_id, const Ckpt__PersistRequest *m)
{
	char job[JOB_BUF];
	if (!session_request_job(s, req_id, m->job, "persist", job, sizeof(job)))
		return;
	struct requester rq = session_requester(s, req_id);
	persist_start(s->d, &rq, job, m->step, m->replicas);
}

/* Copies of (job, step) held here: how many, and whether any is in
 * memory only; *one is rank's (or rank 0's, or the first). */
static size_t step_copies(struct daemon *d, const char *job, uint64_t step, uint32_t rank, bool *memory_only,
			  const struct save **one)
{
	size_t n = 0;
	struct save *sv;
	*memory_only = false;
	*one = NULL;
	TAILQ_FOREACH (sv, &d->held, hlink) {
		if (sv->step != step || strcmp(sv->job, job) != 0)
			continue;
		n++;
		*memory_only |= !sv->durable;
		if (*one == NULL || sv->rank == rank || (sv->rank == 0 && (*one)->rank != rank))
			*one = sv;
	}
	return n;
}

static void where_of(char *buf, size_t len, size_t here, uint32_t world_size, bool storage)
{
	snprintf(buf, len, "%smemory here: %zu of %u ranks", storage ? "storage, " : "", here, world_size);
}

bool show_held(struct session *s, uint64_t req_id, const char *job, uint64_t step, bool one_rank, uint32_t rank)
{
	struct daemon *d = s->d;
	bool memory_only;
	const struct save *one;
	struct viewer view = session_viewer(s);
	const char *shown = tenancy_shown(&view, job);
	size_t n = step_copies(d, job, step, rank, &memory_only, &one);
	if (n == 0 || !memory_only || shown == NULL)
		return false;
	size_t nm = one_rank ? 1 : n, k = 0;
	Ckpt__Manifest *ms = calloc(nm, sizeof(*ms));
	Ckpt__Manifest **mp = calloc(nm, sizeof(*mp));
	int r = ms && mp ? 0 : -ENOMEM;
	struct save *sv;
	TAILQ_FOREACH (sv, &d->held, hlink) {
		if (r < 0 || k == nm)
			break;
		if (sv->step != step || strcmp(sv->job, job) != 0 || (one_rank && sv != one))
			continue;
		r = save_manifest_view(sv, &ms[k], "", 0);
		if (r == 0) {
			ms[k].job = (char *)shown;
			ms[k].extra_state.len = 0; /* as show from storage: the user's, and possibly large */
			mp[k] = &ms[k];
			k++;
		}
	}
	if (r == 0) {
		char where[96];
		where_of(where, sizeof(where), n, one->world_size, false);
		Ckpt__StepInfo si = CKPT__STEP_INFO__INIT;
		si.job = (char *)shown;
		si.step = step;
		si.complete = n == one->world_size;
		si.ranks_present = (uint32_t)n;
		si.world_size = one->world_size;
		si.attempt_id = (char *)one->attempt;
		for (size_t i = 0; i < k; i++)
			si.bytes += ms[i].shard_bytes;
		si.tier = (char *)tier_word[one->tier];
		si.where = where;
		Ckpt__ShowReply rep = CKPT__SHOW_REPLY__INIT;
		rep.info = &si;
		rep.n_manifests = k;
		rep.manifests = mp;
		Ckpt__Frame f = CKPT__FRAME__INIT;
		f.body_case = CKPT__FRAME__BODY_SHOW_REPLY;
		f.show_reply = &rep;
		session_send(s, req_id, &f);
	} else {
		session_reply(s, req_id, r, "out of memory");
	}
	for (size_t i = 0; i < k; i++)
		save_manifest_view_free(&ms[i]);
	free(ms);
	free(mp);
	return true;
}

int list_held(struct bgreq *b, const char *job, Ckpt__StepInfo **v, size_t *n, size_t *cap)
{
	struct daemon *d = b->d;
	size_t listed = *n;
	/* Storage steps held here too: where their copies are. */
	for (size_t i = 0; i < listed; i++) {
		Ckpt__StepInfo *si = &(*v)[i];
		char kept[JOB_BUF];
		int e = tenancy_unshown(&b->view, si->job, kept, sizeof(kept));
		if (e < 0)
			return e;
		bool memory_only;
		const struct save *one;
		size_t here = step_copies(d, kept, si->step, 0, &memory_only, &one);
		si->tier = (char *)"durable";
		char where[96];
		if (here)
			where_of(where, sizeof(where), here, si->world_size, true);
		si->where = strdup(here ? where : "storage");
		if (si->where == NULL)
			return -ENOMEM;
	}
	/* Steps in memory only: one entry per (job, step). */
	struct save *sv;
	TAILQ_FOREACH (sv, &d->held, hlink) {
		const char *shown = tenancy_shown(&b->view, sv->job);
		if (sv->durable || (job[0] && strcmp(sv->job, job) != 0) || shown == NULL)
			continue;
		bool seen = false;
		for (size_t i = listed; i < *n && !seen; i++)
			seen = (*v)[i].step == sv->step && strcmp((*v)[i].job, shown) == 0;
		if (seen)
			continue;
		bool memory_only;
		const struct save *one;
		size_t here = step_copies(d, sv->job, sv->step, 0, &memory_only, &one);
		if (GROW(*v, *cap, *n + 1, 16) < 0)
			return -ENOMEM;
		Ckpt__StepInfo *si = &(*v)[*n];
		ckpt__step_info__init(si);
		char where[400];
		where_of(where, sizeof(where), here, sv->world_size, false);
		if (sv->replicated_to[0]) /* this rank's replicas: the node's go to the same peers */
			snprintf(where + strlen(where), sizeof(where) - strlen(where), "; replicas on %s",
				 sv->replicated_to);
		si->job = strdup(shown);
		si->attempt_id = strdup(sv->attempt);
		si->where = strdup(where);
		si->tier = (char *)tier_word[sv->tier];
		if (si->job == NULL || si->attempt_id == NULL || si->where == NULL) {
			free(si->job);
			free(si->attempt_id);
			free(si->where);
			return -ENOMEM;
		}
		si->step = sv->step;
		si->ranks_present = (uint32_t)here;
		si->world_size = sv->world_size;
		si->complete = here == sv->world_size;
		TAILQ_FOREACH (one, &d->held, hlink)
			if (one->step == sv->step && strcmp(one->job, sv->job) == 0)
				si->bytes += one->shard_bytes;
		(*n)++;
	}
	return 0;
}
