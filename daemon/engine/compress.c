/* Compression on upload: see compress.h. */
#include "compress.h"
#include "daemon.h"
#include "grow.h"
#include "incbase.h"
#include "macro.h"
#include "pieces.h"
#include "planecodec.h"
#include "saveobj.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* What is left of the coding budget (compress_set_budget). */
static _Atomic uint64_t budget_left = UINT64_MAX;

void compress_set_budget(uint64_t bytes)
{
	atomic_store(&budget_left, bytes);
}

static bool reserve(uint64_t n)
{
	uint64_t left = atomic_load(&budget_left);
	do {
		if (left < n)
			return false;
	} while (!atomic_compare_exchange_weak(&budget_left, &left, left - n));
	return true;
}

static void unreserve(uint64_t n)
{
	if (n)
		atomic_fetch_add(&budget_left, n);
}

struct cutter {
	struct piece_cut *v;
	size_t n, cap;
	uint64_t start; /* of the open piece */
	unsigned elem;  /* of the open piece's tensors; 0: none yet */
};

static int close_at(struct cutter *c, uint64_t end, unsigned elem)
{
	if (GROW(c->v, c->cap, c->n + 1, 64) < 0)
		return -ENOMEM;
	c->v[c->n++] = (struct piece_cut){ end, elem ? elem : 1 };
	c->start = end;
	c->elem = 0;
	return 0;
}

static int cmp_off(const void *a, const void *b)
{
	const struct save_tensor *x = *(const struct save_tensor *const *)a, *y = *(const struct save_tensor *const *)b;
	return x->shard_off < y->shard_off ? -1 : x->shard_off > y->shard_off;
}

/* A large tensor's pieces: units of whole rows, a row larger than
 * PIECE_BYTES cut every PIECE_BYTES from its start. */
static int cut_large(struct cutter *c, const struct save_tensor *t, unsigned elem, uint64_t pb)
{
	uint64_t s = t->shard_off, end = s + t->nbytes;
	uint64_t nrows = t->box.ndim > 0 ? t->box.len[0] : 1;
	uint64_t row = nrows ? t->nbytes / nrows : t->nbytes;
	uint64_t unit = piece_unit(row, pb);
	uint64_t sub = row <= pb ? unit : pb;
	for (uint64_t at = s; at < end;) {
		uint64_t base = s + (at - s) / unit * unit;
		uint64_t next = base + ((at - base) / sub + 1) * sub;
		if (next > base + unit)
			next = base + unit;
		if (next > end)
			next = end;
		if (close_at(c, next, elem) < 0)
			return -ENOMEM;
		at = next;
	}
	return 0;
}

int compress_cut(const struct save_tensor *t, size_t n, uint64_t shard_bytes, uint64_t pb, struct piece_cut **out,
		 size_t *nout)
{
	struct cutter c = { 0 };
	const struct save_tensor **by = malloc((n ? n : 1) * sizeof(*by));
	if (by == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		by[i] = &t[i];
	qsort(by, n, sizeof(*by), cmp_off);
	int r = 0;
	for (size_t i = 0; i < n && r == 0; i++) {
		const struct save_tensor *x = by[i];
		if (x->nbytes == 0)
			continue;
		unsigned e = (unsigned)tensor_dtype_size(x->dtype);
		uint64_t s = x->shard_off, end = s + x->nbytes;
		if (x->nbytes >= pb / 4) {
			/* What lies before: a small run closes there; bare
			 * padding joins the piece before it. */
			if (s > c.start) {
				if (c.elem || c.n == 0)
					r = close_at(&c, s, c.elem);
				else
					c.v[c.n - 1].end = c.start = s;
			}
			if (r == 0)
				r = cut_large(&c, x, e, pb);
			continue;
		}
		if (c.elem && (c.elem != e || end - c.start > pb))
			r = close_at(&c, s, c.elem);
		c.elem = e;
	}
	if (r == 0 && c.start < shard_bytes) {
		if (c.elem || c.n == 0)
			r = close_at(&c, shard_bytes, c.elem);
		else
			c.v[c.n - 1].end = shard_bytes;
	}
	free(by);
	if (r < 0) {
		free(c.v);
		return r;
	}
	*out = c.v;
	*nout = c.n;
	return 0;
}

void stored_shard_free(struct stored_shard *s)
{
	unreserve(s->reserved);
	incbase_unref(s->base);
	free(s->refs);
	free(s->hashes);
	free(s->pieces);
	free(s->ptrs);
	free(s->iov);
	for (size_t i = 0; i < s->nbufs; i++)
		free(s->bufs[i]);
	free(s->bufs);
	memset(s, 0, sizeof(*s));
}

/* Add [p, p + n) to the object's iov, joined to the last where it goes on. */
static void iov_add(struct stored_shard *s, const uint8_t *p, size_t n)
{
	struct iovec *last = s->niov ? &s->iov[s->niov - 1] : NULL;
	if (last && (const uint8_t *)last->iov_base + last->iov_len == p)
		last->iov_len += n;
	else
		s->iov[s->niov++] = (struct iovec){ (void *)p, n };
	s->bytes += n;
}

/* A piece stored as it is: its bytes in the pool, chunk by chunk. */
static void add_raw(struct stored_shard *s, const struct save *sv, uint64_t off, uint64_t len)
{
	uint64_t cb = sv->d->pool.chunk_bytes;
	while (len > 0) {
		uint64_t c = off / cb, in = off % cb;
		uint64_t k = cb - in < len ? cb - in : len;
		iov_add(s, pool_span_ptr(&sv->d->pool, sv->chunks[c]) + in, (size_t)k);
		off += k;
		len -= k;
	}
}

/* One thread's share: pieces [first, last). Phase HASH takes each piece's
 * XXH3-128; phase CODE codes those without a reference into its own buf
 * (at most their raw bytes: a piece that does not shrink is left raw). */
enum {
	HASH,
	CODE
};

struct share {
	const struct save *sv;
	const struct piece_cut *cuts;
	Ckpt__ManifestPiece *pieces;
	uint8_t *hashes; /* 16 bytes per piece */
	bool compress;
	int phase;
	size_t first, last;
	uint8_t *buf;
	uint64_t *at;      /* per piece of the share: where its coded bytes are in buf */
	uint64_t reserved; /* of the budget, for buf's bytes */
	size_t over_budget;
	int err;
	char why[200];
	pthread_t th;
};

static uint64_t cut_off(const struct piece_cut *cuts, size_t i)
{
	return i ? cuts[i - 1].end : 0;
}

static void *hash_share(struct share *sh)
{
	const struct piece_cut *cuts = sh->cuts;
	uint64_t maxp = 0;
	for (size_t i = sh->first; i < sh->last; i++)
		maxp = cuts[i].end - cut_off(cuts, i) > maxp ? cuts[i].end - cut_off(cuts, i) : maxp;
	uint8_t *tmp = malloc(maxp ? (size_t)maxp : 1);
	sh->err = -ENOMEM;
	if (tmp == NULL)
		return NULL;
	for (size_t i = sh->first; i < sh->last; i++) {
		uint64_t off = cut_off(cuts, i), len = cuts[i].end - off;
		XXH128_hash_t h = XXH3_128bits(save_shard_bytes(sh->sv, off, len, tmp), (size_t)len);
		XXH128_canonical_t c;
		XXH128_canonicalFromHash(&c, h); /* high half first */
		memcpy(sh->hashes + 16 * i, c.digest, 16);
		sh->pieces[i].hash.data = sh->hashes + 16 * i;
		sh->pieces[i].hash.len = 16;
	}
	free(tmp);
	sh->err = 0;
	return NULL;
}

/* Room in sh->buf for n more bytes after used: grown to what is
 * reserved, no more (large blocks grow in place: mremap), so the memory
 * held is what the budget counts. */
static bool buf_room(struct share *sh, uint64_t used, uint64_t n, uint64_t *cap)
{
	if (used + n <= *cap)
		return true;
	uint64_t want = used + n;
	uint8_t *p = realloc(sh->buf, (size_t)want);
	if (p == NULL)
		return false;
	sh->buf = p;
	*cap = want;
	return true;
}

static void *code_share(struct share *sh)
{
	const struct piece_cut *cuts = sh->cuts;
	uint64_t maxp = 0;
	for (size_t i = sh->first; i < sh->last; i++) {
		uint64_t len = cuts[i].end - cut_off(cuts, i);
		if (sh->pieces[i].ref)
			continue; /* in an older step's shard */
		maxp = len > maxp ? len : maxp;
	}
	size_t encap = planecodec_bound((size_t)maxp);
	struct planecodec c;
	uint8_t *tmp = malloc(maxp ? (size_t)maxp : 1), *enc = malloc(encap);
	/* The coded bytes, grown as pieces shrink: each piece's share of the
	 * daemon's budget is reserved before it is kept. */
	uint64_t cap = 0;
	sh->at = calloc(sh->last - sh->first + 1, sizeof(*sh->at));
	bool have = false;
	sh->err = -ENOMEM;
	if (!tmp || !enc || !sh->at || (sh->err = planecodec_init(&c, 0)) < 0)
		goto out;
	have = true;
	uint64_t in_buf = 0;
	for (size_t i = sh->first; i < sh->last; i++) {
		uint64_t off = cut_off(cuts, i), len = cuts[i].end - off;
		Ckpt__ManifestPiece *p = &sh->pieces[i];
		if (p->ref)
			continue;
		/* A piece is kept coded only if it shrinks: its raw length
		 * bounds what it can take of the budget, reserved before the
		 * coding (over the budget, no work is thrown away), the rest
		 * given back after. */
		if (!reserve(len)) {
			sh->over_budget++; /* stored as it is, from the pool */
			continue;
		}
		const uint8_t *src = save_shard_bytes(sh->sv, off, len, tmp);
		ssize_t k = 0;
		if (planecodec_worth(&c, src, (size_t)len, cuts[i].elem))
			k = planecodec_encode(&c, src, (size_t)len, cuts[i].elem, enc, encap);
		bool keep = k > 0 && (uint64_t)k < len;
		unreserve(keep ? len - (uint64_t)k : len);
		if (k < 0) {
			sh->err = (int)k;
			snprintf(sh->why, sizeof(sh->why), "compressing shard bytes %" PRIu64 "+%" PRIu64 ": %s", off,
				 len, strerror(-sh->err));
			goto out;
		}
		if (keep) {
			sh->reserved += (uint64_t)k;
			if (!buf_room(sh, in_buf, (uint64_t)k, &cap)) {
				sh->err = -ENOMEM;
				snprintf(sh->why, sizeof(sh->why), "out of memory for coded pieces");
				goto out;
			}
			memcpy(sh->buf + in_buf, enc, (size_t)k);
			sh->at[i - sh->first] = in_buf;
			in_buf += (uint64_t)k;
			p->codec = CKPT__CODEC__CODEC_PLANES_ZSTD;
			p->elem = cuts[i].elem;
			p->stored_bytes = (uint64_t)k;
		}
	}
	sh->err = 0;
out:
	if (have)
		planecodec_free(&c);
	free(tmp);
	free(enc);
	return NULL;
}

static void *run_share(void *arg)
{
	struct share *sh = arg;
	return sh->phase == HASH ? hash_share(sh) : code_share(sh);
}

/* Run phase on every share, this thread taking the first (and any whose
 * thread did not start); the first error into why. */
static int run_phase(struct share *sh, unsigned nsh, int phase, char *why, size_t whylen)
{
	unsigned started = 0;
	for (unsigned t = 0; t < nsh; t++)
		sh[t].phase = phase;
	for (unsigned t = 1; t < nsh; t++) {
		if (pthread_create(&sh[t].th, NULL, run_share, &sh[t]) != 0)
			break;
		started = t;
	}
	for (unsigned t = 0; t < nsh; t++)
		if (t == 0 || t > started)
			run_share(&sh[t]);
	for (unsigned t = 1; t <= started; t++)
		pthread_join(sh[t].th, NULL);
	for (unsigned t = 0; t < nsh; t++)
		if (sh[t].err < 0) {
			snprintf(why, whylen, "%s", sh[t].why[0] ? sh[t].why : strerror(-sh[t].err));
			return sh[t].err;
		}
	return 0;
}

/* Pieces whose bytes the base holds become references to them, in at
 * most INCBASE_MAX_REFS older shards: those holding the most of them
 * (the rest are stored again). out->refs gets the shards, in the base's
 * order. */
static int refer(struct stored_shard *out, const struct piece_cut *cuts, const struct incbase *b)
{
	size_t nobj = b->nobj;
	uint64_t *bytes = calloc(nobj ? nobj : 1, sizeof(*bytes));
	uint32_t *index = calloc(nobj ? nobj : 1, sizeof(*index)); /* 1-based ref of each kept shard */
	const struct base_piece **hit = calloc(out->npieces ? out->npieces : 1, sizeof(*hit));
	out->refs = calloc(INCBASE_MAX_REFS, sizeof(*out->refs));
	if (!bytes || !index || !hit || !out->refs) {
		free(bytes);
		free(index);
		free(hit);
		return -ENOMEM;
	}
	for (size_t i = 0; i < out->npieces; i++) {
		const struct base_piece *q = incbase_find(b, cut_off(cuts, i), out->pieces[i].raw_bytes,
							  out->hashes + 16 * i);
		if (q && q->obj < nobj) {
			hit[i] = q;
			bytes[q->obj] += q->stored;
		}
	}
	/* The INCBASE_MAX_REFS shards with the most bytes referred to. */
	for (size_t k = 0; k < INCBASE_MAX_REFS; k++) {
		size_t best = nobj;
		for (size_t o = 0; o < nobj; o++)
			if (!index[o] && bytes[o] > 0 && (best == nobj || bytes[o] > bytes[best]))
				best = o;
		if (best == nobj)
			break;
		index[best] = UINT32_MAX; /* chosen; numbered below, in the base's order */
	}
	for (size_t o = 0; o < nobj; o++)
		if (index[o]) {
			out->refs[out->nrefs++] = b->obj[o];
			index[o] = (uint32_t)out->nrefs;
		}
	for (size_t i = 0; i < out->npieces; i++) {
		const struct base_piece *q = hit[i];
		if (q == NULL || !index[q->obj])
			continue;
		Ckpt__ManifestPiece *p = &out->pieces[i];
		p->ref = index[q->obj];
		p->ref_offset = q->at;
		p->stored_bytes = q->stored;
		p->codec = (Ckpt__Codec)q->codec;
		p->elem = q->elem;
		out->ref_bytes += p->raw_bytes;
	}
	free(bytes);
	free(index);
	free(hit);
	return 0;
}

/* The n pieces cut for nthreads: shares of about equal raw bytes, in
 * piece order, into sh; how many. */
static unsigned share_out(struct share *sh, const struct save *sv, const struct piece_cut *cuts, size_t n,
			  unsigned nthreads, const struct stored_shard *out, bool compress)
{
	unsigned nsh = 0;
	if (nthreads < 1)
		nthreads = 1;
	if (nthreads > COMPRESS_MAX_THREADS)
		nthreads = COMPRESS_MAX_THREADS;
	for (size_t i = 0; i < n && nsh < nthreads;) {
		uint64_t from = cut_off(cuts, i);
		uint64_t goal = (sv->shard_bytes - from) / (nthreads - nsh);
		size_t j = i + 1;
		while (j < n && cuts[j - 1].end - from < goal)
			j++;
		if (nsh == nthreads - 1)
			j = n;
		sh[nsh++] = (struct share){ .sv = sv,
					    .cuts = cuts,
					    .pieces = out->pieces,
					    .hashes = out->hashes,
					    .compress = compress,
					    .first = i,
					    .last = j };
		i = j;
	}
	return nsh;
}

int compress_shard(const struct save *sv, unsigned nthreads, const struct shard_opts *o, struct stored_shard *out,
		   char *why, size_t whylen)
{
	memset(out, 0, sizeof(*out));
	struct piece_cut *cuts = NULL;
	size_t n = 0;
	struct share sh[COMPRESS_MAX_THREADS];
	out->piece_bytes = o->piece_bytes ? o->piece_bytes : PIECE_BYTES;
	int r = compress_cut(sv->tensors, sv->ntensors, sv->shard_bytes, out->piece_bytes, &cuts, &n);
	if (r < 0)
		goto fail;
	out->pieces = calloc(n ? n : 1, sizeof(*out->pieces));
	out->ptrs = calloc(n ? n : 1, sizeof(*out->ptrs));
	/* A raw piece spans at most its chunks (each piece's one more). */
	out->iov = calloc(n + sv->nchunks + 1, sizeof(*out->iov));
	out->bufs = calloc(COMPRESS_MAX_THREADS, sizeof(*out->bufs));
	out->hashes = o->incremental ? malloc(16 * (n ? n : 1)) : NULL;
	r = -ENOMEM;
	if (!out->pieces || !out->ptrs || !out->iov || !out->bufs || (o->incremental && !out->hashes))
		goto fail;
	out->npieces = n;
	for (size_t i = 0; i < n; i++) {
		uint64_t len = cuts[i].end - cut_off(cuts, i);
		ckpt__manifest_piece__init(&out->pieces[i]);
		out->pieces[i].raw_bytes = out->pieces[i].stored_bytes = len;
		out->ptrs[i] = &out->pieces[i];
	}
	unsigned nsh = share_out(sh, sv, cuts, n, nthreads, out, o->compress);
	r = 0;
	if (o->incremental)
		r = run_phase(sh, nsh, HASH, why, whylen);
	if (r == 0 && o->base) {
		out->base = o->base; /* out->refs point into it */
		atomic_fetch_add(&out->base->refs, 1);
		if ((r = refer(out, cuts, o->base)) < 0)
			snprintf(why, whylen, "out of memory");
	}
	if (r == 0 && o->compress)
		r = run_phase(sh, nsh, CODE, why, whylen);
	for (unsigned t = 0; t < nsh; t++) {
		if (sh[t].buf)
			out->bufs[out->nbufs++] = sh[t].buf;
		out->reserved += sh[t].reserved;
		out->over_budget += sh[t].over_budget;
	}
	for (size_t i = 0, t = 0; i < n && r == 0; i++) {
		Ckpt__ManifestPiece *p = &out->pieces[i];
		while (t < nsh && i >= sh[t].last)
			t++;
		if (p->ref)
			continue;
		if (p->codec == CKPT__CODEC__CODEC_PLANES_ZSTD) {
			iov_add(out, sh[t].buf + sh[t].at[i - sh[t].first], (size_t)p->stored_bytes);
			out->coded_bytes += p->raw_bytes;
		} else {
			add_raw(out, sv, cut_off(cuts, i), p->raw_bytes);
		}
	}
	for (unsigned t = 0; t < nsh; t++)
		free(sh[t].at);
	free(cuts);
	if (r < 0) {
		stored_shard_free(out);
		return r;
	}
	return 0;
fail:
	snprintf(why, whylen, "compressing the shard: %s", strerror(-r));
	free(cuts);
	stored_shard_free(out);
	return r;
}
