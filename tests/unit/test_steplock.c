#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>

#include "steplock.h"

static void test_save_and_delete_exclude(void **state)
{
	(void)state;
	assert_int_equal(steplock_save_begin("j", 1), 0);
	assert_int_equal(steplock_save_begin("j", 1), 0); /* another rank's save */
	assert_int_equal(steplock_delete_begin("j", 1), -EBUSY);
	assert_int_equal(steplock_delete_begin("j", 2), 0); /* other steps are free */
	assert_int_equal(steplock_delete_begin("other", 1), 0);
	steplock_save_end("j", 1);
	assert_int_equal(steplock_delete_begin("j", 1), -EBUSY);
	steplock_save_end("j", 1);
	assert_int_equal(steplock_delete_begin("j", 1), 0);
	assert_int_equal(steplock_save_begin("j", 1), -EBUSY);
	assert_int_equal(steplock_delete_begin("j", 1), -EBUSY); /* one delete at a time */
	steplock_delete_end("j", 1);
	assert_int_equal(steplock_save_begin("j", 1), 0);
	steplock_save_end("j", 1);
	steplock_delete_end("j", 2);
	steplock_delete_end("other", 1);
	/* unbalanced ends are harmless */
	steplock_save_end("nobody", 9);
	steplock_delete_end("nobody", 9);
	assert_int_equal(steplock_delete_begin("j", 2), 0);
	steplock_delete_end("j", 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_save_and_delete_exclude),
	};
	return cmocka_run_group_tests_name("steplock", tests, NULL, NULL);
}
