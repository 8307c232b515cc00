#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "crc32c.h"
#include "memcopy.h"
#include "testutil.h"

#define BLK MEMCOPY_CRC_BLOCK
#define CAP (4 * BLK + 4096)

#define LANES (3 * 65536) /* memcopy.c's LANE_CHUNK */

/* Sizes around every edge the routines have: below the streaming
 * threshold, the vector widths, the 4 KiB threshold, the fused block, the
 * lanes' chunk. */
static const size_t sizes[] = { 0,
				1,
				15,
				16,
				17,
				31,
				32,
				63,
				64,
				127,
				128,
				129,
				4095,
				4096,
				4097,
				65536 + 13,
				LANES - 1,
				LANES,
				LANES + 1,
				2 * LANES + 31,
				BLK - 1,
				BLK,
				BLK + 1,
				2 * BLK,
				3 * BLK + 17,
				4 * BLK + 4095 };

/* The ways memcopy_crc can take: its own choice, by blocks, by lanes. */
typedef void (*copy_crc_fn)(void *, const void *, size_t, uint32_t *);

static size_t crc_ways(copy_crc_fn *w)
{
	size_t n = 0;
	w[n++] = memcopy_crc;
	w[n++] = memcopy_crc_blocks;
	if (memcopy_lanes_supported())
		w[n++] = memcopy_crc_lanes;
	return n;
}

static uint8_t *src_buf, *dst_buf;

static int setup(void **state)
{
	(void)state;
	src_buf = malloc(CAP + 64);
	dst_buf = malloc(CAP + 64);
	uint64_t seed = 7;
	tu_fill(&seed, src_buf, CAP + 64);
	return src_buf && dst_buf ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	free(src_buf);
	free(dst_buf);
	return 0;
}

/* Every routine the CPU has copies every size, at every alignment of
 * source and destination, and writes nothing outside [dst, dst + n). */
static void test_routines_copy_exactly(void **state)
{
	(void)state;
	for (int k = 0; k < MEMCOPY_NKINDS; k++) {
		if (!memcopy_kind_supported((enum memcopy_kind)k))
			continue;
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
			for (size_t so = 0; so < 40; so += 13)
				for (size_t d = 0; d < 34; d += 11) {
					size_t n = sizes[i];
					memset(dst_buf, 0xEE, CAP + 64);
					memcopy_with((enum memcopy_kind)k, dst_buf + d, src_buf + so, n);
					assert_memory_equal(dst_buf + d, src_buf + so, n);
					for (size_t j = 0; j < d; j++)
						assert_int_equal(dst_buf[j], 0xEE);
					assert_int_equal(dst_buf[d + n], 0xEE);
				}
	}
	assert_true(memcopy_kind_supported(memcopy_chosen()));
	assert_true(memcopy_kind_supported(MEMCOPY_LIBC));
	assert_false(memcopy_kind_supported(MEMCOPY_NKINDS));
}

/* memcopy_crc copies as memcopy_stream and extends the crc over exactly
 * the bytes copied, for sizes that are no multiple of its block, with
 * unaligned heads and tails, from a crc already under way. */
static void test_fused_copy_and_crc(void **state)
{
	(void)state;
	copy_crc_fn ways[3];
	size_t nways = crc_ways(ways);
	for (size_t wi = 0; wi < nways; wi++)
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
			for (size_t so = 0; so < 8; so += 3)
				for (size_t d = 0; d < 40; d += 13) {
					size_t n = sizes[i];
					memset(dst_buf, 0, CAP + 64);
					uint32_t start = i % 2 ? 0 : 0x12345678u;
					uint32_t crc = start;
					ways[wi](dst_buf + d, src_buf + so, n, &crc);
					assert_memory_equal(dst_buf + d, src_buf + so, n);
					assert_int_equal(dst_buf[d + n], 0);
					assert_int_equal(crc, crc32c_update(start, src_buf + so, n));
					/* two calls, split anywhere, give the crc of the whole */
					size_t cut = n / 3;
					crc = start;
					ways[wi](dst_buf + d, src_buf + so, cut, &crc);
					ways[wi](dst_buf + d + cut, src_buf + so + cut, n - cut, &crc);
					assert_int_equal(crc, crc32c_update(start, src_buf + so, n));
				}
	/* without a crc: a plain copy */
	memset(dst_buf, 0, CAP);
	memcopy_crc(dst_buf + 1, src_buf + 2, 3 * BLK + 5, NULL);
	assert_memory_equal(dst_buf + 1, src_buf + 2, 3 * BLK + 5);
}

/* A byte that differs anywhere, the first, one in the middle (on a block
 * boundary and off it) or the last, changes the fused crc: the check a
 * restore makes with it fails. */
static void test_fused_crc_sees_every_byte(void **state)
{
	(void)state;
	const size_t n = 3 * BLK + 17;
	uint32_t good = crc32c_update(0, src_buf + 5, n);
	/* the lanes' edges too: a chunk's second and third lanes */
	const size_t at[] = { 0, LANES / 3 - 1, LANES / 3, 2 * LANES / 3, LANES - 1, BLK - 1, BLK, n / 2, n - 1 };
	copy_crc_fn ways[3];
	size_t nways = crc_ways(ways);
	for (size_t wi = 0; wi < nways; wi++) {
		for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
			src_buf[5 + at[i]] ^= 0x10;
			uint32_t crc = 0;
			ways[wi](dst_buf + 3, src_buf + 5, n, &crc);
			assert_int_not_equal(crc, good);
			assert_memory_equal(dst_buf + 3, src_buf + 5, n);
			src_buf[5 + at[i]] ^= 0x10;
		}
		uint32_t crc = 0;
		ways[wi](dst_buf + 3, src_buf + 5, n, &crc);
		assert_int_equal(crc, good);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_routines_copy_exactly),
		cmocka_unit_test(test_fused_copy_and_crc),
		cmocka_unit_test(test_fused_crc_sees_every_byte),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
