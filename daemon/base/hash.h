/* Hashes for tables and placement, not for integrity or secrets: FNV-1a
 * over bytes, and a 64-bit finalizer (MurmurHash3's) that spreads its bits
 * where a hash's value is compared (rendezvous scores, start points). */
#ifndef CKPTD_HASH_H
#define CKPTD_HASH_H

#include <stddef.h>
#include <stdint.h>

#define HASH_FNV_SEED 0xcbf29ce484222325ull

static inline uint64_t hash_fnv(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

static inline uint64_t hash_str(const char *s)
{
	uint64_t h = HASH_FNV_SEED;
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
	return h;
}

static inline uint64_t hash_mix(uint64_t h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return h;
}

#endif
