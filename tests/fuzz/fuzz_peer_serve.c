/* A peer's whole side of a connection, served by the daemon's own handlers
 * (peer_serve_frames, peer_int.h): the input is what a peer with a valid
 * certificate sends once its hello passed, byte for byte (frames with
 * their 4-byte length, and the raw shard bytes after a put), its first
 * byte choosing who the peer is (this node's ring predecessor, whose
 * replicas it holds, or another). The daemon's state is real: a pool,
 * the memory tier, the share; loop calls run on this thread.
 *
 * After each input, besides the sanitizers, it checks what a peer must
 * never do (docs/tiers.md "Peers"): this node's own memory-only copy is
 * still held with the same bytes, no copy is left pinned, and the share's
 * running count (daemon.replica_bytes) is what the copies add up to; once the
 * replicas are dropped, the pool is as empty as before. And as it goes, it
 * checks that the own copy is never served: the loop calls that find and
 * list copies for a peer are wrapped (the link's --wrap) and abort if
 * they give it.
 *
 * CKPT_FUZZ_LOG=1 logs what the daemon says (debug); CKPT_FUZZ_SEEDS=DIR writes the seed corpus (a put of a replica and its
 * shard, then gets and a list) into DIR and exits. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "crc32c.h"
#include "log.h"
#include "manifest.h"
#include "peer_int.h"
#include "memtier.h"
#include "rangecache.h"
#include "save.h"
#include "seal.h"

static struct daemon D;
#define KEPT_KEY "j/step-000000000007/rank-00000-of-00001.a.0000000000000000.shard"
#define KEPT_LEN 4096u
static uint32_t kept_crc;
static struct peer P;
static struct save *own;
static uint32_t own_crc;
static uint64_t free_slots;
static const char *const FROM[] = { "a:1", "b:1", "stranger:1" };

static uint32_t shard_crc(const struct save *sv)
{
	uint32_t c = 0;
	uint64_t cb = D.pool.chunk_bytes;
	for (uint32_t i = 0; i < sv->nchunks; i++) {
		uint64_t left = sv->shard_bytes - (uint64_t)i * cb;
		c = crc32c_update(c, pool_span_ptr(&D.pool, sv->chunks[i]), left < cb ? left : cb);
	}
	return c;
}

/* A manifest of one U8 tensor of n bytes, each byte fill, packed as a
 * peer sends it (shard name of the save's own rank, no directory); sealed:
 * the public manifest of a sealed replica (no tensors, a zero CRC per
 * SEAL_CHUNK piece). */
static uint8_t *pack_manifest(const char *job, uint64_t step, uint32_t rank, uint32_t world, uint32_t n, uint8_t fill,
			      bool sealed, size_t *len)
{
	char key[768];
	if (manifest_shard_key(key, sizeof(key), job, step, rank, world, "att", 0, false) < 0)
		abort();
	uint8_t *bytes = malloc(n);
	memset(bytes, fill, n);
	uint64_t cb = D.pool.chunk_bytes, nc = (n + cb - 1) / cb;
	uint32_t crcs[64];
	for (uint64_t i = 0; i < nc; i++)
		crcs[i] = crc32c_update(0, bytes + i * cb, n - i * cb < cb ? n - i * cb : cb);
	uint64_t shape = n;
	Ckpt__ManifestTensor t = CKPT__MANIFEST_TENSOR__INIT;
	Ckpt__ManifestTensor *tp = &t;
	t.name = (char *)"w";
	t.dtype = CKPT__DTYPE__U8;
	t.n_global_shape = 1;
	t.global_shape = &shape;
	t.nbytes = n;
	t.crc32c = crc32c_update(0, bytes, n);
	Ckpt__Manifest m = CKPT__MANIFEST__INIT;
	m.format_version = MANIFEST_FORMAT_VERSION;
	m.job = (char *)job;
	m.attempt_id = (char *)"att";
	m.step = step;
	m.rank = rank;
	m.world_size = world;
	m.shard_bytes = n;
	m.chunk_bytes = cb;
	m.n_chunk_crc32c = nc;
	m.chunk_crc32c = crcs;
	m.n_tensors = 1;
	m.tensors = &tp;
	if (sealed) {
		memset(crcs, 0, sizeof(crcs));
		m.n_tensors = 0;
		m.chunk_bytes = SEAL_CHUNK;
		m.n_chunk_crc32c = seal_pieces(n);
	}
	m.shard_dir = (char *)"";
	m.shard_name = strrchr(key, '/') + 1;
	*len = ckpt__manifest__get_packed_size(&m);
	uint8_t *out = malloc(*len);
	ckpt__manifest__pack(&m, out);
	free(bytes);
	return out;
}

/* This node's own memory-only copy of job j, step 5, rank 0 of 2. */
static void hold_own(void)
{
	size_t ml;
	uint8_t *mb = pack_manifest("j", 5, 0, 2, 3000, 0x11, false, &ml);
	Ckpt__Manifest *m = ckpt__manifest__unpack(NULL, ml, mb);
	char why[200];
	if (m == NULL || manifest_check(m, why, sizeof(why)) < 0)
		abort();
	struct save *sv = peer_save_from_manifest(&D, m, CKPT__TIER__TIER_MEMORY);
	struct reserve rs = { .sv = sv };
	hold_reserve(&D, &rs);
	if (rs.status < 0)
		abort();
	uint8_t *fill = malloc(sv->shard_bytes);
	memset(fill, 0x11, sv->shard_bytes);
	uint64_t cb = D.pool.chunk_bytes;
	for (uint32_t i = 0; i < sv->nchunks; i++) {
		uint64_t left = sv->shard_bytes - (uint64_t)i * cb;
		memcpy(pool_span_ptr(&D.pool, sv->chunks[i]), fill, left < cb ? left : cb);
		sv->chunk_crc[i] = crc32c_update(0, fill, left < cb ? left : cb);
	}
	free(fill);
	struct commit c = { .sv = sv };
	hold_commit(&D, &c);
	own = sv;
	own_crc = shard_crc(sv);
	ckpt__manifest__free_unpacked(m, NULL);
	free(mb);
}

static size_t put_frame(uint8_t *out, const Ckpt__PeerFrame *f)
{
	size_t n = ckpt__peer_frame__get_packed_size(f);
	out[0] = (uint8_t)(n >> 24);
	out[1] = (uint8_t)(n >> 16);
	out[2] = (uint8_t)(n >> 8);
	out[3] = (uint8_t)n;
	ckpt__peer_frame__pack(f, out + 4);
	return n + 4;
}

static void write_seeds(const char *dir)
{
	static uint8_t buf[1 << 16];
	/* 0: a replica from this node's predecessor; 1: the same, the own
	 * copy's manifest only; 2: from a peer whose replicas go elsewhere;
	 * 3: a sealed replica (public manifest, sealed one, ciphertext, tag). */
	for (int k = 0; k < 4; k++) {
		size_t n = 0;
		bool sealed = k == 3;
		uint32_t bytes = k == 2 ? 5000 : 1200;
		buf[n++] = k == 2 ? 0 : 1; /* who: FROM[] */
		size_t ml;
		uint8_t *mb = pack_manifest("j", 7, 1, 2, bytes, 0x22, sealed, &ml);
		uint8_t nonce[SEAL_NONCE_BYTES] = { 9 }, sm[64] = { 7 };
		Ckpt__ReplicaPut put = CKPT__REPLICA_PUT__INIT;
		put.manifest.data = mb;
		put.manifest.len = ml;
		put.tier = CKPT__TIER__TIER_REPLICATED;
		if (sealed) {
			put.seal_nonce.data = nonce;
			put.seal_nonce.len = sizeof(nonce);
			put.sealed_manifest.data = sm;
			put.sealed_manifest.len = sizeof(sm);
		}
		Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
		f.body_case = CKPT__PEER_FRAME__BODY_PUT;
		f.put = &put;
		n += put_frame(buf + n, &f);
		memset(buf + n, 0x22, bytes + (sealed ? SEAL_TAG_BYTES : 0));
		n += bytes + (sealed ? SEAL_TAG_BYTES : 0);
		free(mb);
		Ckpt__ReplicaGet g = CKPT__REPLICA_GET__INIT;
		g.job = (char *)"j";
		g.step = 7;
		g.rank = 1;
		g.world_size = 2;
		f.body_case = CKPT__PEER_FRAME__BODY_GET;
		f.get = &g;
		n += put_frame(buf + n, &f);
		g.step = 5; /* this node's own: never served */
		g.rank = 0;
		g.manifest_only = k == 1;
		n += put_frame(buf + n, &f);
		Ckpt__ReplicaList q = CKPT__REPLICA_LIST__INIT;
		q.job = (char *)"j";
		q.all_ranks = true;
		f.body_case = CKPT__PEER_FRAME__BODY_LIST;
		f.list = &q;
		n += put_frame(buf + n, &f);
		char path[512];
		snprintf(path, sizeof(path), "%s/stream%d", dir, k);
		FILE *o = fopen(path, "wb");
		if (o == NULL || fwrite(buf, 1, n, o) != n)
			abort();
		fclose(o);
	}
	/* 4: restores' reads shared across nodes: a claim, a get of the range
	 * kept here, a part of it, and one of a key not kept. */
	size_t n = 0;
	buf[n++] = 2;
	Ckpt__RangeClaim q = CKPT__RANGE_CLAIM__INIT;
	q.key = (char *)KEPT_KEY;
	q.off = 0;
	q.len = KEPT_LEN;
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	f.body_case = CKPT__PEER_FRAME__BODY_RANGE_CLAIM;
	f.range_claim = &q;
	n += put_frame(buf + n, &f);
	q.failed_holder = (char *)"a:1";
	n += put_frame(buf + n, &f);
	Ckpt__RangeGet g = CKPT__RANGE_GET__INIT;
	g.job = (char *)"j";
	g.key = (char *)KEPT_KEY;
	g.off = 0;
	g.len = KEPT_LEN;
	f.body_case = CKPT__PEER_FRAME__BODY_RANGE_GET;
	f.range_get = &g;
	n += put_frame(buf + n, &f);
	g.off = 100;
	g.len = 1000;
	n += put_frame(buf + n, &f);
	g.key = (char *)"j/step-000000000007/other.shard";
	n += put_frame(buf + n, &f);
	char path[512];
	snprintf(path, sizeof(path), "%s/stream4", dir);
	FILE *o = fopen(path, "wb");
	if (o == NULL || fwrite(buf, 1, n, o) != n)
		abort();
	fclose(o);
}

/* A range this node keeps for its peers (rangecache.h), of the main store. */
static void keep_range(void)
{
	D.rangecache = rangecache_new(KEPT_LEN * 2, 3600ull * 1000000000);
	struct rc_entry *e = rangecache_begin(D.rangecache, D.store, KEPT_KEY, 0, KEPT_LEN);
	uint8_t *b = malloc(KEPT_LEN);
	if (D.rangecache == NULL || e == NULL || b == NULL)
		abort();
	memset(b, 0x33, KEPT_LEN);
	rangecache_end(D.rangecache, e, b);
	kept_crc = crc32c_update(0, b, KEPT_LEN);
	free(b);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	log_set_level(getenv("CKPT_FUZZ_LOG") ? LOG_LVL_DEBUG : LOG_LVL_ERR);
	config_defaults(&D.cfg);
	snprintf(D.cfg.peer_list, sizeof(D.cfg.peer_list), "a:1,b:1");
	D.cfg.peer_replicas = 1;
	D.cfg.peer_share_pct = 50;
	if (pool_init(&D.pool, 1u << 20, 64u << 10) < 0)
		abort();
	D.loop = uv_default_loop();
	TAILQ_INIT(&D.sessions);
	TAILQ_INIT(&D.saves);
	TAILQ_INIT(&D.waitq);
	TAILQ_INIT(&D.uploadq);
	TAILQ_INIT(&D.held);
	TAILQ_INIT(&D.loads);
	uv_timer_init(D.loop, &D.admit_timer);
	P.d = &D;
	P.direct = true;
	P.timeout_ms = 200;
	P.listen_fd = P.sender_fd = -1;
	snprintf(P.self, sizeof(P.self), "self:1");
	pthread_mutex_init(&P.mu, NULL);
	pthread_cond_init(&P.cv, NULL);
	D.peer = &P;
	free_slots = pool_free_slots(&D.pool);
	hold_own();
	keep_range();
	const char *seeds = getenv("CKPT_FUZZ_SEEDS");
	if (seeds) {
		write_seeds(seeds);
		exit(0);
	}
	return 0;
}

/* hold_find and hold_list, as peer_serve.c calls them, checked. */
void __real_hold_find(struct daemon *d, void *arg);
void __real_hold_list(struct daemon *d, void *arg);

void __wrap_hold_find(struct daemon *d, void *arg)
{
	__real_hold_find(d, arg);
	if (((struct find *)arg)->sv == own)
		abort(); /* this node's own copy given to a peer */
}

void __wrap_hold_list(struct daemon *d, void *arg)
{
	__real_hold_list(d, arg);
	const struct listing *l = arg;
	for (size_t i = 0; i < l->n; i++) {
		const Ckpt__HeldCopy *h = &l->v[i];
		if (strcmp(h->job, own->job) != 0 || h->step != own->step || h->rank != own->rank)
			continue;
		bool replica = false; /* a peer's replica of the same step may be listed */
		struct save *sv;
		TAILQ_FOREACH (sv, &d->held, hlink)
			replica |= sv->replica && sv->step == h->step && sv->rank == h->rank &&
				   strcmp(sv->job, h->job) == 0;
		if (!replica)
			abort(); /* this node's own copy listed to a peer */
	}
}

struct feed {
	int fd;
	const uint8_t *data;
	size_t size;
};

/* The peer's end: send everything, then read the answers to the end. */
static void *peer_end(void *arg)
{
	struct feed *fe = arg;
	for (size_t off = 0; off < fe->size;) {
		ssize_t k = send(fe->fd, fe->data + off, fe->size - off, MSG_NOSIGNAL);
		if (k <= 0)
			break;
		off += (size_t)k;
	}
	shutdown(fe->fd, SHUT_WR);
	char sink[1 << 14];
	while (read(fe->fd, sink, sizeof(sink)) > 0)
		;
	return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const char *from = FROM[data[0] % 3];
	int sp[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
		abort();
	struct feed fe = { sp[1], data + 1, size - 1 };
	pthread_t t;
	pthread_create(&t, NULL, peer_end, &fe);
	struct link l;
	link_plain(&l, sp[0], P.timeout_ms);
	peer_serve_frames(&P, &l, from);
	link_close(&l);
	pthread_join(t, NULL);
	close(sp[1]);

	/* What no peer may do, whatever it sent. The range kept for the
	 * peers is still there, the same bytes, and none is left held. */
	const uint8_t *at;
	struct rc_entry *e;
	if (rangecache_hold(D.rangecache, D.store, KEPT_KEY, 0, KEPT_LEN, 0, &at, &e) != 0 ||
	    crc32c_update(0, at, KEPT_LEN) != kept_crc)
		abort();
	rangecache_release(D.rangecache, e);
	struct rangecache_stats rs;
	rangecache_stats(D.rangecache, &rs);
	if (rs.entries != 1 || rs.bytes != KEPT_LEN)
		abort(); /* a peer's request made or dropped a kept range */
	/* What no peer may do, whatever it sent. */
	bool held = false;
	uint32_t nrep = 0;
	uint64_t rep_bytes = 0;
	struct save *sv, *next;
	TAILQ_FOREACH (sv, &D.held, hlink) {
		held |= sv == own;
		nrep += sv->replica;
		rep_bytes += sv->replica ? sv->pool_bytes + sv->meta_bytes : 0;
		if (sv->readers != 0 || sv->drop_pending)
			abort(); /* a copy left pinned */
		if (sv != own && !sv->replica)
			abort(); /* a peer's bytes held as this node's own */
	}
	if (!held || own->state != SAVE_KEPT || shard_crc(own) != own_crc)
		abort(); /* this node's own copy replaced, evicted or changed */
	if (nrep != D.nreplicas || rep_bytes != D.replica_bytes)
		abort(); /* the share's running count is off */
	for (sv = TAILQ_FIRST(&D.held); sv; sv = next) {
		next = TAILQ_NEXT(sv, hlink);
		if (sv != own)
			memtier_drop(&D, sv, "next input");
	}
	if (pool_free_slots(&D.pool) + own->pool_bytes / D.pool.slot_bytes != free_slots)
		abort(); /* pool space leaked */
	return 0;
}
