/* Peer replication (peer.h): the service's threads, the loop bridge, and
 * the three exchanges (put a replica, get a copy back, list copies). */
#include "peer.h"
#include "peer_msg.h"
#include "clock.h"
#include "crc32c.h"
#include "daemon.h"
#include "link.h"
#include "log.h"
#include "manifest.h"
#include "requester.h"
#include "ring.h"
#include "save.h"
#include "seal.h"
#include "tensor.h"
#include "wire.h"

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define PEER_PROTOCOL_VERSION 1 /* a PeerHello's; 2: it may put sealed replicas (seal.h) */
#define PEER_PROTOCOL_SEALED 2
#define MAX_REPLICAS 16             /* [peers] replicas: SaveReplicated names at most this many peers */
#define LIST_MAX 768                /* copies in one ReplicaListReply (a node holds tens of one job's) */
#define LIST_REPLY_MAX (256u << 10) /* bytes of one: 768 copies of the longest names fit */
#define JOBS 64                     /* jobs whose copies' holders are remembered (holder_get, sweep) */
#define HOLDER_RANKS (1u << 20)     /* ranks remembered per job */
#define NAMES 65536                 /* peer names remembered (struct peer.names) */
#define DOWN 64                     /* peers that timed out, remembered (open_link) */
#define DOWN_NS (10ull * 1000 * 1000 * 1000)
#define RING_TTL_NS (5ull * 1000 * 1000 * 1000) /* the ring is built again after this (ring_now) */

/* A function run on the loop for a peer thread, which waits for it. */
struct call {
	struct call *next;
	void (*fn)(struct daemon *d, void *arg);
	void *arg;
	bool done;
};

/* One replicated save on its way to its peers. */
struct job {
	struct job *next;
	struct save *sv; /* pinned (readers) until the loop takes the job back */
	struct session *session;
	uint64_t req_id;
	uint32_t want, copies;
	int status;
	char peers[512]; /* who holds a copy, comma-separated */
	char msg[512];   /* why not, when status != 0 */
};

struct peer {
	struct daemon *d;
	struct link_tls tls;
	char self[RING_NAME_MAX];
	int listen_fd;
	uint32_t timeout_ms;
	pthread_t acceptor, sender;
	bool acceptor_started, sender_started;
	uv_async_t async;

	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stopping;
	struct call *calls, **calls_tail;
	struct job *queue, **queue_tail; /* for the sender */
	struct job *done;                /* for the loop */
	/* Connections served now (shut at stop), under mu: max_handshakes
	 * not yet authenticated plus max_connections peers. A connection
	 * holds its slot until its thread ends (conn_forget). */
	struct slot {
		int fd;            /* -1: free */
		bool authed;       /* past its handshake and PeerHello */
		bool evicted;      /* shut to make room: its thread is ending */
		uint64_t since_ns; /* accepted */
		char host[48];     /* its address */
	} * slots;
	unsigned nslots, nconns;
	uint64_t gate_ns[PEER_LIMIT_N + 1]; /* the last refusal logged, per kind (gate) */
	uint64_t gated[PEER_LIMIT_N + 1];   /* refusals not logged since */
	int sender_fd;                      /* the sender's connection now, or -1 */
	/* Where each rank's copies of a job are (holder_get, holder_set,
	 * sweep), under mu: per job, rank -> 1 + an index in names (0:
	 * unknown), so a job of 4096 ranks costs 16 KiB, whatever its ring. */
	struct holders {
		char job[129];
		int swept; /* 0: not yet; 1: being swept; 2: swept */
		uint32_t n;
		uint32_t *at;
	} jobs[JOBS];
	size_t next_job;
	char (*names)[RING_NAME_MAX];
	uint32_t nnames, names_cap;
	/* Peers that did not answer (a connect or handshake that timed out,
	 * or no route): skipped for DOWN_NS, so that a dead node's silence
	 * costs one timeout, not one per request (a load tries its holders in
	 * turn, then storage). Under mu. */
	struct {
		char name[RING_NAME_MAX];
		uint64_t until_ns;
		char why[160];
	} down[DOWN];
	size_t next_down;
	/* The ring after this node (ring_now), and when it was built. */
	char (*ring)[RING_NAME_MAX];
	size_t nring;
	uint64_t ring_at;
	char ring_why[200];
};

static void count(atomic_uint_fast64_t *c, uint64_t n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

/* The largest frame a peer may send: a manifest (ReplicaPut, or the
 * ReplicaData of a get) of a save this node's own limits allow. A save
 * request fits [limits] max_frame_bytes (its names and shapes); the
 * manifest adds offsets and CRCs per tensor and per chunk, and the extra
 * state. So a peer's frame is about 9 MiB at the defaults, not the 256
 * MiB a manifest may be in storage, and it is read into a buffer that
 * grows as bytes arrive (link.h). */
static size_t frame_max(const struct config *c)
{
	return (size_t)c->max_frame_bytes + c->max_extra_state + (size_t)c->max_tensors * 64 + (64u << 10);
}

/* ---- the loop bridge ---- */

static void on_async(uv_async_t *a)
{
	struct peer *p = a->data;
	struct daemon *d = p->d;
	pthread_mutex_lock(&p->mu);
	struct call *c = p->calls;
	p->calls = NULL;
	p->calls_tail = &p->calls;
	struct job *done = p->done;
	p->done = NULL;
	pthread_mutex_unlock(&p->mu);
	while (c) {
		struct call *next = c->next;
		c->fn(d, c->arg);
		pthread_mutex_lock(&p->mu);
		c->done = true;
		pthread_cond_broadcast(&p->cv);
		pthread_mutex_unlock(&p->mu);
		c = next;
	}
	while (done) {
		struct job *next = done->next;
		struct save *sv = done->sv;
		snprintf(sv->replicated_to, sizeof(sv->replicated_to), "%s", done->peers); /* before strtok_r */
		if (--sv->readers == 0 && sv->drop_pending) {
			save_release(sv);
			save_admit_waiting(d);
		}
		if (done->session && d->req_ops->release(done->session)) {
			Ckpt__SaveReplicated ev = CKPT__SAVE_REPLICATED__INIT;
			char *names[16];
			size_t n = 0;
			char *save = NULL;
			for (char *t = strtok_r(done->peers, ",", &save); t && n < 16; t = strtok_r(NULL, ",", &save))
				names[n++] = t;
			ev.copies = done->copies;
			ev.n_peers = n;
			ev.peers = names;
			ev.status = wire_status(done->status);
			ev.message = done->msg;
			Ckpt__Frame f = CKPT__FRAME__INIT;
			f.body_case = CKPT__FRAME__BODY_SAVE_REPLICATED;
			f.save_replicated = &ev;
			d->req_ops->send(done->session, done->req_id, &f);
		}
		free(done);
		done = next;
	}
}

/* Run fn(d, arg) on the loop and wait for it: 0, or -ESHUTDOWN when the
 * daemon stops first (fn then did not run). */
static int loop_call(struct peer *p, void (*fn)(struct daemon *d, void *arg), void *arg)
{
	struct call c = { .fn = fn, .arg = arg };
	pthread_mutex_lock(&p->mu);
	if (p->stopping) {
		pthread_mutex_unlock(&p->mu);
		return -ESHUTDOWN;
	}
	*p->calls_tail = &c;
	p->calls_tail = &c.next;
	pthread_mutex_unlock(&p->mu);
	uv_async_send(&p->async);
	pthread_mutex_lock(&p->mu);
	while (!c.done && !p->stopping)
		pthread_cond_wait(&p->cv, &p->mu);
	bool done = c.done;
	pthread_mutex_unlock(&p->mu);
	return done ? 0 : -ESHUTDOWN;
}

/* ---- saves as peers see them ---- */

/* A save's manifest as a peer gets it: a shard name of the save's own
 * rank (none exists: the copy is in memory only), so that the receiver's
 * manifest_check holds. Public: what a holder of a sealed replica sees
 * (seal.h): no tensors, no extra state, and no CRC of its bytes (one
 * zero per SEAL_CHUNK piece). */
static int pack_manifest(const struct save *sv, bool public, uint8_t **out, size_t *len)
{
	char key[768];
	if (manifest_shard_key(key, sizeof(key), sv->job, sv->step, sv->rank, sv->world_size, sv->attempt, 0, false) <
	    0)
		return -ENAMETOOLONG;
	Ckpt__Manifest m;
	int r = save_manifest_view(sv, &m, strrchr(key, '/') + 1, 0);
	if (r < 0)
		return r;
	m.shard_dir = (char *)""; /* the name above is the step directory's */
	uint32_t *zeros = NULL;
	size_t nt = m.n_tensors;
	if (public) {
		zeros = calloc(seal_pieces(sv->shard_bytes) + 1, sizeof(*zeros));
		m.n_tensors = 0;
		m.extra_state.len = 0;
		m.chunk_bytes = SEAL_CHUNK;
		m.n_chunk_crc32c = seal_pieces(sv->shard_bytes);
		m.chunk_crc32c = zeros;
	}
	*len = ckpt__manifest__get_packed_size(&m);
	*out = public && zeros == NULL ? NULL : malloc(*len ? *len : 1);
	if (*out)
		ckpt__manifest__pack(&m, *out);
	m.n_tensors = nt;
	save_manifest_view_free(&m);
	free(zeros);
	return *out ? 0 : -ENOMEM;
}

/* ---- sealed replicas (seal.h) ---- */

/* Seal sv's manifest mb (ml bytes) with sv's job key. */
static int seal_manifest(const struct save *sv, const uint8_t *mb, size_t ml, struct sealing *z)
{
	int r = seal_nonce(z->nonce);
	if (r == 0)
		r = sealing_aad(z, sv->job, sv->step, sv->rank, sv->world_size, sv->attempt, sv->shard_bytes);
	if (r < 0)
		return r;
	z->sm = malloc(ml + SEAL_TAG_BYTES);
	if (z->sm == NULL)
		return -ENOMEM;
	z->smlen = ml + SEAL_TAG_BYTES;
	z->on = true;
	return seal_piece(sv->key, z->nonce, SEAL_MANIFEST_INDEX, z->aad, z->aadlen, mb, z->sm, ml, z->sm + ml, true);
}

/* Copy n bytes into sv's pool chunks at shard offset off. */
static void shard_write(struct save *sv, uint64_t off, const uint8_t *src, uint64_t n)
{
	const struct pool *pool = &sv->d->pool;
	uint64_t cb = pool->chunk_bytes;
	for (uint64_t done = 0; done < n;) {
		uint64_t c = (off + done) / cb, in = (off + done) % cb;
		uint64_t k = cb - in < n - done ? cb - in : n - done;
		memcpy(pool_span_ptr(pool, sv->chunks[c]) + in, src + done, k);
		done += k;
	}
}

/* sv's pool chunks' CRC32C into chunk_crc; with m, each of m's chunks
 * checked against it (recv_shard does both as bytes arrive). */
static int shard_crcs(struct save *sv, const Ckpt__Manifest *m, char *why, size_t whylen)
{
	const struct pool *pool = &sv->d->pool;
	uint64_t cb = pool->chunk_bytes;
	for (uint32_t c = 0; c < sv->nchunks; c++) {
		uint64_t left = sv->shard_bytes - (uint64_t)c * cb;
		sv->chunk_crc[c] = crc32c_update(0, pool_span_ptr(pool, sv->chunks[c]), left < cb ? left : cb);
	}
	if (m == NULL)
		return 0;
	uint8_t *tmp = malloc(m->chunk_bytes < sv->shard_bytes ? m->chunk_bytes
			      : sv->shard_bytes                ? sv->shard_bytes
							       : 1);
	if (tmp == NULL) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	int r = 0;
	for (size_t i = 0; i < m->n_chunk_crc32c && r == 0; i++) {
		uint64_t off = (uint64_t)i * m->chunk_bytes;
		uint64_t n = sv->shard_bytes - off < m->chunk_bytes ? sv->shard_bytes - off : m->chunk_bytes;
		if (crc32c_update(0, save_shard_bytes(sv, off, n, tmp), n) != m->chunk_crc32c[i]) {
			snprintf(why, whylen, "chunk %zu of the shard failed its CRC32C once opened", i);
			r = -EIO;
		}
	}
	free(tmp);
	return r;
}

/* Send sv's shard sealed with its key: each SEAL_CHUNK piece's
 * ciphertext, then its tag. */
static int send_sealed(struct link *l, const struct save *sv, const struct sealing *z)
{
	uint8_t *tmp = malloc(SEAL_CHUNK), *ct = malloc(SEAL_CHUNK);
	int r = tmp && ct ? 0 : -ENOMEM;
	for (uint64_t i = 0; r == 0 && i < seal_pieces(sv->shard_bytes); i++) {
		uint64_t off = i * SEAL_CHUNK;
		uint64_t n = sv->shard_bytes - off < SEAL_CHUNK ? sv->shard_bytes - off : SEAL_CHUNK;
		uint8_t tag[SEAL_TAG_BYTES];
		r = seal_piece(sv->key, z->nonce, (uint32_t)i, z->aad, z->aadlen, save_shard_bytes(sv, off, n, tmp), ct,
			       n, tag, true);
		if (r == 0)
			r = link_write(l, ct, n);
		if (r == 0)
			r = link_write(l, tag, SEAL_TAG_BYTES);
	}
	free(tmp);
	free(ct);
	return r;
}

/* Where a held sealed replica keeps each piece's tag, and its sealed
 * manifest (save.seal: nonce, tags, sealed manifest). */
static uint8_t *seal_tags(const struct save *sv)
{
	return sv->seal + SEAL_NONCE_BYTES;
}

static size_t seal_sm_off(const struct save *sv)
{
	return SEAL_NONCE_BYTES + seal_pieces(sv->shard_bytes) * SEAL_TAG_BYTES;
}

/* Send a sealed replica held here as it came: ciphertext from the pool,
 * tags from its seal. */
static int send_held_sealed(struct link *l, const struct save *sv)
{
	uint8_t *tmp = malloc(SEAL_CHUNK);
	int r = tmp ? 0 : -ENOMEM;
	for (uint64_t i = 0; r == 0 && i < seal_pieces(sv->shard_bytes); i++) {
		uint64_t off = i * SEAL_CHUNK;
		uint64_t n = sv->shard_bytes - off < SEAL_CHUNK ? sv->shard_bytes - off : SEAL_CHUNK;
		r = link_write(l, save_shard_bytes(sv, off, n, tmp), n);
		if (r == 0)
			r = link_write(l, seal_tags(sv) + i * SEAL_TAG_BYTES, SEAL_TAG_BYTES);
	}
	free(tmp);
	return r;
}

/* Receive a sealed shard: into sv's pool as it comes (a holder, key
 * NULL: ciphertext, tags kept in sv->seal), or opened with key (a
 * restore: every piece authenticated, then m's CRCs checked). */
static int recv_sealed(struct link *l, struct save *sv, const Ckpt__Manifest *m, const uint8_t *key,
		       const struct sealing *z, char *why, size_t whylen)
{
	uint8_t *buf = malloc(SEAL_CHUNK);
	if (buf == NULL) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	int r = 0;
	for (uint64_t i = 0; r == 0 && i < seal_pieces(sv->shard_bytes); i++) {
		uint64_t off = i * SEAL_CHUNK;
		uint64_t n = sv->shard_bytes - off < SEAL_CHUNK ? sv->shard_bytes - off : SEAL_CHUNK;
		uint8_t tag[SEAL_TAG_BYTES];
		r = link_read(l, buf, n);
		if (r == 0)
			r = link_read(l, tag, SEAL_TAG_BYTES);
		if (r < 0) {
			snprintf(why, whylen, "receiving the shard: %s", strerror(-r));
			break;
		}
		if (key == NULL) {
			memcpy(seal_tags(sv) + i * SEAL_TAG_BYTES, tag, SEAL_TAG_BYTES);
		} else if (seal_piece(key, z->nonce, (uint32_t)i, z->aad, z->aadlen, buf, buf, n, tag, false) < 0) {
			snprintf(why, whylen,
				 "piece %" PRIu64
				 " of the shard does not open with this job's key: altered, or another "
				 "copy's",
				 i);
			r = -EIO;
			break;
		}
		shard_write(sv, off, buf, n);
	}
	explicit_bzero(buf, SEAL_CHUNK);
	free(buf);
	return r < 0 ? r : shard_crcs(sv, key ? m : NULL, why, whylen);
}

/* A held-copy object for the manifest m (checked), its chunks not yet
 * reserved. NULL: out of memory. */
static struct save *save_from_manifest(struct daemon *d, const Ckpt__Manifest *m, int tier)
{
	struct save *sv = calloc(1, sizeof(*sv));
	if (sv == NULL)
		return NULL;
	sv->d = d;
	sv->state = SAVE_NEW;
	snprintf(sv->job, sizeof(sv->job), "%s", m->job);
	snprintf(sv->attempt, sizeof(sv->attempt), "%s", m->attempt_id);
	sv->rank = m->rank;
	sv->world_size = m->world_size;
	sv->step = m->step;
	sv->tier = tier == TIER_MEMORY || tier == TIER_REPLICATED ? (enum save_tier)tier : TIER_REPLICATED;
	sv->shard_bytes = m->shard_bytes;
	sv->tensors = calloc(m->n_tensors ? m->n_tensors : 1, sizeof(*sv->tensors));
	uint64_t cb = d->pool.chunk_bytes;
	uint64_t nchunks = m->shard_bytes / cb + (m->shard_bytes % cb != 0);
	sv->chunks = calloc(nchunks ? nchunks : 1, sizeof(*sv->chunks));
	sv->chunk_crc = calloc(nchunks ? nchunks : 1, sizeof(uint32_t));
	if (sv->tensors == NULL || sv->chunks == NULL || sv->chunk_crc == NULL) {
		save_free(sv);
		return NULL;
	}
	sv->nchunks = (uint32_t)nchunks;
	pool_shape(&d->pool, m->shard_bytes, &sv->whole, &sv->tail_slots);
	sv->pool_bytes = pool_shape_bytes(&d->pool, sv->whole, sv->tail_slots);
	for (size_t i = 0; i < m->n_tensors; i++) {
		const Ckpt__ManifestTensor *t = m->tensors[i];
		struct save_tensor *st = &sv->tensors[i];
		uint64_t nelem;
		char why[128];
		(void)box_from_fields(&st->box, t->n_global_shape, t->global_shape, t->n_box_offsets, t->box_offsets,
				      t->n_box_lengths, t->box_lengths, &nelem, why, sizeof(why));
		st->name = strdup(t->name);
		if (st->name == NULL) {
			save_free(sv);
			return NULL;
		}
		sv->ntensors = i + 1;
		st->dtype = t->dtype;
		st->shard_off = t->shard_offset;
		st->nbytes = t->nbytes;
		st->crc = t->crc32c;
	}
	sv->meta_bytes = (uint64_t)sv->ntensors * sizeof(*sv->tensors) + m->extra_state.len;
	for (size_t i = 0; i < sv->ntensors; i++)
		sv->meta_bytes += strlen(sv->tensors[i].name) + 1;
	if (m->extra_state.len) {
		sv->extra = malloc(m->extra_state.len);
		if (sv->extra == NULL) {
			save_free(sv);
			return NULL;
		}
		memcpy(sv->extra, m->extra_state.data, m->extra_state.len);
		sv->extra_len = m->extra_state.len;
	}
	return sv;
}

/* ---- loop calls ---- */

struct reserve {
	struct save *sv;
	bool replica; /* against the share, and reclaimed first */
	int status;
	char msg[200];
};

/* What the replicas held for peers hold now: bytes (of the pool, and of
 * extra state and tensor tables beside it) and how many. */
static uint64_t replica_bytes(struct daemon *d, uint32_t *count)
{
	uint64_t n = 0;
	uint32_t k = 0;
	struct save *o;
	TAILQ_FOREACH (o, &d->held, hlink)
		if (o->replica) {
			n += o->pool_bytes + o->meta_bytes;
			k++;
		}
	*count = k;
	return n;
}

static bool over_share(struct daemon *d, const struct save *sv, uint64_t share)
{
	uint32_t k;
	uint64_t n = replica_bytes(d, &k);
	return n + sv->pool_bytes + sv->meta_bytes > share || k + 1 > d->cfg.peer_max_replicas;
}

static void reserve_on_loop(struct daemon *d, void *arg)
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

static void release_on_loop(struct daemon *d, void *arg)
{
	save_release(arg);
	save_admit_waiting(d);
}

struct commit {
	struct save *sv;
	bool pin;     /* for a load: pinned before it is held */
	bool durable; /* a copy of a step in storage: held as durable */
	int status;
	char msg[200];
};

static void commit_on_loop(struct daemon *d, void *arg)
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

struct find {
	const char *job;
	uint64_t step;
	uint32_t rank, world_size;
	struct save *sv;
};

/* Whether a peer may see held copy sv: a replica held for a peer, or,
 * with [peers] serve_own, this node's own copies too, but never a
 * tenant's (they leave the node sealed, as replicas, or not at all). */
static bool served(const struct daemon *d, const struct save *sv)
{
	return sv->replica || (d->cfg.peer_serve_own && config_tenant_of_job(&d->cfg, sv->job) == NULL);
}

static void find_on_loop(struct daemon *d, void *arg)
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

static void unpin_on_loop(struct daemon *d, void *arg)
{
	struct save *sv = arg;
	if (--sv->readers == 0 && sv->drop_pending) {
		save_release(sv);
		save_admit_waiting(d);
	}
}

struct listing {
	const char *job;
	uint32_t rank;
	bool all_ranks;
	Ckpt__HeldCopy *v;
	size_t n;
	char (*jobs)[129];
	char (*attempts)[129];
};

static void list_on_loop(struct daemon *d, void *arg)
{
	struct listing *l = arg;
	size_t n = 0;
	struct save *sv;
	TAILQ_FOREACH (sv, &d->held, hlink)
		if ((l->all_ranks || sv->rank == l->rank) && strcmp(sv->job, l->job) == 0 && served(d, sv) &&
		    n < LIST_MAX)
			n++;
	l->v = calloc(n ? n : 1, sizeof(*l->v));
	l->jobs = calloc(n ? n : 1, sizeof(*l->jobs));
	l->attempts = calloc(n ? n : 1, sizeof(*l->attempts));
	if (l->v == NULL || l->jobs == NULL || l->attempts == NULL)
		return;
	/* Newest first: what a load asks for, when there are more than
	 * LIST_MAX. */
	TAILQ_FOREACH_REVERSE(sv, &d->held, save_list, hlink)
	{
		if ((!l->all_ranks && sv->rank != l->rank) || strcmp(sv->job, l->job) != 0 || sv->drop_pending ||
		    !served(d, sv))
			continue;
		if (l->n == n)
			break;
		/* Copied: the reply is sent off the loop, when sv may be gone. */
		Ckpt__HeldCopy *h = &l->v[l->n];
		save_held_view(sv, h, 0);
		snprintf(l->jobs[l->n], sizeof(l->jobs[0]), "%s", sv->job);
		snprintf(l->attempts[l->n], sizeof(l->attempts[0]), "%s", sv->attempt);
		h->job = l->jobs[l->n];
		h->attempt_id = l->attempts[l->n];
		l->n++;
	}
}

/* ---- a shard on the wire ---- */

/* Send sv's shard from the pool (sv pinned); corrupt: its first byte
 * flipped on the wire ([debug] corrupt_replica: the receiver's CRC check
 * must refuse it). */
static int send_shard(struct link *l, const struct save *sv, bool corrupt)
{
	const struct pool *pool = &sv->d->pool;
	uint32_t c = 0;
	if (corrupt && sv->nchunks > 0 && sv->shard_bytes > 0) {
		const uint8_t *first = pool_span_ptr(pool, sv->chunks[0]);
		uint8_t b = first[0] ^ 0x5a;
		uint64_t len = sv->shard_bytes < pool->chunk_bytes ? sv->shard_bytes : pool->chunk_bytes;
		int r = link_write(l, &b, 1);
		if (r == 0)
			r = link_write(l, first + 1, len - 1);
		if (r < 0)
			return r;
		c = 1;
	}
	for (; c < sv->nchunks; c++) {
		uint64_t left = sv->shard_bytes - (uint64_t)c * pool->chunk_bytes;
		int r = link_write(l, pool_span_ptr(pool, sv->chunks[c]),
				   left < pool->chunk_bytes ? left : pool->chunk_bytes);
		if (r < 0)
			return r;
	}
	return 0;
}

/* Receive m's shard into sv's chunks (reserved), checking every chunk
 * of the sender's against m's CRC32C and taking this pool's own. */
static int recv_shard(struct link *l, struct save *sv, const Ckpt__Manifest *m, char *why, size_t whylen)
{
	const struct pool *pool = &sv->d->pool;
	uint64_t mcb = m->chunk_bytes, mpos = 0;
	uint32_t mcrc = 0;
	size_t mi = 0;
	int bad = 0;
	for (uint32_t c = 0; c < sv->nchunks; c++) {
		uint64_t left = sv->shard_bytes - (uint64_t)c * pool->chunk_bytes;
		uint64_t len = left < pool->chunk_bytes ? left : pool->chunk_bytes;
		uint8_t *buf = pool_span_ptr(pool, sv->chunks[c]);
		int r = link_read(l, buf, len);
		if (r < 0) {
			snprintf(why, whylen, "receiving the shard: %s", strerror(-r));
			return r;
		}
		sv->chunk_crc[c] = crc32c_update(0, buf, len);
		for (uint64_t at = 0; at < len;) {
			uint64_t n = mcb - mpos < len - at ? mcb - mpos : len - at;
			mcrc = crc32c_update(mcrc, buf + at, n);
			at += n;
			mpos += n;
			uint64_t shard_at = (uint64_t)c * pool->chunk_bytes + at;
			if (mpos == mcb || shard_at == sv->shard_bytes) {
				/* Read on to the end all the same: the stream must stay
				 * in step for the answer. */
				if (mcrc != m->chunk_crc32c[mi] && bad == 0) {
					snprintf(why, whylen, "chunk %zu of the shard failed its CRC32C on arrival",
						 mi);
					bad = -EIO;
				}
				mi++;
				mpos = 0;
				mcrc = 0;
			}
		}
	}
	return bad;
}

/* ---- serving a peer ---- */

static void reply_status(struct link *l, Ckpt__PeerFrame__BodyCase body, int status, const char *msg)
{
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	Ckpt__ReplicaReady rd = CKPT__REPLICA_READY__INIT;
	Ckpt__ReplicaAck ack = CKPT__REPLICA_ACK__INIT;
	f.body_case = body;
	if (body == CKPT__PEER_FRAME__BODY_READY) {
		rd.status = wire_status(status);
		rd.message = (char *)msg;
		f.ready = &rd;
	} else {
		ack.status = wire_status(status);
		ack.message = (char *)msg;
		f.ack = &ack;
	}
	(void)link_send(l, &f);
}

static size_t ring_now(struct peer *p, size_t max, char (**out)[RING_NAME_MAX], char *why, size_t whylen);

/* Whether this node holds from's replicas: from is one of its [peers]
 * replicas (K) predecessors in the ring, as from's own ring_now puts it
 * (ring_now lists the others in ring order after this node, so from's
 * successors include this node when from is among the last K). */
static bool holder_for(struct peer *p, const char *from)
{
	char(*ring)[RING_NAME_MAX] = NULL;
	char why[200] = "";
	size_t n = ring_now(p, RING_MAX, &ring, why, sizeof(why));
	size_t k = p->d->cfg.peer_replicas;
	bool ok = false;
	for (size_t i = 0; i < n; i++)
		if (strcmp(ring[i], from) == 0)
			ok = n <= k || i >= n - k;
	free(ring);
	return ok;
}

/* ReplicaPut: check, reserve within the share, receive, hold. Only from
 * a peer whose replicas go here (holder_for). false: the connection
 * cannot go on. */
static bool serve_put(struct peer *p, struct link *l, const Ckpt__ReplicaPut *put, const char *from)
{
	struct daemon *d = p->d;
	Ckpt__Manifest *m = NULL;
	char why[300];
	bool sealed = false;
	struct put_limits lim = { d->cfg.max_tensors, d->cfg.max_extra_state, d->pool.bytes };
	int r = peer_msg_put(put, &lim, &m, &sealed, why, sizeof(why));
	if (r == 0 && !holder_for(p, from)) {
		r = -EPERM;
		snprintf(why, sizeof(why),
			 "%s is not one of the %u peers before this node in its ring ([peers] replicas): its replicas "
			 "go to other nodes",
			 from, d->cfg.peer_replicas);
	}
	struct save *sv = r == 0 ? save_from_manifest(d, m, (int)put->tier) : NULL;
	if (r == 0 && sv == NULL) {
		r = -ENOMEM;
		snprintf(why, sizeof(why), "out of memory");
	}
	if (r == 0 && sealed) {
		sv->seal_len = SEAL_NONCE_BYTES + seal_pieces(m->shard_bytes) * SEAL_TAG_BYTES +
			       put->sealed_manifest.len;
		sv->seal = malloc(sv->seal_len);
		if (sv->seal == NULL) {
			r = -ENOMEM;
			snprintf(why, sizeof(why), "out of memory");
		} else {
			memcpy(sv->seal, put->seal_nonce.data, SEAL_NONCE_BYTES);
			memcpy(sv->seal + seal_sm_off(sv), put->sealed_manifest.data, put->sealed_manifest.len);
			sv->meta_bytes += sv->seal_len;
		}
	}
	struct reserve rs = { .sv = sv, .replica = true };
	if (r == 0) {
		sv->replica = true;
		snprintf(sv->peer, sizeof(sv->peer), "%s", from);
		r = loop_call(p, reserve_on_loop, &rs);
		if (r == 0 && rs.status < 0) {
			r = rs.status;
			snprintf(why, sizeof(why), "%s", rs.msg);
		}
	}
	if (r < 0) {
		if (sv)
			save_free(sv); /* no chunks */
		if (m)
			ckpt__manifest__free_unpacked(m, NULL);
		log_warn("peers: refused a replica from %s: %s", from, why);
		reply_status(l, CKPT__PEER_FRAME__BODY_READY, r, why);
		return r != -EBADMSG && r != -ESHUTDOWN;
	}
	reply_status(l, CKPT__PEER_FRAME__BODY_READY, 0, "");
	r = sealed ? recv_sealed(l, sv, NULL, NULL, NULL, why, sizeof(why)) : recv_shard(l, sv, m, why, sizeof(why));
	struct commit c = { .sv = sv };
	if (r == 0 && loop_call(p, commit_on_loop, &c) == 0) {
		count(&d->stats.peer_bytes_received, sv->shard_bytes);
		log_debug("peers: holding %s step %" PRIu64 " rank %u for %s (%" PRIu64 " bytes)", m->job, m->step,
			  m->rank, from, m->shard_bytes);
		reply_status(l, CKPT__PEER_FRAME__BODY_ACK, c.status, c.msg);
		ckpt__manifest__free_unpacked(m, NULL);
		return true;
	}
	if (r == 0) {
		r = -ESHUTDOWN;
		snprintf(why, sizeof(why), "ckptd is stopping");
	}
	if (loop_call(p, release_on_loop, sv) < 0)
		log_warn("peers: a replica's pool space stays reserved: ckptd is stopping");
	log_warn("peers: a replica of %s step %" PRIu64 " rank %u from %s failed: %s", m->job, m->step, m->rank, from,
		 why);
	count(&d->stats.peer_link_errors, 1);
	ckpt__manifest__free_unpacked(m, NULL);
	if (r != -EIO)
		return false; /* the stream is broken */
	reply_status(l, CKPT__PEER_FRAME__BODY_ACK, r, why);
	return true;
}

/* ReplicaGet: the copy of (job, step, rank) held here, if any. */
static bool serve_get(struct peer *p, struct link *l, const Ckpt__ReplicaGet *g)
{
	struct find f = { .job = g->job, .step = g->step, .rank = g->rank, .world_size = g->world_size };
	Ckpt__PeerFrame out = CKPT__PEER_FRAME__INIT;
	Ckpt__ReplicaData data = CKPT__REPLICA_DATA__INIT;
	out.body_case = CKPT__PEER_FRAME__BODY_DATA;
	out.data = &data;
	if (loop_call(p, find_on_loop, &f) < 0)
		return false;
	uint8_t *mb = NULL;
	size_t ml = 0;
	if (f.sv == NULL) {
		data.status = wire_status(-ENOENT);
		data.message = (char *)"no copy of it is held here";
	} else if (pack_manifest(f.sv, f.sv->seal != NULL, &mb, &ml) < 0) {
		data.status = wire_status(-ENOMEM);
		data.message = (char *)"out of memory";
	} else {
		data.manifest.data = mb;
		data.manifest.len = ml;
		if (f.sv->seal) { /* as it was put: its seal, then ciphertext and tags */
			data.seal_nonce.data = f.sv->seal;
			data.seal_nonce.len = SEAL_NONCE_BYTES;
			data.sealed_manifest.data = f.sv->seal + seal_sm_off(f.sv);
			data.sealed_manifest.len = f.sv->seal_len - seal_sm_off(f.sv);
		}
	}
	int r = link_send(l, &out);
	if (r == 0 && f.sv && mb && !g->manifest_only) {
		r = f.sv->seal ? send_held_sealed(l, f.sv) : send_shard(l, f.sv, false);
		if (r == 0)
			count(&p->d->stats.peer_bytes_sent, f.sv->shard_bytes);
	}
	free(mb);
	if (f.sv)
		(void)loop_call(p, unpin_on_loop, f.sv);
	return r == 0;
}

static bool serve_list(struct peer *p, struct link *l, const Ckpt__ReplicaList *q)
{
	struct listing ls = { .job = q->job, .rank = q->rank, .all_ranks = q->all_ranks };
	if (loop_call(p, list_on_loop, &ls) < 0)
		return false;
	Ckpt__HeldCopy **ptrs = calloc(ls.n ? ls.n : 1, sizeof(*ptrs));
	for (size_t i = 0; ptrs && i < ls.n; i++)
		ptrs[i] = &ls.v[i];
	Ckpt__ReplicaListReply rep = CKPT__REPLICA_LIST_REPLY__INIT;
	rep.n_held = ptrs ? ls.n : 0;
	rep.held = ptrs;
	Ckpt__PeerFrame out = CKPT__PEER_FRAME__INIT;
	out.body_case = CKPT__PEER_FRAME__BODY_LIST_REPLY;
	out.list_reply = &rep;
	int r = link_send(l, &out);
	free(ptrs);
	free(ls.v);
	free(ls.jobs);
	free(ls.attempts);
	return r == 0;
}

struct conn {
	struct peer *p;
	int fd, slot;
	char addr[64];
};

/* The connection in slot i ends: its slot is free (before its socket is
 * closed, so that no one shuts a number reused meanwhile). */
static void conn_forget(struct peer *p, int i)
{
	pthread_mutex_lock(&p->mu);
	p->slots[i].fd = -1;
	p->nconns--;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

/* Whether to log a refusal of kind now (under mu): one line a second per
 * kind at most, saying how many were not logged since, so that a flood
 * of connections is counted (the metric) without flooding the log. */
static bool gate(struct peer *p, int kind, uint64_t *skipped)
{
	uint64_t now = clock_now_ns();
	if (p->gate_ns[kind] && now - p->gate_ns[kind] < 1000000000ull) {
		p->gated[kind]++;
		return false;
	}
	p->gate_ns[kind] = now;
	*skipped = p->gated[kind];
	p->gated[kind] = 0;
	return true;
}

static void refuse(struct peer *p, enum peer_limit_kind kind)
{
	count(&p->d->stats.peer_refused[kind], 1);
}

/* Count the slots of connections not shut to make room: not yet
 * authenticated, authenticated, and from host (under mu). */
static void slot_counts(const struct peer *p, const char *host, unsigned *hand, unsigned *authed, unsigned *from)
{
	*hand = *authed = *from = 0;
	for (unsigned i = 0; i < p->nslots; i++) {
		const struct slot *sl = &p->slots[i];
		if (sl->fd < 0 || sl->evicted)
			continue;
		*hand += !sl->authed;
		*authed += sl->authed;
		*from += host && strcmp(sl->host, host) == 0;
	}
}

/* The slot (its index) for a connection from host just accepted (under
 * mu), or -1 with why. An address with [peers] max_per_address
 * authenticated peers gets no more. Connections still in their handshake
 * make room for a new one: an address at max_per_address gives up its
 * own oldest, else, at max_handshakes, the oldest of all is shut; so
 * connections that never finish a handshake cannot keep a peer out.
 * max_connections is checked once authenticated (conn_authed). */
static int slot_take(struct peer *p, int fd, const char *host, char *why, size_t whylen)
{
	const struct config *c = &p->d->cfg;
	unsigned hand, authed, from, authed_from = 0;
	slot_counts(p, host, &hand, &authed, &from);
	for (unsigned i = 0; i < p->nslots; i++)
		authed_from += p->slots[i].fd >= 0 && p->slots[i].authed && strcmp(p->slots[i].host, host) == 0;
	uint64_t skipped = 0;
	if (authed_from >= c->peer_max_per_address) {
		refuse(p, PEER_LIMIT_PER_ADDRESS);
		if (gate(p, PEER_LIMIT_PER_ADDRESS, &skipped))
			snprintf(why, whylen, "%u peers from it at once already ([peers] max_per_address)%s",
				 authed_from, skipped ? " (and more refused, not logged)" : "");
		return -1;
	}
	/* Room among the handshakes: an address at its cap gives up its own
	 * oldest, else the oldest of all gives way. */
	bool mine = from >= c->peer_max_per_address;
	if (mine || hand >= c->peer_max_handshakes) {
		struct slot *old = NULL;
		for (unsigned i = 0; i < p->nslots; i++) {
			struct slot *sl = &p->slots[i];
			if (sl->fd >= 0 && !sl->authed && !sl->evicted && (!mine || strcmp(sl->host, host) == 0) &&
			    (old == NULL || sl->since_ns < old->since_ns))
				old = sl;
		}
		if (old) {
			refuse(p, mine ? PEER_LIMIT_PER_ADDRESS : PEER_LIMIT_HANDSHAKES);
			if (gate(p, PEER_LIMIT_HANDSHAKES, &skipped))
				log_warn("peers: closed a connection from %s still in its handshake after %" PRIu64
					 " ms, for a new one: %u at once ([peers] %s)%s",
					 old->host, (clock_now_ns() - old->since_ns) / 1000000, mine ? from : hand,
					 mine ? "max_per_address" : "max_handshakes",
					 skipped ? " (more since, not logged)" : "");
			old->evicted = true;
			shutdown(old->fd, SHUT_RDWR);
		}
	}
	for (unsigned i = 0; i < p->nslots; i++)
		if (p->slots[i].fd < 0) {
			struct slot *sl = &p->slots[i];
			memset(sl, 0, sizeof(*sl));
			sl->fd = fd;
			sl->since_ns = clock_now_ns();
			snprintf(sl->host, sizeof(sl->host), "%s", host);
			p->nconns++;
			return (int)i;
		}
	/* Every slot is taken by connections still closing. */
	refuse(p, PEER_LIMIT_HANDSHAKES);
	if (gate(p, PEER_LIMIT_HANDSHAKES, &skipped))
		snprintf(why, whylen, "%u connections at once already", p->nslots);
	return -1;
}

/* The connection on fd authenticated (its certificate, then PeerHello):
 * false when [peers] max_connections peers are served already. */
static bool conn_authed(struct peer *p, int slot, const char *from)
{
	pthread_mutex_lock(&p->mu);
	unsigned hand, authed, n;
	slot_counts(p, NULL, &hand, &authed, &n);
	bool ok = authed < p->d->cfg.peer_max_connections;
	uint64_t skipped = 0;
	if (ok)
		p->slots[slot].authed = true;
	if (!ok) {
		refuse(p, PEER_LIMIT_CONNECTIONS);
		if (gate(p, PEER_LIMIT_CONNECTIONS, &skipped))
			log_warn("peers: closed a connection from %s: %u peers served at once already ([peers] "
				 "max_connections)%s",
				 from, authed, skipped ? " (more since, not logged)" : "");
	}
	pthread_mutex_unlock(&p->mu);
	return ok;
}

static void *serve_conn(void *arg)
{
	struct conn *cn = arg;
	struct peer *p = cn->p;
	int fd = cn->fd;
	struct link l;
	char err[300];
	uint64_t skipped = 0;
	int r = link_accept(&p->tls, fd, p->timeout_ms, p->d->cfg.peer_min_rate, &l, err, sizeof(err));
	if (r < 0) {
		pthread_mutex_lock(&p->mu);
		bool evicted = p->slots[cn->slot].evicted;
		bool say = !evicted && gate(p, PEER_LIMIT_N, &skipped);
		pthread_mutex_unlock(&p->mu);
		if (r == -ETIMEDOUT)
			refuse(p, PEER_LIMIT_DEADLINE);
		if (say)
			log_warn("peers: refused a connection from %s: %s%s", cn->addr, err,
				 skipped ? " (more since, not logged)" : "");
		if (!evicted)
			count(&p->d->stats.peer_link_errors, 1);
		conn_forget(p, cn->slot);
		close(fd);
		free(cn);
		return NULL;
	}
	Ckpt__PeerFrame *f = NULL;
	char from[RING_NAME_MAX] = "";
	r = link_recv(&l, 4096, &f);
	if (r == 0 && f->body_case == CKPT__PEER_FRAME__BODY_HELLO &&
	    (f->hello->protocol_version == PEER_PROTOCOL_VERSION ||
	     f->hello->protocol_version == PEER_PROTOCOL_SEALED) &&
	    f->hello->node[0] && strlen(f->hello->node) < sizeof(from)) {
		snprintf(from, sizeof(from), "%s", f->hello->node);
	} else {
		log_warn("peers: %s did not open with a PeerHello of version %d%s; closed", cn->addr,
			 PEER_PROTOCOL_VERSION, r == -ETIMEDOUT ? " in time ([peers] timeout_ms)" : "");
		count(&p->d->stats.peer_link_errors, 1);
		if (r == -ETIMEDOUT)
			refuse(p, PEER_LIMIT_DEADLINE);
	}
	if (f)
		ckpt__peer_frame__free_unpacked(f, NULL);
	/* The name it gives is its certificate's ([peers] verify_names): a
	 * peer speaks, and puts replicas, only as itself. */
	if (from[0] && p->d->cfg.peer_verify_names && !link_peer_named(&l, from)) {
		log_warn("peers: %s said it is %s, which its certificate does not name ([peers] verify_names); closed",
			 cn->addr, from);
		count(&p->d->stats.peer_link_errors, 1);
		from[0] = '\0';
	}
	bool go = from[0] != '\0' && conn_authed(p, cn->slot, from);
	while (go) {
		f = NULL;
		r = link_recv(&l, frame_max(&p->d->cfg), &f);
		if (r == -EMSGSIZE) {
			uint64_t skipped = 0;
			refuse(p, PEER_LIMIT_FRAME_BYTES);
			pthread_mutex_lock(&p->mu);
			bool say = gate(p, PEER_LIMIT_FRAME_BYTES, &skipped);
			pthread_mutex_unlock(&p->mu);
			if (say)
				log_warn("peers: closed the connection of %s: a frame larger than %zu bytes, the "
					 "largest "
					 "manifest this node's [limits] allow%s",
					 from, frame_max(&p->d->cfg), skipped ? " (more since, not logged)" : "");
		}
		if (r < 0) {
			/* The peer's end, or an idle link it left; a frame it began and
			 * did not finish by its deadline is a refusal. */
			if (r != -EPIPE && r != -ETIMEDOUT)
				count(&p->d->stats.peer_link_errors, 1);
			break;
		}
		switch (f->body_case) {
		case CKPT__PEER_FRAME__BODY_PUT: go = serve_put(p, &l, f->put, from); break;
		case CKPT__PEER_FRAME__BODY_GET: go = serve_get(p, &l, f->get); break;
		case CKPT__PEER_FRAME__BODY_LIST: go = serve_list(p, &l, f->list); break;
		default:
			log_warn("peers: %s sent an unexpected message (%d); closed", from, (int)f->body_case);
			count(&p->d->stats.peer_link_errors, 1);
			go = false;
		}
		ckpt__peer_frame__free_unpacked(f, NULL);
	}
	conn_forget(p, cn->slot);
	link_close(&l);
	free(cn);
	return NULL;
}

static void *acceptor_main(void *arg)
{
	struct peer *p = arg;
	for (;;) {
		struct sockaddr_storage sa;
		socklen_t sl = sizeof(sa);
		int fd = accept4(p->listen_fd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC);
		pthread_mutex_lock(&p->mu);
		bool stop = p->stopping;
		pthread_mutex_unlock(&p->mu);
		if (stop) {
			if (fd >= 0)
				close(fd);
			return NULL;
		}
		if (fd < 0) {
			if (errno != EINTR && errno != ECONNABORTED)
				usleep(100 * 1000); /* out of fds: back off */
			continue;
		}
		struct conn *cn = calloc(1, sizeof(*cn));
		char host[48] = "?", serv[16] = "", why[200] = "";
		getnameinfo((struct sockaddr *)&sa, sl, host, sizeof(host), serv, sizeof(serv),
			    NI_NUMERICHOST | NI_NUMERICSERV);
		pthread_mutex_lock(&p->mu);
		int slot = cn ? slot_take(p, fd, host, why, sizeof(why)) : -1;
		pthread_mutex_unlock(&p->mu);
		pthread_t t;
		pthread_attr_t at;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		if (slot >= 0) {
			cn->p = p;
			cn->fd = fd;
			cn->slot = slot;
			snprintf(cn->addr, sizeof(cn->addr), "%s:%s", host, serv);
			if (pthread_create(&t, &at, serve_conn, cn) != 0) {
				conn_forget(p, slot);
				snprintf(why, sizeof(why), "cannot start a thread for it");
				slot = -1;
			}
		}
		pthread_attr_destroy(&at);
		if (slot < 0) {
			if (why[0])
				log_warn("peers: refused a connection from %s: %s", host, why);
			close(fd);
			free(cn);
		}
	}
}

/* ---- the ring, now ---- */

/* The other nodes of the ring of [peers] peers and what dns resolves
 * to, in ring order after this one, at most max. Returns how many, in
 * *out (malloc'd); 0 with why when none. */
static size_t ring_build_now(struct peer *p, size_t max, char (**out)[RING_NAME_MAX], char *why, size_t whylen)
{
	const struct config *c = &p->d->cfg;
	char *extra[256] = { NULL };
	size_t nextra = 0;
	char host[256], port[16];
	*out = NULL;
	if (c->peer_dns[0] && link_split(c->peer_dns, host, sizeof(host), port, sizeof(port)) == 0) {
		struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL;
		if (getaddrinfo(host, port, &hints, &res) == 0) {
			for (struct addrinfo *ai = res; ai && nextra < 256; ai = ai->ai_next) {
				char ip[64];
				if (getnameinfo(ai->ai_addr, ai->ai_addrlen, ip, sizeof(ip), NULL, 0, NI_NUMERICHOST) !=
				    0)
					continue;
				char *name = malloc(RING_NAME_MAX);
				if (name == NULL)
					break;
				snprintf(name, RING_NAME_MAX, strchr(ip, ':') ? "[%s]:%s" : "%s:%s", ip, port);
				extra[nextra++] = name;
			}
			freeaddrinfo(res);
		} else {
			snprintf(why, whylen, "resolving %s found no peer", c->peer_dns);
		}
	}
	struct ring r;
	size_t n = 0;
	if (ring_build(&r, p->self, c->peer_list, (const char *const *)extra, nextra) == 0) {
		const char **names = calloc(r.n ? r.n : 1, sizeof(*names));
		*out = calloc(r.n ? r.n : 1, sizeof(**out));
		if (names && *out) {
			n = ring_successors(&r, p->self, max > UINT32_MAX ? UINT32_MAX : (uint32_t)max, names, r.n);
			for (size_t i = 0; i < n; i++)
				snprintf((*out)[i], RING_NAME_MAX, "%s", names[i]);
		}
		free(names);
		ring_free(&r);
	} else {
		snprintf(why, whylen, "the [peers] list is not valid");
	}
	for (size_t i = 0; i < nextra; i++)
		free(extra[i]);
	if (n == 0 && why[0] == '\0')
		snprintf(why, whylen, "no peer besides this node in the ring");
	if (n == 0) {
		free(*out);
		*out = NULL;
	}
	return n;
}

/* ring_build_now's answer, at most RING_TTL_NS old: a load asks its
 * copies' holders per shard, and the ring (a DNS lookup of every peer,
 * sorted) does not change that fast. This node's replicas go to the
 * first [peers] replicas of them. */
static size_t ring_now(struct peer *p, size_t max, char (**out)[RING_NAME_MAX], char *why, size_t whylen)
{
	uint64_t now = clock_now_ns();
	pthread_mutex_lock(&p->mu);
	if (p->ring_at == 0 || now - p->ring_at > RING_TTL_NS) {
		pthread_mutex_unlock(&p->mu);
		char(*fresh)[RING_NAME_MAX] = NULL;
		char fwhy[200] = "";
		size_t n = ring_build_now(p, RING_MAX, &fresh, fwhy, sizeof(fwhy));
		pthread_mutex_lock(&p->mu);
		free(p->ring);
		p->ring = fresh;
		p->nring = n;
		snprintf(p->ring_why, sizeof(p->ring_why), "%s", fwhy);
		p->ring_at = now;
	}
	size_t n = p->nring < max ? p->nring : max;
	*out = n ? malloc(n * sizeof(**out)) : NULL;
	if (*out)
		memcpy(*out, p->ring, n * sizeof(**out));
	else
		n = 0;
	if (n == 0)
		snprintf(why, whylen, "%s", p->ring_why[0] ? p->ring_why : "out of memory");
	pthread_mutex_unlock(&p->mu);
	return n;
}

/* The remembered holders of job (under mu), made if make (another job's
 * place taken, the oldest not being swept); NULL if none. */
static struct holders *holders_of(struct peer *p, const char *job, bool make)
{
	for (size_t i = 0; i < JOBS; i++)
		if (p->jobs[i].job[0] && strcmp(p->jobs[i].job, job) == 0)
			return &p->jobs[i];
	if (!make)
		return NULL;
	for (size_t k = 0; k < JOBS; k++) {
		struct holders *h = &p->jobs[p->next_job++ % JOBS];
		if (h->swept == 1)
			continue;
		free(h->at);
		memset(h, 0, sizeof(*h));
		snprintf(h->job, sizeof(h->job), "%s", job);
		return h;
	}
	return NULL;
}

/* The peer that last said it holds copies of (job, rank) (peer_list,
 * sweep), or "" : a node that came back under another name, or a load
 * that reshards (it needs other ranks' copies, held by other nodes'
 * successors), finds the copies by asking around once, then goes
 * straight there. */
static void holder_get(struct peer *p, const char *job, uint32_t rank, char *out, size_t len)
{
	out[0] = '\0';
	pthread_mutex_lock(&p->mu);
	struct holders *h = holders_of(p, job, false);
	if (h && rank < h->n && h->at[rank])
		snprintf(out, len, "%s", p->names[h->at[rank] - 1]);
	pthread_mutex_unlock(&p->mu);
}

/* 1 + the index of name in p->names, added if new; 0 when full. */
static uint32_t name_index(struct peer *p, const char *name)
{
	for (uint32_t i = 0; i < p->nnames; i++)
		if (strcmp(p->names[i], name) == 0)
			return i + 1;
	if (p->nnames == p->names_cap) {
		uint32_t nc = p->names_cap ? 2 * p->names_cap : 16;
		void *nv = nc <= NAMES ? realloc(p->names, nc * sizeof(*p->names)) : NULL;
		if (nv == NULL)
			return 0;
		p->names = nv;
		p->names_cap = nc;
	}
	snprintf(p->names[p->nnames], sizeof(p->names[0]), "%s", name);
	return ++p->nnames;
}

static void holder_set(struct peer *p, const char *job, uint32_t rank, const char *peer)
{
	if (rank >= HOLDER_RANKS)
		return;
	pthread_mutex_lock(&p->mu);
	struct holders *h = holders_of(p, job, true);
	uint32_t idx = name_index(p, peer);
	if (h && idx && rank >= h->n) {
		uint32_t nn = h->n ? h->n : 64;
		while (nn <= rank)
			nn *= 2;
		uint32_t *na = realloc(h->at, nn * sizeof(*na));
		if (na) {
			memset(na + h->n, 0, (nn - h->n) * sizeof(*na));
			h->at = na;
			h->n = nn;
		}
	}
	if (h && idx && rank < h->n)
		h->at[rank] = idx;
	pthread_mutex_unlock(&p->mu);
}

static int say_hello(struct peer *p, struct link *l, uint32_t version)
{
	Ckpt__PeerHello h = CKPT__PEER_HELLO__INIT;
	h.protocol_version = version;
	h.node = p->self;
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	f.body_case = CKPT__PEER_FRAME__BODY_HELLO;
	f.hello = &h;
	return link_send(l, &f);
}

/* Connect to peer name and say hello, as version (PEER_PROTOCOL_SEALED
 * only to put a sealed replica, so that older peers still take the
 * rest). */
static int open_link(struct peer *p, const char *name, uint32_t version, struct link *l, char *why, size_t whylen)
{
	char err[300] = "";
	uint64_t now = clock_now_ns();
	pthread_mutex_lock(&p->mu);
	for (size_t i = 0; i < DOWN; i++)
		if (p->down[i].until_ns > now && strcmp(p->down[i].name, name) == 0) {
			snprintf(why, whylen, "not asked again for %" PRIu64 " s: %s",
				 (p->down[i].until_ns - now) / 1000000000 + 1, p->down[i].why);
			pthread_mutex_unlock(&p->mu);
			l->fd = -1;
			l->ssl = NULL;
			return -EHOSTDOWN;
		}
	pthread_mutex_unlock(&p->mu);
	int r = link_connect(&p->tls, name, p->timeout_ms, p->d->cfg.peer_min_rate, l, err, sizeof(err));
	if (r == 0)
		r = say_hello(p, l, version);
	if (r < 0) {
		snprintf(why, whylen, "%s", err);
		link_close(l);
		count(&p->d->stats.peer_link_errors, 1);
	}
	if (r == -ETIMEDOUT || r == -EHOSTUNREACH || r == -ENETUNREACH) {
		pthread_mutex_lock(&p->mu);
		size_t at = p->next_down++ % DOWN;
		for (size_t i = 0; i < DOWN; i++)
			if (strcmp(p->down[i].name, name) == 0)
				at = i;
		snprintf(p->down[at].name, sizeof(p->down[at].name), "%s", name);
		snprintf(p->down[at].why, sizeof(p->down[at].why), "%s", err);
		p->down[at].until_ns = clock_now_ns() + DOWN_NS;
		pthread_mutex_unlock(&p->mu);
	}
	return r;
}

/* ---- replicating: the sender thread ---- */

/* Put sv on the peer named name. 0, or -errno and why. */
static int put_one(struct peer *p, const struct save *sv, const uint8_t *mb, size_t ml, const struct sealing *z,
		   const char *name, char *why, size_t whylen)
{
	struct link l;
	char err[300] = "";
	int r = open_link(p, name, z->on ? PEER_PROTOCOL_SEALED : PEER_PROTOCOL_VERSION, &l, err, sizeof(err));
	if (r < 0) {
		snprintf(why, whylen, "%s", err);
		return r;
	}
	pthread_mutex_lock(&p->mu);
	p->sender_fd = l.fd;
	pthread_mutex_unlock(&p->mu);
	Ckpt__ReplicaPut put = CKPT__REPLICA_PUT__INIT;
	put.manifest.data = (uint8_t *)mb;
	put.manifest.len = ml;
	put.tier = (Ckpt__Tier)sv->tier;
	if (z->on) {
		put.seal_nonce.data = (uint8_t *)z->nonce;
		put.seal_nonce.len = SEAL_NONCE_BYTES;
		put.sealed_manifest.data = z->sm;
		put.sealed_manifest.len = z->smlen;
	}
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	f.body_case = CKPT__PEER_FRAME__BODY_PUT;
	f.put = &put;
	Ckpt__PeerFrame *in = NULL;
	r = link_send(&l, &f);
	if (r == 0)
		r = link_recv(&l, 64 << 10, &in);
	if (r == 0 && in->body_case != CKPT__PEER_FRAME__BODY_READY)
		r = -EPROTO;
	if (r == 0 && in->ready->status != 0) {
		r = wire_errno(in->ready->status);
		snprintf(why, whylen, "%s", in->ready->message);
	}
	if (in)
		ckpt__peer_frame__free_unpacked(in, NULL);
	in = NULL;
	if (r == 0)
		r = z->on ? send_sealed(&l, sv, z) : send_shard(&l, sv, p->d->cfg.debug_corrupt_replica);
	if (r == 0)
		r = link_recv(&l, 64 << 10, &in);
	if (r == 0 && in->body_case != CKPT__PEER_FRAME__BODY_ACK)
		r = -EPROTO;
	if (r == 0 && in->ack->status != 0) {
		r = wire_errno(in->ack->status);
		snprintf(why, whylen, "%s", in->ack->message);
	}
	if (in)
		ckpt__peer_frame__free_unpacked(in, NULL);
	if (r < 0 && why[0] == '\0')
		snprintf(why, whylen, "%s", r == -ETIMEDOUT ? "timed out ([peers] timeout_ms)" : strerror(-r));
	pthread_mutex_lock(&p->mu);
	p->sender_fd = -1;
	pthread_mutex_unlock(&p->mu);
	link_close(&l);
	if (r < 0 && r != -ENOSPC && r != -ESTALE)
		count(&p->d->stats.peer_link_errors, 1);
	return r;
}

static void replicate(struct peer *p, struct job *j)
{
	struct save *sv = j->sv;
	char(*targets)[RING_NAME_MAX] = NULL;
	char why[300] = "";
	size_t n = ring_now(p, p->d->cfg.peer_replicas, &targets, why, sizeof(why));
	j->want = p->d->cfg.peer_replicas;
	uint8_t *mb = NULL;
	size_t ml = 0;
	struct sealing z = { 0 };
	int pr = n > 0 ? pack_manifest(sv, false, &mb, &ml) : 0;
	if (n > 0 && pr == 0 && sv->has_key) {
		/* Sealed with its job's key (seal.h): the holders see the
		 * public manifest only. */
		pr = seal_manifest(sv, mb, ml, &z);
		free(mb);
		mb = NULL;
		if (pr == 0)
			pr = pack_manifest(sv, true, &mb, &ml);
	}
	if (pr < 0) {
		n = 0;
		snprintf(why, sizeof(why), "%s", pr == -ENOMEM ? "out of memory" : "cannot seal it");
	}
	size_t used = 0, wused = 0;
	for (size_t i = 0; i < n; i++) {
		char one[300] = "";
		int r = put_one(p, sv, mb, ml, &z, targets[i], one, sizeof(one));
		if (r == 0) {
			j->copies++;
			used += (size_t)snprintf(j->peers + used, used < sizeof(j->peers) ? sizeof(j->peers) - used : 0,
						 "%s%s", used ? "," : "", targets[i]);
			count(&p->d->stats.peer_bytes_sent, sv->shard_bytes);
		} else {
			if (j->status == 0)
				j->status = r;
			wused += (size_t)snprintf(why + wused, wused < sizeof(why) ? sizeof(why) - wused : 0,
						  "%s%s: %s", wused ? "; " : "", targets[i], one);
		}
	}
	free(mb);
	free(z.sm);
	free(targets);
	if (j->copies < j->want) {
		if (j->status == 0)
			j->status = -EHOSTUNREACH;
		snprintf(j->msg, sizeof(j->msg), "replicated to %u of %u peers: %s", j->copies, j->want, why);
		log_warn("peers: %s step %" PRIu64 " rank %u: %s", sv->job, sv->step, sv->rank, j->msg);
	} else {
		j->status = 0;
	}
}

static void *sender_main(void *arg)
{
	struct peer *p = arg;
	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (p->queue == NULL && !p->stopping)
			pthread_cond_wait(&p->cv, &p->mu);
		if (p->stopping)
			break;
		struct job *j = p->queue;
		p->queue = j->next;
		if (p->queue == NULL)
			p->queue_tail = &p->queue;
		pthread_mutex_unlock(&p->mu);
		replicate(p, j);
		pthread_mutex_lock(&p->mu);
		j->next = p->done;
		p->done = j;
		pthread_mutex_unlock(&p->mu);
		uv_async_send(&p->async);
		pthread_mutex_lock(&p->mu);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

/* daemon.on_replicate (loop): pin sv and queue it for the sender, which
 * answers SaveReplicated through the loop when done. */
static void on_replicate(struct daemon *d, struct save *sv)
{
	struct peer *p = d->peer;
	struct job *j = calloc(1, sizeof(*j));
	if (j == NULL) {
		log_warn("peers: out of memory: %s step %" PRIu64 " rank %u not replicated", sv->job, sv->step,
			 sv->rank);
		return;
	}
	j->sv = sv;
	sv->readers++;
	j->session = sv->session;
	j->req_id = sv->req_id;
	if (j->session)
		d->req_ops->hold(j->session);
	pthread_mutex_lock(&p->mu);
	*p->queue_tail = j;
	p->queue_tail = &j->next;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

/* ---- restoring from peers (a load's threadpool thread) ---- */

/* Ask peer name for its copy of (job, step, rank) of world_size: 0 with
 * the link open, and its manifest (checked) in *m, the shard (unless
 * manifest_only) to read next; -errno and why. */
static int ask_copy(struct peer *p, const char *name, const Ckpt__ReplicaGet *g, const uint8_t *key, struct link *l,
		    Ckpt__Manifest **m, struct sealing *z, char *why, size_t whylen)
{
	*m = NULL;
	z->on = false;
	int r = open_link(p, name, PEER_PROTOCOL_VERSION, l, why, whylen);
	if (r < 0)
		return r;
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	f.body_case = CKPT__PEER_FRAME__BODY_GET;
	f.get = (Ckpt__ReplicaGet *)g;
	Ckpt__PeerFrame *in = NULL;
	r = link_send(l, &f);
	if (r == 0)
		r = link_recv(l, frame_max(&p->d->cfg), &in);
	if (r == -EMSGSIZE) {
		refuse(p, PEER_LIMIT_FRAME_BYTES);
		snprintf(why, whylen,
			 "its answer is larger than %zu bytes, the largest manifest this node's [limits] allow",
			 frame_max(&p->d->cfg));
	}
	if (r == 0 && in->body_case != CKPT__PEER_FRAME__BODY_DATA)
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

struct fetch {
	Ckpt__ReplicaGet g;
	const uint8_t *key;        /* the asking rank's job key, or NULL */
	const struct peer_want *w; /* fetch_from */
	struct save *sv;           /* fetch_from */
	uint8_t *extra;            /* extra_from */
	size_t extra_len;
};

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

/* The copy from peer name, into the pool, held and pinned. */
static int fetch_from(struct peer *p, const char *name, void *arg, char *why, size_t whylen)
{
	struct fetch *ft = arg;
	struct daemon *d = p->d;
	struct link l;
	Ckpt__Manifest *m = NULL;
	struct save *sv = NULL;
	struct sealing z = { 0 };
	int r = ask_copy(p, name, &ft->g, ft->key, &l, &m, &z, why, whylen);
	if (r < 0)
		return r;
	const struct peer_want *w = ft->w;
	if (w->expect && !same_save(m, w->expect)) {
		snprintf(why, whylen, "it holds another save of the step (attempt '%.60s')", m->attempt_id);
		ckpt__manifest__free_unpacked(m, NULL);
		link_close(&l);
		return -ESTALE;
	}
	struct reserve rs = { 0 };
	sv = save_from_manifest(d, m, CKPT__TIER__TIER_REPLICATED);
	r = sv ? loop_call(p, reserve_on_loop, (rs.sv = sv, &rs)) : -ENOMEM;
	if (r == 0 && rs.status < 0) {
		r = rs.status;
		snprintf(why, whylen, "%s", rs.msg);
	}
	if (r < 0 && sv) {
		save_free(sv);
		sv = NULL;
	}
	if (r == 0)
		r = z.on ? recv_sealed(&l, sv, m, ft->key, &z, why, whylen) : recv_shard(&l, sv, m, why, whylen);
	struct commit c = { .sv = sv, .pin = true, .durable = w->expect != NULL };
	if (r == 0) {
		sv->from_peer = true;
		snprintf(sv->peer, sizeof(sv->peer), "%s", name);
		if (w->expect)
			snprintf(sv->shard_name, sizeof(sv->shard_name), "%s", w->expect->shard_name);
		r = loop_call(p, commit_on_loop, &c);
	} else if (sv) {
		(void)loop_call(p, release_on_loop, sv);
	}
	if (r < 0 && why[0] == '\0')
		snprintf(why, whylen, "%s", strerror(-r));
	ckpt__manifest__free_unpacked(m, NULL);
	link_close(&l);
	if (r == 0) {
		count(&d->stats.peer_bytes_received, sv->shard_bytes);
		count(&d->stats.peer_restores, 1);
		ft->sv = sv;
	}
	return r;
}

/* The copy's extra state only, from peer name (its manifest; no shard). */
static int extra_from(struct peer *p, const char *name, void *arg, char *why, size_t whylen)
{
	struct fetch *ft = arg;
	struct link l;
	Ckpt__Manifest *m = NULL;
	struct sealing z = { 0 };
	int r = ask_copy(p, name, &ft->g, ft->key, &l, &m, &z, why, whylen);
	if (r < 0)
		return r;
	ft->extra_len = m->extra_state.len;
	ft->extra = malloc(m->extra_state.len ? m->extra_state.len : 1);
	if (ft->extra)
		memcpy(ft->extra, m->extra_state.data, m->extra_state.len);
	else
		r = -ENOMEM;
	ckpt__manifest__free_unpacked(m, NULL);
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
	holder_get(p, job, rank, known, sizeof(known));
	size_t n = ring_now(p, p->d->cfg.peer_replicas, &ring, why, whylen);
	size_t used = strlen(why);
	int r = -ENOENT;
	for (size_t i = 0; i <= n + (no_sweep ? 0 : 1) && r < 0; i++) {
		const char *name = i == 0 ? known : i <= n ? ring[i - 1] : found;
		if (i == n + 1) { /* neither: the whole ring, once per job */
			sweep(p, job);
			holder_get(p, job, rank, found, sizeof(found));
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
static int peer_fetch(struct daemon *d, const struct peer_want *w, struct save **out, char *why, size_t whylen)
{
	struct fetch ft = { .g = CKPT__REPLICA_GET__INIT, .w = w, .key = w->key };
	ft.g.job = (char *)w->job;
	ft.g.step = w->step;
	ft.g.rank = w->rank;
	ft.g.world_size = w->world_size;
	int r = each_holder(d->peer, w->job, w->rank, w->no_sweep, fetch_from, &ft, why, whylen);
	*out = ft.sv;
	return r;
}

/* daemon.peer_extra (each_holder): a copy's extra state, no shard. */
static int peer_extra(struct daemon *d, const struct peer_want *w, uint8_t **extra, size_t *len, char *why,
		      size_t whylen)
{
	struct fetch ft = { .g = CKPT__REPLICA_GET__INIT, .key = w->key };
	ft.g.job = (char *)w->job;
	ft.g.step = w->step;
	ft.g.rank = w->rank;
	ft.g.world_size = w->world_size;
	ft.g.manifest_only = true;
	int r = each_holder(d->peer, w->job, w->rank, false, extra_from, &ft, why, whylen);
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
	int r = open_link(p, name, PEER_PROTOCOL_VERSION, &l, err, sizeof(err));
	if (r < 0)
		return r;
	Ckpt__ReplicaList q = CKPT__REPLICA_LIST__INIT;
	q.job = (char *)job;
	q.rank = rank;
	q.all_ranks = all_ranks;
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	f.body_case = CKPT__PEER_FRAME__BODY_LIST;
	f.list = &q;
	Ckpt__PeerFrame *in = NULL;
	r = link_send(&l, &f);
	if (r == 0)
		r = link_recv(&l, LIST_REPLY_MAX, &in);
	if (r == -EMSGSIZE) {
		refuse(p, PEER_LIMIT_FRAME_BYTES);
		log_warn("peers: %s answered a list of %s with more than %u bytes; not read", name, job,
			 LIST_REPLY_MAX);
	}
	if (r == 0 && in->body_case != CKPT__PEER_FRAME__BODY_LIST_REPLY)
		r = -EPROTO;
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
	pthread_mutex_lock(&p->mu);
	struct holders *h = holders_of(p, job, true);
	if (h == NULL || h->swept != 0) {
		while (h && h->swept == 1 && strcmp(h->job, job) == 0 && !p->stopping)
			pthread_cond_wait(&p->cv, &p->mu);
		pthread_mutex_unlock(&p->mu);
		return;
	}
	h->swept = 1; /* not taken by another job until swept */
	pthread_mutex_unlock(&p->mu);
	char(*ring)[RING_NAME_MAX] = NULL;
	char why[300] = "";
	size_t n = ring_now(p, RING_MAX, &ring, why, sizeof(why));
	size_t asked = 0;
	for (size_t i = 0; i < n; i++) {
		struct peer_copy *v = NULL;
		size_t k = 0;
		if (list_one(p, ring[i], job, 0, true, &v, &k) == 0)
			asked++;
		for (size_t j = 0; j < k; j++)
			holder_set(p, job, v[j].rank, ring[i]);
		free(v);
	}
	free(ring);
	log_info("peers: asked %zu of %zu peers which copies of %s they hold (once)", asked, n, job);
	pthread_mutex_lock(&p->mu);
	h->swept = 2;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

/* daemon.peer_list: the copies of (job, rank) the peers hold: asked of
 * the peer that last said it holds them, then of this node's successors
 * (where a node's copies go), and only then, once per job in this
 * daemon's life, of the whole ring (a node that came back under another
 * name: sweep). So a rank asks at most 1 + K peers, flat in the ring's
 * size, but for that one sweep per job per daemon (ring size requests,
 * shared by the node's ranks). */
static int peer_list(struct daemon *d, const char *job, uint32_t rank, struct peer_copy **out, size_t *nout)
{
	struct peer *p = d->peer;
	char(*ring)[RING_NAME_MAX] = NULL;
	char why[300] = "", known[RING_NAME_MAX];
	struct peer_copy *v = NULL;
	size_t k = 0;
	holder_get(p, job, rank, known, sizeof(known));
	if (known[0])
		(void)list_one(p, known, job, rank, false, &v, &k);
	size_t n = k ? 0 : ring_now(p, d->cfg.peer_replicas, &ring, why, sizeof(why));
	for (size_t i = 0; i < n && k == 0; i++)
		if (strcmp(ring[i], known) != 0 && list_one(p, ring[i], job, rank, false, &v, &k) == 0 && k > 0)
			holder_set(p, job, rank, ring[i]);
	free(ring);
	if (k == 0) {
		sweep(p, job);
		char found[RING_NAME_MAX];
		holder_get(p, job, rank, found, sizeof(found));
		if (found[0] && strcmp(found, known) != 0)
			(void)list_one(p, found, job, rank, false, &v, &k);
	}
	*out = v;
	*nout = k;
	return 0;
}

/* ---- start and stop ---- */

static int listen_on(const char *hostport, char *err, size_t errlen)
{
	char host[256], port[16];
	if (link_split(hostport, host, sizeof(host), port, sizeof(port)) < 0) {
		snprintf(err, errlen, "[peers] listen '%s' is not HOST:PORT", hostport);
		return -EINVAL;
	}
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *res = NULL;
	int g = getaddrinfo(host, port, &hints, &res);
	if (g != 0) {
		snprintf(err, errlen, "[peers] listen %s: %s", hostport, gai_strerror(g));
		return -EINVAL;
	}
	int fd = -1, e = 0;
	for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0) {
			e = errno;
			continue;
		}
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 64) < 0) {
			e = errno;
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(res);
	if (fd < 0) {
		snprintf(err, errlen, "[peers] listen %s: %s", hostport, strerror(e));
		return -e;
	}
	return fd;
}

int peer_start(struct daemon *d, char *err, size_t errlen)
{
	const struct config *c = &d->cfg;
	if (c->peer_listen[0] == '\0') {
		snprintf(d->peer_why, sizeof(d->peer_why), "peer replication is off in this ckptd (no [peers] listen)");
		return 0;
	}
	if (!c->peer_cert[0] || !c->peer_key[0] || !c->peer_ca[0]) {
		snprintf(d->peer_why, sizeof(d->peer_why),
			 "peer replication is off in this ckptd: [peers] cert, key and ca are needed (never "
			 "unauthenticated)");
		log_warn("peers: %s", d->peer_why);
		return 0;
	}
	if (c->peer_replicas < 1 || c->peer_replicas > MAX_REPLICAS) {
		snprintf(err, errlen, "[peers] replicas = %u: want 1 to %d", c->peer_replicas, MAX_REPLICAS);
		return -EINVAL;
	}
	if (c->peer_max_connections < 1 || c->peer_max_handshakes < 1 || c->peer_max_per_address < 1 ||
	    c->peer_max_connections > 65536 || c->peer_max_handshakes > 65536) {
		snprintf(err, errlen,
			 "[peers] max_connections, max_handshakes and max_per_address: want 1 or more (at most 65536)");
		return -EINVAL;
	}
	struct peer *p = calloc(1, sizeof(*p));
	if (p == NULL) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	p->d = d;
	p->listen_fd = -1;
	p->sender_fd = -1;
	p->nslots = c->peer_max_handshakes + c->peer_max_connections;
	p->slots = calloc(p->nslots, sizeof(*p->slots));
	if (p->slots == NULL) {
		free(p);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (unsigned i = 0; i < p->nslots; i++)
		p->slots[i].fd = -1;
	p->timeout_ms = c->peer_timeout_ms ? c->peer_timeout_ms : DEFAULT_PEER_TIMEOUT_MS;
	p->calls_tail = &p->calls;
	p->queue_tail = &p->queue;
	snprintf(p->self, sizeof(p->self), "%s", c->peer_advertise[0] ? c->peer_advertise : c->peer_listen);
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	int r = link_tls_init(&p->tls, c->peer_cert, c->peer_key, c->peer_ca, err, errlen);
	p->tls.verify_names = c->peer_verify_names;
	if (r == 0) {
		r = listen_on(c->peer_listen, err, errlen);
		p->listen_fd = r;
	}
	if (r < 0) {
		link_tls_fini(&p->tls);
		pthread_mutex_destroy(&p->mu);
		pthread_cond_destroy(&p->cv);
		free(p->slots);
		free(p);
		return r;
	}
	uv_async_init(d->loop, &p->async, on_async);
	p->async.data = p;
	d->peer = p;
	if (pthread_create(&p->acceptor, NULL, acceptor_main, p) == 0)
		p->acceptor_started = true;
	if (pthread_create(&p->sender, NULL, sender_main, p) == 0)
		p->sender_started = true;
	if (!p->acceptor_started || !p->sender_started) {
		snprintf(err, errlen, "cannot start the peer threads");
		peer_stop(d);
		return -EAGAIN;
	}
	d->on_replicate = on_replicate;
	d->peer_fetch = peer_fetch;
	d->peer_extra = peer_extra;
	d->peer_list = peer_list;
	d->job_key = seal_derive;
	log_info("peers: listening on %s as %s, %u replica(s) per save, TLS with client certificates", c->peer_listen,
		 p->self, c->peer_replicas);
	return 0;
}

static void async_closed(uv_handle_t *h)
{
	struct peer *p = h->data;
	link_tls_fini(&p->tls);
	free(p->slots);
	for (size_t i = 0; i < JOBS; i++)
		free(p->jobs[i].at);
	free(p->names);
	free(p->ring);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p);
}

void peer_stop(struct daemon *d)
{
	struct peer *p = d->peer;
	if (p == NULL)
		return;
	d->on_replicate = NULL;
	d->peer_fetch = NULL;
	d->peer_extra = NULL;
	d->peer_list = NULL;
	d->job_key = NULL;
	pthread_mutex_lock(&p->mu);
	p->stopping = true;
	/* Waiting loop calls give up (-ESHUTDOWN); every socket is shut, so
	 * blocked reads and writes end now. */
	struct call *c = p->calls;
	p->calls = NULL;
	p->calls_tail = &p->calls;
	(void)c;
	for (unsigned i = 0; i < p->nslots; i++)
		if (p->slots[i].fd >= 0)
			shutdown(p->slots[i].fd, SHUT_RDWR);
	if (p->sender_fd >= 0)
		shutdown(p->sender_fd, SHUT_RDWR);
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	if (p->listen_fd >= 0)
		shutdown(p->listen_fd, SHUT_RDWR);
	if (p->acceptor_started)
		pthread_join(p->acceptor, NULL);
	if (p->sender_started)
		pthread_join(p->sender, NULL);
	if (p->listen_fd >= 0)
		close(p->listen_fd);
	/* Connection threads end once their socket is shut (their loop calls
	 * now fail); wait for them, a little. */
	pthread_mutex_lock(&p->mu);
	for (int i = 0; i < 50 && p->nconns > 0; i++) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 100 * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&p->cv, &p->mu, &ts);
	}
	bool left = p->nconns > 0;
	pthread_mutex_unlock(&p->mu);
	/* Jobs the sender did not finish: unpinned by nobody (the copies are
	 * dropped at exit with the memory tier). */
	d->peer = NULL;
	if (left)
		log_warn("peers: %u connection(s) still closing at stop; left to the exit", p->nconns);
	/* Closed either way, or the loop would never end; p is freed once no
	 * thread can hold it (those left see stopping and touch only p). */
	uv_close((uv_handle_t *)&p->async, left ? NULL : async_closed);
}
