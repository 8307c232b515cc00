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

#include <json-c/json.h>

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

static void warn_site2(int i)
{
	log_warn("cable trouble %d", i); /* another call site */
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
	/* When the window ends, the next message from the site says how many
	 * were left out ("(N similar messages suppressed)", docs/operations.md
	 * "Logs"). */
	log_set_rate_window_ms(50);
	for (int i = 0; i < 30; i++)
		warn_site2(i);
	usleep(80 * 1000);
	warn_site2(99);
	assert_int_equal(count_lines(f, "(10 similar messages suppressed)"), 1);
	assert_int_equal(count_lines(f, "cable trouble"), LOG_RATE_BURST + 1);
	log_set_rate_window_ms(LOG_RATE_WINDOW_MS);
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

/* [log] format = json: one object per line that a JSON parser reads back,
 * with the message escaped, the level named and the context's fields. */
static void test_json_lines(void **state)
{
	(void)state;
	char line[4096];
	struct timespec t = { .tv_sec = 1795000000, .tv_nsec = 123456789 };
	struct log_ctx ctx = { .job = "llama \"70b\"", .rank = 3, .step = 1200, .save_id = 9 };
	size_t n = log_json_line(LOG_LVL_WARN, &ctx, "a \"quoted\" \\ path\nand\ta tab\x01", &t, line, sizeof(line));
	assert_true(n > 0 && line[n - 1] == '\n');
	assert_null(memchr(line, '\n', n - 1)); /* one line */
	struct json_object *o = json_tokener_parse(line);
	assert_non_null(o);
	struct json_object *v;
	assert_true(json_object_object_get_ex(o, "msg", &v));
	assert_string_equal(json_object_get_string(v), "a \"quoted\" \\ path\nand\ta tab\x01");
	assert_true(json_object_object_get_ex(o, "level", &v));
	assert_string_equal(json_object_get_string(v), "warn");
	assert_true(json_object_object_get_ex(o, "time", &v));
	assert_string_equal(json_object_get_string(v), "2026-11-18T11:06:40.123Z");
	assert_true(json_object_object_get_ex(o, "job", &v));
	assert_string_equal(json_object_get_string(v), "llama \"70b\"");
	assert_true(json_object_object_get_ex(o, "rank", &v));
	assert_int_equal(json_object_get_int64(v), 3);
	assert_true(json_object_object_get_ex(o, "step", &v));
	assert_int_equal(json_object_get_int64(v), 1200);
	assert_true(json_object_object_get_ex(o, "save_id", &v));
	assert_int_equal(json_object_get_int64(v), 9);
	json_object_put(o);
	/* No context: only time, level and msg. A long message is cut, and the
	 * line is still JSON. */
	static char big[8000];
	memset(big, '"', sizeof(big) - 1);
	n = log_json_line(LOG_LVL_INFO, NULL, big, &t, line, sizeof(line));
	o = json_tokener_parse(line);
	assert_non_null(o);
	assert_int_equal(json_object_object_length(o), 3);
	json_object_put(o);
	/* Through the logger, as the daemon writes it. */
	FILE *f = tmpfile();
	assert_non_null(f);
	log_set_output(f);
	log_set_format(LOG_FORMAT_JSON);
	log_info("saved %d bytes", 42);
	log_set_format(LOG_FORMAT_TEXT);
	log_set_output(NULL);
	rewind(f);
	assert_non_null(fgets(line, sizeof(line), f));
	fclose(f);
	o = json_tokener_parse(line);
	assert_non_null(o);
	assert_true(json_object_object_get_ex(o, "msg", &v));
	assert_string_equal(json_object_get_string(v), "saved 42 bytes");
	json_object_put(o);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_prefix_and_level),
		cmocka_unit_test(test_repeated_errors_rate_limited),
		cmocka_unit_test(test_journal_stream_match),
		cmocka_unit_test(test_journal_fields),
		cmocka_unit_test(test_json_lines),
	};
	return cmocka_run_group_tests_name("log", tests, NULL, NULL);
}
