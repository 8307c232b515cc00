/* Restoring from peers (peer_int.h), on a load's threadpool thread: a
 * copy, or its extra state, from the peers likeliest to hold it, and the
 * copies peers hold. */
#include "peer_int.h"
#include "log.h"
#include "save.h"
#include "wire.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fetch {
	Ckpt__ReplicaGet g;
	const uint8_t *key;        /* the asking rank's job key, or NULL */
	const struct peer_want *w; /* fetch_from */
	struct save *sv;           /* fetch_from */
	uint8_t *extra;            /* extra_from */
	size_t extra_len;
	/* A peer skipped as down (peer_open_link); only those asked, down or
	 * not (the second pass of peer_fetch). */
	bool skipped, only_down;
};

/* Ask peer name for its copy of ft's (job, step, rank) of world_size: 0
 * with the link open, and its manifest (checked) in *m, the shard (unless
 * manifest_only) to read next; -errno and why. */
static int ask_copy(struct peer *p, const char *name, struct fetch *ft, struct link *l, Ckpt__Manifest **m,
		    struct sealing *z, char *why, size_t whylen)
{
	*m = NULL;
	z->on = false;
	const Ckpt__ReplicaGet *g = &ft->g;
	const uint8_t *key = ft->key;
	if (ft->only_down && !peer_is_down(p, name)) {
		snprintf(why, whylen, "asked already");
		return -ENOENT;
	}
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	f.body_case = CKPT__PEER_FRAME__BODY_GET;
	f.get = (Ckpt__ReplicaGet *)g;
	Ckpt__PeerFrame *in = NULL;
	int r = peer_request(p, name, ft->only_down, &f, frame_max(&p->d->cfg), l, &in, why, whylen);
	if (r == -EHOSTDOWN)
		ft->skipped = true;
	if (r == -EMSGSIZE) {
		refuse(p, PEER_LIMIT_FRAME_BYTES);
		snprintf(why, whylen,
			 "its answer is larger than %zu bytes, the largest manifest this node's [limits] allow",
			 frame_max(&p->d->cfg));
	}
	if (r < 0)
		return r;
	if (in->body_case != CKPT__PEER_FRAME__BODY_DATA)
		r = -EPROTO;
	if (r == 0 && in->data->status != 0) {
		r = wire_errno(in->data->status);
		snprintf(why, whylen, "%s", in->data->message);
	} else if (r == 0) {
		r = peer_msg_data(in->data, g, key, z, m, why, whylen);
	}
	if (in)
		ckpt__peer_frame__free_unpacked(in, NULL);
	if (r < 0) {
		if (*m)
			ckpt__manifest__free_unpacked(*m, NULL);
		*m = NULL;
		link_close(l);
	}
	return r;
}

/* A peer's copy (its manifest m) is the save whose manifest in storage is
 * want: the same attempt and shard size, and the same tensors where they
 * were, with the same CRC32C. */
static bool same_save(const Ckpt__Manifest *m, const Ckpt__Manifest *want)
{
	if (strcmp(m->attempt_id, want->attempt_id) != 0 || m->shard_bytes != want->shard_bytes ||
	    m->n_tensors != want->n_tensors)
		return false;
	for (size_t i = 0; i < m->n_tensors; i++) {
		const Ckpt__ManifestTensor *a = m->tensors[i], *b = want->tensors[i];
		if (a->crc32c != b->crc32c || a->nbytes != b->nbytes || a->shard_offset != b->shard_offset ||
		    strcmp(a->name, b->name) != 0)
			return false;
	}
	return true;
}

/* A sealed replica of what ft asks for held here, pinned, and its whole
 * manifest opened with ft's key (a rank of a job with a secret restoring
 * another node's rank, resharding: the copy is ciphertext here, and no
 * peer serves that node's own copy). 0, or -ENOENT (none, or no key),
 * or why it does not open. */
static int open_held(struct peer *p, struct fetch *ft, struct save **held, Ckpt__Manifest **m, struct sealing *z,
		     char *why, size_t whylen)
{
	*held = NULL;
	*m = NULL;
	if (ft->key == NULL)
		return -ENOENT;
	struct find f = { .job = ft->g.job, .step = ft->g.step, .rank = ft->g.rank, .world_size = ft->g.world_size };
	if (peer_loop_call(p, hold_find, &f) < 0 || f.sv == NULL)
		return -ENOENT;
	if (!f.sv->replica || f.sv->seal == NULL) {
		(void)peer_loop_call(p, hold_unpin, f.sv);
		return -ENOENT;
	}
	/* As its holder would send it (peer_serve.c), checked as a peer's. */
	uint8_t *mb = NULL;
	size_t ml = 0;
	int r = peer_pack_manifest(f.sv, true, &mb, &ml);
	if (r == 0) {
		Ckpt__ReplicaData data = CKPT__REPLICA_DATA__INIT;
		data.manifest.data = mb;
		data.manifest.len = ml;
		data.seal_nonce.data = f.sv->seal;
		data.seal_nonce.len = SEAL_NONCE_BYTES;
		data.sealed_manifest.data = f.sv->seal + peer_seal_sm_off(f.sv);
		data.sealed_manifest.len = f.sv->seal_len - peer_seal_sm_off(f.sv);
		r = peer_msg_data(&data, &ft->g, ft->key, z, m, why, whylen);
	} else {
		snprintf(why, whylen, "out of memory");
	}
	free(mb);
	if (r < 0) {
		(void)peer_loop_call(p, hold_unpin, f.sv);
		return r;
	}
	*held = f.sv;
	return 0;
}

/* The copy whose manifest m (and seal z) came from a peer on l, or from
 * a sealed replica held here: into the pool, held and pinned (ft->sv);
 * name: where it came from. Frees m. */
static int take_copy(struct peer *p, struct fetch *ft, Ckpt__Manifest *m, const struct sealing *z, struct link *l,
		     const struct save *held, const char *name, char *why, size_t whylen)
{
	struct daemon *d = p->d;
	const struct peer_want *w = ft->w;
	if (w->expect && !same_save(m, w->expect)) {
		snprintf(why, whylen, "it holds another save of the step (attempt '%.60s')", m->attempt_id);
		ckpt__manifest__free_unpacked(m, NULL);
		return -ESTALE;
	}
	struct reserve rs = { 0 };
	struct save *sv = peer_save_from_manifest(d, m, CKPT__TIER__TIER_REPLICATED);
	int r = sv ? peer_loop_call(p, hold_reserve, (rs.sv = sv, &rs)) : -ENOMEM;
	if (r == 0 && rs.status < 0) {
		r = rs.status;
		snprintf(why, whylen, "%s", rs.msg);
	}
	if (r < 0 && sv) {
		save_free(sv);
		sv = NULL;
	}
	if (r == 0)
		r = held    ? peer_open_held(held, sv, m, ft->key, z, why, whylen)
		    : z->on ? peer_recv_sealed(l, sv, m, ft->key, z, why, whylen)
			    : peer_recv_shard(l, sv, m, why, whylen);
	struct commit c = { .sv = sv, .pin = true, .durable = w->expect != NULL };
	if (r == 0) {
		sv->from_peer = sv->peer_unread = true;
		snprintf(sv->peer, sizeof(sv->peer), "%s", name);
		if (w->expect)
			snprintf(sv->shard_name, sizeof(sv->shard_name), "%s", w->expect->shard_name);
		r = peer_loop_call(p, hold_commit, &c);
	} else if (sv) {
		(void)peer_loop_call(p, hold_release, sv);
	}
	if (r < 0 && why[0] == '\0')
		snprintf(why, whylen, "%s", strerror(-r));
	ckpt__manifest__free_unpacked(m, NULL);
	if (r == 0) {
		if (held == NULL)
			count(&d->stats.peer_bytes_received, sv->shard_bytes);
		count(&d->stats.peer_restores, 1);
		ft->sv = sv;
	}
	return r;
}

/* The copy from peer name, into the pool, held and pinned. */
static int fetch_from(struct peer *p, const char *name, void *arg, char *why, size_t whylen)
{
	struct fetch *ft = arg;
	struct link l;
	Ckpt__Manifest *m = NULL;
	struct sealing z = { 0 };
	int r = ask_copy(p, name, ft, &l, &m, &z, why, whylen);
	if (r < 0)
		return r;
	r = take_copy(p, ft, m, &z, &l, NULL, name, why, whylen);
	link_close(&l);
	return r;
}

/* The copy opened from a sealed replica held here (open_held). */
static int fetch_held(struct peer *p, struct fetch *ft, char *why, size_t whylen)
{
	struct save *held;
	Ckpt__Manifest *m;
	struct sealing z = { 0 };
	int r = open_held(p, ft, &held, &m, &z, why, whylen);
	if (r < 0)
		return r;
	char origin[sizeof(held->peer)];
	snprintf(origin, sizeof(origin), "%s", held->peer);
	r = take_copy(p, ft, m, &z, NULL, held, origin, why, whylen);
	(void)peer_loop_call(p, hold_unpin, held);
	return r;
}

/* m's extra state into ft. Frees m. */
static int take_extra(struct fetch *ft, Ckpt__Manifest *m)
{
	ft->extra_len = m->extra_state.len;
	ft->extra = malloc(m->extra_state.len ? m->extra_state.len : 1);
	if (ft->extra)
		memcpy(ft->extra, m->extra_state.data, m->extra_state.len);
	ckpt__manifest__free_unpacked(m, NULL);
	return ft->extra ? 0 : -ENOMEM;
}

/* The copy's extra state only, from peer name (its manifest; no shard). */
static int extra_from(struct peer *p, const char *name, void *arg, char *why, size_t whylen)
{
	struct fetch *ft = arg;
	struct link l;
	Ckpt__Manifest *m = NULL;
	struct sealing z = { 0 };
	int r = ask_copy(p, name, ft, &l, &m, &z, why, whylen);
	if (r < 0)
		return r;
	r = take_extra(ft, m);
	link_close(&l);
	return r;
}

static void sweep(struct peer *p, const char *job);

/* fn on the peers likeliest to hold (job, rank)'s copies, in turn, until
 * one works: the one that last said it holds them, then this node's
 * successors (where its own ranks' copies go), then, when neither has
 * them, the holder the whole ring names (sweep: once per job in this
 * daemon's life). So a copy costs 1 + K peer requests at most, flat in
 * the ring's size, but for that one sweep per job, which a node that came
 * back under another name, or a load that reshards (other nodes' ranks'
 * copies), needs. why: each peer asked, and its answer. */
static int each_holder(struct peer *p, const char *job, uint32_t rank, bool no_sweep,
		       int (*fn)(struct peer *p, const char *name, void *arg, char *why, size_t whylen), void *arg,
		       char *why, size_t whylen)
{
	char(*ring)[RING_NAME_MAX] = NULL;
	char known[RING_NAME_MAX], found[RING_NAME_MAX];
	why[0] = '\0';
	peer_holder_get(p, job, rank, known, sizeof(known));
	size_t n = peer_ring_now(p, p->d->cfg.peer_replicas, &ring, why, whylen);
	size_t used = strlen(why);
	int r = -ENOENT;
	for (size_t i = 0; i <= n + (no_sweep ? 0 : 1) && r < 0; i++) {
		const char *name = i == 0 ? known : i <= n ? ring[i - 1] : found;
		if (i == n + 1) { /* neither: the whole ring, once per job */
			sweep(p, job);
			peer_holder_get(p, job, rank, found, sizeof(found));
			for (size_t k = 0; k < n && found[0]; k++)
				if (strcmp(found, ring[k]) == 0)
					found[0] = '\0';
		}
		if (name[0] == '\0' || (i > 0 && strcmp(name, known) == 0))
			continue;
		char one[300] = "";
		r = fn(p, name, arg, one, sizeof(one));
		if (r < 0 && used + 1 < whylen)
			used += (size_t)snprintf(why + used, whylen - used, "%s%s: %s", used ? "; " : "", name, one);
	}
	free(ring);
	return r;
}

/* daemon.peer_fetch (each_holder). */
int peer_fetch(struct daemon *d, const struct peer_want *w, struct save **out, char *why, size_t whylen)
{
	struct fetch ft = { .g = CKPT__REPLICA_GET__INIT, .w = w, .key = w->key };
	ft.g.job = (char *)w->job;
	ft.g.step = w->step;
	ft.g.rank = w->rank;
	ft.g.world_size = w->world_size;
	/* A sealed replica held here first: no peer request. */
	int r = fetch_held(d->peer, &ft, why, whylen);
	if (r < 0)
		r = each_holder(d->peer, w->job, w->rank, w->no_sweep, fetch_from, &ft, why, whylen);
	/* A step in no storage has no other source: the holders skipped as
	 * down (a link that flapped, a node that came back) are asked after
	 * all, at the cost of their timeout, only by a load that would fail
	 * without them. */
	if (r < 0 && w->expect == NULL && ft.skipped) {
		ft.only_down = true;
		r = each_holder(d->peer, w->job, w->rank, true, fetch_from, &ft, why, whylen);
	}
	*out = ft.sv;
	return r;
}

/* daemon.peer_extra (each_holder): a copy's extra state, no shard. */
int peer_extra(struct daemon *d, const struct peer_want *w, uint8_t **extra, size_t *len, char *why, size_t whylen)
{
	struct fetch ft = { .g = CKPT__REPLICA_GET__INIT, .key = w->key };
	ft.g.job = (char *)w->job;
	ft.g.step = w->step;
	ft.g.rank = w->rank;
	ft.g.world_size = w->world_size;
	ft.g.manifest_only = true;
	struct save *held;
	Ckpt__Manifest *m;
	struct sealing z = { 0 };
	int r = open_held(d->peer, &ft, &held, &m, &z, why, whylen);
	if (r == 0) {
		(void)peer_loop_call(d->peer, hold_unpin, held);
		r = take_extra(&ft, m);
	} else {
		r = each_holder(d->peer, w->job, w->rank, false, extra_from, &ft, why, whylen);
	}
	*extra = ft.extra;
	*len = ft.extra_len;
	return r;
}

/* The copies of (job, rank) that peer name holds, appended to *v. -errno
 * when it could not be asked. */
static int list_one(struct peer *p, const char *name, const char *job, uint32_t rank, bool all_ranks,
		    struct peer_copy **v, size_t *k)
{
	struct link l;
	char err[300];
	Ckpt__ReplicaList q = CKPT__REPLICA_LIST__INIT;
	q.job = (char *)job;
	q.rank = rank;
	q.all_ranks = all_ranks;
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	f.body_case = CKPT__PEER_FRAME__BODY_LIST;
	f.list = &q;
	Ckpt__PeerFrame *in = NULL;
	size_t max = (size_t)p->d->cfg.peer_max_list * LIST_ENTRY_BYTES + 4096;
	int r = peer_request(p, name, false, &f, max, &l, &in, err, sizeof(err));
	if (r == -EMSGSIZE) {
		refuse(p, PEER_LIMIT_LIST);
		log_warn("peers: %s answered a list of %s with more than %zu bytes ([peers] max_list); not read", name,
			 job, max);
	}
	if (r < 0)
		return r;
	if (in->body_case != CKPT__PEER_FRAME__BODY_LIST_REPLY)
		r = -EPROTO;
	char why[200];
	if (r == 0 && (r = peer_msg_list(in->list_reply, &q, p->d->cfg.peer_max_list, why, sizeof(why))) < 0) {
		refuse(p, PEER_LIMIT_LIST);
		log_warn("peers: %s answered a list of %s with copies not asked for; not used: %s", name, job, why);
	}
	if (r == 0) {
		const Ckpt__ReplicaListReply *rep = in->list_reply;
		struct peer_copy *nv = realloc(*v, (*k + rep->n_held + 1) * sizeof(**v));
		if (nv == NULL)
			r = -ENOMEM;
		for (size_t j = 0; nv && j < rep->n_held; j++) {
			const Ckpt__HeldCopy *h = rep->held[j];
			struct peer_copy *c = &nv[(*k)++];
			memset(c, 0, sizeof(*c));
			snprintf(c->peer, sizeof(c->peer), "%s", name);
			snprintf(c->job, sizeof(c->job), "%s", h->job);
			snprintf(c->attempt, sizeof(c->attempt), "%s", h->attempt_id);
			c->rank = h->rank;
			c->world_size = h->world_size;
			c->step = h->step;
			c->bytes = h->bytes;
			c->tier = (int)h->tier;
			c->durable = h->durable;
		}
		if (nv)
			*v = nv;
	}
	if (in)
		ckpt__peer_frame__free_unpacked(in, NULL);
	link_close(&l);
	return r;
}

/* Ask every peer of the ring, once per job in this daemon's life (the
 * ranks of this node share it: the first sweeps, the others wait), which
 * ranks' copies of job it holds, and remember the holders. */
static void sweep(struct peer *p, const char *job)
{
	struct holders *h = peer_sweep_begin(p, job);
	if (h == NULL)
		return;
	char(*ring)[RING_NAME_MAX] = NULL;
	char why[300] = "";
	size_t n = peer_ring_now(p, RING_MAX, &ring, why, sizeof(why));
	size_t asked = 0;
	for (size_t i = 0; i < n; i++) {
		struct peer_copy *v = NULL;
		size_t k = 0;
		if (list_one(p, ring[i], job, 0, true, &v, &k) == 0)
			asked++;
		for (size_t j = 0; j < k; j++)
			peer_holder_set(p, job, v[j].rank, ring[i]);
		free(v);
	}
	free(ring);
	log_info("peers: asked %zu of %zu peers which copies of %s they hold (once)", asked, n, job);
	peer_sweep_end(p, h, asked == n);
}

/* daemon.peer_list: the copies of (job, rank) the peers hold: asked of
 * the peer that last said it holds them, then of this node's successors
 * (where a node's copies go), and only then, once per job in this
 * daemon's life, of the whole ring (a node that came back under another
 * name: sweep). So a rank asks at most 1 + K peers, flat in the ring's
 * size, but for that one sweep per job per daemon (ring size requests,
 * shared by the node's ranks). */
int peer_list(struct daemon *d, const char *job, uint32_t rank, struct peer_copy **out, size_t *nout)
{
	struct peer *p = d->peer;
	char(*ring)[RING_NAME_MAX] = NULL;
	char why[300] = "", known[RING_NAME_MAX];
	struct peer_copy *v = NULL;
	size_t k = 0;
	peer_holder_get(p, job, rank, known, sizeof(known));
	if (known[0])
		(void)list_one(p, known, job, rank, false, &v, &k);
	size_t n = k ? 0 : peer_ring_now(p, d->cfg.peer_replicas, &ring, why, sizeof(why));
	for (size_t i = 0; i < n && k == 0; i++)
		if (strcmp(ring[i], known) != 0 && list_one(p, ring[i], job, rank, false, &v, &k) == 0 && k > 0)
			peer_holder_set(p, job, rank, ring[i]);
	free(ring);
	if (k == 0) {
		sweep(p, job);
		char found[RING_NAME_MAX];
		peer_holder_get(p, job, rank, found, sizeof(found));
		if (found[0] && strcmp(found, known) != 0)
			(void)list_one(p, found, job, rank, false, &v, &k);
	}
	*out = v;
	*nout = k;
	return 0;
}
