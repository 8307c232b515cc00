/* Ranges kept for the peers (rangecache.h): a kept range answers any part
 * of itself, and nothing else; a get waits for a read in flight, and
 * misses one that failed; the budget pushes out the least lately used
 * that no one reads, never one being read or held; an entry expires ttl
 * after its last use (at a begin, or a sweep); and a held entry's bytes
 * outlive a drop. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rangecache.h"
#include "testutil.h"

#define LEN (64u << 10)

static int S; /* a store, compared as a pointer */

static void fill(uint8_t *b, uint64_t seed)
{
	tu_fill(&seed, b, LEN);
}

static void keep(struct rangecache *rc, const char *key, uint64_t off, const uint8_t *src)
{
	struct rc_entry *e = rangecache_begin(rc, &S, key, off, LEN);
	assert_non_null(e);
	rangecache_end(rc, e, src);
}

/* 0 when [off, off + len) of key is kept with the bytes at want. */
static int got(struct rangecache *rc, const char *key, uint64_t off, uint64_t len, const uint8_t *want)
{
	const uint8_t *at;
	struct rc_entry *e;
	int r = rangecache_hold(rc, &S, key, off, len, 0, &at, &e);
	if (r == 0) {
		assert_memory_equal(at, want, len);
		rangecache_release(rc, e);
	}
	return r;
}

static void test_parts_and_others(void **state)
{
	(void)state;
	struct rangecache *rc = rangecache_new(1u << 20, 60ull * 1000000000);
	uint8_t b[LEN];
	fill(b, 1);
	keep(rc, "j/a.shard", 4096, b);
	assert_int_equal(got(rc, "j/a.shard", 4096, LEN, b), 0);
	assert_int_equal(got(rc, "j/a.shard", 4096 + 100, 1000, b + 100), 0);
	assert_int_equal(got(rc, "j/a.shard", 4096 + LEN - 1, 1, b + LEN - 1), 0);
	assert_int_equal(got(rc, "j/a.shard", 4095, 10, b), -ENOENT);          /* before it */
	assert_int_equal(got(rc, "j/a.shard", 4096 + LEN - 1, 2, b), -ENOENT); /* past its end */
	assert_int_equal(got(rc, "j/b.shard", 4096, 10, b), -ENOENT);
	const uint8_t *at;
	struct rc_entry *e;
	assert_int_equal(rangecache_hold(rc, &rc, "j/a.shard", 4096, 10, 0, &at, &e), -ENOENT); /* another store */
	/* The same range again: not made twice. */
	assert_null(rangecache_begin(rc, &S, "j/a.shard", 4096 + 10, 10));
	struct rangecache_stats st;
	rangecache_stats(rc, &st);
	assert_int_equal(st.entries, 1);
	assert_int_equal(st.bytes, LEN);
	assert_int_equal(st.hits, 3);
	rangecache_free(rc);
}

struct waiter {
	struct rangecache *rc;
	uint32_t wait_ms;
	int r;
	uint8_t first;
};

static void *wait_run(void *arg)
{
	struct waiter *w = arg;
	const uint8_t *at;
	struct rc_entry *e;
	w->r = rangecache_hold(w->rc, &S, "j/a.shard", 0, LEN, w->wait_ms, &at, &e);
	if (w->r == 0) {
		w->first = at[0];
		rangecache_release(w->rc, e);
	}
	return NULL;
}

static void test_waits_for_read(void **state)
{
	(void)state;
	struct rangecache *rc = rangecache_new(1u << 20, 60ull * 1000000000);
	uint8_t b[LEN];
	fill(b, 2);
	/* Ended with bytes: the waiter gets them. */
	struct rc_entry *e = rangecache_begin(rc, &S, "j/a.shard", 0, LEN);
	assert_non_null(e);
	struct waiter w = { .rc = rc, .wait_ms = 10000 };
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, wait_run, &w), 0);
	usleep(50000);
	rangecache_end(rc, e, b);
	pthread_join(th, NULL);
	assert_int_equal(w.r, 0);
	assert_int_equal(w.first, b[0]);
	rangecache_free(rc);

	/* Failed: the waiter misses, and nothing is kept. */
	rc = rangecache_new(1u << 20, 60ull * 1000000000);
	e = rangecache_begin(rc, &S, "j/a.shard", 0, LEN);
	w.rc = rc;
	w.r = 1;
	assert_int_equal(pthread_create(&th, NULL, wait_run, &w), 0);
	usleep(50000);
	rangecache_end(rc, e, NULL);
	pthread_join(th, NULL);
	assert_int_equal(w.r, -ENOENT);
	struct rangecache_stats st;
	rangecache_stats(rc, &st);
	assert_int_equal(st.entries, 0);
	assert_int_equal(st.bytes, 0);

	/* Still being read past the wait: -ETIMEDOUT. */
	e = rangecache_begin(rc, &S, "j/a.shard", 0, LEN);
	w.wait_ms = 30;
	wait_run(&w);
	assert_int_equal(w.r, -ETIMEDOUT);
	rangecache_end(rc, e, b);
	assert_int_equal(got(rc, "j/a.shard", 0, LEN, b), 0);
	rangecache_free(rc);
}

static void test_budget_and_ttl(void **state)
{
	(void)state;
	struct rangecache *rc = rangecache_new(3 * LEN, 60ull * 1000000000);
	uint8_t b[3][LEN];
	for (int i = 0; i < 3; i++)
		fill(b[i], 10 + (uint64_t)i);
	keep(rc, "j/0.shard", 0, b[0]);
	keep(rc, "j/1.shard", 0, b[1]);
	keep(rc, "j/2.shard", 0, b[2]);
	/* 0 used last: 1 is the least lately used, and goes for a fourth. */
	assert_int_equal(got(rc, "j/0.shard", 0, LEN, b[0]), 0);
	/* 2 held: not pushed out while a peer reads it. */
	const uint8_t *at;
	struct rc_entry *held;
	assert_int_equal(rangecache_hold(rc, &S, "j/2.shard", 0, LEN, 0, &at, &held), 0);
	keep(rc, "j/3.shard", 0, b[0]);
	assert_int_equal(got(rc, "j/1.shard", 0, 10, b[1]), -ENOENT);
	assert_int_equal(got(rc, "j/0.shard", 0, LEN, b[0]), 0);
	/* A fifth: 3 goes (0 used since, 2 held); a sixth: 0 goes; then
	 * nothing is left to push out but the held one: refused. */
	keep(rc, "j/4.shard", 0, b[1]);
	assert_int_equal(got(rc, "j/3.shard", 0, 10, b[0]), -ENOENT);
	keep(rc, "j/5.shard", 0, b[1]);
	assert_int_equal(got(rc, "j/0.shard", 0, 10, b[0]), -ENOENT);
	assert_int_equal(got(rc, "j/4.shard", 0, 10, b[1]), 0);
	struct rc_entry *big = rangecache_begin(rc, &S, "j/6.shard", 0, 3 * LEN);
	assert_null(big);
	assert_memory_equal(at, b[2], LEN); /* the held bytes are intact */
	rangecache_release(rc, held);
	/* Larger than the whole budget: never. */
	assert_null(rangecache_begin(rc, &S, "j/7.shard", 0, 4 * LEN));
	struct rangecache_stats st;
	rangecache_stats(rc, &st);
	assert_true(st.bytes <= 3 * LEN);
	assert_true(st.refused >= 2);
	rangecache_free(rc);

	/* ttl: an entry unused for longer is gone at the next begin. */
	rc = rangecache_new(1u << 20, 20ull * 1000000);
	keep(rc, "j/0.shard", 0, b[0]);
	usleep(60000);
	keep(rc, "j/1.shard", 0, b[1]);
	assert_int_equal(got(rc, "j/0.shard", 0, 10, b[0]), -ENOENT);
	assert_int_equal(got(rc, "j/1.shard", 0, 10, b[1]), 0);
	/* ... and at a sweep, with no begin at all (an idle node). */
	usleep(60000);
	rangecache_sweep(rc);
	rangecache_stats(rc, &st);
	assert_int_equal(st.entries, 0);
	assert_int_equal(st.bytes, 0);
	rangecache_free(rc);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parts_and_others),
		cmocka_unit_test(test_waits_for_read),
		cmocka_unit_test(test_budget_and_ttl),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
