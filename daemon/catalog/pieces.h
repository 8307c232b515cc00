/* A shard's pieces (proto ManifestPiece; docs/format.md "Pieces"): where
 * each raw byte of a shard stored compressed lies in its object, and how
 * to get it back. A manifest without pieces stores its shard raw: byte i
 * of the object is byte i of the shard. */
#ifndef CKPTD_PIECES_H
#define CKPTD_PIECES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.pb-c.h"

struct planecodec;

/* A manifest with pieces has this format_version (1: none). */
#define MANIFEST_FORMAT_PIECES 2
/* No piece is larger (manifest_check): a reader's buffers stay bounded
 * whatever a manifest says. */
#define PIECE_MAX_BYTES (64u << 20)
/* The smallest piece size a save may cut with ([pool] piece_bytes), and
 * what every piece size is a multiple of. */
#define PIECE_MIN_BYTES (4u << 10)
/* The most older shards one manifest refers to (incbase.h). */
#define PIECES_MAX_REFS 64

/* How a save cuts its shard (compress.c), with pieces of piece_bytes
 * ([pool] piece_bytes, PIECE_BYTES by default; recorded in the manifest):
 * a tensor of at least piece_bytes / 4 into units of whole rows (along
 * dim 0) of at most piece_bytes, or of one row where a row is larger (cut
 * again every piece_bytes); smaller tensors of one element size share a
 * piece of at most piece_bytes. A load reads a tensor in slabs of whole
 * units (loadexec.c), so that no piece is fetched or decoded twice. */
#define PIECE_BYTES (4u << 20) /* the default ([pool] piece_bytes) */

/* The unit of a tensor whose rows are row_bytes long, cut with pieces of
 * piece_bytes. */
static inline uint64_t piece_unit(uint64_t row_bytes, uint64_t piece_bytes)
{
	if (row_bytes == 0)
		return piece_bytes;
	return row_bytes <= piece_bytes ? piece_bytes / row_bytes * row_bytes : row_bytes;
}

/* A manifest's pieces, indexed: piece i is raw [raw[i], raw[i + 1]) of
 * the shard, and its stored bytes are at at[i] of its object: the
 * manifest's own shard, or ref[i] (relative to the job) where a later
 * step refers to an older one's. cum[i] is the stored bytes of the pieces
 * before i, wherever they are: a read of pieces [p0, p1) needs
 * cum[p1] - cum[p0] bytes for them, and keeps piece i at cum[i] - cum[p0]. */
struct pieces {
	size_t n; /* 0: the shard is stored raw */
	uint64_t *raw, *at, *cum;
	const char **ref; /* NULL: in the manifest's own shard */
	const Ckpt__ManifestPiece *const *p;
	const char *job;      /* the manifest's: refs are relative to it */
	uint64_t piece_bytes; /* what the save cut with */
};

/* The object piece i lies in: own (the manifest's shard) or job/ref. 0 or
 * -ENAMETOOLONG. */
int pieces_key(const struct pieces *x, size_t i, const char *own, char *out, size_t cap);

/* x for m (checked): 0 or -ENOMEM. pieces_free frees what it holds. */
int pieces_index(struct pieces *x, const Ckpt__Manifest *m);
void pieces_free(struct pieces *x);

/* The pieces [*p0, *p1) that hold raw bytes [off, off + len), len > 0,
 * inside the shard; x->n > 0. */
void pieces_span(const struct pieces *x, uint64_t off, uint64_t len, size_t *p0, size_t *p1);

/* Whether pieces i and j lie in the same object. */
bool pieces_same_object(const struct pieces *x, size_t i, size_t j);

/* The end of the segment that starts at piece a, before p1: the pieces
 * after a that lie right after it in the same object, fetched by one
 * ranged read of [at[a], at[a] + cum[end] - cum[a]). */
size_t pieces_segment(const struct pieces *x, size_t a, size_t p1);

/* Pieces [p0, p1) back to raw bytes: stored holds their stored bytes, piece
 * i at cum[i] - cum[p0]; raw gets the shard's from x->raw[p0] on. 0, or
 * -EBADMSG with why naming the piece (a damaged object); -ENOMEM. */
int pieces_decode(const struct pieces *x, struct planecodec *c, size_t p0, size_t p1, const uint8_t *stored,
		  uint8_t *raw, char *why, size_t whylen);

#endif
