/* bufmap: a session's buffers by id, against a plain array as the model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "bufmap.h"
#include "hostbuf.h"
#include "testutil.h"

#define N 6000

static unsigned cleared;

static void count_clear(struct hostbuf *b)
{
	(void)b;
	cleared++;
}

static void check_all(const struct bufmap *m, struct hostbuf *bufs, const int *in)
{
	for (int i = 0; i < N; i++)
		assert_ptr_equal(bufmap_get(m, bufs[i].id), in[i] ? &bufs[i] : NULL);
}

static void run(uint64_t (*id_of)(uint64_t *seed, int i))
{
	static struct hostbuf bufs[N];
	static int in[N];
	uint64_t seed = 5;
	struct bufmap m = { 0 };
	assert_null(bufmap_get(&m, 1));
	assert_null(bufmap_take(&m, 1));
	for (int i = 0; i < N; i++) {
		bufs[i] = (struct hostbuf){ .id = id_of(&seed, i) };
		in[i] = 0;
	}
	/* Rounds of random puts and takes, checked against the model. */
	for (int round = 0; round < 4; round++) {
		for (int k = 0; k < N; k++) {
			int i = (int)tu_below(&seed, N);
			if (in[i]) {
				assert_ptr_equal(bufmap_take(&m, bufs[i].id), &bufs[i]);
				in[i] = 0;
			} else {
				assert_int_equal(bufmap_put(&m, &bufs[i]), 0);
				in[i] = 1;
			}
		}
		check_all(&m, bufs, in);
		unsigned n = 0;
		for (int i = 0; i < N; i++)
			n += (unsigned)in[i];
		assert_int_equal(m.n, n);
	}
	cleared = 0;
	unsigned left = m.n;
	bufmap_clear(&m, count_clear);
	assert_int_equal(cleared, left);
	assert_int_equal(m.n, 0);
	assert_null(bufmap_get(&m, bufs[0].id));
}

static uint64_t sequential(uint64_t *seed, int i)
{
	(void)seed;
	return (uint64_t)i + 1;
}

static uint64_t random_id(uint64_t *seed, int i)
{
	(void)i;
	/* Distinct: the low bits are i's. */
	return (tu_rand(seed) << 16) | (uint64_t)i;
}

/* Ids that all land on one home slot: the longest runs. */
static uint64_t colliding(uint64_t *seed, int i)
{
	(void)seed;
	return ((uint64_t)i << 40) + 1;
}

static void test_sequential_ids(void **state)
{
	(void)state;
	run(sequential);
}

static void test_random_ids(void **state)
{
	(void)state;
	run(random_id);
}

static void test_colliding_ids(void **state)
{
	(void)state;
	run(colliding);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sequential_ids),
		cmocka_unit_test(test_random_ids),
		cmocka_unit_test(test_colliding_ids),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
