/* Restores' shared storage reads (readshare.h): concurrent loaders of one
 * range share one fetch, a part of a range in flight joins it, another
 * object, store or a range not covered does not, a loader after the read
 * reads again, a failed read is handed to the joiners, which then read
 * alone, and a leader's buffer is not reused while a joiner applies it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "readshare.h"
#include "testutil.h"

#define OBJ (128u << 10)
#define NTHR 8

/* The object in storage, and how its fetches behave. */
struct obj {
	uint8_t bytes[OBJ];
	atomic_int calls;    /* fetches begun */
	atomic_int go;       /* the first fetch waits for it */
	atomic_int fail;     /* -errno: the first fetch fails with it */
	atomic_int fail_all; /* -errno: every fetch does */
	atomic_int bad;      /* an apply saw wrong bytes */
	atomic_int how;      /* what a fetch answers on success (where from) */
};

/* One loader's call. */
struct loader {
	struct readshare *rs;
	struct obj *o;
	const void *store;
	const char *key;
	uint64_t off, len;
	uint8_t *buf; /* its own read buffer */
	int applied, r;
	int how; /* what its apply was told */
};

static int fetch(void *ctx, uint8_t *buf)
{
	struct loader *l = ctx;
	int n = atomic_fetch_add(&l->o->calls, 1);
	if (n == 0)
		for (int i = 0; i < 10000 && !atomic_load(&l->o->go); i++)
			usleep(1000);
	if (n == 0 && atomic_load(&l->o->fail))
		return atomic_load(&l->o->fail);
	if (atomic_load(&l->o->fail_all))
		return atomic_load(&l->o->fail_all);
	memcpy(buf, l->o->bytes + l->off, l->len);
	return atomic_load(&l->o->how);
}

static void apply(void *ctx, const uint8_t *src, int how)
{
	struct loader *l = ctx;
	l->applied++;
	l->how = how;
	if (memcmp(src, l->o->bytes + l->off, l->len) != 0)
		atomic_store(&l->o->bad, 1);
}

static void *run(void *arg)
{
	struct loader *l = arg;
	l->r = readshare_read(l->rs, l->store, l->key, l->off, l->len, l->buf, fetch, apply, l);
	return NULL;
}

static struct obj *obj_new(void)
{
	struct obj *o = calloc(1, sizeof(*o));
	assert_non_null(o);
	uint64_t seed = 38;
	tu_fill(&seed, o->bytes, sizeof(o->bytes));
	return o;
}

static void loader_init(struct loader *l, struct readshare *rs, struct obj *o, const char *key, uint64_t off,
			uint64_t len)
{
	*l = (struct loader){ .rs = rs, .o = o, .store = o, .key = key, .off = off, .len = len };
	l->buf = malloc(len);
	assert_non_null(l->buf);
}

/* Poll until the first fetch began and `joined` loaders joined it. */
static void wait_joined(struct readshare *rs, struct obj *o, uint64_t joined)
{
	for (int i = 0; i < 10000; i++) {
		struct readshare_stats st;
		readshare_stats(rs, &st);
		if (atomic_load(&o->calls) >= 1 && st.joined >= joined)
			return;
		usleep(1000);
	}
	fail_msg("never %" PRIu64 " joined", joined);
}

static void wait_calls(struct obj *o, int n)
{
	for (int i = 0; i < 10000 && atomic_load(&o->calls) < n; i++)
		usleep(1000);
	assert_true(atomic_load(&o->calls) >= n);
}

static void start_all(struct loader *l, pthread_t *th, size_t n)
{
	for (size_t i = 0; i < n; i++)
		assert_int_equal(pthread_create(&th[i], NULL, run, &l[i]), 0);
}

static void join_all(struct loader *l, pthread_t *th, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		pthread_join(th[i], NULL);
		free(l[i].buf);
	}
}

static void test_concurrent_share_one_read(void **state)
{
	(void)state;
	struct readshare *rs = readshare_new();
	struct obj *o = obj_new();
	struct loader l[NTHR];
	pthread_t th[NTHR];
	for (int i = 0; i < NTHR; i++)
		loader_init(&l[i], rs, o, "j/step/rank-0.shard", 4096, 64 << 10);
	start_all(l, th, NTHR);
	wait_joined(rs, o, NTHR - 1);
	atomic_store(&o->go, 1);
	join_all(l, th, NTHR);
	assert_int_equal(atomic_load(&o->calls), 1);
	for (int i = 0; i < NTHR; i++) {
		assert_int_equal(l[i].r, 0);
		assert_int_equal(l[i].applied, 1);
	}
	assert_false(atomic_load(&o->bad));
	struct readshare_stats st;
	readshare_stats(rs, &st);
	assert_int_equal(st.reads, 1);
	assert_int_equal(st.read_bytes, 64 << 10);
	assert_int_equal(st.shared, NTHR - 1);
	assert_int_equal(st.shared_bytes, (NTHR - 1) * (64 << 10));
	assert_int_equal(st.joined, 0);
	readshare_free(rs);
	free(o);
}

/* Bytes the leader's fetch got elsewhere than storage (a peer's, or kept
 * here: its answer > 0) reach every joiner with that answer, and are not
 * counted as read from storage. */
static void test_how_reaches_joiners(void **state)
{
	(void)state;
	struct readshare *rs = readshare_new();
	struct obj *o = obj_new();
	atomic_store(&o->how, 7);
	struct loader l[3];
	pthread_t th[3];
	for (int i = 0; i < 3; i++)
		loader_init(&l[i], rs, o, "j/step/rank-0.shard", 0, 32 << 10);
	start_all(l, th, 3);
	wait_joined(rs, o, 2);
	atomic_store(&o->go, 1);
	join_all(l, th, 3);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(l[i].r, 0);
		assert_int_equal(l[i].how, 7);
	}
	struct readshare_stats st;
	readshare_stats(rs, &st);
	assert_int_equal(st.reads, 1);
	assert_int_equal(st.read_bytes, 0);
	assert_int_equal(st.shared, 2);
	/* Alone (no sharing), the same. */
	struct loader a;
	loader_init(&a, NULL, o, "j/step/rank-0.shard", 0, 1024);
	a.r = readshare_read(NULL, a.store, a.key, a.off, a.len, a.buf, fetch, apply, &a);
	assert_int_equal(a.r, 0);
	assert_int_equal(a.how, 7);
	free(a.buf);
	readshare_free(rs);
	free(o);
}

/* Parts of the range in flight join it (their own bytes); a range it does
 * not cover, another object or another store read for themselves. */
static void test_covered_only(void **state)
{
	(void)state;
	struct readshare *rs = readshare_new();
	struct obj *o = obj_new(), *other = obj_new();
	struct loader l[6];
	pthread_t th[6];
	loader_init(&l[0], rs, o, "k", 0, 64 << 10);
	loader_init(&l[1], rs, o, "k", 4096, 4096);        /* inside */
	loader_init(&l[2], rs, o, "k", 60 << 10, 4 << 10); /* inside, at the end */
	loader_init(&l[3], rs, o, "k", 60 << 10, 8 << 10); /* past the end */
	loader_init(&l[4], rs, o, "k2", 0, 64 << 10);      /* another object */
	loader_init(&l[5], rs, o, "k", 0, 64 << 10);       /* ... */
	l[5].store = other;                                /* in another store */
	start_all(l, th, 1);
	wait_calls(o, 1);
	/* The two inside join first: started beside l[3], l[2] could join
	 * l[3]'s read instead (it covers [60K, 64K) too) and be gone before
	 * two were ever joined at once. */
	start_all(l + 1, th + 1, 2);
	wait_joined(rs, o, 2);
	start_all(l + 3, th + 3, 3);
	wait_calls(o, 4); /* the three outside read while the first waits */
	atomic_store(&o->go, 1);
	join_all(l, th, 6);
	assert_int_equal(atomic_load(&o->calls), 4);
	for (int i = 0; i < 6; i++) {
		assert_int_equal(l[i].r, 0);
		assert_int_equal(l[i].applied, 1);
	}
	assert_false(atomic_load(&o->bad));
	struct readshare_stats st;
	readshare_stats(rs, &st);
	assert_int_equal(st.shared, 2);
	assert_int_equal(st.shared_bytes, 8 << 10);
	assert_int_equal(st.reads, 4);
	readshare_free(rs);
	free(o);
	free(other);
}

/* Nothing is kept: a loader after the read reads again; rs NULL shares
 * nothing. */
static void test_after_reads_again(void **state)
{
	(void)state;
	struct readshare *rs = readshare_new();
	struct obj *o = obj_new();
	atomic_store(&o->go, 1);
	struct loader l;
	for (int i = 0; i < 3; i++) {
		loader_init(&l, i < 2 ? rs : NULL, o, "k", 100, 1000);
		run(&l);
		assert_int_equal(l.r, 0);
		assert_int_equal(l.applied, 1);
		free(l.buf);
	}
	assert_int_equal(atomic_load(&o->calls), 3);
	struct readshare_stats st;
	readshare_stats(rs, &st);
	assert_int_equal(st.reads, 2);
	assert_int_equal(st.read_bytes, 2000);
	assert_int_equal(st.shared, 0);
	readshare_free(rs);
	free(o);
}

/* The leader's read fails: it fails, each joiner reads alone, once, and
 * succeeds; nothing was shared. */
static void test_leader_fails_joiners_read_alone(void **state)
{
	(void)state;
	struct readshare *rs = readshare_new();
	struct obj *o = obj_new();
	atomic_store(&o->fail, -ETIMEDOUT);
	struct loader l[4];
	pthread_t th[4];
	for (int i = 0; i < 4; i++)
		loader_init(&l[i], rs, o, "k", 0, 32 << 10);
	start_all(l, th, 4);
	wait_joined(rs, o, 3);
	atomic_store(&o->go, 1);
	join_all(l, th, 4);
	assert_int_equal(atomic_load(&o->calls), 4);
	int failed = 0;
	for (int i = 0; i < 4; i++) {
		if (l[i].r == -ETIMEDOUT) {
			failed++;
			assert_int_equal(l[i].applied, 0);
		} else {
			assert_int_equal(l[i].r, 0);
			assert_int_equal(l[i].applied, 1);
		}
	}
	assert_int_equal(failed, 1);
	assert_false(atomic_load(&o->bad));
	struct readshare_stats st;
	readshare_stats(rs, &st);
	assert_int_equal(st.reads, 3);
	assert_int_equal(st.shared, 0);
	assert_int_equal(st.joined, 0);
	readshare_free(rs);
	free(o);
}

/* A read that fails for everyone fails each loader with its own error. */
static void test_all_fail(void **state)
{
	(void)state;
	struct readshare *rs = readshare_new();
	struct obj *o = obj_new();
	atomic_store(&o->fail_all, -ENOENT);
	struct loader l[4];
	pthread_t th[4];
	for (int i = 0; i < 4; i++)
		loader_init(&l[i], rs, o, "k", 0, 32 << 10);
	start_all(l, th, 4);
	wait_joined(rs, o, 3);
	atomic_store(&o->go, 1);
	join_all(l, th, 4);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(l[i].r, -ENOENT);
		assert_int_equal(l[i].applied, 0);
	}
	struct readshare_stats st;
	readshare_stats(rs, &st);
	assert_int_equal(st.reads, 0);
	assert_int_equal(st.read_bytes, 0);
	readshare_free(rs);
	free(o);
}

/* Many loaders, each a copy thread reusing its buffer at once (scribbled
 * over after each call), reading random ranges of a few objects: every
 * apply sees the object's bytes, so no leader reused its buffer while a
 * joiner applied it, and nothing deadlocks. */
struct stress {
	struct readshare *rs;
	struct obj *o;
	uint64_t seed;
	int reads;
};

static void stress_apply(void *ctx, const uint8_t *src, int how)
{
	const struct loader *l = ctx;
	if (l->off == 0)
		usleep(100); /* a joiner slow to release */
	apply(ctx, src, how);
}

static void *stress_run(void *arg)
{
	struct stress *s = arg;
	static const char *keys[] = { "a", "b", "c" };
	uint8_t *buf = malloc(OBJ);
	assert_non_null(buf);
	for (int i = 0; i < 400; i++) {
		uint64_t off = tu_below(&s->seed, 4) * (8 << 10);
		uint64_t len = (1 + tu_below(&s->seed, 4)) * (8 << 10);
		struct loader l = { .rs = s->rs,
				    .o = s->o,
				    .store = s->o,
				    .key = keys[tu_below(&s->seed, 3)],
				    .off = off,
				    .len = len,
				    .buf = buf };
		l.r = readshare_read(l.rs, l.store, l.key, l.off, l.len, buf, fetch, stress_apply, &l);
		if (l.r != 0 || l.applied != 1)
			atomic_store(&s->o->bad, 1);
		memset(buf, 0xee, OBJ);
		s->reads++;
	}
	free(buf);
	return NULL;
}

static void test_stress_buffers(void **state)
{
	(void)state;
	struct readshare *rs = readshare_new();
	struct obj *o = obj_new();
	atomic_store(&o->go, 1);
	struct stress s[NTHR];
	pthread_t th[NTHR];
	for (int i = 0; i < NTHR; i++) {
		s[i] = (struct stress){ .rs = rs, .o = o, .seed = 1000 + (uint64_t)i };
		assert_int_equal(pthread_create(&th[i], NULL, stress_run, &s[i]), 0);
	}
	for (int i = 0; i < NTHR; i++)
		pthread_join(th[i], NULL);
	assert_false(atomic_load(&o->bad));
	struct readshare_stats st;
	readshare_stats(rs, &st);
	assert_int_equal(st.reads + st.shared, NTHR * 400);
	print_message("# %" PRIu64 " reads, %" PRIu64 " shared\n", st.reads, st.shared);
	assert_int_equal(st.joined, 0);
	readshare_free(rs);
	free(o);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_concurrent_share_one_read),
		cmocka_unit_test(test_covered_only),
		cmocka_unit_test(test_how_reaches_joiners),
		cmocka_unit_test(test_after_reads_again),
		cmocka_unit_test(test_leader_fails_joiners_read_alone),
		cmocka_unit_test(test_all_fail),
		cmocka_unit_test(test_stress_buffers),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
