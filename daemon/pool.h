/* The staging pool: one allocation made and pre-faulted at start, carved
 * into fixed chunks. Reservation is all-or-nothing. Loop-thread only. */
#ifndef CKPTD_POOL_H
#define CKPTD_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pool {
	uint8_t *base;
	uint64_t bytes;
	uint64_t chunk_bytes;
	uint32_t nchunks;
	uint32_t nfree;
	uint32_t *free_stack; /* indices of free chunks */
	bool locked;          /* mlock succeeded */
};

/* Allocate and pre-fault. 0 or -errno. */
int pool_init(struct pool *p, uint64_t bytes, uint64_t chunk_bytes);
void pool_fini(struct pool *p);
/* Reserve n chunks into out[] or none: 0, or -ENOSPC when fewer are free,
 * -E2BIG when the pool could never hold n. */
int pool_reserve(struct pool *p, uint32_t n, uint32_t *out);
void pool_release(struct pool *p, const uint32_t *chunks, uint32_t n);
uint8_t *pool_chunk(const struct pool *p, uint32_t idx);
uint64_t pool_used_bytes(const struct pool *p);

#endif
