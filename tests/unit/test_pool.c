#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <errno.h>

#include "pool.h"

#define KiB 1024ull
#define MiB (1024ull * 1024)

static void test_init_sizes(void **state)
{
	(void)state;
	struct pool p;
	assert_int_equal(pool_init(&p, 4 * MiB, 1 * MiB), 0);
	assert_int_equal(p.nchunks, 4);
	assert_int_equal(p.nfree, 4);
	assert_int_equal(p.bytes, 4 * MiB);
	assert_int_equal(p.chunk_bytes, 1 * MiB);
	assert_non_null(p.base);
	assert_int_equal(pool_used_bytes(&p), 0);
	pool_fini(&p);
	assert_null(p.base);

	/* Rounded down to whole chunks. */
	assert_int_equal(pool_init(&p, 3 * MiB + 100 * KiB, 256 * KiB), 0);
	assert_int_equal(p.nchunks, 12);
	assert_int_equal(p.bytes, 3 * MiB);
	pool_fini(&p);

	assert_int_equal(pool_init(&p, 64 * KiB, 64 * KiB), 0);
	assert_int_equal(p.nchunks, 1);
	pool_fini(&p);
}

static void test_init_errors(void **state)
{
	(void)state;
	struct pool p;
	assert_int_equal(pool_init(&p, 64 * KiB - 1, 64 * KiB), -EINVAL);
	assert_null(p.base);
	assert_int_equal(pool_init(&p, 0, 64 * KiB), -EINVAL);
	assert_int_equal(pool_init(&p, 1 * MiB, 0), -EINVAL);
	pool_fini(&p); /* harmless on a failed init */
}

static void test_reserve_all_or_nothing(void **state)
{
	(void)state;
	struct pool p;
	uint32_t a[8], b[8];
	assert_int_equal(pool_init(&p, 2 * MiB, 256 * KiB), 0);
	assert_int_equal(p.nchunks, 8);

	assert_int_equal(pool_reserve(&p, 5, a), 0);
	assert_int_equal(p.nfree, 3);
	assert_int_equal(pool_used_bytes(&p), 5 * 256 * KiB);

	/* 4 do not fit in the 3 left: nothing taken. */
	memset(b, 0xff, sizeof(b));
	assert_int_equal(pool_reserve(&p, 4, b), -ENOSPC);
	assert_int_equal(p.nfree, 3);
	assert_int_equal(pool_used_bytes(&p), 5 * 256 * KiB);
	assert_int_equal(b[0], 0xffffffffu);

	/* More than the whole pool could ever hold. */
	assert_int_equal(pool_reserve(&p, 9, b), -E2BIG);
	assert_int_equal(p.nfree, 3);

	assert_int_equal(pool_reserve(&p, 3, b), 0);
	assert_int_equal(p.nfree, 0);
	assert_int_equal(pool_used_bytes(&p), p.bytes);
	assert_int_equal(pool_reserve(&p, 1, b + 3), -ENOSPC);
	/* Zero chunks always succeed. */
	assert_int_equal(pool_reserve(&p, 0, b + 3), 0);

	/* Every chunk handed out once. */
	uint8_t seen[8] = { 0 };
	for (int i = 0; i < 5; i++)
		seen[a[i]]++;
	for (int i = 0; i < 3; i++)
		seen[b[i]]++;
	for (int i = 0; i < 8; i++)
		assert_int_equal(seen[i], 1);
	pool_fini(&p);
}

static void test_release_and_reuse(void **state)
{
	(void)state;
	struct pool p;
	uint32_t a[4], b[4], c[4];
	assert_int_equal(pool_init(&p, 4 * MiB, 1 * MiB), 0);
	assert_int_equal(pool_reserve(&p, 4, a), 0);
	assert_int_equal(pool_reserve(&p, 1, c), -ENOSPC);

	pool_release(&p, a + 1, 2); /* give back a[1], a[2] */
	assert_int_equal(p.nfree, 2);
	assert_int_equal(pool_used_bytes(&p), 2 * MiB);
	assert_int_equal(pool_reserve(&p, 3, b), -ENOSPC);
	assert_int_equal(pool_reserve(&p, 2, b), 0);
	/* The released chunks are the ones handed out again. */
	assert_true((b[0] == a[1] && b[1] == a[2]) || (b[0] == a[2] && b[1] == a[1]));

	pool_release(&p, a, 1);
	pool_release(&p, a + 3, 1);
	pool_release(&p, b, 2);
	assert_int_equal(p.nfree, 4);
	assert_int_equal(pool_used_bytes(&p), 0);
	assert_int_equal(pool_reserve(&p, 4, c), 0);
	pool_fini(&p);
}

static void test_chunks_distinct_inside_writable(void **state)
{
	(void)state;
	struct pool p;
	enum { N = 16 };
	uint32_t idx[N];
	assert_int_equal(pool_init(&p, 1 * MiB, 64 * KiB), 0);
	assert_int_equal(p.nchunks, N);
	assert_int_equal(pool_reserve(&p, N, idx), 0);
	for (int i = 0; i < N; i++) {
		assert_in_range(idx[i], 0, N - 1);
		uint8_t *c = pool_chunk(&p, idx[i]);
		assert_true(c >= p.base);
		assert_true(c + p.chunk_bytes <= p.base + p.bytes);
		assert_int_equal((uint64_t)(c - p.base) % p.chunk_bytes, 0);
		for (int j = 0; j < i; j++)
			assert_ptr_not_equal(c, pool_chunk(&p, idx[j]));
		memset(c, (int)(i + 1), p.chunk_bytes);
	}
	/* No chunk overlaps another: each still holds its own pattern. */
	for (int i = 0; i < N; i++) {
		uint8_t *c = pool_chunk(&p, idx[i]);
		assert_int_equal(c[0], i + 1);
		assert_int_equal(c[p.chunk_bytes - 1], i + 1);
	}
	pool_fini(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_init_sizes),
		cmocka_unit_test(test_init_errors),
		cmocka_unit_test(test_reserve_all_or_nothing),
		cmocka_unit_test(test_release_and_reuse),
		cmocka_unit_test(test_chunks_distinct_inside_writable),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
