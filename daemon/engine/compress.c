/* Compression on upload: see compress.h. */
#include "compress.h"
#include "daemon.h"
#include "grow.h"
#include "pieces.h"
#include "planecodec.h"
#include "saveobj.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
static int cut_large(struct cutter *c, const struct save_tensor *t, unsigned elem)
{
	uint64_t s = t->shard_off, end = s + t->nbytes;
	uint64_t nrows = t->box.ndim > 0 ? t->box.len[0] : 1;
	uint64_t row = nrows ? t->nbytes / nrows : t->nbytes;
	uint64_t unit = piece_unit(row);
	uint64_t sub = row <= PIECE_BYTES ? unit : PIECE_BYTES;
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

int compress_cut(const struct save_tensor *t, size_t n, uint64_t shard_bytes, struct piece_cut **out, size_t *nout)
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
		if (x->nbytes >= PIECE_BYTES / 4) {
			/* What lies before: a small run closes there; bare
			 * padding joins the piece before it. */
			if (s > c.start) {
				if (c.elem || c.n == 0)
					r = close_at(&c, s, c.elem);
				else
					c.v[c.n - 1].end = c.start = s;
			}
			if (r == 0)
				r = cut_large(&c, x, e);
			continue;
		}
		if (c.elem && (c.elem != e || end - c.start > PIECE_BYTES))
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
	free(s->pieces);
	free(s->ptrs);
	free(s->iov);
	free(s->buf);
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

int compress_shard(const struct save *sv, struct stored_shard *out, char *why, size_t whylen)
{
	memset(out, 0, sizeof(*out));
	struct piece_cut *cuts = NULL;
	size_t n = 0;
	struct planecodec c;
	bool have_codec = false;
	uint8_t *tmp = NULL, *enc = NULL;
	int r = compress_cut(sv->tensors, sv->ntensors, sv->shard_bytes, &cuts, &n);
	if (r < 0)
		goto fail;
	uint64_t maxp = 0, chunks = sv->nchunks;
	for (size_t i = 0, prev = 0; i < n; prev = cuts[i++].end)
		if (cuts[i].end - prev > maxp)
			maxp = cuts[i].end - prev;
	size_t encap = planecodec_bound((size_t)maxp);
	out->pieces = calloc(n ? n : 1, sizeof(*out->pieces));
	out->ptrs = calloc(n ? n : 1, sizeof(*out->ptrs));
	/* A raw piece spans at most its chunks (each piece's one more). */
	out->iov = calloc(n + chunks + 1, sizeof(*out->iov));
	out->buf = malloc(sv->shard_bytes ? (size_t)sv->shard_bytes : 1);
	tmp = malloc(maxp ? (size_t)maxp : 1);
	enc = malloc(encap);
	r = -ENOMEM;
	if (!out->pieces || !out->ptrs || !out->iov || !out->buf || !tmp || !enc)
		goto fail;
	if ((r = planecodec_init(&c, 0)) < 0)
		goto fail;
	have_codec = true;
	uint64_t in_buf = 0;
	for (size_t i = 0; i < n; i++) {
		uint64_t off = i ? cuts[i - 1].end : 0, len = cuts[i].end - off;
		Ckpt__ManifestPiece *p = &out->pieces[i];
		ckpt__manifest_piece__init(p);
		out->ptrs[i] = p;
		p->raw_bytes = len;
		p->stored_bytes = len;
		const uint8_t *src = save_shard_bytes(sv, off, len, tmp);
		ssize_t k = 0;
		if (planecodec_worth(&c, src, (size_t)len, cuts[i].elem)) {
			k = planecodec_encode(&c, src, (size_t)len, cuts[i].elem, enc, encap);
			if (k < 0 && k != -ENOSPC) {
				r = (int)k;
				snprintf(why, whylen, "compressing shard bytes %" PRIu64 "+%" PRIu64 ": %s", off, len,
					 strerror(-r));
				goto fail_msg;
			}
		}
		if (k > 0 && (uint64_t)k < len) {
			memcpy(out->buf + in_buf, enc, (size_t)k);
			iov_add(out, out->buf + in_buf, (size_t)k);
			in_buf += (uint64_t)k;
			p->codec = CKPT__CODEC__CODEC_PLANES_ZSTD;
			p->elem = cuts[i].elem;
			p->stored_bytes = (uint64_t)k;
			out->coded_bytes += len;
		} else {
			add_raw(out, sv, off, len);
		}
	}
	out->npieces = n;
	planecodec_free(&c);
	free(cuts);
	free(tmp);
	free(enc);
	return 0;
fail:
	snprintf(why, whylen, "compressing the shard: %s", strerror(-r));
fail_msg:
	if (have_codec)
		planecodec_free(&c);
	free(cuts);
	free(tmp);
	free(enc);
	stored_shard_free(out);
	return r;
}
