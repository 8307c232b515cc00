#include "memcopy.h"
#include "crc32c.h"

#include <stdint.h>
#include <string.h>

static const char *const kind_names[MEMCOPY_NKINDS] = { "memcpy", "sse2-nt", "avx2-nt" };

const char *memcopy_kind_name(enum memcopy_kind k)
{
	return k < MEMCOPY_NKINDS ? kind_names[k] : "?";
}

static void copy_libc(void *dst, const void *src, size_t n)
{
	memcpy(dst, src, n);
}

#if defined(__x86_64__)
#include <immintrin.h>

#define STREAM_MIN (4u << 10)

/* 16-byte non-temporal stores (SSE2, every x86-64). */
static void copy_sse2_nt(void *dst, const void *src, size_t n)
{
	uint8_t *d = dst;
	const uint8_t *s = src;
	if (n < STREAM_MIN) {
		memcpy(d, s, n);
		return;
	}
	/* Align the destination to 16 bytes for the streaming stores. */
	size_t head = (16 - ((uintptr_t)d & 15)) & 15;
	memcpy(d, s, head);
	d += head;
	s += head;
	n -= head;
	size_t i = 0;
	for (; i + 64 <= n; i += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)(s + i));
		__m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
		_mm_stream_si128((__m128i *)(d + i), a);
		_mm_stream_si128((__m128i *)(d + i + 16), b);
		_mm_stream_si128((__m128i *)(d + i + 32), c);
		_mm_stream_si128((__m128i *)(d + i + 48), e);
	}
	/* Streaming stores are weakly ordered: fence before anyone (another
	 * thread, the kernel writing the shard) may read them. */
	_mm_sfence();
	memcpy(d + i, s + i, n - i);
}

/* 32-byte non-temporal stores, a cache line of two per half iteration;
 * compiled for AVX2 alone (the target attribute), so the file still
 * builds for baseline x86-64 and memcopy_pick calls it only where the CPU
 * has AVX2. */
__attribute__((target("avx2"))) static void copy_avx2_nt(void *dst, const void *src, size_t n)
{
	uint8_t *d = dst;
	const uint8_t *s = src;
	if (n < STREAM_MIN) {
		memcpy(d, s, n);
		return;
	}
	size_t head = (32 - ((uintptr_t)d & 31)) & 31;
	memcpy(d, s, head);
	d += head;
	s += head;
	n -= head;
	size_t i = 0;
	for (; i + 128 <= n; i += 128) {
		__m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
		__m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
		__m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
		__m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
		_mm256_stream_si256((__m256i *)(d + i), a);
		_mm256_stream_si256((__m256i *)(d + i + 32), b);
		_mm256_stream_si256((__m256i *)(d + i + 64), c);
		_mm256_stream_si256((__m256i *)(d + i + 96), e);
	}
	_mm_sfence();
	memcpy(d + i, s + i, n - i);
}

static int kind_ok(enum memcopy_kind k)
{
	__builtin_cpu_init();
	return k == MEMCOPY_LIBC || k == MEMCOPY_SSE2_NT || (k == MEMCOPY_AVX2_NT && __builtin_cpu_supports("avx2"));
}
#else
#define copy_sse2_nt copy_libc
#define copy_avx2_nt copy_libc
static int kind_ok(enum memcopy_kind k)
{
	return k == MEMCOPY_LIBC;
}
#endif

static void (*const copies[MEMCOPY_NKINDS])(void *, const void *, size_t) = { copy_libc, copy_sse2_nt, copy_avx2_nt };

bool memcopy_kind_supported(enum memcopy_kind k)
{
	return k < MEMCOPY_NKINDS && kind_ok(k);
}

void memcopy_with(enum memcopy_kind k, void *dst, const void *src, size_t n)
{
	copies[k](dst, src, n);
}

static enum memcopy_kind chosen = MEMCOPY_SSE2_NT;

__attribute__((constructor)) static void memcopy_pick(void)
{
	if (kind_ok(MEMCOPY_AVX2_NT))
		chosen = MEMCOPY_AVX2_NT;
	else if (!kind_ok(MEMCOPY_SSE2_NT))
		chosen = MEMCOPY_LIBC;
}

enum memcopy_kind memcopy_chosen(void)
{
	return chosen;
}

void memcopy_stream(void *dst, const void *src, size_t n)
{
	copies[chosen](dst, src, n);
}

void memcopy_crc(void *dst, const void *src, size_t n, uint32_t *crc)
{
	if (crc == NULL) {
		memcopy_stream(dst, src, n);
		return;
	}
	uint8_t *d = dst;
	const uint8_t *s = src;
	for (size_t i = 0; i < n;) {
		size_t b = n - i < MEMCOPY_CRC_BLOCK ? n - i : MEMCOPY_CRC_BLOCK;
		/* The copy reads the block into this core's cache (its stores
		 * bypass it); the crc then reads it from there. The other
		 * order, the crc pulling the block in and the copy reading it
		 * from cache, was 82-94% of memcpy's speed where this is
		 * 92-101% (tests/bench/memcopy_bench, 1 and 2 threads). */
		copies[chosen](d + i, s + i, b);
		*crc = crc32c_update(*crc, s + i, b);
		i += b;
	}
}
