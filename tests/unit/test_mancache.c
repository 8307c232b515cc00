/* The manifest cache: single flight, failures shared but never kept, the
 * listed time and size as part of the identity, LRU by bytes, dropping a
 * step, entries held past their eviction. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "mancache.h"
#include "manifest_util.h"

struct src {
	atomic_int calls;
	int fail;          /* -errno: fetches fail with it */
	unsigned sleep_ms; /* inside each fetch */
	uint32_t rank;
	struct mancache *c; /* with waiters: each fetch waits until that many callers wait for it */
	uint64_t waiters;
};

static int fetch(void *ctx, Ckpt__Manifest **out, char *err, size_t errlen)
{
	struct src *s = ctx;
	atomic_fetch_add(&s->calls, 1);
	for (int i = 0; s->waiters && i < 1000; i++) {
		struct mancache_stats st;
		mancache_stats(s->c, &st);
		if (st.hits >= s->waiters)
			break;
		usleep(10 * 1000);
	}
	if (s->sleep_ms)
		usleep(s->sleep_ms * 1000);
	if (s->fail) {
		snprintf(err, errlen, "fetch failed");
		return s->fail;
	}
	struct tm_manifest x;
	tm_init(&x, "j", 1, s->rank, 8, "a");
	size_t len;
	uint8_t *buf = tm_pack(&x.m, &len);
	*out = ckpt__manifest__unpack(NULL, len, buf);
	free(buf);
	return *out ? 0 : -ENOMEM;
}

static int get(struct mancache *c, struct src *s, int64_t mtime, const Ckpt__Manifest **m, struct mancache_entry **e)
{
	char key[64], err[128];
	snprintf(key, sizeof(key), "j/step-000000000001/rank-%05u-of-00008.a.manifest", s->rank);
	return mancache_get(c, key, mtime, 100, fetch, s, m, e, err, sizeof(err));
}

struct thr {
	struct mancache *c;
	struct src *s;
	int r;
	const Ckpt__Manifest *m;
	struct mancache_entry *e;
};

static void *getter(void *arg)
{
	struct thr *t = arg;
	t->r = get(t->c, t->s, 1, &t->m, &t->e);
	return NULL;
}

/* Eight callers at once: one fetch, every one gets the same manifest. */
static void test_single_flight(void **state)
{
	(void)state;
	struct mancache *c = mancache_new(1 << 20);
	struct src s = { .c = c, .waiters = 7 };
	struct thr t[8];
	pthread_t th[8];
	for (int i = 0; i < 8; i++) {
		t[i] = (struct thr){ .c = c, .s = &s };
		assert_int_equal(pthread_create(&th[i], NULL, getter, &t[i]), 0);
	}
	for (int i = 0; i < 8; i++)
		pthread_join(th[i], NULL);
	assert_int_equal(atomic_load(&s.calls), 1);
	for (int i = 0; i < 8; i++) {
		assert_int_equal(t[i].r, 0);
		assert_ptr_equal(t[i].m, t[0].m);
		assert_int_equal(t[i].m->rank, 0);
		mancache_release(c, t[i].e);
	}
	struct mancache_stats st;
	mancache_stats(c, &st);
	assert_int_equal(st.misses, 1);
	assert_int_equal(st.hits, 7);
	assert_int_equal(st.entries, 1);
	assert_true(st.bytes > 0);
	/* Kept: the next caller does not fetch. */
	const Ckpt__Manifest *m;
	struct mancache_entry *e;
	assert_int_equal(get(c, &s, 1, &m, &e), 0);
	assert_int_equal(atomic_load(&s.calls), 1);
	mancache_release(c, e);
	mancache_free(c);
}

/* A failure goes to the callers waiting for that fetch, and is not kept. */
static void test_failure_not_kept(void **state)
{
	(void)state;
	struct mancache *c = mancache_new(1 << 20);
	struct src s = { .c = c, .waiters = 3, .fail = -EIO };
	struct thr t[4];
	pthread_t th[4];
	for (int i = 0; i < 4; i++) {
		t[i] = (struct thr){ .c = c, .s = &s };
		assert_int_equal(pthread_create(&th[i], NULL, getter, &t[i]), 0);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 4; i++)
		assert_int_equal(t[i].r, -EIO);
	assert_int_equal(atomic_load(&s.calls), 1);
	struct mancache_stats st;
	mancache_stats(c, &st);
	assert_int_equal(st.entries, 0);
	assert_int_equal(st.bytes, 0);
	char err[128];
	const Ckpt__Manifest *m;
	struct mancache_entry *e;
	s.waiters = 0;
	assert_int_equal(mancache_get(c, "j/step-000000000001/rank-00000-of-00008.a.manifest", 1, 100, fetch, &s, &m,
				      &e, err, sizeof(err)), -EIO);
	assert_string_equal(err, "fetch failed");
	assert_int_equal(atomic_load(&s.calls), 2);
	s.fail = 0;
	assert_int_equal(get(c, &s, 1, &m, &e), 0);
	assert_int_equal(atomic_load(&s.calls), 3);
	mancache_release(c, e);
	mancache_free(c);
}

/* The same name listed with another time is another object: fetched
 * again, and the old entry goes (it stays valid for who holds it). */
static void test_listed_time_is_identity(void **state)
{
	(void)state;
	struct mancache *c = mancache_new(1 << 20);
	struct src s = { 0 };
	const Ckpt__Manifest *m1, *m2;
	struct mancache_entry *e1, *e2;
	assert_int_equal(get(c, &s, 1, &m1, &e1), 0);
	assert_int_equal(get(c, &s, 2, &m2, &e2), 0);
	assert_int_equal(atomic_load(&s.calls), 2);
	assert_ptr_not_equal(m1, m2);
	assert_int_equal(m1->rank, 0); /* still readable: held */
	struct mancache_stats st;
	mancache_stats(c, &st);
	assert_int_equal(st.entries, 1);
	mancache_release(c, e1);
	mancache_release(c, e2);
	assert_int_equal(get(c, &s, 2, &m2, &e2), 0);
	assert_int_equal(atomic_load(&s.calls), 2);
	mancache_release(c, e2);
	mancache_free(c);
}

/* Bounded by bytes, least recently used out first. */
static void test_lru_bound(void **state)
{
	(void)state;
	struct mancache *c = mancache_new(1 << 20);
	struct src s = { 0 };
	const Ckpt__Manifest *m;
	struct mancache_entry *e;
	assert_int_equal(get(c, &s, 1, &m, &e), 0);
	mancache_release(c, e);
	struct mancache_stats st;
	mancache_stats(c, &st);
	uint64_t one = st.bytes;
	mancache_free(c);

	c = mancache_new(3 * one + one / 2); /* room for three */
	struct src r[5] = { { .rank = 0 }, { .rank = 1 }, { .rank = 2 }, { .rank = 3 }, { .rank = 4 } };
	for (int i = 0; i < 3; i++) {
		assert_int_equal(get(c, &r[i], 1, &m, &e), 0);
		mancache_release(c, e);
	}
	assert_int_equal(get(c, &r[0], 1, &m, &e), 0); /* 0 is the newest now */
	mancache_release(c, e);
	assert_int_equal(get(c, &r[3], 1, &m, &e), 0); /* 1 goes */
	mancache_release(c, e);
	mancache_stats(c, &st);
	assert_int_equal(st.entries, 3);
	assert_true(st.bytes <= 3 * one + one / 2);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(get(c, &r[i], 1, &m, &e), 0);
		mancache_release(c, e);
	}
	assert_int_equal(atomic_load(&r[0].calls), 1);
	assert_int_equal(atomic_load(&r[1].calls), 2);
	/* Held past its eviction: still valid until released. */
	const Ckpt__Manifest *held;
	struct mancache_entry *he;
	assert_int_equal(get(c, &r[4], 1, &held, &he), 0);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(get(c, &r[i], 1, &m, &e), 0);
		mancache_release(c, e);
	}
	assert_int_equal(held->rank, 4);
	assert_string_equal(held->tensors[1]->name, "b");
	mancache_release(c, he);
	/* Larger than the whole cache: served, never kept. */
	struct mancache *tiny = mancache_new(one / 2);
	assert_int_equal(get(tiny, &r[0], 1, &m, &e), 0);
	mancache_stats(tiny, &st);
	assert_int_equal(st.entries, 0);
	assert_int_equal(st.bytes, 0);
	assert_int_equal(m->rank, 0);
	mancache_release(tiny, e);
	mancache_free(tiny);
	mancache_free(c);
}

struct dropper {
	struct mancache *c;
};

static void *drop_later(void *arg)
{
	struct dropper *d = arg;
	usleep(50 * 1000);
	mancache_drop_prefix(d->c, "j/step-000000000001/");
	return NULL;
}

/* A step's entries go with it, a fetch in flight included (its callers
 * get it, the cache does not keep it); other steps stay. */
static void test_drop_step(void **state)
{
	(void)state;
	struct mancache *c = mancache_new(1 << 20);
	struct src s = { 0 };
	const Ckpt__Manifest *m;
	struct mancache_entry *e;
	char err[128];
	assert_int_equal(get(c, &s, 1, &m, &e), 0);
	mancache_release(c, e);
	assert_int_equal(mancache_get(c, "j/step-000000000010/rank-00000-of-00008.a.manifest", 1, 100, fetch, &s, &m,
				      &e, err, sizeof(err)), 0);
	mancache_release(c, e);
	mancache_drop_prefix(c, "j/step-000000000001/");
	struct mancache_stats st;
	mancache_stats(c, &st);
	assert_int_equal(st.entries, 1);
	assert_int_equal(get(c, &s, 1, &m, &e), 0);
	assert_int_equal(atomic_load(&s.calls), 3);
	mancache_release(c, e);
	mancache_drop_prefix(c, "j/step-000000000001/");

	s.sleep_ms = 200;
	struct dropper d = { c };
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, drop_later, &d), 0);
	assert_int_equal(get(c, &s, 1, &m, &e), 0);
	pthread_join(th, NULL);
	assert_int_equal(m->rank, 0);
	mancache_release(c, e);
	mancache_stats(c, &st);
	assert_int_equal(st.entries, 1); /* step 10's only */
	s.sleep_ms = 0;
	assert_int_equal(get(c, &s, 1, &m, &e), 0);
	assert_int_equal(atomic_load(&s.calls), 5);
	mancache_release(c, e);
	mancache_free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_single_flight),
		cmocka_unit_test(test_failure_not_kept),
		cmocka_unit_test(test_listed_time_is_identity),
		cmocka_unit_test(test_lru_bound),
		cmocka_unit_test(test_drop_step),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
