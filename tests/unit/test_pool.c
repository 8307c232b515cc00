#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <errno.h>

#include "pool.h"

#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

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
	struct pool_span a[8], b[8];
	assert_int_equal(pool_init(&p, 2 * MiB, 256 * KiB), 0);
	assert_int_equal(p.nchunks, 8);

	assert_int_equal(pool_reserve(&p, 5, 0, a), 0);
	assert_int_equal(p.nfree, 3);
	assert_int_equal(pool_used_bytes(&p), 5 * 256 * KiB);

	/* 4 do not fit in the 3 left: nothing taken. */
	memset(b, 0xff, sizeof(b));
	assert_int_equal(pool_reserve(&p, 4, 0, b), -ENOSPC);
	assert_int_equal(p.nfree, 3);
	assert_int_equal(pool_used_bytes(&p), 5 * 256 * KiB);
	assert_int_equal(b[0].chunk, 0xffffffffu);

	/* More than the whole pool could ever hold. */
	assert_int_equal(pool_reserve(&p, 9, 0, b), -E2BIG);
	assert_int_equal(p.nfree, 3);

	assert_int_equal(pool_reserve(&p, 3, 0, b), 0);
	assert_int_equal(p.nfree, 0);
	assert_int_equal(pool_used_bytes(&p), p.bytes);
	assert_int_equal(pool_reserve(&p, 1, 0, b + 3), -ENOSPC);
	/* Zero chunks always succeed. */
	assert_int_equal(pool_reserve(&p, 0, 0, b + 3), 0);

	/* Every chunk handed out once. */
	uint8_t seen[8] = { 0 };
	for (int i = 0; i < 5; i++)
		seen[a[i].chunk]++;
	for (int i = 0; i < 3; i++)
		seen[b[i].chunk]++;
	for (int i = 0; i < 8; i++)
		assert_int_equal(seen[i], 1);
	pool_fini(&p);
}

static void test_release_and_reuse(void **state)
{
	(void)state;
	struct pool p;
	struct pool_span a[4], b[4], c[4];
	assert_int_equal(pool_init(&p, 4 * MiB, 1 * MiB), 0);
	assert_int_equal(pool_reserve(&p, 4, 0, a), 0);
	assert_int_equal(pool_reserve(&p, 1, 0, c), -ENOSPC);

	pool_release(&p, a + 1, 2); /* give back a[1], a[2] */
	assert_int_equal(p.nfree, 2);
	assert_int_equal(pool_used_bytes(&p), 2 * MiB);
	assert_int_equal(pool_reserve(&p, 3, 0, b), -ENOSPC);
	assert_int_equal(pool_reserve(&p, 2, 0, b), 0);
	/* The released chunks are the ones handed out again. */
	assert_true((b[0].chunk == a[1].chunk && b[1].chunk == a[2].chunk) ||
		    (b[0].chunk == a[2].chunk && b[1].chunk == a[1].chunk));

	pool_release(&p, a, 1);
	pool_release(&p, a + 3, 1);
	pool_release(&p, b, 2);
	assert_int_equal(p.nfree, 4);
	assert_int_equal(pool_used_bytes(&p), 0);
	assert_int_equal(pool_reserve(&p, 4, 0, c), 0);
	pool_fini(&p);
}

static void test_chunks_distinct_inside_writable(void **state)
{
	(void)state;
	struct pool p;
	enum { N = 16 };
	struct pool_span idx[N];
	assert_int_equal(pool_init(&p, 1 * MiB, 64 * KiB), 0);
	assert_int_equal(p.nchunks, N);
	assert_int_equal(pool_reserve(&p, N, 0, idx), 0);
	for (int i = 0; i < N; i++) {
		assert_in_range(idx[i].chunk, 0, N - 1);
		assert_int_equal(idx[i].nslots, p.slots);
		uint8_t *c = pool_span_ptr(&p, idx[i]);
		assert_true(c >= p.base);
		assert_true(c + p.chunk_bytes <= p.base + p.bytes);
		assert_int_equal((uint64_t)(c - p.base) % p.chunk_bytes, 0);
		for (int j = 0; j < i; j++)
			assert_ptr_not_equal(c, pool_span_ptr(&p, idx[j]));
		memset(c, (int)(i + 1), p.chunk_bytes);
	}
	/* No chunk overlaps another: each still holds its own pattern. */
	for (int i = 0; i < N; i++) {
		uint8_t *c = pool_span_ptr(&p, idx[i]);
		assert_int_equal(c[0], i + 1);
		assert_int_equal(c[p.chunk_bytes - 1], i + 1);
	}
	pool_fini(&p);
}

static void test_shape(void **state)
{
	(void)state;
	struct pool p;
	uint32_t w, t;
	assert_int_equal(pool_init(&p, 4 * MiB, 1 * MiB), 0);
	assert_int_equal(p.slots, POOL_SLOTS);
	assert_int_equal(p.slot_bytes, 16 * KiB);
	pool_shape(&p, 0, &w, &t);
	assert_true(w == 0 && t == 0);
	pool_shape(&p, 1, &w, &t);
	assert_true(w == 0 && t == 1);
	pool_shape(&p, 16 * KiB + 1, &w, &t);
	assert_true(w == 0 && t == 2);
	pool_shape(&p, 2 * MiB + 100 * KiB, &w, &t);
	assert_true(w == 2 && t == 7);
	assert_int_equal(pool_shape_bytes(&p, w, t), 2 * MiB + 112 * KiB);
	/* A tail that needs every slot is a whole chunk. */
	pool_shape(&p, 2 * MiB - 1, &w, &t);
	assert_true(w == 2 && t == 0);
	pool_fini(&p);

	/* Slots that would not be page-aligned: whole chunks only. */
	assert_int_equal(pool_init(&p, 1 * MiB, 64 * KiB), 0);
	assert_int_equal(p.slots, 1);
	pool_shape(&p, 1, &w, &t);
	assert_true(w == 1 && t == 0);
	pool_shape(&p, 64 * KiB + 1, &w, &t);
	assert_true(w == 2 && t == 0);
	pool_fini(&p);
}

/* Small shards share chunks: 64 shards of one slot fill one chunk, not 64. */
static void test_tails_share_chunks(void **state)
{
	(void)state;
	struct pool p;
	struct pool_span s[POOL_SLOTS + 1], big[4];
	assert_int_equal(pool_init(&p, 4 * MiB, 1 * MiB), 0);
	for (int i = 0; i < POOL_SLOTS; i++) {
		assert_int_equal(pool_reserve(&p, 0, 1, &s[i]), 0);
		assert_int_equal(s[i].nslots, 1);
		memset(pool_span_ptr(&p, s[i]), i + 1, p.slot_bytes);
	}
	assert_int_equal(p.nfree, 3);
	assert_int_equal(pool_used_bytes(&p), 1 * MiB);
	for (int i = 0; i < POOL_SLOTS; i++) {
		assert_int_equal(s[i].chunk, s[0].chunk);
		uint8_t *b = pool_span_ptr(&p, s[i]);
		assert_int_equal(b[0], i + 1); /* nobody else wrote it */
		assert_int_equal(b[p.slot_bytes - 1], i + 1);
	}
	/* The next tail opens a new chunk. */
	assert_int_equal(pool_reserve(&p, 0, 1, &s[POOL_SLOTS]), 0);
	assert_int_not_equal(s[POOL_SLOTS].chunk, s[0].chunk);
	assert_int_equal(p.nfree, 2);
	/* Three whole chunks no longer fit; two plus a tail in the open chunk do. */
	assert_false(pool_fits(&p, 3, 0));
	assert_true(pool_fits(&p, 2, 63));
	assert_int_equal(pool_reserve(&p, 3, 0, big), -ENOSPC);
	assert_int_equal(pool_reserve(&p, 2, 63, big), 0);
	assert_int_equal(big[2].chunk, s[POOL_SLOTS].chunk);
	assert_int_equal(big[2].slot, 1);
	assert_int_equal(p.nfree, 0);
	assert_int_equal(pool_used_bytes(&p), p.bytes);
	pool_release(&p, big, 3);

	/* A chunk goes back whole only when its last slot is released. */
	pool_release(&p, s, POOL_SLOTS - 1);
	assert_int_equal(p.nfree, 2);
	pool_release(&p, &s[POOL_SLOTS - 1], 1);
	assert_int_equal(p.nfree, 3);
	pool_release(&p, &s[POOL_SLOTS], 1);
	assert_int_equal(p.nfree, 4);
	assert_int_equal(pool_used_bytes(&p), 0);
	pool_fini(&p);
}

/* Tails need consecutive slots; a cut-up chunk is skipped, and a
 * reservation that cannot take its tail takes nothing. */
static void test_tail_runs_and_all_or_nothing(void **state)
{
	(void)state;
	struct pool p;
	struct pool_span s[POOL_SLOTS], t[2];
	assert_int_equal(pool_init(&p, 2 * MiB, 1 * MiB), 0);
	for (int i = 0; i < POOL_SLOTS; i++)
		assert_int_equal(pool_reserve(&p, 0, 1, &s[i]), 0);
	/* Free every other slot: 32 free, no two together. */
	for (int i = 0; i < POOL_SLOTS; i += 2)
		pool_release(&p, &s[i], 1);
	assert_int_equal(pool_free_slots(&p), POOL_SLOTS + 32);
	assert_int_equal(pool_reserve(&p, 0, 2, t), 0);
	assert_int_not_equal(t[0].chunk, s[0].chunk); /* the free chunk */
	assert_int_equal(p.nfree, 0);
	/* One whole chunk: none free, though 94 slots are. */
	assert_false(pool_fits(&p, 1, 0));
	assert_int_equal(pool_reserve(&p, 1, 0, t + 1), -ENOSPC);
	/* One slot fits in a gap of the first chunk. */
	assert_int_equal(pool_reserve(&p, 0, 1, t + 1), 0);
	assert_int_equal(t[1].chunk, s[0].chunk);
	assert_int_equal(t[1].slot % 2, 0);
	/* More than the pool could ever hold. */
	assert_int_equal(pool_reserve(&p, 2, 1, t), -E2BIG);
	pool_fini(&p);
}

/* Locked memory of this process, from /proc/self/status (VmLck, bytes). */
static uint64_t vm_locked(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	unsigned long long kb = 0;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmLck: %llu kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return (uint64_t)kb * 1024;
}

/* docs/operations.md: the pool is mlock()ed when allowed (root, or RLIMIT_MEMLOCK room):
 * then the kernel counts it as locked; when not, it still works. */
static void test_pool_locked_when_allowed(void **state)
{
	(void)state;
	uint64_t before = vm_locked(), bytes = 16ull << 20;
	struct rlimit rl;
	assert_int_equal(getrlimit(RLIMIT_MEMLOCK, &rl), 0);
	bool allowed = geteuid() == 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= before + bytes;
	struct pool p;
	assert_int_equal(pool_init(&p, bytes, 4ull << 20), 0);
	if (allowed)
		assert_true(p.locked);
#ifndef __SANITIZE_ADDRESS__ /* ASan's mlock() is a no-op that returns 0 */
	if (p.locked)
		assert_true(vm_locked() >= before + bytes);
	else
		assert_true(vm_locked() < before + bytes);
#endif
	struct pool_span sp;
	assert_int_equal(pool_reserve(&p, 1, 0, &sp), 0); /* usable either way */
	pool_fini(&p);
	assert_true(vm_locked() <= before);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_init_sizes),
		cmocka_unit_test(test_init_errors),
		cmocka_unit_test(test_reserve_all_or_nothing),
		cmocka_unit_test(test_release_and_reuse),
		cmocka_unit_test(test_chunks_distinct_inside_writable),
		cmocka_unit_test(test_shape),
		cmocka_unit_test(test_tails_share_chunks),
		cmocka_unit_test(test_tail_runs_and_all_or_nothing),
		cmocka_unit_test(test_pool_locked_when_allowed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
