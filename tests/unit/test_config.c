#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "config.h"

static void test_parse_size_good(void **state)
{
	(void)state;
	static const struct { const char *s; uint64_t v; } ok[] = {
		{ "0", 0 },
		{ "4096", 4096 },
		{ "64M", 64ull << 20 },
		{ "64m", 64ull << 20 },
		{ "1G", 1ull << 30 },
		{ "1g", 1ull << 30 },
		{ "2KiB", 2048 },
		{ "2k", 2048 },
		{ "3MB", 3ull << 20 },
		{ "1T", 1ull << 40 },
		{ "18446744073709551615", UINT64_MAX },
		{ "16777215T", 16777215ull << 40 },
	};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		uint64_t v = 12345;
		assert_int_equal(config_parse_size(ok[i].s, &v), 0);
		assert_int_equal(v, ok[i].v);
	}
}

static void test_parse_size_errors(void **state)
{
	(void)state;
	static const char *bad[] = { "", "-1", " -1", " 5", "+5", "-0", "12X", "1M5", "M",
				     "G1", "1GG", "0x10", "1 G", "1.5G" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint64_t v = 777;
		int r = config_parse_size(bad[i], &v);
		if (r != -EINVAL)
			fail_msg("config_parse_size(\"%s\") = %d, want -EINVAL", bad[i], r);
		assert_int_equal(v, 777); /* untouched on failure */
	}
	uint64_t v = 777;
	assert_int_equal(config_parse_size(NULL, &v), -EINVAL);
	/* Too big for 64 bits, with or without a suffix. */
	assert_int_equal(config_parse_size("16777216T", &v), -ERANGE);
	assert_int_equal(config_parse_size("17179869184G", &v), -ERANGE);
	assert_int_equal(config_parse_size("18446744073709551616", &v), -ERANGE);
	assert_int_equal(config_parse_size("99999999999999999999999", &v), -ERANGE);
	assert_int_equal(v, 777);
}

/* Writes text to a fresh temporary file; returns its path (static). */
static const char *write_ini(const char *text)
{
	static char path[64];
	snprintf(path, sizeof(path), "/tmp/ckptd-config-XXXXXX");
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	size_t n = strlen(text);
	assert_int_equal(write(fd, text, n), (ssize_t)n);
	close(fd);
	return path;
}

static void test_load_good(void **state)
{
	(void)state;
	struct config c;
	char err[512] = "";
	config_defaults(&c);
	const char *path = write_ini(
		"; comment\n"
		"[server]\n"
		"socket = /tmp/ckptd-test.sock\n"
		"allowed_uids = 4242, 17\n"
		"[pool]\n"
		"staging_bytes = 2G\n"
		"[limits]\n"
		"max_frame_bytes = 65536\n"
		"[storage]\n"
		"url = file:///tmp/ckptd-store\n"
		"[log]\n"
		"level = debug\n");
	int r = config_load(&c, path, err, sizeof(err));
	unlink(path);
	assert_int_equal(r, 0);
	assert_string_equal(c.socket_path, "/tmp/ckptd-test.sock");
	assert_int_equal(c.n_allowed_uids, 2);
	assert_int_equal(c.allowed_uids[0], 4242);
	assert_int_equal(c.allowed_uids[1], 17);
	assert_int_equal(c.staging_bytes, 2ull << 30);
	assert_int_equal(c.max_frame_bytes, 65536);
	assert_string_equal(c.storage_url, "file:///tmp/ckptd-store");
	assert_int_equal(c.log_level, 7);
	/* Keys not in the file keep their defaults. */
	assert_int_equal(c.chunk_bytes, DEFAULT_CHUNK_BYTES);
	assert_int_equal(c.max_sessions, DEFAULT_MAX_SESSIONS);
	assert_string_equal(c.state_dir, DEFAULT_STATE_DIR);
	assert_int_equal(config_validate(&c, err, sizeof(err)), 0);
}

static void test_load_unknown_key(void **state)
{
	(void)state;
	struct config c;
	char err[512] = "";
	config_defaults(&c);
	const char *path = write_ini("[pool]\n"
				     "staging_bytes = 1G\n"
				     "stagng_bytes = 2G\n");
	int r = config_load(&c, path, err, sizeof(err));
	assert_int_equal(r, -ENOENT);
	assert_non_null(strstr(err, path));
	assert_non_null(strstr(err, ":3:"));
	assert_non_null(strstr(err, "stagng_bytes"));
	assert_non_null(strstr(err, "unknown key"));
	unlink(path);

	/* A known key in the wrong section is unknown too. */
	config_defaults(&c);
	path = write_ini("[server]\n\nstaging_bytes = 1G\n");
	assert_int_equal(config_load(&c, path, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, ":3:"));
	assert_non_null(strstr(err, "staging_bytes"));
	unlink(path);
}

static void test_load_bad_values(void **state)
{
	(void)state;
	struct config c;
	char err[512] = "";
	config_defaults(&c);
	const char *path = write_ini("[pool]\nchunk_bytes = 12X\n");
	assert_int_equal(config_load(&c, path, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, ":2:"));
	assert_non_null(strstr(err, "chunk_bytes"));
	assert_int_equal(c.chunk_bytes, DEFAULT_CHUNK_BYTES);
	unlink(path);

	config_defaults(&c);
	path = write_ini("[limits]\nmax_sessions = 5G\n"); /* > UINT32_MAX */
	assert_int_equal(config_load(&c, path, err, sizeof(err)), -ERANGE);
	assert_non_null(strstr(err, "max_sessions"));
	unlink(path);

	config_defaults(&c);
	path = write_ini("[server]\nallowed_uids = 12, abc\n");
	assert_int_equal(config_load(&c, path, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "allowed_uids"));
	unlink(path);

	/* strtoul would read "-0" as 0 (root) and wrap other signs. */
	static const char *bad_uids[] = { "-0", "1, -18446744073709551615", "+5", "12x" };
	for (size_t i = 0; i < sizeof(bad_uids) / sizeof(bad_uids[0]); i++) {
		char text[128];
		snprintf(text, sizeof(text), "[server]\nallowed_uids = %s\n", bad_uids[i]);
		config_defaults(&c);
		path = write_ini(text);
		int r = config_load(&c, path, err, sizeof(err));
		unlink(path);
		if (r != -EINVAL)
			fail_msg("allowed_uids = %s: %d, want -EINVAL", bad_uids[i], r);
	}

	config_defaults(&c);
	path = write_ini("[log]\nlevel = loud\n");
	assert_int_equal(config_load(&c, path, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "level"));
	unlink(path);

	char longsock[300];
	snprintf(longsock, sizeof(longsock), "[server]\nsocket = /%0200d\n", 0);
	config_defaults(&c);
	path = write_ini(longsock);
	assert_int_equal(config_load(&c, path, err, sizeof(err)), -ENAMETOOLONG);
	assert_string_equal(c.socket_path, DEFAULT_SOCKET_PATH);
	unlink(path);

	/* A line that is not "key = value". */
	config_defaults(&c);
	path = write_ini("[pool]\nstaging_bytes 1G\n");
	assert_int_equal(config_load(&c, path, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, ":2:"));
	unlink(path);

	config_defaults(&c);
	assert_int_equal(config_load(&c, "/nonexistent/ckptd.conf", err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "/nonexistent/ckptd.conf"));
}

static void valid_config(struct config *c)
{
	config_defaults(c);
	snprintf(c->storage_url, sizeof(c->storage_url), "file:///tmp/x");
}

/* Every key the shipped example documents is one the daemon reads. */
static void test_example_file(void **state)
{
	(void)state;
	const char *root = getenv("CKPT_SOURCE_ROOT");
	assert_non_null(root);
	char path[1024], err[512] = "";
	snprintf(path, sizeof(path), "%s/deploy/ckptd.conf.example", root);
	struct config c;
	config_defaults(&c);
	int r = config_load(&c, path, err, sizeof(err));
	if (r != 0)
		fail_msg("%s: %s", path, err);
	assert_int_equal(c.max_inflight_loads, 4);
	assert_int_equal(c.policy, POLICY_BLOCK);
	assert_true(c.memory_tier);
	assert_int_equal(c.manifest_cache_bytes, DEFAULT_MANIFEST_CACHE_BYTES);
}

static void test_job_policy(void **state)
{
	(void)state;
	char path[] = "/tmp/ckpt-conf-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	const char *text = "[pool]\npolicy = skip\nquota = 50%\n[job.big]\npolicy = coalesce\nquota = 1G\n"
			   "max_inflight_saves = 2\n[job.small]\nquota = 10%\n";
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	struct config c;
	char err[256];
	config_defaults(&c);
	assert_int_equal(config_load(&c, path, err, sizeof(err)), 0);
	unlink(path);
	struct job_policy jp;
	config_job_policy(&c, "big", 4ull << 30, &jp);
	assert_int_equal(jp.policy, POLICY_COALESCE);
	assert_int_equal(jp.quota_bytes, 1ull << 30);
	assert_int_equal(jp.max_inflight_saves, 2);
	config_job_policy(&c, "small", 4ull << 30, &jp);
	assert_int_equal(jp.policy, POLICY_SKIP);
	assert_int_equal(jp.quota_bytes, (4ull << 30) * 10 / 100);
	assert_int_equal(jp.max_inflight_saves, DEFAULT_MAX_INFLIGHT_SAVES);
	config_job_policy(&c, "other", 4ull << 30, &jp);
	assert_int_equal(jp.quota_bytes, 2ull << 30);
	/* Bad policy and quota values are errors naming the key. */
	const char *bad[] = { "[pool]\npolicy = sometimes\n", "[job.x]\nquota = 0\n", "[job.x]\nquota = 150%\n",
			      "[job.x]\ncolour = red\n" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char p2[] = "/tmp/ckpt-conf-XXXXXX";
		fd = mkstemp(p2);
		assert_int_equal(write(fd, bad[i], strlen(bad[i])), (ssize_t)strlen(bad[i]));
		close(fd);
		config_defaults(&c);
		err[0] = '\0';
		assert_true(config_load(&c, p2, err, sizeof(err)) < 0);
		assert_true(err[0] != '\0');
		unlink(p2);
	}
}

static void test_validate(void **state)
{
	(void)state;
	struct config c;
	char err[256];

	valid_config(&c);
	assert_int_equal(config_validate(&c, err, sizeof(err)), 0);

	valid_config(&c);
	c.chunk_bytes = 3 * 4096 + 512;
	assert_int_equal(config_validate(&c, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "multiple of 4096"));
	c.chunk_bytes = 1000;
	assert_int_equal(config_validate(&c, err, sizeof(err)), -EINVAL);
	c.chunk_bytes = 0;
	assert_int_equal(config_validate(&c, err, sizeof(err)), -EINVAL);
	c.chunk_bytes = 3 * 4096; /* a multiple, not a power of two: fine */
	assert_int_equal(config_validate(&c, err, sizeof(err)), 0);

	valid_config(&c);
	c.staging_bytes = c.chunk_bytes - 4096;
	assert_int_equal(config_validate(&c, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "smaller than one chunk"));
	c.staging_bytes = c.chunk_bytes;
	assert_int_equal(config_validate(&c, err, sizeof(err)), 0);

	valid_config(&c);
	c.storage_url[0] = '\0';
	assert_int_equal(config_validate(&c, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "storage"));

	valid_config(&c);
	c.copy_threads = 0;
	assert_int_equal(config_validate(&c, err, sizeof(err)), -EINVAL);

	valid_config(&c);
	c.max_frame_bytes = 100;
	assert_int_equal(config_validate(&c, err, sizeof(err)), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_size_good),
		cmocka_unit_test(test_parse_size_errors),
		cmocka_unit_test(test_load_good),
		cmocka_unit_test(test_load_unknown_key),
		cmocka_unit_test(test_load_bad_values),
		cmocka_unit_test(test_validate),
		cmocka_unit_test(test_example_file),
		cmocka_unit_test(test_job_policy),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
