#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "grow.h"

static void test_doubles_from_first(void **state)
{
	(void)state;
	int *v = NULL;
	size_t cap = 0;
	assert_int_equal(GROW(v, cap, 1, 16), 0);
	assert_non_null(v);
	assert_int_equal(cap, 16);
	for (int i = 0; i < 16; i++)
		v[i] = i;
	assert_int_equal(GROW(v, cap, 16, 16), 0); /* room already */
	assert_int_equal(cap, 16);
	assert_int_equal(GROW(v, cap, 17, 16), 0);
	assert_int_equal(cap, 32);
	assert_int_equal(GROW(v, cap, 100, 16), 0); /* need past twice cap */
	assert_int_equal(cap, 100);
	for (int i = 0; i < 16; i++)
		assert_int_equal(v[i], i);
	free(v);
}

static void test_narrow_capacity(void **state)
{
	(void)state;
	char *v = NULL;
	uint8_t cap = 0;
	assert_int_equal(GROW(v, cap, 200, 1), 0);
	assert_int_equal(cap, 200);
	assert_int_equal(GROW(v, cap, 201, 1), 0); /* twice 200 is past uint8_t */
	assert_int_equal(cap, 255);
	char *was = v;
	assert_int_equal(GROW(v, cap, 256, 1), -ENOMEM);
	assert_ptr_equal(v, was);
	assert_int_equal(cap, 255);
	free(v);
}

static void test_overflow_leaves_array(void **state)
{
	(void)state;
	uint64_t *v = NULL;
	size_t cap = 0;
	assert_int_equal(GROW(v, cap, 4, 4), 0);
	uint64_t *was = v;
	assert_int_equal(GROW(v, cap, SIZE_MAX / 4, 4), -ENOMEM); /* bytes past SIZE_MAX */
	assert_ptr_equal(v, was);
	assert_int_equal(cap, 4);
	free(v);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_doubles_from_first),
		cmocka_unit_test(test_narrow_capacity),
		cmocka_unit_test(test_overflow_leaves_array),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
