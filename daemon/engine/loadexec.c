/* A restore's copies: see loadexec.h. */
#include "loadexec.h"
#include "crc32c.h"
#include "grow.h"
#include "hash.h"
#include "daemon.h"
#include "hostbuf.h"
#include "load_int.h"
#include "log.h"
#include "manifest.h"
#include "pieces.h"
#include "planecodec.h"
#include "rangecache.h"
#include "readshare.h"
#include "saveobj.h"
#include "store.h"
#include "tensor.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define READ_BLOCK (16u << 20)

/* The load runs in two phases. Plan (one thread): walk the manifests, the
 * one likeliest to hold this rank's share first (load_run), intersect every saved tensor with the requests, decide
 * replicas and coverage, and cut each saved tensor into slabs of whole rows
 * along dim 0 (contiguous in the shard, at most about READ_BLOCK each).
 * Execute (copy_threads threads): read each slab from the memory tier or
 * storage, crc it, and scatter its part of every cut into the client's
 * buffers. Cuts are disjoint, so slabs never write
 * the same bytes, and any order is correct. */

struct tplan {
	const Ckpt__ManifestTensor *t;
	const struct save *held; /* memory-tier copy, or NULL: storage */
	bool verify;             /* crc the held copy too ([pool] verify_held) */
	const char *key;         /* the shard in storage */
	const struct pieces *pc; /* its pieces (storage only), or NULL: stored raw */
	struct box saved;
	size_t es;
	uint64_t nrows, row_bytes, rows_per, nslabs;
	struct load_req **hits;
	struct box *cuts;
	size_t nhits;
	uint32_t *slab_crc;
};

struct ltask {
	size_t plan;
	uint64_t slab;
	uint64_t off, len; /* in the shard */
};

/* One read: tasks [first, first + n) of one shard in storage, in offset
 * order, fetched by one ranged GET of [off, off + len) when they lie close
 * together (READ_GAP), up to READ_BLOCK; a held copy's task is its own. A
 * rank's many small tensors then cost a GET per 16 MiB, not one each.
 * A shard with pieces: [off, off + len) is the raw bytes of its pieces
 * [p0, p1), whole, and the GET is of their stored bytes; tasks that share
 * a piece share a read, so that no piece is fetched twice (unless the
 * read would pass READ_BLOCK twice over, which no layout of ours makes). */
struct lread {
	size_t first, n;
	uint64_t off, len;
	const struct pieces *pc;
	size_t p0, p1;
};
#define READ_GAP (256u << 10) /* bytes of a gap worth reading rather than a request */

static void exec_fail(struct exec *ex, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void exec_fail(struct exec *ex, int status, const char *fmt, ...)
{
	pthread_mutex_lock(&ex->mu);
	if (ex->ld->status == 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(ex->ld->msg, sizeof(ex->ld->msg), fmt, ap);
		va_end(ap);
		ex->ld->status = status;
	}
	atomic_store(&ex->failed, 1);
	pthread_mutex_unlock(&ex->mu);
}

/* The slab's crc is taken in the copies' pass over it (one read of the
 * slab from memory, not two): in slab order, crc32c over [0, at) so far.
 * A run of the scatter extends it over any gap before the run (bytes no
 * cut takes), then over the run itself, fused with its copy
 * (hostbuf_write_crc); bytes already covered (a second cut of the same
 * rows) are copied without. apply_task extends it to the slab's end:
 * every byte of the slab once, in order, whatever the cuts, as one crc of
 * the whole slab would. */
struct slabcrc {
	uint32_t crc;
	uint64_t at;
};

static void slabcrc_to(struct slabcrc *c, const uint8_t *src, uint64_t end)
{
	if (end > c->at) {
		c->crc = crc32c_update(c->crc, src + c->at, (size_t)(end - c->at));
		c->at = end;
	}
}

struct scatter {
	const uint8_t *src;
	const struct load_req *req;
	struct slabcrc *crc; /* NULL: not verified */
};

static int scatter_run(void *ctx, uint64_t dst_off, uint64_t src_off, uint64_t n)
{
	struct scatter *sc = ctx;
	const struct hostbuf *b = sc->req->buf;
	uint64_t off = sc->req->buf_off + dst_off;
	struct slabcrc *c = sc->crc;
	if (c == NULL || src_off + n <= c->at)
		return hostbuf_write(b, off, sc->src + src_off, n);
	slabcrc_to(c, sc->src, src_off);
	uint64_t done = c->at - src_off; /* covered already: copied alone */
	int r = done ? hostbuf_write(b, off, sc->src + src_off, done) : 0;
	if (r == 0)
		r = hostbuf_write_crc(b, off + done, sc->src + c->at, n - done, &c->crc);
	c->at = src_off + n;
	return r;
}

/* Task tk's slab is at src (from storage when the plan has no held copy):
 * take its crc share and scatter it into every cut it meets. */
static void apply_task(struct exec *ex, const struct ltask *tk, const uint8_t *src)
{
	struct tplan *p = &ex->plans[tk->plan];
	const Ckpt__ManifestTensor *t = p->t;
	uint64_t r0 = tk->slab * p->rows_per;
	uint64_t k = p->nrows - r0 < p->rows_per ? p->nrows - r0 : p->rows_per;
	struct slabcrc crc = { 0, 0 };
	bool verify = !p->held || p->verify;
	struct box slab = p->saved;
	if (slab.ndim > 0) {
		slab.off[0] = p->saved.off[0] + r0;
		slab.len[0] = k;
	}
	for (size_t i = 0; i < p->nhits; i++) {
		struct box part;
		if (!box_intersect(&slab, &p->cuts[i], &part))
			continue;
		struct scatter sc = { .src = src, .req = p->hits[i], .crc = verify ? &crc : NULL };
		int r = box_copy_runs(&part, &slab, &p->hits[i]->box, p->es, scatter_run, &sc);
		if (r < 0) {
			exec_fail(ex, r, "writing tensor '%s' into buffer %" PRIu64 ": %s", t->name,
				  p->hits[i]->buf->id,
				  r == -EFAULT ? "the client truncated its buffer file" : strerror(-r));
			return;
		}
	}
	if (verify) {
		slabcrc_to(&crc, src, tk->len);
		p->slab_crc[tk->slab] = crc.crc;
	}
}

/* A storage read (readshare_read's fetch and apply): rd's range of key. */
struct share_ctx {
	struct exec *ex;
	const struct lread *rd;
	struct store *st;
	const char *key;
	uint64_t off, len; /* of the object: rd's range, or a segment's stored bytes */
	bool across;       /* shared with the other nodes (peer_range.c) */
	uint8_t *raw;      /* rd's pieces decoded (the worker's) */
	struct planecodec *codec;
	const size_t *run; /* with pieces: the run fetched (read_pieces), [off, off + len) */
	size_t nrun;
};

/* Where a read's bytes came from (readshare.h), besides storage. */
#define FROM_KEPT 1 /* this node's own read, kept for its peers (rangecache.h) */
#define FROM_PEER 2 /* the peer that read it for the job's nodes */

/* Whether the load's storage reads are shared with the other nodes: a
 * job of the main store (never a tenant's), whose trainer gave no secret
 * (its bytes would cross the network in the clear), unless it asked for
 * storage alone, or bytes from a peer already failed its check. */
static bool shares_across(const struct load *ld)
{
	const struct daemon *d = ld->d;
	return d->peer_range && d->rangecache && !ld->has_key && !ld->storage_only && !ld->no_shared &&
	       config_tenant_of_job(&d->cfg, ld->job) == NULL && daemon_store_of(d, ld->job) == d->store;
}

/* This node as its peers name it. */
static const char *node_name(const struct config *c)
{
	return c->peer_advertise[0] ? c->peer_advertise : c->peer_listen;
}

/* Across nodes: kept here, else from the node that reads it for all, else
 * read here (and kept for the others when the range's directory said this
 * node reads it). */
static int share_fetch(void *ctx, uint8_t *buf)
{
	struct share_ctx *sc = ctx;
	struct load *ld = sc->ex->ld;
	struct daemon *d = ld->d;
	struct rc_entry *e = NULL;
	int (*across)(struct daemon *, const char *, const char *, uint64_t, uint64_t, uint8_t *, char *,
		      size_t) = sc->across ? d->peer_range : NULL;
	if (across) {
		const uint8_t *at;
		if (rangecache_hold(d->rangecache, sc->st, sc->key, sc->off, sc->len, 0, &at, &e) == 0) {
			memcpy(buf, at, (size_t)sc->len);
			rangecache_release(d->rangecache, e);
			return FROM_KEPT;
		}
		/* Made before the claim: a peer the directory sends here at
		 * once finds the read in flight and waits for it. Without room
		 * to keep it, this node claims nothing and reads alone. */
		e = rangecache_begin(d->rangecache, sc->st, sc->key, sc->off, sc->len);
	}
	if (e) {
		char why[300] = "";
		int r = across(d, ld->job, sc->key, sc->off, sc->len, buf, why, sizeof(why));
		if (r != PEER_RANGE_MINE) {
			rangecache_end(d->rangecache, e, NULL);
			e = NULL;
		}
		if (r == 0)
			return FROM_PEER;
		if (r < 0) {
			atomic_fetch_add_explicit(&d->stats.range_fallbacks, 1, memory_order_relaxed);
			log_debug("load: %s rank %u: %s bytes %" PRIu64 "+%" PRIu64 " read from storage alone: %s",
				  ld->job, ld->rank, sc->key, sc->off, sc->len, why);
		}
	}
	int r = sc->st->ops->get_range(sc->st, sc->key, sc->off, buf, (size_t)sc->len);
	if (e)
		rangecache_end(d->rangecache, e, r < 0 ? NULL : buf);
	return r < 0 ? r : READSHARE_STORAGE;
}

/* src: the read's bytes, in our buffer or in another load's. */
static void share_apply(void *ctx, const uint8_t *src, int how)
{
	struct share_ctx *sc = ctx;
	const struct lread *rd = sc->rd;
	if (how == FROM_PEER)
		atomic_store(&sc->ex->ld->from_peer_reads, true);
	if (rd->pc) {
		/* Each load decodes for itself: the bytes it shares with the
		 * node's other loads (and nodes) are the stored ones. The tasks
		 * run once every segment is in (run_read). */
		char why[400];
		const struct pieces *pc = rd->pc;
		int r = sc->codec ? 0 : -ENOMEM;
		for (size_t j = 0; j < sc->nrun && r == 0; j++) {
			size_t i = sc->run[j];
			r = pieces_decode(pc, sc->codec, i, i + 1, src + (pc->at[i] - sc->off),
					  sc->raw + (pc->raw[i] - pc->raw[rd->p0]), why, sizeof(why));
		}
		if (r < 0)
			exec_fail(sc->ex, r == -EBADMSG ? -EIO : r, "reading tensor '%s' from %s: %s",
				  sc->ex->plans[sc->ex->tasks[rd->first].plan].t->name, sc->key,
				  sc->codec ? why : "out of memory for a decoder");
		return;
	}
	for (size_t i = 0; i < rd->n && !atomic_load(&sc->ex->failed); i++) {
		const struct ltask *tk = &sc->ex->tasks[rd->first + i];
		apply_task(sc->ex, tk, src + (tk->off - rd->off));
	}
}

/* A worker's buffers: tmp for a read's bytes as fetched, raw for its
 * pieces decoded, and the decoder, made on its first read of pieces. */
struct worker {
	uint8_t *tmp, *raw;
	uint64_t cap; /* tmp's bytes */
	struct planecodec codec;
	bool have_codec;
	size_t *run; /* read_pieces' run, and which pieces are done */
	size_t run_cap;
	uint8_t *done;
	size_t done_cap;
};

static void read_failed(struct exec *ex, const struct lread *rd, const char *key, int r);

/* A read of pieces: object by object, in runs of its pieces that lie in
 * order close together there (a gap of up to READ_GAP read too: a piece a
 * later step stored anew leaves such a hole in an older shard), each run
 * by one ranged read of at most w->cap bytes and its pieces decoded into
 * w->raw. An incremental step's pieces then cost about a read per shard
 * they lie in, not one per change of shard. 0, or the load failed. */
static int read_pieces(struct exec *ex, const struct lread *rd, struct worker *w, struct share_ctx *sc, const void *as)
{
	const struct pieces *pc = rd->pc;
	size_t n = rd->p1 - rd->p0;
	if (GROW(w->run, w->run_cap, n, 64) < 0 || GROW(w->done, w->done_cap, n, 64) < 0) {
		exec_fail(ex, -ENOMEM, "out of memory");
		return -ENOMEM;
	}
	memset(w->done, 0, n);
	sc->raw = w->raw;
	if (!w->have_codec)
		w->have_codec = planecodec_init(&w->codec, 0) == 0;
	sc->codec = w->have_codec ? &w->codec : NULL;
	sc->run = w->run;
	char key[1024];
	for (size_t a = rd->p0; a < rd->p1 && !atomic_load(&ex->failed); a++) {
		if (w->done[a - rd->p0])
			continue;
		uint64_t start = pc->at[a], end = start + pc->p[a]->stored_bytes;
		size_t k = 0;
		w->run[k++] = a;
		w->done[a - rd->p0] = 1;
		for (size_t i = a + 1; i < rd->p1; i++) {
			uint64_t s = pc->at[i], e = s + pc->p[i]->stored_bytes;
			if (w->done[i - rd->p0] || !pieces_same_object(pc, i, a) || s < end)
				continue;
			/* An object's pieces lie in raw order: its later ones are
			 * further on still (any that are not get runs of their own). */
			if (s - end > READ_GAP || e - start > w->cap)
				break;
			w->run[k++] = i;
			w->done[i - rd->p0] = 1;
			end = e;
		}
		sc->nrun = k;
		sc->off = start;
		sc->len = end - start;
		if (pieces_key(pc, a, ex->plans[ex->tasks[rd->first].plan].key, key, sizeof(key)) < 0) {
			exec_fail(ex, -ENAMETOOLONG, "a piece's object name is too long");
			return -ENAMETOOLONG;
		}
		sc->key = key;
		int r = readshare_read(ex->ld->d->readshare, as, key, sc->off, sc->len, w->tmp, share_fetch,
				       share_apply, sc);
		if (r < 0) {
			read_failed(ex, rd, key, r);
			return r;
		}
	}
	return atomic_load(&ex->failed) ? -EIO : 0;
}

static void read_failed(struct exec *ex, const struct lread *rd, const char *key, int r)
{
	char more[64] = "";
	if (rd->n > 1)
		snprintf(more, sizeof(more), " (one read with %zu more)", rd->n - 1);
	exec_fail(ex, r, "reading tensor '%s' from %s%s: %s", ex->plans[ex->tasks[rd->first].plan].t->name, key, more,
		  r == -ENODATA ? "the shard is shorter than its manifest says" : store_error(r));
}

static void run_read(struct exec *ex, const struct lread *rd, struct worker *w)
{
	uint8_t *tmp = w->tmp;
	const struct ltask *first = &ex->tasks[rd->first];
	struct tplan *p = &ex->plans[first->plan];
	if (p->held) {
		/* Our own pool: crc'd all the same, so a bug that wrote into
		 * a held copy (or a bad DIMM) fails the load, not the model. */
		apply_task(ex, first, save_shard_bytes(p->held, first->off, first->len, tmp));
		return;
	}
	/* From storage, shared with the node's other loads of the same range
	 * that run now (readshare.h). */
	struct share_ctx sc = { .ex = ex,
				.rd = rd,
				.st = daemon_store_of(ex->ld->d, ex->ld->job),
				.key = p->key,
				.off = rd->off,
				.len = rd->len,
				.across = shares_across(ex->ld) };
	/* A read shared across nodes may bring a peer's bytes: only loads
	 * that take those join it (the range cache stands for the main store
	 * read that way). */
	const void *as = sc.across ? (const void *)ex->ld->d->rangecache : (const void *)sc.st;
	if (rd->pc == NULL) {
		int r = readshare_read(ex->ld->d->readshare, as, p->key, sc.off, sc.len, tmp, share_fetch, share_apply,
				       &sc);
		if (r < 0)
			read_failed(ex, rd, p->key, r);
		return;
	}
	if (read_pieces(ex, rd, w, &sc, as) < 0)
		return;
	for (size_t i = 0; i < rd->n && !atomic_load(&ex->failed); i++) {
		const struct ltask *tk = &ex->tasks[rd->first + i];
		apply_task(ex, tk, w->raw + (tk->off - rd->off));
	}
}

static void *exec_worker(void *arg)
{
	struct exec *ex = arg;
	/* Without pieces a read's bytes land in tmp; with them, stored bytes
	 * land in tmp and raw ones in raw. */
	uint64_t tmp_len = ex->max_stored ? ex->max_stored + READ_GAP : 0;
	if (ex->max_read > tmp_len)
		tmp_len = ex->max_read;
	struct worker w = { .tmp = malloc(tmp_len ? (size_t)tmp_len : 1), .cap = tmp_len };
	if (ex->max_stored)
		w.raw = malloc(ex->max_read ? (size_t)ex->max_read : 1);
	if (w.tmp == NULL || (ex->max_stored && w.raw == NULL)) {
		exec_fail(ex, -ENOMEM, "out of memory for a read buffer of %" PRIu64 " bytes", tmp_len);
		goto out;
	}
	for (;;) {
		size_t i = atomic_fetch_add(&ex->next, 1);
		if (i >= ex->nreads || atomic_load(&ex->failed))
			break;
		run_read(ex, &ex->reads[(i + ex->rot) % ex->nreads], &w);
	}
out:
	if (w.have_codec)
		planecodec_free(&w.codec);
	free(w.tmp);
	free(w.raw);
	free(w.run);
	free(w.done);
	return NULL;
}

/* 1 if cut was already written (a replica), 0 if it is new, -1 if it
 * overlaps something written only in part. */
static int cut_seen(const struct load_req *q, const struct box *cut)
{
	for (size_t i = 0; i < q->napplied; i++) {
		struct box x;
		if (box_contains(&q->applied[i], cut))
			return 1;
		if (box_intersect(&q->applied[i], cut, &x))
			return -1;
	}
	return 0;
}

/* Add the plan for saved tensor t meeting hits/cuts; account coverage. */
static int plan_tensor(struct exec *ex, const char *key, const struct pieces *pc, const struct save *held, unsigned src,
		       const Ckpt__ManifestTensor *t, const struct box *saved, struct load_req **hits,
		       const struct box *cuts, size_t nh)
{
	struct load *ld = ex->ld;
	if (GROW(ex->plans, ex->cap, ex->nplans + 1, 64) < 0)
		return load_fail(ld, -ENOMEM, "out of memory");
	struct tplan *p = &ex->plans[ex->nplans];
	memset(p, 0, sizeof(*p));
	p->t = t;
	p->held = held;
	/* Bytes that came from a peer, a replica put here by one included,
	 * are checked whatever [pool] verify_held says: for a step in
	 * storage, against the stored manifest's CRC32C. */
	p->verify = ld->d->cfg.verify_held || src == SRC_PEER || (held && held->replica);
	p->key = key;
	p->pc = held ? NULL : pc;
	p->saved = *saved;
	p->es = tensor_dtype_size(t->dtype);
	p->nrows = saved->ndim > 0 ? saved->len[0] : 1;
	p->row_bytes = p->nrows ? t->nbytes / p->nrows : 0;
	p->rows_per = p->row_bytes == 0 || p->row_bytes >= READ_BLOCK ? 1 : READ_BLOCK / p->row_bytes;
	if (p->pc && p->row_bytes > 0 && p->row_bytes <= p->pc->piece_bytes) {
		/* Slabs of whole units, the save's pieces (pieces.h). */
		uint64_t unit = piece_unit(p->row_bytes, p->pc->piece_bytes);
		p->rows_per = (READ_BLOCK / unit ? READ_BLOCK / unit : 1) * (unit / p->row_bytes);
	}
	p->nslabs = p->nrows == 0 ? 0 : (p->nrows + p->rows_per - 1) / p->rows_per;
	if (p->rows_per * p->row_bytes > SIZE_MAX / 2)
		return load_fail(ld, -ENOMEM, "tensor '%s': one row of %" PRIu64 " bytes is too large", t->name,
				 p->row_bytes);
	p->hits = malloc(nh * sizeof(*p->hits));
	p->cuts = malloc(nh * sizeof(*p->cuts));
	p->slab_crc = calloc(p->nslabs ? p->nslabs : 1, sizeof(uint32_t));
	if (!p->hits || !p->cuts || !p->slab_crc) {
		free(p->hits);
		free(p->cuts);
		free(p->slab_crc);
		return load_fail(ld, -ENOMEM, "out of memory");
	}
	memcpy(p->hits, hits, nh * sizeof(*hits));
	memcpy(p->cuts, cuts, nh * sizeof(*cuts));
	p->nhits = nh;
	ex->nplans++;
	if (p->rows_per * p->row_bytes > ex->max_read)
		ex->max_read = p->rows_per * p->row_bytes;
	for (size_t i = 0; i < nh; i++) {
		struct load_req *q = hits[i];
		if (GROW(q->applied, q->applied_cap, q->napplied + 1, 8) < 0)
			return load_fail(ld, -ENOMEM, "out of memory");
		q->applied[q->napplied++] = cuts[i];
		q->covered += box_volume(&cuts[i]);
		q->sources |= src;
		ld->bytes += box_volume(&cuts[i]) * p->es;
		if (held)
			ld->bytes_memory += box_volume(&cuts[i]) * p->es;
	}
	return 0;
}

/* Plan from manifest m, whose shard is key in storage or the held copy. */
int plan_manifest(struct exec *ex, const Ckpt__Manifest *m, const char *key, const struct save *held)
{
	struct load *ld = ex->ld;
	unsigned src = held ? SRC_MEMORY : SRC_STORAGE;
	for (size_t i = 0; i < ld->npinned && held; i++)
		if (ld->pinned[i] == held && (ld->pin_flags[i] & PIN_FETCHED)) {
			src = SRC_PEER;
			ld->pin_flags[i] |= PIN_READ_PEER;
			load_note_peer(ld, held);
		}
	struct load_req **hits = calloc(ld->nreqs ? ld->nreqs : 1, sizeof(*hits));
	struct box *cuts = calloc(ld->nreqs ? ld->nreqs : 1, sizeof(*cuts));
	struct pieces *pc = NULL;
	int r = 0;
	if (hits == NULL || cuts == NULL) {
		r = load_fail(ld, -ENOMEM, "out of memory");
		goto out;
	}
	if (held == NULL && m->n_pieces > 0) {
		/* Kept until exec_free: the plans point into it (and it into m). */
		pc = malloc(sizeof(*pc));
		if (pc == NULL || GROW(ex->pieces, ex->pieces_cap, ex->npieces + 1, 8) < 0 || pieces_index(pc, m) < 0) {
			free(pc);
			r = load_fail(ld, -ENOMEM, "out of memory");
			goto out;
		}
		ex->pieces[ex->npieces++] = pc;
	}
	for (size_t i = 0; i < m->n_tensors && r == 0; i++) {
		const Ckpt__ManifestTensor *t = m->tensors[i];
		struct box saved;
		uint64_t nelem;
		char why[128];
		box_from_fields(&saved, t->n_global_shape, t->global_shape, t->n_box_offsets, t->box_offsets,
				t->n_box_lengths, t->box_lengths, &nelem, why, sizeof(why));
		size_t nh = 0;
		for (size_t k = load_find_first(ld, t->name);
		     k < ld->nreqs && strcmp(ld->by_name[k]->name, t->name) == 0; k++) {
			struct load_req *q = ld->by_name[k];
			if (q->dtype != (int)t->dtype || !box_same_shape(&q->box, &saved)) {
				char want[96], have[96];
				box_shape_str(&q->box, want, sizeof(want));
				box_shape_str(&saved, have, sizeof(have));
				r = load_fail(ld, -EINVAL,
					      "rank %u: tensor '%s': requested dtype %s shape %s, but it was "
					      "saved as dtype %s shape %s",
					      ld->rank, t->name, tensor_dtype_name(q->dtype), want,
					      tensor_dtype_name((int)t->dtype), have);
				break;
			}
			if (!box_intersect(&saved, &q->box, &cuts[nh]))
				continue;
			/* Replicated tensors: what one rank's manifest already
			 * gave (the first one read) is not read again. */
			int seen = cut_seen(q, &cuts[nh]);
			if (seen < 0) {
				r = load_fail(ld, -EINVAL,
					      "rank %u: tensor '%s': saved boxes of different ranks overlap in "
					      "part; cannot tell which copy to load",
					      ld->rank, t->name);
				break;
			}
			if (seen == 0)
				hits[nh++] = q;
		}
		if (r == 0 && nh > 0)
			r = plan_tensor(ex, key, pc, held, src, t, &saved, hits, cuts, nh);
	}
out:
	free(hits);
	free(cuts);
	return r;
}

static int cmp_task(const void *a, const void *b, void *arg)
{
	const struct exec *ex = arg;
	const struct ltask *x = a, *y = b;
	const struct tplan *px = &ex->plans[x->plan], *py = &ex->plans[y->plan];
	/* Held copies first, each on its own; then by shard and offset. */
	if ((px->held != NULL) != (py->held != NULL))
		return px->held ? -1 : 1;
	int c = px->held ? 0 : strcmp(px->key, py->key);
	if (c)
		return c;
	return x->off < y->off ? -1 : x->off > y->off;
}

/* Task tk as a read on its own: its bytes, or its pieces' whole. */
static struct lread task_read(const struct exec *ex, size_t i)
{
	const struct ltask *tk = &ex->tasks[i];
	const struct pieces *pc = ex->plans[tk->plan].pc;
	struct lread rd = { .first = i, .n = 1, .off = tk->off, .len = tk->len };
	if (pc && tk->len > 0) {
		rd.pc = pc;
		pieces_span(pc, tk->off, tk->len, &rd.p0, &rd.p1);
		rd.off = pc->raw[rd.p0];
		rd.len = pc->raw[rd.p1] - rd.off;
	}
	return rd;
}

/* Whether read nx joins read rd (the one before it, of the same shard). */
static bool joins(const struct lread *rd, const struct lread *nx)
{
	uint64_t end = rd->off + rd->len;
	uint64_t len = nx->off + nx->len > end ? nx->off + nx->len - rd->off : rd->len;
	if (rd->pc != nx->pc)
		return false;
	if (nx->pc && nx->p0 < rd->p1) /* a piece of both */
		return len <= 2 * (uint64_t)READ_BLOCK;
	return nx->off >= end && nx->off - end <= READ_GAP && len <= READ_BLOCK;
}

/* Sort the tasks and cut them into reads (struct lread). */
static int group_reads(struct exec *ex)
{
	qsort_r(ex->tasks, ex->ntasks, sizeof(*ex->tasks), cmp_task, ex);
	ex->reads = calloc(ex->ntasks ? ex->ntasks : 1, sizeof(*ex->reads));
	if (ex->reads == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < ex->ntasks; i++) {
		const struct ltask *tk = &ex->tasks[i];
		const struct tplan *p = &ex->plans[tk->plan];
		struct lread *rd = ex->nreads ? &ex->reads[ex->nreads - 1] : NULL;
		struct lread nx = task_read(ex, i);
		if (rd && !p->held) {
			const struct ltask *prev = &ex->tasks[rd->first + rd->n - 1];
			const struct tplan *pp = &ex->plans[prev->plan];
			if (!pp->held && strcmp(pp->key, p->key) == 0 && pp->pc == p->pc && joins(rd, &nx)) {
				rd->n++;
				if (nx.off + nx.len > rd->off + rd->len)
					rd->len = nx.off + nx.len - rd->off;
				if (nx.p1 > rd->p1)
					rd->p1 = nx.p1;
				continue;
			}
		}
		ex->reads[ex->nreads++] = nx;
	}
	for (size_t i = 0; i < ex->nreads; i++) {
		const struct lread *rd = &ex->reads[i];
		if (rd->len > ex->max_read)
			ex->max_read = rd->len;
		if (rd->pc && rd->pc->cum[rd->p1] - rd->pc->cum[rd->p0] > ex->max_stored)
			ex->max_stored = rd->pc->cum[rd->p1] - rd->pc->cum[rd->p0];
	}
	return 0;
}

/* The objects tensor p's bytes were read from: its shard, or with pieces
 * each object its pieces lie in (an incremental step's older shards). */
static void tensor_objects(const struct tplan *p, char *out, size_t cap)
{
	snprintf(out, cap, "%s", p->key);
	if (p->pc == NULL || p->t->nbytes == 0)
		return;
	size_t p0, p1, used = 0;
	pieces_span(p->pc, p->t->shard_offset, p->t->nbytes, &p0, &p1);
	const char *seen[4];
	size_t nseen = 0;
	for (size_t i = p0; i < p1 && nseen < 4; i++) {
		const char *ref = p->pc->ref[i] ? p->pc->ref[i] : "";
		size_t k = 0;
		while (k < nseen && strcmp(seen[k], ref) != 0)
			k++;
		if (k < nseen)
			continue;
		seen[nseen++] = ref;
		char key[1024];
		if (pieces_key(p->pc, i, p->key, key, sizeof(key)) < 0)
			continue;
		int w = snprintf(out + used, cap - used, "%s%s", nseen > 1 ? " and " : "", key);
		used = w < 0 || (size_t)w >= cap - used ? cap - 1 : used + (size_t)w;
	}
}

/* Run every read on up to copy_threads threads, this one included. */
void execute(struct exec *ex, unsigned nthreads)
{
	size_t n = 0;
	for (size_t i = 0; i < ex->nplans; i++)
		n += ex->plans[i].nslabs;
	ex->tasks = calloc(n ? n : 1, sizeof(*ex->tasks));
	if (ex->tasks == NULL) {
		exec_fail(ex, -ENOMEM, "out of memory");
		return;
	}
	for (size_t i = 0; i < ex->nplans; i++) {
		struct tplan *p = &ex->plans[i];
		for (uint64_t sl = 0; sl < p->nslabs; sl++) {
			uint64_t r0 = sl * p->rows_per;
			uint64_t k = p->nrows - r0 < p->rows_per ? p->nrows - r0 : p->rows_per;
			ex->tasks[ex->ntasks++] = (struct ltask){ .plan = i,
								  .slab = sl,
								  .off = p->t->shard_offset + r0 * p->row_bytes,
								  .len = k * p->row_bytes };
		}
	}
	if (group_reads(ex) < 0) {
		exec_fail(ex, -ENOMEM, "out of memory");
		return;
	}
	/* Shared across nodes, the first node to claim a range reads it: if
	 * every node went through the reads in the same order, one would
	 * claim them all and send the model R - 1 times. Each node starts at
	 * its own point instead (by its name), so the first claims, and the
	 * reading and sending, spread over the nodes. */
	if (ex->nreads && shares_across(ex->ld))
		ex->rot = (size_t)(hash_mix(hash_str(node_name(&ex->ld->d->cfg))) % ex->nreads);
	if (nthreads > ex->nreads)
		nthreads = ex->nreads ? (unsigned)ex->nreads : 1;
	pthread_t th[64];
	unsigned started = 0;
	for (unsigned i = 1; i < nthreads && i < 64; i++)
		if (pthread_create(&th[started], NULL, exec_worker, ex) == 0)
			started++;
	exec_worker(ex);
	for (unsigned i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	if (atomic_load(&ex->failed))
		return;
	/* Every tensor's slabs, from storage or memory: their crcs, combined
	 * in order, must match the manifest's. */
	for (size_t i = 0; i < ex->nplans; i++) {
		struct tplan *p = &ex->plans[i];
		if (p->held && !p->verify)
			continue; /* [pool] verify_held = false */
		uint32_t crc = 0;
		for (uint64_t sl = 0; sl < p->nslabs; sl++) {
			uint64_t r0 = sl * p->rows_per;
			uint64_t k = p->nrows - r0 < p->rows_per ? p->nrows - r0 : p->rows_per;
			crc = sl == 0 ? p->slab_crc[0] : crc32c_combine(crc, p->slab_crc[sl], k * p->row_bytes);
		}
		if (crc != p->t->crc32c) {
			if (p->held)
				ex->ld->bad_held = p->held; /* load_done drops it */
			char where[1200];
			tensor_objects(p, where, sizeof(where));
			exec_fail(ex, -EIO,
				  "checksum mismatch in tensor '%s' of %s%s: manifest says crc32c %08x, "
				  "data has %08x",
				  p->t->name, p->held ? "the memory tier's copy of " : "", where, p->t->crc32c, crc);
			return;
		}
	}
}

void exec_free(struct exec *ex)
{
	for (size_t i = 0; i < ex->nplans; i++) {
		free(ex->plans[i].hits);
		free(ex->plans[i].cuts);
		free(ex->plans[i].slab_crc);
	}
	free(ex->plans);
	free(ex->tasks);
	free(ex->reads);
	for (size_t i = 0; i < ex->npieces; i++) {
		pieces_free(ex->pieces[i]);
		free(ex->pieces[i]);
	}
	free(ex->pieces);
	pthread_mutex_destroy(&ex->mu);
}

void exec_init(struct exec *ex, struct load *ld)
{
	memset(ex, 0, sizeof(*ex));
	ex->ld = ld;
	pthread_mutex_init(&ex->mu, NULL);
}
