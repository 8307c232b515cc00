#include "pool.h"
#include "log.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static uint64_t full_mask(const struct pool *p)
{
	return p->slots == 64 ? ~0ull : (1ull << p->slots) - 1;
}

int pool_init(struct pool *p, uint64_t bytes, uint64_t chunk_bytes)
{
	memset(p, 0, sizeof(*p));
	if (chunk_bytes == 0 || bytes < chunk_bytes)
		return -EINVAL;
	uint64_t n = bytes / chunk_bytes;
	if (n > UINT32_MAX)
		return -E2BIG;
	p->chunk_bytes = chunk_bytes;
	/* Slots stay page-aligned, so every span starts on a page. */
	p->slots = chunk_bytes % (POOL_SLOTS * 4096ull) == 0 ? POOL_SLOTS : 1;
	p->slot_bytes = chunk_bytes / p->slots;
	p->bytes = n * chunk_bytes;
	p->nchunks = (uint32_t)n;
	p->free_stack = calloc(n, sizeof(uint32_t));
	p->used = calloc(n, sizeof(uint64_t));
	if (p->free_stack == NULL || p->used == NULL) {
		pool_fini(p);
		return -ENOMEM;
	}
	void *m = mmap(NULL, p->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) {
		int e = errno;
		pool_fini(p);
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
	free(p->used);
	memset(p, 0, sizeof(*p));
}

void pool_shape(const struct pool *p, uint64_t bytes, uint32_t *whole, uint32_t *tail_slots)
{
	uint64_t w = bytes / p->chunk_bytes, tail = bytes % p->chunk_bytes;
	uint64_t ts = tail / p->slot_bytes + (tail % p->slot_bytes != 0);
	if (ts == p->slots) {
		w++;
		ts = 0;
	}
	*whole = w > UINT32_MAX ? UINT32_MAX : (uint32_t)w;
	*tail_slots = (uint32_t)ts;
}

uint64_t pool_shape_bytes(const struct pool *p, uint32_t whole, uint32_t tail_slots)
{
	return (uint64_t)whole * p->chunk_bytes + (uint64_t)tail_slots * p->slot_bytes;
}

/* The first run of n free slots in a chunk in part use: 0 and where, or
 * -ENOSPC. First fit; chunks wholly free are left for whole reservations. */
static int find_tail(const struct pool *p, uint32_t n, uint32_t *chunk, uint32_t *slot)
{
	uint64_t full = full_mask(p);
	for (uint32_t c = 0; c < p->nchunks; c++) {
		uint64_t u = p->used[c];
		if (u == 0 || u == full)
			continue;
		/* Bit i of m: slots i .. i+n-1 are all free. */
		uint64_t fr = ~u & full, m = fr;
		for (uint32_t j = 1; j < n && m; j++)
			m &= fr >> j;
		if (m) {
			*chunk = c;
			*slot = (uint32_t)__builtin_ctzll(m);
			return 0;
		}
	}
	return -ENOSPC;
}

bool pool_fits(const struct pool *p, uint32_t whole, uint32_t tail_slots)
{
	uint32_t c, s;
	uint64_t need = whole;
	if (tail_slots > 0 && find_tail(p, tail_slots, &c, &s) < 0)
		need++;
	return need <= p->nfree;
}

static void take(struct pool *p, uint32_t chunk, uint32_t slot, uint32_t n, struct pool_span *out)
{
	uint64_t bits = (n == 64 ? ~0ull : (1ull << n) - 1) << slot;
	assert((p->used[chunk] & bits) == 0);
	p->used[chunk] |= bits;
	p->used_slots += n;
	*out = (struct pool_span){ .chunk = chunk, .slot = (uint8_t)slot, .nslots = (uint8_t)n };
}

int pool_reserve(struct pool *p, uint32_t whole, uint32_t tail_slots, struct pool_span *out)
{
	assert(tail_slots < p->slots || (tail_slots == 0 && p->slots == 1));
	if ((uint64_t)whole + (tail_slots > 0) > p->nchunks)
		return -E2BIG;
	uint32_t tc = 0, ts = 0;
	bool in_part = tail_slots > 0 && find_tail(p, tail_slots, &tc, &ts) == 0;
	if ((uint64_t)whole + (tail_slots > 0 && !in_part) > p->nfree)
		return -ENOSPC;
	for (uint32_t i = 0; i < whole; i++)
		take(p, p->free_stack[--p->nfree], 0, p->slots, &out[i]);
	if (tail_slots > 0) {
		if (!in_part) {
			tc = p->free_stack[--p->nfree];
			ts = 0;
		}
		take(p, tc, ts, tail_slots, &out[whole]);
	}
	return 0;
}

void pool_release(struct pool *p, const struct pool_span *spans, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		const struct pool_span *s = &spans[i];
		assert(s->chunk < p->nchunks && s->nslots > 0 && s->slot + s->nslots <= p->slots);
		uint64_t bits = (s->nslots == 64 ? ~0ull : (1ull << s->nslots) - 1) << s->slot;
		assert((p->used[s->chunk] & bits) == bits);
		p->used[s->chunk] &= ~bits;
		p->used_slots -= s->nslots;
		if (p->used[s->chunk] == 0) {
			assert(p->nfree < p->nchunks);
			p->free_stack[p->nfree++] = s->chunk;
		}
	}
}

uint8_t *pool_span_ptr(const struct pool *p, struct pool_span s)
{
	assert(s.chunk < p->nchunks);
	return p->base + (uint64_t)s.chunk * p->chunk_bytes + (uint64_t)s.slot * p->slot_bytes;
}

uint64_t pool_used_bytes(const struct pool *p)
{
	return p->used_slots * p->slot_bytes;
}

uint64_t pool_free_slots(const struct pool *p)
{
	return (uint64_t)p->nchunks * p->slots - p->used_slots;
}
