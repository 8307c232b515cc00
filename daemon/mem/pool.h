/* The staging pool: one allocation made and pre-faulted at start, carved
 * into fixed chunks, each cut into POOL_SLOTS equal slots. A save takes
 * whole chunks for its body and, for its tail (or the whole of a small
 * shard), only the consecutive slots it needs inside one chunk, so a
 * 1 MiB shard holds 1 MiB of a 64 MiB chunk, not all of it. Tails go into
 * chunks already in part use first, which keeps whole chunks free for
 * large saves. Reservation is all-or-nothing. Loop-thread only. */
#ifndef CKPTD_POOL_H
#define CKPTD_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define POOL_SLOTS 64 /* slots per chunk: one bit each in a uint64_t */

/* A reserved piece of the pool: slots [slot, slot + nslots) of a chunk.
 * A whole chunk is slot 0 and nslots == pool.slots. */
struct pool_span {
	uint32_t chunk;
	uint8_t slot, nslots;
};

struct pool {
	uint8_t *base;
	uint64_t bytes;
	uint64_t chunk_bytes;
	uint64_t slot_bytes; /* chunk_bytes / slots */
	uint32_t slots;      /* per chunk: POOL_SLOTS, or 1 when a slot would not be page-aligned */
	uint32_t nchunks;
	uint32_t nfree;       /* chunks with no slot in use */
	uint32_t *free_stack; /* indices of free chunks */
	uint64_t *used;       /* per chunk: a bit per slot in use */
	uint64_t used_slots;
	bool locked; /* mlock succeeded */
};

/* Allocate and pre-fault. 0 or -errno. */
int pool_init(struct pool *p, uint64_t bytes, uint64_t chunk_bytes);
void pool_fini(struct pool *p);
/* A shard of `bytes` as reservation sizes: whole chunks, then the slots of
 * a tail (0 when the shard ends on a chunk boundary or its tail needs a
 * whole chunk, which is then counted in *whole). */
void pool_shape(const struct pool *p, uint64_t bytes, uint32_t *whole, uint32_t *tail_slots);
/* Bytes a reservation of that shape holds. */
uint64_t pool_shape_bytes(const struct pool *p, uint32_t whole, uint32_t tail_slots);
/* Whether pool_reserve of that shape would succeed now. */
bool pool_fits(const struct pool *p, uint32_t whole, uint32_t tail_slots);
/* Reserve whole chunks then the tail into out[0 .. whole + (tail_slots > 0))
 * or nothing: 0, -ENOSPC when there is no room now, -E2BIG when the pool
 * could never hold it. */
int pool_reserve(struct pool *p, uint32_t whole, uint32_t tail_slots, struct pool_span *out);
void pool_release(struct pool *p, const struct pool_span *spans, uint32_t n);
uint8_t *pool_span_ptr(const struct pool *p, struct pool_span s);
uint64_t pool_used_bytes(const struct pool *p);
/* Free bytes, and what they can hold: free slots over all chunks. */
uint64_t pool_free_slots(const struct pool *p);

#endif
