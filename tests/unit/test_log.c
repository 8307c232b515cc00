#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

static int count_lines(FILE *f, const char *needle)
{
	fflush(f);
	rewind(f);
	char line[2200];
	int n = 0;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, needle))
			n++;
	return n;
}

static void test_prefix_and_level(void **state)
{
	(void)state;
	FILE *f = tmpfile();
	assert_non_null(f);
	log_set_output(f);
	log_set_level(LOG_LVL_INFO);
	log_info("hello %d", 42);
	log_debug("hidden");
	log_err("bad thing");
	assert_int_equal(count_lines(f, "<6>hello 42"), 1);
	assert_int_equal(count_lines(f, "hidden"), 0);
	assert_int_equal(count_lines(f, "<3>bad thing"), 1);
	log_set_output(NULL);
	fclose(f);
}

static void warn_site(int i)
{
	log_warn("disk trouble %d", i); /* one call site */
}

static void test_repeated_errors_rate_limited(void **state)
{
	(void)state;
	FILE *f = tmpfile();
	log_set_output(f);
	log_set_level(LOG_LVL_INFO);
	for (int i = 0; i < 100; i++)
		warn_site(i);
	assert_int_equal(count_lines(f, "disk trouble"), LOG_RATE_BURST);
	/* Info lines are never limited. */
	for (int i = 0; i < 100; i++)
		log_info("progress %d", i);
	assert_int_equal(count_lines(f, "progress"), 100);
	log_set_output(NULL);
	fclose(f);
}

static void test_journal_stream_match(void **state)
{
	(void)state;
	FILE *f = tmpfile();
	struct stat st;
	assert_int_equal(fstat(fileno(f), &st), 0);
	char env[64];
	snprintf(env, sizeof(env), "%llu:%llu", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
	assert_true(log_journal_stream_matches(env, fileno(f)));
	snprintf(env, sizeof(env), "%llu:%llu", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino + 1);
	assert_false(log_journal_stream_matches(env, fileno(f)));
	assert_false(log_journal_stream_matches(NULL, fileno(f)));
	assert_false(log_journal_stream_matches("junk", fileno(f)));
	fclose(f);
}

static void test_journal_fields(void **state)
{
	(void)state;
	char out[8][1100];
	struct log_ctx ctx = { .job = "llama", .rank = 3, .step = 1200, .save_id = 9 };
	int n = log_journal_fields(LOG_LVL_WARN, &ctx, "save failed", out, 8);
	assert_int_equal(n, 7);
	assert_string_equal(out[0], "MESSAGE=save failed");
	assert_string_equal(out[1], "PRIORITY=4");
	assert_string_equal(out[3], "CKPT_JOB=llama");
	assert_string_equal(out[4], "CKPT_RANK=3");
	assert_string_equal(out[5], "CKPT_STEP=1200");
	assert_string_equal(out[6], "CKPT_SAVE_ID=9");
	struct log_ctx none = { .rank = -1, .step = -1 };
	assert_int_equal(log_journal_fields(LOG_LVL_INFO, &none, "x", out, 8), 3);
	assert_int_equal(log_journal_fields(LOG_LVL_INFO, NULL, "x", out, 8), 3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_prefix_and_level),
		cmocka_unit_test(test_repeated_errors_rate_limited),
		cmocka_unit_test(test_journal_stream_match),
		cmocka_unit_test(test_journal_fields),
	};
	return cmocka_run_group_tests_name("log", tests, NULL, NULL);
}
