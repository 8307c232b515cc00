#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <zstd.h>

#include "macro.h"
#include "planecodec.h"
#include "testutil.h"

#define BIG ((3u << 20) + 5)
#define CANARY 0xEE
#define PAD 64

static const unsigned elems[] = { 1, 2, 4, 8 };

static uint8_t *rnd, *bf16, *dst, *blob;
static size_t blob_cap;
static struct planecodec pc;

/* About N(0, 1): the sum of 12 uniforms less 6 (no libm), from the
 * tests' own generator. */
static double gauss(uint64_t *s)
{
	double sum = 0;
	for (int i = 0; i < 12; i++)
		sum += (double)(tu_rand(s) >> 11) / 9007199254740992.0;
	return sum - 6.0;
}

/* bf16 weights as a trained layer's: N(0, 0.02) floats, truncated to
 * their high 16 bits. The exponent byte takes a few values, the mantissa's
 * is near uniform. */
static void fill_bf16(uint64_t *s, uint8_t *p, size_t n)
{
	for (size_t i = 0; i + 2 <= n; i += 2) {
		float f = (float)(0.02 * gauss(s));
		uint32_t u;
		memcpy(&u, &f, 4);
		p[i] = (uint8_t)(u >> 16);
		p[i + 1] = (uint8_t)(u >> 24);
	}
	if (n % 2)
		p[n - 1] = 0x3c;
}

static int setup(void **state)
{
	(void)state;
	blob_cap = planecodec_bound(BIG) + PAD;
	rnd = malloc(BIG + PAD);
	bf16 = malloc(BIG + PAD);
	dst = malloc(BIG + 2 * PAD);
	blob = malloc(blob_cap);
	if (!rnd || !bf16 || !dst || !blob || planecodec_init(&pc, 0) != 0)
		return -1;
	uint64_t seed = 11;
	tu_fill(&seed, rnd, BIG + PAD);
	fill_bf16(&seed, bf16, BIG + PAD);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	planecodec_free(&pc);
	free(rnd);
	free(bf16);
	free(dst);
	free(blob);
	return 0;
}

/* Decode blob into dst + off, n bytes, with canaries either side: the
 * result, and that nothing outside [dst + off, dst + off + n) changed. */
static int decode_guarded(struct planecodec *c, const uint8_t *b, size_t blen, size_t off, size_t n)
{
	memset(dst, CANARY, off);
	memset(dst + off + n, CANARY, PAD);
	int r = planecodec_decode(c, b, blen, dst + off, n);
	for (size_t i = 0; i < off; i++)
		assert_int_equal(dst[i], CANARY);
	for (size_t i = 0; i < PAD; i++)
		assert_int_equal(dst[off + n + i], CANARY);
	return r;
}

static void round_trip(struct planecodec *c, const uint8_t *src, size_t n, unsigned elem, size_t doff)
{
	ssize_t len = planecodec_encode(c, src, n, elem, blob, planecodec_bound(n));
	assert_true(len >= (ssize_t)PLANECODEC_HDR(elem));
	assert_true((size_t)len <= n + PLANECODEC_HDR(elem));
	assert_int_equal(decode_guarded(c, blob, (size_t)len, doff, n), 0);
	assert_memory_equal(dst + doff, src, n);
}

/* Every elem, at sizes around every edge (empty, less than an element,
 * odd tails, the 16- and 32-element steps of the transposes, the 64 KiB
 * where a plane starts being sampled, a few MiB), from unaligned sources
 * into unaligned destinations, of both kinds of data. */
static void test_round_trips(void **state)
{
	(void)state;
	static const size_t sizes[] = { 0,   1,   2,   3,   7,    9,    15,        17,    31,        33,         63, 65,
					127, 129, 255, 257, 1000, 4097, 65536 - 1, 65536, 65536 + 1, 524288 + 3, BIG };
	for (size_t e = 0; e < ELEMENTSOF(elems); e++)
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
			for (size_t so = 0; so < 3; so++) {
				size_t n = sizes[i];
				round_trip(&pc, rnd + so, n, elems[e], (so * 5) % 8);
				round_trip(&pc, bf16 + so, n, elems[e], so);
			}
}

/* Every transpose the CPU has stores the same bytes as the scalar one and
 * reads back what any other stored, at every step edge. */
static void test_kinds_agree(void **state)
{
	(void)state;
	static const size_t counts[] = { 0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 1000, 4099, 40000 };
	uint8_t *ref = malloc(planecodec_bound(8 * 40000 + 7));
	assert_non_null(ref);
	struct planecodec k;
	assert_int_equal(planecodec_init(&k, 0), 0);
	for (size_t e = 1; e < ELEMENTSOF(elems); e++)
		for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
			for (size_t t = 0; t < 2; t++) {
				unsigned elem = elems[e];
				size_t n = counts[i] * elem + t * (elem - 1);
				const uint8_t *src = (i % 2 ? rnd : bf16) + i;
				pc.kind = PLANECODEC_SCALAR;
				ssize_t rl = planecodec_encode(&pc, src, n, elem, ref, planecodec_bound(n));
				assert_true(rl > 0);
				for (int kind = 0; kind < PLANECODEC_NKINDS; kind++) {
					if (!planecodec_kind_supported((enum planecodec_kind)kind))
						continue;
					k.kind = (enum planecodec_kind)kind;
					ssize_t l = planecodec_encode(&k, src, n, elem, blob, planecodec_bound(n));
					assert_int_equal(l, rl);
					assert_memory_equal(blob, ref, (size_t)l);
					assert_int_equal(decode_guarded(&k, ref, (size_t)rl, 3, n), 0);
					assert_memory_equal(dst + 3, src, n);
				}
			}
	pc.kind = planecodec_chosen();
	assert_true(planecodec_kind_supported(planecodec_chosen()));
	assert_true(planecodec_kind_supported(PLANECODEC_SCALAR));
	assert_false(planecodec_kind_supported(PLANECODEC_NKINDS));
	planecodec_free(&k);
	free(ref);
}

/* bf16 weights shrink by 1.2x or more, and planecodec_worth says so from
 * its sample; random bytes are stored raw, every plane, larger only by the
 * header, and planecodec_worth says no. */
static void test_ratios_and_worth(void **state)
{
	(void)state;
	size_t n = BIG - 5;
	ssize_t l = planecodec_encode(&pc, bf16, n, 2, blob, blob_cap);
	assert_true(l > 0);
	print_message("# bf16 N(0,0.02): %zu -> %zd bytes, %.3fx\n", n, l, (double)n / (double)l);
	assert_true((double)n / (double)l >= 1.2);
	assert_int_equal(blob[16], PLANECODEC_RAW);  /* the mantissa's low bits */
	assert_int_equal(blob[32], PLANECODEC_ZSTD); /* sign and exponent */
	assert_true(planecodec_worth(&pc, bf16, n, 2));
	assert_true(planecodec_worth(&pc, bf16, 100000, 2));
	for (size_t e = 0; e < ELEMENTSOF(elems); e++) {
		unsigned elem = elems[e];
		l = planecodec_encode(&pc, rnd, n, elem, blob, blob_cap);
		assert_int_equal(l, n + PLANECODEC_HDR(elem));
		for (unsigned k = 0; k < elem; k++)
			assert_int_equal(blob[16 + 16 * k], PLANECODEC_RAW);
		assert_false(planecodec_worth(&pc, rnd, n, elem));
		assert_false(planecodec_worth(&pc, rnd, 1000, elem));
	}
	/* Nothing to save in an empty piece or a lone tail; no elem 3. */
	assert_false(planecodec_worth(&pc, bf16, 0, 2));
	assert_false(planecodec_worth(&pc, bf16, 7, 8));
	assert_false(planecodec_worth(&pc, bf16, n, 3));
}

static void test_encode_refuses(void **state)
{
	(void)state;
	assert_int_equal(planecodec_encode(&pc, bf16, 100, 3, blob, blob_cap), -EINVAL);
	assert_int_equal(planecodec_encode(&pc, bf16, 100, 0, blob, blob_cap), -EINVAL);
	assert_int_equal(planecodec_encode(&pc, bf16, 100, 2, blob, planecodec_bound(100) - 1), -ENOSPC);
}

/* A small blob with a zstd plane, a raw plane and a tail. */
static size_t small_blob(uint8_t *b, size_t *n)
{
	*n = 4001;
	ssize_t l = planecodec_encode(&pc, bf16, *n, 2, b, planecodec_bound(*n));
	assert_true(l > 0);
	assert_int_equal(b[16], PLANECODEC_RAW);
	assert_int_equal(b[32], PLANECODEC_ZSTD);
	return (size_t)l;
}

/* Every cut of a valid blob, one byte more, each bit and each whole byte
 * of its header changed, and the wrong n: refused, and nothing written
 * past n. */
static void test_decode_refuses_damage(void **state)
{
	(void)state;
	size_t n;
	size_t len = small_blob(blob, &n);
	uint8_t *b = malloc(len + 1);
	assert_non_null(b);
	for (size_t cut = 0; cut < len; cut++) {
		memcpy(b, blob, cut);
		assert_int_equal(decode_guarded(&pc, b, cut, 1, n), -EBADMSG);
	}
	memcpy(b, blob, len);
	b[len] = 0;
	assert_int_equal(decode_guarded(&pc, b, len + 1, 1, n), -EBADMSG);
	assert_int_equal(decode_guarded(&pc, b, len, 1, n - 1), -EBADMSG);
	assert_int_equal(decode_guarded(&pc, b, len, 1, n + 1), -EBADMSG);
	for (size_t i = 0; i < PLANECODEC_HDR(2); i++)
		for (int bit = 0; bit <= 8; bit++) {
			memcpy(b, blob, len);
			b[i] ^= bit == 8 ? 0xff : 1u << bit;
			assert_int_equal(decode_guarded(&pc, b, len, 1, n), -EBADMSG);
		}
	/* The blob as it was still decodes. */
	assert_int_equal(decode_guarded(&pc, blob, len, 1, n), 0);
	assert_memory_equal(dst + 1, bf16, n);
	free(b);
}

/* A blob of elem 1, n bytes, one plane of method zstd holding frame f. */
static size_t zstd_blob(uint8_t *b, uint64_t n, const uint8_t *f, size_t flen)
{
	memset(b, 0, 32);
	memcpy(b, PLANECODEC_MAGIC, 4);
	b[4] = PLANECODEC_VERSION;
	b[5] = 1;
	for (int i = 0; i < 8; i++) {
		b[8 + i] = (uint8_t)(n >> (8 * i));
		b[24 + i] = (uint8_t)((uint64_t)flen >> (8 * i));
	}
	b[16] = PLANECODEC_ZSTD;
	memcpy(b + 32, f, flen);
	return 32 + flen;
}

/* Frames that are not exactly the plane: a byte short, a byte over, no
 * content size, two frames, a content size that lies. The blob's lengths
 * all add up; the frames alone are wrong. */
static void test_decode_refuses_wrong_frames(void **state)
{
	(void)state;
	const size_t n = 1000;
	uint8_t plain[1001];
	memset(plain, 'a', sizeof(plain));
	plain[500] = 'b';
	uint8_t f[2048], b[4096];
	size_t fl;

	fl = ZSTD_compress(f, sizeof(f), plain, n, 1);
	assert_false(ZSTD_isError(fl));
	size_t bl = zstd_blob(b, n, f, fl);
	assert_int_equal(decode_guarded(&pc, b, bl, 0, n), 0); /* as made, it is good */
	assert_memory_equal(dst, plain, n);

	for (int d = -1; d <= 1; d += 2) {
		fl = ZSTD_compress(f, sizeof(f), plain, n + d, 1);
		assert_false(ZSTD_isError(fl));
		bl = zstd_blob(b, n, f, fl);
		assert_int_equal(decode_guarded(&pc, b, bl, 0, n), -EBADMSG);
	}

	ZSTD_CCtx *cc = ZSTD_createCCtx();
	assert_non_null(cc);
	assert_false(ZSTD_isError(ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 0)));
	/* Streamed, so the frame has no size to record. */
	ZSTD_outBuffer out = { f, sizeof(f), 0 };
	ZSTD_inBuffer in = { plain, n, 0 };
	assert_int_equal(ZSTD_compressStream2(cc, &out, &in, ZSTD_e_end), 0);
	assert_int_equal(ZSTD_getFrameContentSize(f, out.pos), ZSTD_CONTENTSIZE_UNKNOWN);
	bl = zstd_blob(b, n, f, out.pos);
	assert_int_equal(decode_guarded(&pc, b, bl, 0, n), -EBADMSG);
	ZSTD_freeCCtx(cc);

	size_t h = ZSTD_compress(f, sizeof(f), plain, n / 2, 1);
	size_t h2 = ZSTD_compress(f + h, sizeof(f) - h, plain + n / 2, n / 2, 1);
	assert_false(ZSTD_isError(h) || ZSTD_isError(h2));
	bl = zstd_blob(b, n, f, h + h2);
	assert_int_equal(decode_guarded(&pc, b, bl, 0, n), -EBADMSG);

	/* A frame exactly as long as the plane, which encode stores raw.
	 * zstd stores a block raw unless it saves a 64th of it, so such a
	 * frame is searched for with two blocks: 128 KiB of random bytes
	 * (raw), then a short block that saves just the frame's overhead. */
	size_t big = (128u << 10) + 4096;
	uint8_t *mixed = malloc(big), *fb = malloc(2 * big);
	assert_true(mixed && fb);
	memcpy(mixed, rnd, 128u << 10);
	size_t m = 0;
	fl = 1;
	for (unsigned mask = 1; mask < 255 && fl != m; mask = mask * 2 + 1)
		for (size_t t = 64; t < 4096 && fl != m; t++) {
			m = (128u << 10) + t;
			for (size_t i = 128u << 10; i < m; i++)
				mixed[i] = rnd[i] & mask;
			fl = ZSTD_compress(fb, 2 * big, mixed, m, 1);
		}
	assert_int_equal(fl, m);
	print_message("# a frame of %zu bytes holding as many\n", m);
	uint8_t *bb = malloc(32 + fl);
	assert_non_null(bb);
	bl = zstd_blob(bb, m, fb, fl);
	uint8_t *dec = malloc(m + PAD);
	assert_non_null(dec);
	assert_int_equal(planecodec_decode(&pc, bb, bl, dec, m), -EBADMSG);
	bb[16] = PLANECODEC_RAW; /* the same bytes as a raw plane are fine */
	memcpy(bb + 32, mixed, m);
	assert_int_equal(planecodec_decode(&pc, bb, 32 + m, dec, m), 0);
	assert_memory_equal(dec, mixed, m);
	free(dec);
	free(bb);
	free(fb);
	free(mixed);

	/* A frame of 1000 bytes whose header says 1001, in a blob of 1001:
	 * its 2-byte content size field (value - 256) ends the frame header. */
	fl = ZSTD_compress(f, sizeof(f), plain, n, 1);
	static const size_t did_len[4] = { 0, 1, 2, 4 };
	size_t hs = 5 + !(f[4] >> 5 & 1) + did_len[f[4] & 3] + 2;
	assert_int_equal(f[4] >> 6, 1);
	assert_int_equal(f[hs - 2] | f[hs - 1] << 8, n - 256);
	f[hs - 2] = (uint8_t)(n + 1 - 256);
	assert_int_equal(ZSTD_getFrameContentSize(f, fl), n + 1);
	bl = zstd_blob(b, n + 1, f, fl);
	assert_int_equal(decode_guarded(&pc, b, bl, 0, n + 1), -EBADMSG);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trips),           cmocka_unit_test(test_kinds_agree),
		cmocka_unit_test(test_ratios_and_worth),      cmocka_unit_test(test_encode_refuses),
		cmocka_unit_test(test_decode_refuses_damage), cmocka_unit_test(test_decode_refuses_wrong_frames),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
