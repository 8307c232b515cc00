#include "planecodec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
/* For ZSTD_c_literalCompressionMode, an experimental parameter (see
 * planecodec_init): only its number, no unstable function. */
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#include <zstd_errors.h>

/* Why planes: the bytes of a trained weight or an optimizer moment are not
 * alike. The byte with a bf16's sign and high exponent bits takes a few
 * dozen values; the mantissa's bytes are close to uniform. Interleaved,
 * zstd sees neither well; split into planes, an exponent plane shrinks to
 * a fraction and a mantissa plane is stored as it is, without zstd
 * spending time on it (ZipNN, arXiv:2411.05239). */

static const char *const kind_names[PLANECODEC_NKINDS] = { "scalar", "ssse3", "avx2" };

const char *planecodec_kind_name(enum planecodec_kind k)
{
	return k < PLANECODEC_NKINDS ? kind_names[k] : "?";
}

static inline void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t get_le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

static bool elem_ok(unsigned elem)
{
	return elem == 1 || elem == 2 || elem == 4 || elem == 8;
}

/* The transposes. split: m elements of src into planes p[0..elem), byte k
 * of element i to p[k][i]; merge: the inverse. The planes are separate
 * pointers because decode merges some from the blob itself (raw planes)
 * and some from the scratch zstd decoded into. elem is 2, 4 or 8 (1 needs
 * no transpose). */

/* The constant e lets the compiler unroll the inner loop per elem. */
static inline void split_e(uint8_t *const *p, const uint8_t *s, size_t from, size_t m, const unsigned e)
{
	for (size_t i = from; i < m; i++)
		for (unsigned k = 0; k < e; k++)
			p[k][i] = s[i * e + k];
}

static inline void merge_e(uint8_t *d, const uint8_t *const *p, size_t from, size_t m, const unsigned e)
{
	for (size_t i = from; i < m; i++)
		for (unsigned k = 0; k < e; k++)
			d[i * e + k] = p[k][i];
}

static void split_tail(uint8_t *const *p, const uint8_t *s, size_t from, size_t m, unsigned elem)
{
	switch (elem) {
	case 2: split_e(p, s, from, m, 2); break;
	case 4: split_e(p, s, from, m, 4); break;
	default: split_e(p, s, from, m, 8); break;
	}
}

static void merge_tail(uint8_t *d, const uint8_t *const *p, size_t from, size_t m, unsigned elem)
{
	switch (elem) {
	case 2: merge_e(d, p, from, m, 2); break;
	case 4: merge_e(d, p, from, m, 4); break;
	default: merge_e(d, p, from, m, 8); break;
	}
}

static void split_scalar(uint8_t *const *p, const uint8_t *s, size_t m, unsigned elem)
{
	split_tail(p, s, 0, m, elem);
}

static void merge_scalar(uint8_t *d, const uint8_t *const *p, size_t m, unsigned elem)
{
	merge_tail(d, p, 0, m, elem);
}

#if defined(__x86_64__)
#include <immintrin.h>

/* 16 elements a step. elem 2: the low and high bytes of each 16-bit word,
 * masked or shifted down and packed (SSE2). elem 4: each 16 bytes
 * shuffled so that their dwords are planes 0..3 of 4 elements, then a 4x4
 * transpose of dwords. elem 8: shuffled so that word k holds byte k of
 * two elements, then an 8x8 transpose of words. */
__attribute__((target("ssse3"))) static void split_ssse3(uint8_t *const *p, const uint8_t *s, size_t m, unsigned elem)
{
	size_t i = 0;
	if (elem == 2) {
		const __m128i lo = _mm_set1_epi16(0xff);
		for (; i + 16 <= m; i += 16) {
			__m128i a = _mm_loadu_si128((const __m128i *)(s + 2 * i));
			__m128i b = _mm_loadu_si128((const __m128i *)(s + 2 * i + 16));
			_mm_storeu_si128((__m128i *)(p[0] + i),
					 _mm_packus_epi16(_mm_and_si128(a, lo), _mm_and_si128(b, lo)));
			_mm_storeu_si128((__m128i *)(p[1] + i),
					 _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8)));
		}
	} else if (elem == 4) {
		const __m128i sh = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
		for (; i + 16 <= m; i += 16) {
			const uint8_t *q = s + 4 * i;
			__m128i r0 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)q), sh);
			__m128i r1 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(q + 16)), sh);
			__m128i r2 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(q + 32)), sh);
			__m128i r3 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(q + 48)), sh);
			__m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpackhi_epi32(r0, r1);
			__m128i t2 = _mm_unpacklo_epi32(r2, r3), t3 = _mm_unpackhi_epi32(r2, r3);
			_mm_storeu_si128((__m128i *)(p[0] + i), _mm_unpacklo_epi64(t0, t2));
			_mm_storeu_si128((__m128i *)(p[1] + i), _mm_unpackhi_epi64(t0, t2));
			_mm_storeu_si128((__m128i *)(p[2] + i), _mm_unpacklo_epi64(t1, t3));
			_mm_storeu_si128((__m128i *)(p[3] + i), _mm_unpackhi_epi64(t1, t3));
		}
	} else {
		const __m128i sh = _mm_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
		for (; i + 16 <= m; i += 16) {
			const uint8_t *q = s + 8 * i;
			__m128i r[8], a[8], b[8];
			for (int j = 0; j < 8; j++)
				r[j] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(q + 16 * j)), sh);
			for (int j = 0; j < 8; j += 2) {
				a[j] = _mm_unpacklo_epi16(r[j], r[j + 1]);
				a[j + 1] = _mm_unpackhi_epi16(r[j], r[j + 1]);
			}
			/* b[0..3]: words 0-1, 2-3, 4-5, 6-7 of r0..r3; b[4..7] of r4..r7. */
			for (int h = 0; h < 2; h++) {
				b[4 * h] = _mm_unpacklo_epi32(a[4 * h], a[4 * h + 2]);
				b[4 * h + 1] = _mm_unpackhi_epi32(a[4 * h], a[4 * h + 2]);
				b[4 * h + 2] = _mm_unpacklo_epi32(a[4 * h + 1], a[4 * h + 3]);
				b[4 * h + 3] = _mm_unpackhi_epi32(a[4 * h + 1], a[4 * h + 3]);
			}
			for (int j = 0; j < 4; j++) {
				_mm_storeu_si128((__m128i *)(p[2 * j] + i), _mm_unpacklo_epi64(b[j], b[j + 4]));
				_mm_storeu_si128((__m128i *)(p[2 * j + 1] + i), _mm_unpackhi_epi64(b[j], b[j + 4]));
			}
		}
	}
	split_tail(p, s, i, m, elem);
}

/* The inverse with byte, word and dword unpacks (SSE2 alone). */
__attribute__((target("ssse3"))) static void merge_ssse3(uint8_t *d, const uint8_t *const *p, size_t m, unsigned elem)
{
	size_t i = 0;
	if (elem == 2) {
		for (; i + 16 <= m; i += 16) {
			__m128i a = _mm_loadu_si128((const __m128i *)(p[0] + i));
			__m128i b = _mm_loadu_si128((const __m128i *)(p[1] + i));
			_mm_storeu_si128((__m128i *)(d + 2 * i), _mm_unpacklo_epi8(a, b));
			_mm_storeu_si128((__m128i *)(d + 2 * i + 16), _mm_unpackhi_epi8(a, b));
		}
	} else if (elem == 4) {
		for (; i + 16 <= m; i += 16) {
			__m128i a = _mm_loadu_si128((const __m128i *)(p[0] + i));
			__m128i b = _mm_loadu_si128((const __m128i *)(p[1] + i));
			__m128i c = _mm_loadu_si128((const __m128i *)(p[2] + i));
			__m128i e = _mm_loadu_si128((const __m128i *)(p[3] + i));
			__m128i abl = _mm_unpacklo_epi8(a, b), abh = _mm_unpackhi_epi8(a, b);
			__m128i cel = _mm_unpacklo_epi8(c, e), ceh = _mm_unpackhi_epi8(c, e);
			uint8_t *q = d + 4 * i;
			_mm_storeu_si128((__m128i *)q, _mm_unpacklo_epi16(abl, cel));
			_mm_storeu_si128((__m128i *)(q + 16), _mm_unpackhi_epi16(abl, cel));
			_mm_storeu_si128((__m128i *)(q + 32), _mm_unpacklo_epi16(abh, ceh));
			_mm_storeu_si128((__m128i *)(q + 48), _mm_unpackhi_epi16(abh, ceh));
		}
	} else {
		for (; i + 16 <= m; i += 16) {
			__m128i x[8], y[8];
			/* x: planes 2j, 2j+1 as words, elements 0-7 (x[2j]) and 8-15. */
			for (int j = 0; j < 4; j++) {
				__m128i a = _mm_loadu_si128((const __m128i *)(p[2 * j] + i));
				__m128i b = _mm_loadu_si128((const __m128i *)(p[2 * j + 1] + i));
				x[2 * j] = _mm_unpacklo_epi8(a, b);
				x[2 * j + 1] = _mm_unpackhi_epi8(a, b);
			}
			/* y: planes 0-3 (y[0..3]) and 4-7 (y[4..7]) as dwords,
			 * elements 0-3, 4-7, 8-11, 12-15. */
			for (int h = 0; h < 2; h++) {
				y[4 * h] = _mm_unpacklo_epi16(x[4 * h], x[4 * h + 2]);
				y[4 * h + 1] = _mm_unpackhi_epi16(x[4 * h], x[4 * h + 2]);
				y[4 * h + 2] = _mm_unpacklo_epi16(x[4 * h + 1], x[4 * h + 3]);
				y[4 * h + 3] = _mm_unpackhi_epi16(x[4 * h + 1], x[4 * h + 3]);
			}
			uint8_t *q = d + 8 * i;
			for (int j = 0; j < 4; j++) {
				_mm_storeu_si128((__m128i *)(q + 32 * j), _mm_unpacklo_epi32(y[j], y[j + 4]));
				_mm_storeu_si128((__m128i *)(q + 32 * j + 16), _mm_unpackhi_epi32(y[j], y[j + 4]));
			}
		}
	}
	merge_tail(d, p, i, m, elem);
}

/* 32 elements a step for elem 2 and 4: the 16-byte method in each lane,
 * then the lanes put in order (AVX2's shuffles and unpacks work within
 * 128-bit lanes). elem 8 takes the SSSE3 one. */
__attribute__((target("avx2"))) static void split_avx2(uint8_t *const *p, const uint8_t *s, size_t m, unsigned elem)
{
	size_t i = 0;
	if (elem == 2) {
		const __m256i lo = _mm256_set1_epi16(0xff);
		for (; i + 32 <= m; i += 32) {
			__m256i a = _mm256_loadu_si256((const __m256i *)(s + 2 * i));
			__m256i b = _mm256_loadu_si256((const __m256i *)(s + 2 * i + 32));
			__m256i l = _mm256_packus_epi16(_mm256_and_si256(a, lo), _mm256_and_si256(b, lo));
			__m256i h = _mm256_packus_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
			/* The packs left the quads as a0 b0 a1 b1. */
			_mm256_storeu_si256((__m256i *)(p[0] + i), _mm256_permute4x64_epi64(l, 0xd8));
			_mm256_storeu_si256((__m256i *)(p[1] + i), _mm256_permute4x64_epi64(h, 0xd8));
		}
	} else if (elem == 4) {
		const __m256i sh = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12,
						    1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
		const __m256i ord = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
		for (; i + 32 <= m; i += 32) {
			const uint8_t *q = s + 4 * i;
			__m256i r[4];
			/* Each r: quad k is 8 bytes of plane k. */
			for (int j = 0; j < 4; j++)
				r[j] = _mm256_permutevar8x32_epi32(
					_mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(q + 32 * j)), sh),
					ord);
			__m256i t0 = _mm256_unpacklo_epi64(r[0], r[1]), t1 = _mm256_unpackhi_epi64(r[0], r[1]);
			__m256i t2 = _mm256_unpacklo_epi64(r[2], r[3]), t3 = _mm256_unpackhi_epi64(r[2], r[3]);
			_mm256_storeu_si256((__m256i *)(p[0] + i), _mm256_permute2x128_si256(t0, t2, 0x20));
			_mm256_storeu_si256((__m256i *)(p[1] + i), _mm256_permute2x128_si256(t1, t3, 0x20));
			_mm256_storeu_si256((__m256i *)(p[2] + i), _mm256_permute2x128_si256(t0, t2, 0x31));
			_mm256_storeu_si256((__m256i *)(p[3] + i), _mm256_permute2x128_si256(t1, t3, 0x31));
		}
	} else {
		split_ssse3(p, s, m, elem);
		return;
	}
	split_tail(p, s, i, m, elem);
}

__attribute__((target("avx2"))) static void merge_avx2(uint8_t *d, const uint8_t *const *p, size_t m, unsigned elem)
{
	size_t i = 0;
	if (elem == 2) {
		for (; i + 32 <= m; i += 32) {
			__m256i a = _mm256_loadu_si256((const __m256i *)(p[0] + i));
			__m256i b = _mm256_loadu_si256((const __m256i *)(p[1] + i));
			__m256i l = _mm256_unpacklo_epi8(a, b), h = _mm256_unpackhi_epi8(a, b);
			_mm256_storeu_si256((__m256i *)(d + 2 * i), _mm256_permute2x128_si256(l, h, 0x20));
			_mm256_storeu_si256((__m256i *)(d + 2 * i + 32), _mm256_permute2x128_si256(l, h, 0x31));
		}
	} else if (elem == 4) {
		for (; i + 32 <= m; i += 32) {
			__m256i a = _mm256_loadu_si256((const __m256i *)(p[0] + i));
			__m256i b = _mm256_loadu_si256((const __m256i *)(p[1] + i));
			__m256i c = _mm256_loadu_si256((const __m256i *)(p[2] + i));
			__m256i e = _mm256_loadu_si256((const __m256i *)(p[3] + i));
			__m256i abl = _mm256_unpacklo_epi8(a, b), abh = _mm256_unpackhi_epi8(a, b);
			__m256i cel = _mm256_unpacklo_epi8(c, e), ceh = _mm256_unpackhi_epi8(c, e);
			/* Elements 0-3|16-19, 4-7|20-23, 8-11|24-27, 12-15|28-31. */
			__m256i o0 = _mm256_unpacklo_epi16(abl, cel), o1 = _mm256_unpackhi_epi16(abl, cel);
			__m256i o2 = _mm256_unpacklo_epi16(abh, ceh), o3 = _mm256_unpackhi_epi16(abh, ceh);
			uint8_t *q = d + 4 * i;
			_mm256_storeu_si256((__m256i *)q, _mm256_permute2x128_si256(o0, o1, 0x20));
			_mm256_storeu_si256((__m256i *)(q + 32), _mm256_permute2x128_si256(o2, o3, 0x20));
			_mm256_storeu_si256((__m256i *)(q + 64), _mm256_permute2x128_si256(o0, o1, 0x31));
			_mm256_storeu_si256((__m256i *)(q + 96), _mm256_permute2x128_si256(o2, o3, 0x31));
		}
	} else {
		merge_ssse3(d, p, m, elem);
		return;
	}
	merge_tail(d, p, i, m, elem);
}

static bool kind_ok(enum planecodec_kind k)
{
	__builtin_cpu_init();
	return k == PLANECODEC_SCALAR || (k == PLANECODEC_SSSE3 && __builtin_cpu_supports("ssse3")) ||
	       (k == PLANECODEC_AVX2 && __builtin_cpu_supports("avx2"));
}
#else
#define split_ssse3 split_scalar
#define split_avx2 split_scalar
#define merge_ssse3 merge_scalar
#define merge_avx2 merge_scalar
static bool kind_ok(enum planecodec_kind k)
{
	return k == PLANECODEC_SCALAR;
}
#endif

static void (*const splits[PLANECODEC_NKINDS])(uint8_t *const *, const uint8_t *, size_t,
					       unsigned) = { split_scalar, split_ssse3, split_avx2 };
static void (*const merges[PLANECODEC_NKINDS])(uint8_t *, const uint8_t *const *, size_t,
					       unsigned) = { merge_scalar, merge_ssse3, merge_avx2 };

static enum planecodec_kind chosen = PLANECODEC_SCALAR;

__attribute__((constructor)) static void planecodec_pick(void)
{
	if (kind_ok(PLANECODEC_AVX2))
		chosen = PLANECODEC_AVX2;
	else if (kind_ok(PLANECODEC_SSSE3))
		chosen = PLANECODEC_SSSE3;
}

enum planecodec_kind planecodec_chosen(void)
{
	return chosen;
}

bool planecodec_kind_supported(enum planecodec_kind k)
{
	return k < PLANECODEC_NKINDS && kind_ok(k);
}

int planecodec_init(struct planecodec *c, int level)
{
	memset(c, 0, sizeof(*c));
	c->level = level ? level : PLANECODEC_LEVEL_DEFAULT;
	c->kind = chosen;
	c->cctx = ZSTD_createCCtx();
	c->dctx = ZSTD_createDCtx();
	/* Gathered elements, then their planes, side by side. */
	c->sample = malloc(2 * (size_t)PLANECODEC_SAMPLE);
	if (c->cctx == NULL || c->dctx == NULL || c->sample == NULL) {
		planecodec_free(c);
		return -ENOMEM;
	}
	if (ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_compressionLevel, c->level)))
		c->level = PLANECODEC_LEVEL_DEFAULT;
	ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_compressionLevel, c->level);
	/* At negative levels zstd stores literals raw; an exponent plane is
	 * nearly all literals (its matches are short and cost more than they
	 * save), so its whole gain is their Huffman coding: keep it. Far
	 * negative, with few matches tried, this is in effect Huffman alone,
	 * 3x as fast as level 1 and smaller (tests/bench/codec_bench.c). The
	 * parameter came with zstd 1.4.0 (ZSTD_lcm_huffman, which later
	 * headers keep beside ZSTD_ps_enable, the same value); older ones
	 * leave literals raw and compress less. */
#if ZSTD_VERSION_NUMBER >= 10400
	if (c->level < 0)
		ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_literalCompressionMode, ZSTD_lcm_huffman);
#endif
	return 0;
}

void planecodec_free(struct planecodec *c)
{
	ZSTD_freeCCtx(c->cctx);
	ZSTD_freeDCtx(c->dctx);
	free(c->scratch);
	free(c->sample);
	memset(c, 0, sizeof(*c));
}

static int scratch_reserve(struct planecodec *c, size_t n)
{
	if (n <= c->scratch_cap)
		return 0;
	/* Not realloc: the old bytes are not wanted, and copying them would
	 * cost a pass over the largest piece yet. */
	uint8_t *p = malloc(n);
	if (p == NULL)
		return -ENOMEM;
	free(c->scratch);
	c->scratch = p;
	c->scratch_cap = n;
	return 0;
}

size_t planecodec_bound(size_t n)
{
	/* A plane is never stored larger than it is. */
	return n > SIZE_MAX - PLANECODEC_HDR_MAX ? SIZE_MAX : n + PLANECODEC_HDR_MAX;
}

/* zstd's size for src into at most cap bytes, or 0 where it needs more
 * (the plane is then stored raw), or -EIO. */
static ssize_t zstd_into(struct planecodec *c, void *dst, size_t cap, const void *src, size_t len)
{
	size_t r = ZSTD_compress2(c->cctx, dst, cap, src, len);
	if (!ZSTD_isError(r))
		return (ssize_t)r;
	return ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall ? 0 : -EIO;
}

#define PLANE_WINDOWS 4
#define PLANE_WINDOW (4u << 10)

/* Whether a plane is worth zstd's time: 4 windows of 4 KiB, spread over
 * it, must compress to 96% or less. A mantissa plane, near uniform bytes,
 * does not, and zstd over it would cost as much as over the exponent
 * plane for nothing. Planes below 64 KiB are always tried: a sample would
 * be a good part of the work. */
static bool plane_compressible(struct planecodec *c, const uint8_t *plane, size_t len)
{
	if (len < 16 * PLANE_WINDOW)
		return true;
	uint8_t *g = c->sample;
	for (size_t w = 0; w < PLANE_WINDOWS; w++)
		memcpy(g + w * PLANE_WINDOW, plane + (len - PLANE_WINDOW) / (PLANE_WINDOWS - 1) * w, PLANE_WINDOW);
	size_t glen = PLANE_WINDOWS * PLANE_WINDOW;
	return zstd_into(c, c->sample + PLANECODEC_SAMPLE, glen * 96 / 100, g, glen) > 0;
}

ssize_t planecodec_encode(struct planecodec *c, const void *src, size_t n, unsigned elem, void *dst, size_t cap)
{
	if (!elem_ok(elem))
		return -EINVAL;
	if (cap < planecodec_bound(n) || n > (size_t)SSIZE_MAX - PLANECODEC_HDR_MAX)
		return -ENOSPC;
	const uint8_t *s = src;
	uint8_t *d = dst;
	size_t m = n / elem, tail = n % elem;
	uint8_t *planes[8];
	if (elem == 1) {
		planes[0] = (uint8_t *)s;
	} else {
		int r = scratch_reserve(c, m * elem);
		if (r < 0)
			return r;
		for (unsigned k = 0; k < elem; k++)
			planes[k] = c->scratch + k * m;
		splits[c->kind](planes, s, m, elem);
	}
	memcpy(d, PLANECODEC_MAGIC, 4);
	d[4] = PLANECODEC_VERSION;
	d[5] = (uint8_t)elem;
	d[6] = d[7] = 0;
	put_le64(d + 8, n);
	size_t off = PLANECODEC_HDR(elem);
	for (unsigned k = 0; k < elem; k++) {
		uint8_t *e = d + 16 + 16 * k;
		ssize_t z = 0;
		/* Stored as zstd only where that is smaller: at most m - 1
		 * bytes, which cap (at least the bound) always has room for. */
		if (m > 1 && plane_compressible(c, planes[k], m))
			z = zstd_into(c, d + off, m - 1, planes[k], m);
		if (z < 0)
			return z;
		memset(e, 0, 16);
		if (z > 0) {
			e[0] = PLANECODEC_ZSTD;
			put_le64(e + 8, (uint64_t)z);
			off += (size_t)z;
		} else {
			e[0] = PLANECODEC_RAW;
			put_le64(e + 8, m);
			if (m) /* planes[k] may be NULL for an empty piece */
				memcpy(d + off, planes[k], m);
			off += m;
		}
	}
	if (tail)
		memcpy(d + off, s + m * elem, tail);
	return (ssize_t)(off + tail);
}

bool planecodec_worth(struct planecodec *c, const void *src, size_t n, unsigned elem)
{
	/* Less than an element is all tail, stored raw. */
	if (!elem_ok(elem) || n < elem)
		return false;
	const uint8_t *s = src;
	size_t m = n / elem;
	/* Whole elements from 4 windows spread over the piece, or all of a
	 * piece that fits. */
	size_t wm = PLANECODEC_SAMPLE / elem / PLANE_WINDOWS;
	size_t sm = m <= wm * PLANE_WINDOWS ? m : wm * PLANE_WINDOWS;
	uint8_t *g = c->sample, *pl = c->sample + PLANECODEC_SAMPLE;
	if (sm == m) {
		memcpy(g, s, m * elem);
	} else {
		for (size_t w = 0; w < PLANE_WINDOWS; w++)
			memcpy(g + w * wm * elem, s + (m - wm) / (PLANE_WINDOWS - 1) * w * elem, wm * elem);
	}
	uint8_t *planes[8];
	for (unsigned k = 0; k < elem; k++)
		planes[k] = pl + k * sm;
	if (elem == 1)
		memcpy(pl, g, sm);
	else
		splits[c->kind](planes, g, sm, elem);
	/* The planes' stored sizes, as encode would store them, scaled to
	 * the piece; the header counts in full, as it does for a small one. */
	size_t stored = 0;
	for (unsigned k = 0; k < elem; k++) {
		ssize_t z = sm > 1 ? zstd_into(c, g, sm - 1, planes[k], sm) : 0;
		stored += z > 0 ? (size_t)z : sm;
	}
	double est = (double)stored * (double)n / (double)(sm * elem) + PLANECODEC_HDR(elem);
	return est <= 0.9 * (double)n;
}

int planecodec_decode(struct planecodec *c, const void *src, size_t srclen, void *dst, size_t n)
{
	const uint8_t *s = src;
	uint8_t *d = dst;
	/* The fixed part, then the plane table, each against srclen before
	 * a byte of it is read. */
	if (srclen < 16 || memcmp(s, PLANECODEC_MAGIC, 4) != 0 || s[4] != PLANECODEC_VERSION || !elem_ok(s[5]) ||
	    s[6] != 0 || s[7] != 0 || get_le64(s + 8) != (uint64_t)n)
		return -EBADMSG;
	unsigned elem = s[5];
	size_t m = n / elem, tail = n % elem;
	if (srclen < PLANECODEC_HDR(elem))
		return -EBADMSG;
	size_t off = PLANECODEC_HDR(elem);
	size_t at[8], len[8];
	bool any_zstd = false;
	for (unsigned k = 0; k < elem; k++) {
		const uint8_t *e = s + 16 + 16 * k;
		for (int i = 1; i < 8; i++)
			if (e[i] != 0)
				return -EBADMSG;
		uint64_t l = get_le64(e + 8);
		/* Raw is the plane, zstd strictly less (encode stores it only
		 * so), and each within what is left of the blob. */
		if (e[0] == PLANECODEC_RAW ? l != m : e[0] != PLANECODEC_ZSTD || l == 0 || l >= m)
			return -EBADMSG;
		if (l > srclen - off)
			return -EBADMSG;
		at[k] = off;
		len[k] = (size_t)l;
		off += (size_t)l;
		any_zstd |= e[0] == PLANECODEC_ZSTD;
	}
	if (srclen - off != tail)
		return -EBADMSG;
	if (any_zstd && elem > 1) {
		int r = scratch_reserve(c, m * elem);
		if (r < 0)
			return r;
	}
	const uint8_t *planes[8];
	for (unsigned k = 0; k < elem; k++) {
		const uint8_t *e = s + 16 + 16 * k;
		if (e[0] == PLANECODEC_RAW) {
			planes[k] = s + at[k];
			continue;
		}
		/* One frame, exactly the stored bytes, that says it holds the
		 * plane and does: ZSTD_decompressDCtx alone would take several
		 * frames, and a frame without its size. */
		uint8_t *out = elem == 1 ? d : c->scratch + k * m;
		if (ZSTD_getFrameContentSize(s + at[k], len[k]) != (unsigned long long)m ||
		    ZSTD_findFrameCompressedSize(s + at[k], len[k]) != len[k])
			return -EBADMSG;
		size_t r = ZSTD_decompressDCtx(c->dctx, out, m, s + at[k], len[k]);
		if (ZSTD_isError(r) || r != m)
			return -EBADMSG;
		planes[k] = out;
	}
	if (elem == 1) {
		if (m && planes[0] != d) /* d may be NULL for an empty piece */
			memcpy(d, planes[0], m);
	} else {
		merges[c->kind](d, planes, m, elem);
	}
	if (tail)
		memcpy(d + m * elem, s + off, tail);
	return 0;
}
