#include "pool.h"
#include "log.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int pool_init(struct pool *p, uint64_t bytes, uint64_t chunk_bytes)
{
	memset(p, 0, sizeof(*p));
	if (chunk_bytes == 0 || bytes < chunk_bytes)
		return -EINVAL;
	uint64_t n = bytes / chunk_bytes;
	if (n > UINT32_MAX)
		return -E2BIG;
	p->chunk_bytes = chunk_bytes;
	p->bytes = n * chunk_bytes;
	p->nchunks = (uint32_t)n;
	p->free_stack = calloc(n, sizeof(uint32_t));
	if (p->free_stack == NULL)
		return -ENOMEM;
	void *m = mmap(NULL, p->bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) {
		int e = errno;
		free(p->free_stack);
		p->free_stack = NULL;
		return -e;
	}
	p->base = m;
	/* Fault every page in now, writable: first touch costs seconds per
	 * GiB on these VMs and must never happen on the save path. Huge pages
	 * (where THP allows) make that far cheaper and cut TLB misses. */
	(void)madvise(p->base, p->bytes, MADV_HUGEPAGE);
	if (madvise(p->base, p->bytes, MADV_POPULATE_WRITE) != 0) {
		for (uint64_t off = 0; off < p->bytes; off += 4096)
			((volatile uint8_t *)p->base)[off] = 0;
	}
	if (mlock(p->base, p->bytes) == 0) {
		p->locked = true;
	} else {
		log_warn("pool: mlock of %llu bytes failed (%s); staging memory may be swapped; raise LimitMEMLOCK",
			 (unsigned long long)p->bytes, strerror(errno));
	}
	/* Hand out low chunks first: push in reverse. */
	for (uint32_t i = 0; i < p->nchunks; i++)
		p->free_stack[i] = p->nchunks - 1 - i;
	p->nfree = p->nchunks;
	return 0;
}

void pool_fini(struct pool *p)
{
	if (p->base)
		munmap(p->base, p->bytes);
	free(p->free_stack);
	memset(p, 0, sizeof(*p));
}

int pool_reserve(struct pool *p, uint32_t n, uint32_t *out)
{
	if (n > p->nchunks)
		return -E2BIG;
	if (n > p->nfree)
		return -ENOSPC;
	for (uint32_t i = 0; i < n; i++)
		out[i] = p->free_stack[--p->nfree];
	return 0;
}

void pool_release(struct pool *p, const uint32_t *chunks, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		assert(chunks[i] < p->nchunks);
		assert(p->nfree < p->nchunks);
		p->free_stack[p->nfree++] = chunks[i];
	}
}

uint8_t *pool_chunk(const struct pool *p, uint32_t idx)
{
	assert(idx < p->nchunks);
	return p->base + (uint64_t)idx * p->chunk_bytes;
}

uint64_t pool_used_bytes(const struct pool *p)
{
	return (uint64_t)(p->nchunks - p->nfree) * p->chunk_bytes;
}
