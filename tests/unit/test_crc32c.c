#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "crc32c.h"
#include "testutil.h"

/* Bitwise CRC32C, independent of ISA-L. */
static uint32_t ref_crc32c(const void *buf, size_t len)
{
	const uint8_t *p = buf;
	uint32_t c = 0xFFFFFFFFu;
	for (size_t i = 0; i < len; i++) {
		c ^= p[i];
		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
	}
	return ~c;
}

static void test_check_value(void **state)
{
	(void)state;
	assert_int_equal(crc32c_update(0, "123456789", 9), 0xE3069283u);
	assert_int_equal(crc32c_update(0, "", 0), 0);
	/* RFC 3720 B.4: 32 bytes of zeros. */
	uint8_t z[32] = { 0 };
	assert_int_equal(crc32c_update(0, z, sizeof(z)), 0x8A9136AAu);
}

static void test_matches_bitwise_reference(void **state)
{
	(void)state;
	uint64_t seed = 0x1234;
	uint8_t buf[4099];
	for (int iter = 0; iter < 200; iter++) {
		size_t len = (size_t)tu_below(&seed, sizeof(buf) + 1);
		size_t start = (size_t)tu_below(&seed, 8);
		if (start > len)
			start = 0;
		tu_fill(&seed, buf, len);
		assert_int_equal(crc32c_update(0, buf + start, len - start), ref_crc32c(buf + start, len - start));
	}
}

static void test_chunked_equals_one_shot(void **state)
{
	(void)state;
	uint64_t seed = 99;
	size_t len = 300 * 1024 + 17;
	uint8_t *buf = malloc(len);
	assert_non_null(buf);
	tu_fill(&seed, buf, len);
	uint32_t whole = crc32c_update(0, buf, len);
	assert_int_equal(whole, ref_crc32c(buf, len));
	for (int iter = 0; iter < 50; iter++) {
		uint32_t c = 0;
		size_t off = 0;
		while (off < len) {
			size_t n = (size_t)tu_below(&seed, 70000);
			if (n > len - off)
				n = len - off;
			c = crc32c_update(c, buf + off, n);
			off += n;
		}
		assert_int_equal(c, whole);
	}
	free(buf);
}

static void test_combine(void **state)
{
	(void)state;
	uint64_t seed = 7;
	size_t len = 200 * 1024 + 3; /* splits on both sides of 64 KiB */
	uint8_t *buf = malloc(len);
	assert_non_null(buf);
	tu_fill(&seed, buf, len);

	size_t fixed[] = { 0, 1, 4, 65535, 65536, 65537, 131072, len - 1, len };
	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
		size_t a = fixed[i];
		uint32_t ca = crc32c_update(0, buf, a);
		uint32_t cb = crc32c_update(0, buf + a, len - a);
		assert_int_equal(crc32c_combine(ca, cb, len - a), crc32c_update(0, buf, len));
	}
	for (int iter = 0; iter < 300; iter++) {
		size_t total = (size_t)tu_below(&seed, len + 1);
		size_t a = (size_t)tu_below(&seed, total + 1);
		uint32_t ca = crc32c_update(0, buf, a);
		uint32_t cb = crc32c_update(0, buf + a, total - a);
		assert_int_equal(crc32c_combine(ca, cb, total - a), crc32c_update(0, buf, total));
	}
	/* Empty first part: combine(crc(""), crc(B)) == crc(B). */
	uint32_t cb = crc32c_update(0, buf, 1000);
	assert_int_equal(crc32c_combine(0, cb, 1000), cb);
	free(buf);
}

/* The GF(2) matrix method of zlib's first crc32_combine, kept here as an
 * independent reference for lengths too long to checksum in a test. */
static uint32_t ref_times(const uint32_t *mat, uint32_t vec)
{
	uint32_t sum = 0;
	for (int i = 0; vec; i++, vec >>= 1)
		if (vec & 1)
			sum ^= mat[i];
	return sum;
}

static void ref_square(uint32_t *sq, const uint32_t *mat)
{
	for (int n = 0; n < 32; n++)
		sq[n] = ref_times(mat, mat[n]);
}

static uint32_t ref_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
	uint32_t even[32], odd[32];
	if (len_b == 0)
		return crc_a;
	odd[0] = 0x82f63b78u;
	for (int n = 1; n < 32; n++)
		odd[n] = 1u << (n - 1);
	ref_square(even, odd);
	ref_square(odd, even);
	do {
		ref_square(even, odd);
		if (len_b & 1)
			crc_a = ref_times(even, crc_a);
		len_b >>= 1;
		if (len_b == 0)
			break;
		ref_square(odd, even);
		if (len_b & 1)
			crc_a = ref_times(odd, crc_a);
		len_b >>= 1;
	} while (len_b != 0);
	return crc_a ^ crc_b;
}

/* Lengths of any size, up to 2^64 - 1, against the reference. */
static void test_combine_long(void **state)
{
	(void)state;
	uint64_t seed = 11;
	uint64_t fixed[] = { 1, 63, 64, (1ull << 32) - 1, 1ull << 32, (5ull << 30) + 17, 1ull << 63, UINT64_MAX };
	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		assert_int_equal(crc32c_combine(0xdeadbeefu, 0x12345678u, fixed[i]),
				 ref_combine(0xdeadbeefu, 0x12345678u, fixed[i]));
	for (int iter = 0; iter < 2000; iter++) {
		uint32_t a = (uint32_t)tu_below(&seed, UINT32_MAX), b = (uint32_t)tu_below(&seed, UINT32_MAX);
		/* len 0 is B empty: crc(B) is then 0 (the reference skips the xor). */
		uint64_t len = (tu_below(&seed, UINT64_MAX) >> tu_below(&seed, 64)) | 1;
		assert_int_equal(crc32c_combine(a, b, len), ref_combine(a, b, len));
	}
}

/* Folding many chunk crcs into one, as the shard checksum does. */
static void test_combine_fold(void **state)
{
	(void)state;
	uint64_t seed = 3;
	size_t len = 1u << 20;
	uint8_t *buf = malloc(len);
	assert_non_null(buf);
	tu_fill(&seed, buf, len);
	size_t chunk = 65536 + 123;
	uint32_t acc = 0;
	for (size_t off = 0; off < len; off += chunk) {
		size_t n = len - off < chunk ? len - off : chunk;
		acc = crc32c_combine(acc, crc32c_update(0, buf + off, n), n);
	}
	assert_int_equal(acc, crc32c_update(0, buf, len));
	free(buf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_check_value),
		cmocka_unit_test(test_matches_bitwise_reference),
		cmocka_unit_test(test_chunked_equals_one_shot),
		cmocka_unit_test(test_combine),
		cmocka_unit_test(test_combine_long),
		cmocka_unit_test(test_combine_fold),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
