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

/* The copy and the crc of src in one loop, for CPUs with AVX2 and SSE4.2
 * (whose crc32 instruction is CRC32C's): each 64-byte line is loaded
 * into two vector registers and streamed out, and its eight words are
 * fed to crc32 from L1, where the load just put them. crc32 takes three
 * cycles and one can start each cycle, so a chunk is cut into three lanes
 * whose crcs run side by side, joined by crc32c_combine at the chunk's
 * end: eight instructions per line and lane hide under the line's trip
 * to memory, where a crc after the copy (memcopy_crc's block way) is a
 * second pass over the block, from cache but not overlapped with the
 * copy. The register is CRC32C's inverted one, as crc32c_update's. */
#define LANE_CHUNK (3u * (64u << 10))

__attribute__((target("avx2,sse4.2"))) static uint32_t lanes_avx2(uint8_t *d, const uint8_t *s, size_t lane,
								  uint32_t crc)
{
	uint64_t a = ~crc & 0xffffffffu, b = 0xffffffffu, c = 0xffffffffu;
	const uint8_t *s1 = s + lane, *s2 = s + 2 * lane;
	uint8_t *d1 = d + lane, *d2 = d + 2 * lane;
	for (size_t i = 0; i < lane; i += 64) {
		__m256i x0 = _mm256_loadu_si256((const __m256i *)(s + i));
		__m256i x1 = _mm256_loadu_si256((const __m256i *)(s + i + 32));
		__m256i y0 = _mm256_loadu_si256((const __m256i *)(s1 + i));
		__m256i y1 = _mm256_loadu_si256((const __m256i *)(s1 + i + 32));
		__m256i z0 = _mm256_loadu_si256((const __m256i *)(s2 + i));
		__m256i z1 = _mm256_loadu_si256((const __m256i *)(s2 + i + 32));
		_mm256_stream_si256((__m256i *)(d + i), x0);
		_mm256_stream_si256((__m256i *)(d + i + 32), x1);
		_mm256_stream_si256((__m256i *)(d1 + i), y0);
		_mm256_stream_si256((__m256i *)(d1 + i + 32), y1);
		_mm256_stream_si256((__m256i *)(d2 + i), z0);
		_mm256_stream_si256((__m256i *)(d2 + i + 32), z1);
		for (size_t w = 0; w < 64; w += 8) {
			uint64_t p, q, r;
			memcpy(&p, s + i + w, 8);
			memcpy(&q, s1 + i + w, 8);
			memcpy(&r, s2 + i + w, 8);
			a = _mm_crc32_u64(a, p);
			b = _mm_crc32_u64(b, q);
			c = _mm_crc32_u64(c, r);
		}
	}
	uint32_t ca = ~(uint32_t)a, cb = ~(uint32_t)b, cc = ~(uint32_t)c;
	return crc32c_combine(crc32c_combine(ca, cb, lane), cc, lane);
}

/* memcopy_crc by lanes (lanes_avx2): the head up to the destination's
 * 32-byte alignment and the tail short of a whole chunk by block. */
__attribute__((target("avx2,sse4.2"))) static void copy_crc_lanes(uint8_t *d, const uint8_t *s, size_t n, uint32_t *crc)
{
	size_t head = (32 - ((uintptr_t)d & 31)) & 31;
	if (head > n)
		head = n;
	memcpy(d, s, head);
	*crc = crc32c_update(*crc, s, head);
	size_t i = head;
	for (; n - i >= LANE_CHUNK; i += LANE_CHUNK)
		*crc = lanes_avx2(d + i, s + i, LANE_CHUNK / 3, *crc);
	_mm_sfence();
	if (i < n) {
		copy_avx2_nt(d + i, s + i, n - i);
		*crc = crc32c_update(*crc, s + i, n - i);
	}
}

static int lanes_ok(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("sse4.2");
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
static int lanes_ok(void)
{
	return 0;
}
static void copy_crc_lanes(uint8_t *d, const uint8_t *s, size_t n, uint32_t *crc)
{
	memcopy_crc_blocks(d, s, n, crc); /* never chosen here: lanes_ok() */
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
static bool by_lanes; /* memcopy_crc's way, picked with chosen */

__attribute__((constructor)) static void memcopy_pick(void)
{
	if (kind_ok(MEMCOPY_AVX2_NT))
		chosen = MEMCOPY_AVX2_NT;
	else if (!kind_ok(MEMCOPY_SSE2_NT))
		chosen = MEMCOPY_LIBC;
	by_lanes = chosen == MEMCOPY_AVX2_NT && lanes_ok();
}

enum memcopy_kind memcopy_chosen(void)
{
	return chosen;
}

void memcopy_stream(void *dst, const void *src, size_t n)
{
	copies[chosen](dst, src, n);
}

void memcopy_crc_lanes(void *dst, const void *src, size_t n, uint32_t *crc)
{
	copy_crc_lanes(dst, src, n, crc);
}

void memcopy_fence(void)
{
#if defined(__x86_64__)
	_mm_sfence();
#endif
}

bool memcopy_lanes_supported(void)
{
	return lanes_ok();
}

void memcopy_crc_blocks(void *dst, const void *src, size_t n, uint32_t *crc)
{
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

void memcopy_crc(void *dst, const void *src, size_t n, uint32_t *crc)
{
	if (crc == NULL)
		memcopy_stream(dst, src, n);
	else if (by_lanes)
		copy_crc_lanes(dst, src, n, crc);
	else
		memcopy_crc_blocks(dst, src, n, crc);
}
