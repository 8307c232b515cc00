/* Incremental steps (docs/format.md "Pieces"): per (job, rank, world
 * size), the pieces of that rank's newest durable step (saved here, or read back),
 * with their hashes and where their stored bytes are, so that the next
 * save stores a piece whose bytes have not changed as a reference to them.
 * Thread-safe (uploads run on the threadpool); kept in memory, and after
 * a start read back from storage by the first save (upload.c
 * base_from_storage). */
#ifndef CKPTD_INCBASE_H
#define CKPTD_INCBASE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.pb-c.h"
#include "names.h"

/* One piece of a base: raw [raw_off, raw_off + raw_len) of the shard,
 * stored in obj (an index into incbase.obj) at at. */
struct base_piece {
	uint64_t raw_off, raw_len;
	uint64_t at, stored;
	uint8_t hash[16];
	uint32_t obj;
	uint32_t elem;
	int codec;
};

struct incbase {
	atomic_uint refs;
	char job[JOB_BUF];
	uint32_t rank, world_size;
	uint64_t step;
	char attempt[ATTEMPT_BUF];
	char **obj; /* shards holding its pieces, relative to the job (ManifestPiece.ref) */
	uint64_t *obj_step;
	size_t nobj;
	struct base_piece *p; /* by raw_off */
	size_t n;
};

/* At most this many older steps one save refers to (refs markers and
 * checks per save); the pieces in others are stored again. */
#define INCBASE_MAX_REFS 8
/* Bases kept; past it the oldest set goes. */
#define INCBASE_MAX 4096

/* The base of (job, rank, world size), referenced, or NULL. */
struct incbase *incbase_get(const char *job, uint32_t rank, uint32_t world_size);
void incbase_unref(struct incbase *b);
/* From manifest m as uploaded (its pieces hashed; own_ref: its shard as
 * manifest_shard_ref names it): becomes the base of its (job, rank, world
 * size) unless that one is of a newer step of the same attempt (a run
 * restarted from an older step takes its own). 0 or -ENOMEM. */
int incbase_record(const Ckpt__Manifest *m, const char *own_ref);
/* The piece of b at raw_off of raw_len bytes with this hash, or NULL. */
const struct base_piece *incbase_find(const struct incbase *b, uint64_t raw_off, uint64_t raw_len,
				      const uint8_t hash[16]);
/* Forget every base (tests; a job's steps removed wholesale). */
void incbase_clear(void);

#endif
