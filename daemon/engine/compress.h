/* Compression on upload (docs/format.md "Pieces"): a save's shard cut into
 * pieces, each stored by planecodec where a sample shows it shrinks by a
 * tenth, else as it is. Runs on the upload's thread, after staged: the
 * trainer's stall does not change. */
#ifndef CKPTD_COMPRESS_H
#define CKPTD_COMPRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "ckpt.pb-c.h"

struct save;
struct save_tensor;
struct incbase;

/* One piece as cut: it ends at raw byte end; elem, its planes' element. */
struct piece_cut {
	uint64_t end;
	unsigned elem;
};

/* The pieces of a shard of shard_bytes holding tensors t[0..n) (any
 * order), cut with piece_bytes per pieces.h's rule: malloc'd into *out. 0
 * or -ENOMEM. */
int compress_cut(const struct save_tensor *t, size_t n, uint64_t shard_bytes, uint64_t piece_bytes,
		 struct piece_cut **out, size_t *nout);

/* A shard as stored: the manifest's pieces, and the object's bytes as iov
 * (pieces stored as they are point into the pool; the others into bufs,
 * one per thread that coded them). */
struct stored_shard {
	Ckpt__ManifestPiece *pieces;
	Ckpt__ManifestPiece **ptrs;
	size_t npieces;
	struct iovec *iov;
	size_t niov;
	uint8_t **bufs;
	size_t nbufs;
	uint8_t *hashes;      /* incremental: 16 bytes per piece, the pieces' hash fields */
	struct incbase *base; /* referenced: refs point into it */
	const char **refs;    /* the older shards pieces refer to (Manifest.refs) */
	size_t nrefs;
	uint64_t piece_bytes; /* cut with */
	uint64_t bytes;       /* the object's */
	uint64_t coded_bytes; /* raw bytes of the pieces planecodec stored */
	uint64_t ref_bytes;   /* raw bytes of the pieces stored as references */
	uint64_t reserved;    /* of the coding budget (compress_set_budget), given back by stored_shard_free */
	size_t over_budget;   /* pieces that shrank but were stored as they are: the budget was spent */
};

/* What a save stores: its pieces compressed, hashed (incremental), and
 * those base holds the same bytes of (same place, same hash) as
 * references to them. */
struct shard_opts {
	bool compress;
	bool incremental;
	uint64_t piece_bytes; /* 0: PIECE_BYTES */
	struct incbase *base; /* NULL: none */
};

/* sv's shard, stored, its pieces coded on nthreads threads (this one
 * among them; at most COMPRESS_MAX_THREADS), each taking a run of pieces
 * of about equal bytes: 0, or -ENOMEM / -EIO with why. */
#define COMPRESS_MAX_THREADS 16
int compress_shard(const struct save *sv, unsigned nthreads, const struct shard_opts *o, struct stored_shard *out,
		   char *why, size_t whylen);
void stored_shard_free(struct stored_shard *s);

/* Coded pieces live outside the pool until their object is written: at
 * most bytes of them daemon-wide, across every upload. A piece that would
 * pass it is stored as it is (from the pool), so compression never needs
 * more memory than the pool's share set here. Set once at start (main.c:
 * half of [pool] staging_bytes, at least 64 MiB); unset: no bound. */
void compress_set_budget(uint64_t bytes);

#endif
