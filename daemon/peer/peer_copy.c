/* A save as peers see it (peer_int.h): its manifest, public or sealed,
 * a held copy made from one, and its shard on the wire, sealed or not. */
#include "peer_int.h"
#include "crc32c.h"
#include "manifest.h"
#include "save.h"
#include "seal.h"
#include "tensor.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A save's manifest as a peer gets it: a shard name of the save's own
 * rank (none exists: the copy is in memory only), so that the receiver's
 * manifest_check holds. Public: what a holder of a sealed replica sees
 * (seal.h): no tensors, no extra state, and no CRC of its bytes (one
 * zero per SEAL_CHUNK piece). */
int peer_pack_manifest(const struct save *sv, bool public, uint8_t **out, size_t *len)
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
int peer_seal_manifest(const struct save *sv, const uint8_t *mb, size_t ml, struct sealing *z)
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

/* A shard's CRC32Cs as its bytes arrive, in order: of each of sv's pool
 * chunks (into chunk_crc), and, with m, of each of m's chunks, checked
 * against m's (the first that fails is said in why; the bytes are read on
 * to the end all the same, so that the stream stays in step). So each
 * byte is read once, as it lands in the pool. */
#define RECV_SLICE (1u << 20)

struct crc_walk {
	struct save *sv;
	const Ckpt__Manifest *m;
	uint64_t pos;  /* shard bytes so far */
	uint32_t pcrc; /* of the pool chunk at pos */
	uint64_t mpos; /* bytes into m's chunk at pos */
	uint32_t mcrc;
	size_t mi;
	int bad;
	char *why;
	size_t whylen;
};

static void crc_walk(struct crc_walk *w, const uint8_t *p, uint64_t n)
{
	struct save *sv = w->sv;
	uint64_t cb = sv->d->pool.chunk_bytes;
	for (uint64_t at = 0; at < n;) {
		uint64_t in = w->pos % cb, k = cb - in < n - at ? cb - in : n - at;
		w->pcrc = crc32c_update(w->pcrc, p + at, k);
		if (in + k == cb || w->pos + k == sv->shard_bytes) {
			sv->chunk_crc[w->pos / cb] = w->pcrc;
			w->pcrc = 0;
		}
		w->pos += k;
		at += k;
	}
	const Ckpt__Manifest *m = w->m;
	if (m == NULL)
		return;
	uint64_t start = w->pos - n;
	for (uint64_t at = 0; at < n;) {
		uint64_t k = m->chunk_bytes - w->mpos < n - at ? m->chunk_bytes - w->mpos : n - at;
		w->mcrc = crc32c_update(w->mcrc, p + at, k);
		at += k;
		w->mpos += k;
		if (w->mpos == m->chunk_bytes || start + at == sv->shard_bytes) {
			if (w->mi < m->n_chunk_crc32c && w->mcrc != m->chunk_crc32c[w->mi] && w->bad == 0) {
				snprintf(w->why, w->whylen, "chunk %zu of the shard failed its CRC32C on arrival",
					 w->mi);
				w->bad = -EIO;
			}
			w->mi++;
			w->mpos = 0;
			w->mcrc = 0;
		}
	}
}

/* Send sv's shard sealed with its key: each SEAL_CHUNK piece's
 * ciphertext, then its tag. */
int peer_send_sealed(struct link *l, const struct save *sv, const struct sealing *z)
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

size_t peer_seal_sm_off(const struct save *sv)
{
	return SEAL_NONCE_BYTES + seal_pieces(sv->shard_bytes) * SEAL_TAG_BYTES;
}

/* Send a sealed replica held here as it came: ciphertext from the pool,
 * tags from its seal. */
int peer_send_held_sealed(struct link *l, const struct save *sv)
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
/* Where a sealed shard's pieces come from: piece i (n bytes of
 * ciphertext, then its tag) read into buf and tag. */
struct pieces {
	int (*next)(struct pieces *src, uint64_t i, uint8_t *buf, uint64_t n, uint8_t *tag);
	struct link *l;          /* from a peer */
	const struct save *held; /* from a sealed replica held here */
};

static int piece_from_link(struct pieces *src, uint64_t i, uint8_t *buf, uint64_t n, uint8_t *tag)
{
	(void)i;
	int r = link_read(src->l, buf, n);
	return r < 0 ? r : link_read(src->l, tag, SEAL_TAG_BYTES);
}

static int piece_from_held(struct pieces *src, uint64_t i, uint8_t *buf, uint64_t n, uint8_t *tag)
{
	const uint8_t *p = save_shard_bytes(src->held, i * SEAL_CHUNK, n, buf);
	if (p != buf)
		memcpy(buf, p, n);
	memcpy(tag, seal_tags(src->held) + i * SEAL_TAG_BYTES, SEAL_TAG_BYTES);
	return 0;
}

/* A sealed shard's pieces from src into sv: kept sealed (key NULL: a
 * holder keeps ciphertext and tags), or each opened with key and z and
 * m's CRCs checked as they open (a restore). */
static int take_sealed(struct pieces *src, struct save *sv, const Ckpt__Manifest *m, const uint8_t *key,
		       const struct sealing *z, char *why, size_t whylen)
{
	uint8_t *buf = malloc(SEAL_CHUNK);
	if (buf == NULL) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	int r = 0;
	struct crc_walk w = { .sv = sv, .m = key ? m : NULL, .why = why, .whylen = whylen };
	for (uint64_t i = 0; r == 0 && i < seal_pieces(sv->shard_bytes); i++) {
		uint64_t off = i * SEAL_CHUNK;
		uint64_t n = sv->shard_bytes - off < SEAL_CHUNK ? sv->shard_bytes - off : SEAL_CHUNK;
		uint8_t tag[SEAL_TAG_BYTES];
		r = src->next(src, i, buf, n, tag);
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
		crc_walk(&w, buf, n);
	}
	explicit_bzero(buf, SEAL_CHUNK);
	free(buf);
	return r < 0 ? r : w.bad;
}

int peer_recv_sealed(struct link *l, struct save *sv, const Ckpt__Manifest *m, const uint8_t *key,
		     const struct sealing *z, char *why, size_t whylen)
{
	struct pieces src = { .next = piece_from_link, .l = l };
	return take_sealed(&src, sv, m, key, z, why, whylen);
}

int peer_open_held(const struct save *held, struct save *sv, const Ckpt__Manifest *m, const uint8_t *key,
		   const struct sealing *z, char *why, size_t whylen)
{
	struct pieces src = { .next = piece_from_held, .held = held };
	return take_sealed(&src, sv, m, key, z, why, whylen);
}

/* A held-copy object for the manifest m (checked), its chunks not yet
 * reserved. NULL: out of memory. */
struct save *peer_save_from_manifest(struct daemon *d, const Ckpt__Manifest *m, int tier)
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

/* ---- a shard on the wire ---- */

/* Send sv's shard from the pool (sv pinned); corrupt: its first byte
 * flipped on the wire ([debug] corrupt_replica: the receiver's CRC check
 * must refuse it). */
int peer_send_shard(struct link *l, const struct save *sv, bool corrupt)
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
int peer_recv_shard(struct link *l, struct save *sv, const Ckpt__Manifest *m, char *why, size_t whylen)
{
	const struct pool *pool = &sv->d->pool;
	struct crc_walk w = { .sv = sv, .m = m, .why = why, .whylen = whylen };
	for (uint32_t c = 0; c < sv->nchunks; c++) {
		uint64_t left = sv->shard_bytes - (uint64_t)c * pool->chunk_bytes;
		uint64_t len = left < pool->chunk_bytes ? left : pool->chunk_bytes;
		uint8_t *buf = pool_span_ptr(pool, sv->chunks[c]);
		/* In slices, so that both CRCs read each slice from cache. */
		for (uint64_t at = 0; at < len; at += RECV_SLICE) {
			uint64_t n = len - at < RECV_SLICE ? len - at : RECV_SLICE;
			int r = link_read(l, buf + at, n);
			if (r < 0) {
				snprintf(why, whylen, "receiving the shard: %s", strerror(-r));
				return r;
			}
			crc_walk(&w, buf + at, n);
		}
	}
	return w.bad;
}
