#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include <errno.h>

#include "config.h"
#include "retention.h"

#define S 1000000000ull

/* Steps 1..n, complete, created one second apart ending at now. */
static void steps(struct step_view *v, size_t n, uint64_t now)
{
	for (size_t i = 0; i < n; i++)
		v[i] = (struct step_view){ .step = i + 1, .complete = true, .newest_ns = now - (n - i) * S };
}

static void expect(const struct step_view *v, size_t n, const char *want)
{
	char got[64];
	for (size_t i = 0; i < n; i++)
		got[i] = v[i].remove ? 'x' : '.';
	got[n] = '\0';
	assert_string_equal(got, want);
}

static void test_nothing_set_keeps_all(void **state)
{
	(void)state;
	struct retention r = { 0 };
	struct step_view v[5];
	steps(v, 5, 100 * S);
	assert_int_equal(retention_plan(&r, v, 5, 100 * S), 0);
	expect(v, 5, ".....");
}

static void test_keep_last(void **state)
{
	(void)state;
	struct retention r = { .keep_last = 2 };
	struct step_view v[6];
	steps(v, 6, 100 * S);
	assert_int_equal(retention_plan(&r, v, 6, 100 * S), 4);
	expect(v, 6, "xxxx..");
	assert_non_null(v[0].reason);
}

static void test_keep_every(void **state)
{
	(void)state;
	struct retention r = { .keep_last = 1, .keep_every = 3 };
	struct step_view v[7];
	steps(v, 7, 100 * S);
	retention_plan(&r, v, 7, 100 * S);
	expect(v, 7, "xx.xx.."); /* 3 and 6 are every-3rd; 7 is newest */
}

static void test_max_age_and_newest(void **state)
{
	(void)state;
	struct retention r = { .max_age_s = 3 };
	struct step_view v[6];
	steps(v, 6, 100 * S); /* ages 6..1 s */
	retention_plan(&r, v, 6, 100 * S);
	expect(v, 6, "xxx...");
	/* Even far past max_age, the newest complete step stays. */
	retention_plan(&r, v, 6, 1000 * S);
	expect(v, 6, "xxxxx.");
}

static void test_busy_and_incomplete(void **state)
{
	(void)state;
	struct retention r = { .keep_last = 1, .incomplete_grace_s = 10 };
	struct step_view v[6];
	steps(v, 6, 100 * S);
	v[1].busy = true;          /* being read: kept */
	v[5].complete = false;     /* newest is incomplete, young: kept */
	v[2].complete = false;     /* incomplete, 4 s old: within grace */
	retention_plan(&r, v, 6, 100 * S);
	/* newest complete is step 5 (index 4); 1 and 4 go */
	expect(v, 6, "x..x..");
	retention_plan(&r, v, 6, 120 * S); /* step 3 is past grace; 6 too, but it is newer */
	expect(v, 6, "x.xx.."); /* than the newest complete step: it may be in progress */
	/* No complete step at all: incomplete ones stay, however old. */
	struct step_view w[2];
	steps(w, 2, 100 * S);
	w[0].complete = w[1].complete = false;
	struct retention g = { .incomplete_grace_s = 1 };
	assert_int_equal(retention_plan(&g, w, 2, 1000 * S), 0);
	/* grace 0: incomplete steps are never removed by gc */
	r.incomplete_grace_s = 0;
	retention_plan(&r, v, 6, 1000 * S);
	expect(v, 6, "x..x..");
}

static void test_parse_duration(void **state)
{
	(void)state;
	uint64_t v;
	assert_int_equal(config_parse_duration("90", &v), 0);
	assert_int_equal(v, 90);
	assert_int_equal(config_parse_duration("30s", &v), 0);
	assert_int_equal(v, 30);
	assert_int_equal(config_parse_duration("15m", &v), 0);
	assert_int_equal(v, 900);
	assert_int_equal(config_parse_duration("2h", &v), 0);
	assert_int_equal(v, 7200);
	assert_int_equal(config_parse_duration("7d", &v), 0);
	assert_int_equal(v, 7 * 86400);
	assert_int_equal(config_parse_duration("", &v), -EINVAL);
	assert_int_equal(config_parse_duration("-1", &v), -EINVAL);
	assert_int_equal(config_parse_duration("5w", &v), -EINVAL);
	assert_int_equal(config_parse_duration("5ss", &v), -EINVAL);
	assert_int_equal(config_parse_duration("99999999999999999999d", &v), -ERANGE);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_nothing_set_keeps_all),
		cmocka_unit_test(test_keep_last),
		cmocka_unit_test(test_keep_every),
		cmocka_unit_test(test_max_age_and_newest),
		cmocka_unit_test(test_busy_and_incomplete),
		cmocka_unit_test(test_parse_duration),
	};
	return cmocka_run_group_tests_name("retention", tests, NULL, NULL);
}
