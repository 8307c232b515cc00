/* Small helpers shared by the unit tests. */
#ifndef CKPTD_TESTUTIL_H
#define CKPTD_TESTUTIL_H

#include <stdint.h>
#include <stdlib.h>

/* Deterministic xorshift64*, so a failing case can be replayed. */
static inline uint64_t tu_rand(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545F4914F6CDD1Dull;
}

/* Uniform-ish in [0, n). */
static inline uint64_t tu_below(uint64_t *s, uint64_t n)
{
	return n ? tu_rand(s) % n : 0;
}

static inline void tu_fill(uint64_t *s, void *buf, size_t len)
{
	uint8_t *p = buf;
	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)(tu_rand(s) >> 56);
}

#endif
