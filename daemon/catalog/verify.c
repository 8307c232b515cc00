/* Checking a step's shards against their manifests (verify.h). */
#include "verify.h"
#include "crc32c.h"
#include "manifest.h"
#include "pieces.h"
#include "planecodec.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int verify_init(struct verify *v, struct store *st)
{
	memset(v, 0, sizeof(*v));
	v->st = st;
	v->ok = true;
	v->buf = malloc(VERIFY_BLOCK);
	return v->buf ? 0 : -ENOMEM;
}

void verify_free(struct verify *v)
{
	for (size_t i = 0; i < v->nproblems; i++)
		free(v->problems[i]);
	v->nproblems = 0;
	free(v->buf);
	v->buf = NULL;
}

void verify_problem(struct verify *v, const char *fmt, ...)
{
	v->ok = false;
	if (v->nproblems == VERIFY_MAX_PROBLEMS)
		return;
	char line[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	v->problems[v->nproblems] = strdup(line);
	if (v->problems[v->nproblems])
		v->nproblems++;
}

static int cmp_tensor_off(const void *a, const void *b)
{
	const Ckpt__ManifestTensor *x = *(Ckpt__ManifestTensor *const *)a, *y = *(Ckpt__ManifestTensor *const *)b;
	return x->shard_offset < y->shard_offset ? -1 : x->shard_offset > y->shard_offset;
}

/* A shard's raw bytes in order, a block at a time: as stored, or, where
 * the manifest has pieces, whole pieces decoded (up to VERIFY_BLOCK of
 * them, at least one). */
struct shard_reader {
	struct store *st;
	const char *key;
	const Ckpt__Manifest *m;
	struct pieces pc;
	size_t next; /* the next piece */
	struct planecodec codec;
	bool have_codec;
	uint8_t *raw, *stored; /* pieces: their buffers, of raw_cap and stored_cap */
	uint64_t raw_cap, stored_cap;
};

static void reader_free(struct shard_reader *rd)
{
	pieces_free(&rd->pc);
	if (rd->have_codec)
		planecodec_free(&rd->codec);
	free(rd->raw);
	free(rd->stored);
}

static int grow_buf(uint8_t **p, uint64_t *cap, uint64_t want)
{
	if (want <= *cap)
		return 0;
	uint8_t *n = realloc(*p, (size_t)want);
	if (n == NULL)
		return -ENOMEM;
	*p = n;
	*cap = want;
	return 0;
}

/* The shard's bytes from pos on (where the last call left off): *out and
 * their length, or -errno with why. */
static int reader_next(struct shard_reader *rd, uint64_t pos, uint8_t *buf, const uint8_t **out, size_t *len, char *why,
		       size_t whylen)
{
	const Ckpt__Manifest *m = rd->m;
	if (rd->pc.n == 0) {
		*len = m->shard_bytes - pos < VERIFY_BLOCK ? (size_t)(m->shard_bytes - pos) : VERIFY_BLOCK;
		*out = buf;
		int r = rd->st->ops->get_range(rd->st, rd->key, pos, buf, *len);
		if (r < 0)
			snprintf(why, whylen, "reading %s at %" PRIu64 ": %s", rd->key, pos,
				 r == -ENODATA ? "the shard is shorter than its manifest says" : store_error(r));
		return r;
	}
	const struct pieces *pc = &rd->pc;
	size_t p0 = rd->next, p1 = p0 + 1;
	while (p1 < pc->n && pc->raw[p1 + 1] - pc->raw[p0] <= VERIFY_BLOCK)
		p1++;
	uint64_t slen = pc->cum[p1] - pc->cum[p0], rlen = pc->raw[p1] - pc->raw[p0];
	if (grow_buf(&rd->raw, &rd->raw_cap, rlen) < 0 || grow_buf(&rd->stored, &rd->stored_cap, slen) < 0 ||
	    (!rd->have_codec && !(rd->have_codec = planecodec_init(&rd->codec, 0) == 0))) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	/* A segment at a time: pieces an incremental step keeps in an older
	 * step's shard are read from there. */
	char key[1024];
	int r = 0;
	for (size_t a = p0, b; a < p1; a = b) {
		b = pieces_segment(pc, a, p1);
		if ((r = pieces_key(pc, a, rd->key, key, sizeof(key))) < 0) {
			snprintf(why, whylen, "a piece's object name is too long");
			return r;
		}
		r = rd->st->ops->get_range(rd->st, key, pc->at[a], rd->stored + (pc->cum[a] - pc->cum[p0]),
					   (size_t)(pc->cum[b] - pc->cum[a]));
		if (r < 0) {
			snprintf(why, whylen, "reading %s at %" PRIu64 ": %s", key, pc->at[a],
				 r == -ENODATA ? "the object is shorter than the manifest's pieces say"
					       : store_error(r));
			return r;
		}
	}
	char what[400];
	r = pieces_decode(pc, &rd->codec, p0, p1, rd->stored, rd->raw, what, sizeof(what));
	if (r < 0) {
		snprintf(why, whylen, "%s: %s", rd->key, what);
		return r;
	}
	rd->next = p1;
	*out = rd->raw;
	*len = (size_t)rlen;
	return 0;
}

/* Each older step m refers to must have m's ref (docs/architecture.md
 * "References between steps"), or retention may take the bytes m needs:
 * one GET per step referred to. */
static void verify_refs(struct verify *v, const Ckpt__Manifest *m)
{
	struct store *st = v->st;
	for (size_t k = 0; k < m->n_refs; k++) {
		uint64_t t;
		char key[1024];
		void *buf = NULL;
		size_t len = 0;
		if (manifest_ref_check(m, m->refs[k], &t) < 0 ||
		    manifest_ref_key(key, sizeof(key), m->job, m->step, t, m->rank, m->world_size, m->attempt_id) < 0)
			continue; /* manifest_check refused such a manifest already */
		int r = st->ops->get_all(st, key, 64, &buf, &len);
		free(buf);
		if (r == -ENOENT)
			verify_problem(v,
				       "rank %u: pieces lie in step %" PRIu64
				       "'s shard, but %s is missing: retention may remove "
				       "that shard",
				       m->rank, t, key);
		else if (r < 0)
			verify_problem(v, "rank %u: reading %s: %s", m->rank, key, store_error(r));
	}
}

/* The tensors of m by their offset in the shard (NULL: out of memory),
 * with a problem for each pair that overlaps and each empty tensor with a
 * crc. */
static Ckpt__ManifestTensor **by_offset(struct verify *v, const Ckpt__Manifest *m)
{
	Ckpt__ManifestTensor **ts = malloc((m->n_tensors ? m->n_tensors : 1) * sizeof(*ts));
	if (ts == NULL)
		return NULL;
	memcpy(ts, m->tensors, m->n_tensors * sizeof(*ts));
	qsort(ts, m->n_tensors, sizeof(*ts), cmp_tensor_off);
	for (size_t i = 0; i < m->n_tensors; i++) {
		if (i > 0 && ts[i]->shard_offset < ts[i - 1]->shard_offset + ts[i - 1]->nbytes)
			verify_problem(v, "rank %u: tensors '%s' and '%s' overlap in the shard", m->rank,
				       ts[i - 1]->name, ts[i]->name);
		if (ts[i]->nbytes == 0 && ts[i]->crc32c != 0)
			verify_problem(v, "rank %u: tensor '%s' is empty but has crc32c %08x", m->rank, ts[i]->name,
				       ts[i]->crc32c);
	}
	return ts;
}

/* One pass over a shard's bytes: the running crcs of the tensor and the
 * chunk under way. */
struct pass {
	const Ckpt__Manifest *m;
	Ckpt__ManifestTensor **ts; /* by offset */
	size_t ti;                 /* next tensor not yet finished */
	uint32_t tcrc;             /* running crc of ts[ti] */
	uint32_t ccrc;             /* running crc of the current chunk */
};

static void skip_empty(struct pass *p)
{
	while (p->ti < p->m->n_tensors && p->ts[p->ti]->nbytes == 0)
		p->ti++;
}

/* Fold the shard's bytes [pos, pos + len) in: each segment between chunk
 * and tensor boundaries is crc'd once and folded into both crcs; a crc
 * that ends there is checked. */
static void fold(struct verify *v, struct pass *p, uint64_t pos, const uint8_t *blk, size_t len)
{
	const Ckpt__Manifest *m = p->m;
	uint64_t cb = m->chunk_bytes, start = pos, end = pos + len;
	while (pos < end) {
		/* The next boundary: end of block, chunk, or tensor start/end. */
		uint64_t nb = end;
		uint64_t chunk_end = (pos / cb + 1) * cb;
		if (chunk_end < nb)
			nb = chunk_end;
		Ckpt__ManifestTensor *t = p->ti < m->n_tensors ? p->ts[p->ti] : NULL;
		if (t) {
			uint64_t s = t->shard_offset, e = s + t->nbytes;
			if (pos < s && s < nb)
				nb = s;
			else if (pos >= s && e > pos && e < nb)
				nb = e;
		}
		uint32_t seg = crc32c_update(0, blk + (pos - start), nb - pos);
		p->ccrc = crc32c_combine(p->ccrc, seg, nb - pos);
		if (t && pos >= t->shard_offset) {
			p->tcrc = crc32c_combine(p->tcrc, seg, nb - pos);
			if (nb == t->shard_offset + t->nbytes) {
				if (p->tcrc != t->crc32c)
					verify_problem(v,
						       "rank %u: tensor '%s' crc32c mismatch: manifest %08x, data %08x",
						       m->rank, t->name, t->crc32c, p->tcrc);
				p->tcrc = 0;
				p->ti++;
				skip_empty(p);
			}
		}
		if (nb % cb == 0 || nb == m->shard_bytes) {
			uint64_t c = (nb - 1) / cb;
			if (c < m->n_chunk_crc32c && p->ccrc != m->chunk_crc32c[c])
				verify_problem(v,
					       "rank %u: chunk %" PRIu64 " crc32c mismatch: manifest %08x, data %08x",
					       m->rank, c, m->chunk_crc32c[c], p->ccrc);
			p->ccrc = 0;
		}
		pos = nb;
	}
}

void verify_shard(struct verify *v, const Ckpt__Manifest *m)
{
	char key[768];
	if (manifest_shard_of(m, key, sizeof(key)) < 0) {
		verify_problem(v, "rank %u: the manifest names no shard of its own", m->rank);
		return;
	}
	if (m->chunk_bytes == 0) { /* manifest_check refuses it; fold divides by it */
		verify_problem(v, "rank %u: the manifest's chunk size is 0", m->rank);
		return;
	}
	struct pass p = { .m = m, .ts = by_offset(v, m) };
	if (p.ts == NULL) {
		verify_problem(v, "rank %u: out of memory", m->rank);
		return;
	}
	verify_refs(v, m);
	struct shard_reader rd = { .st = v->st, .key = key, .m = m };
	if (pieces_index(&rd.pc, m) < 0) {
		verify_problem(v, "rank %u: out of memory", m->rank);
		free(p.ts);
		return;
	}
	skip_empty(&p);
	for (uint64_t pos = 0; pos < m->shard_bytes;) {
		size_t len;
		const uint8_t *blk;
		char why[512];
		if (reader_next(&rd, pos, v->buf, &blk, &len, why, sizeof(why)) < 0) {
			verify_problem(v, "rank %u: %s", m->rank, why);
			break;
		}
		v->bytes_checked += len;
		fold(v, &p, pos, blk, len);
		pos += len;
	}
	reader_free(&rd);
	free(p.ts);
}
