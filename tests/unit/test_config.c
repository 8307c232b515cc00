#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>

#include "config.h"

static void test_parse_size_good(void **state)
{
	(void)state;
	static const struct {
		const char *s;
		uint64_t v;
	} ok[] = {
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
	static const char *bad[] = { "",    "-1", " -1", " 5",  "+5",   "-0",  "12X",
				     "1M5", "M",  "G1",  "1GG", "0x10", "1 G", "1.5G" };
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
	const char *path = write_ini("; comment\n"
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

	/* Paths are absolute; the metrics address parses as a start takes it. */
	valid_config(&c);
	snprintf(c.socket_path, sizeof(c.socket_path), "run/ckptd.sock");
	assert_int_equal(config_validate(&c, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "socket 'run/ckptd.sock' must be an absolute path"));
	valid_config(&c);
	snprintf(c.state_dir, sizeof(c.state_dir), "state");
	assert_int_equal(config_validate(&c, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "state_dir 'state'"));
	static const char *const bad_listen[] = { "9464", ":9464", "0.0.0.0:", "0.0.0.0:65536", "localhost:9464",
						  "[::1:9464", "1.2.3:80", "0.0.0.0:94x" };
	for (size_t i = 0; i < sizeof(bad_listen) / sizeof(bad_listen[0]); i++) {
		valid_config(&c);
		snprintf(c.metrics_listen, sizeof(c.metrics_listen), "%s", bad_listen[i]);
		if (config_validate(&c, err, sizeof(err)) != -EINVAL || strstr(err, "want HOST:PORT") == NULL)
			fail_msg("[metrics] listen = %s passed: %s", bad_listen[i], err);
	}
	static const char *const good_listen[] = { "0.0.0.0:9464", "127.0.0.1:0", "[::]:9464", "[::1]:1" };
	for (size_t i = 0; i < sizeof(good_listen) / sizeof(good_listen[0]); i++) {
		valid_config(&c);
		snprintf(c.metrics_listen, sizeof(c.metrics_listen), "%s", good_listen[i]);
		if (config_validate(&c, err, sizeof(err)) != 0)
			fail_msg("[metrics] listen = %s refused: %s", good_listen[i], err);
	}
}

/* A config file's keys, commented ("# keep_last = 3") or not, with their
 * sections ("# [job.x]" counts): calls fn for each. Prose comments have no
 * "word =" at their start. */
struct ini_key {
	char section[64], name[64];
};

static size_t scan_keys(const char *text, struct ini_key *out, size_t max)
{
	char section[64] = "";
	size_t n = 0;
	for (const char *l = text; *l;) {
		const char *e = strchr(l, '\n');
		size_t len = e ? (size_t)(e - l) : strlen(l);
		char line[512];
		snprintf(line, sizeof(line), "%.*s", (int)(len < sizeof(line) ? len : sizeof(line) - 1), l);
		l += len + (e != NULL);
		char *p = line;
		while (*p == ' ' || *p == '\t' || *p == '#' || *p == ';')
			p++;
		if (*p == '[') {
			char *close = strchr(p, ']');
			if (close && (size_t)(close - p - 1) < sizeof(section))
				snprintf(section, sizeof(section), "%.*s", (int)(close - p - 1), p + 1);
			continue;
		}
		size_t k = strspn(p, "abcdefghijklmnopqrstuvwxyz0123456789_");
		const char *q = p + k;
		while (*q == ' ')
			q++;
		if (k == 0 || k >= sizeof(out[0].name) || *q != '=')
			continue;
		assert_true(n < max);
		snprintf(out[n].section, sizeof(out[n].section), "%s", section);
		snprintf(out[n].name, sizeof(out[n].name), "%.*s", (int)k, p);
		n++;
	}
	return n;
}

static char *read_text(const char *path)
{
	FILE *f = fopen(path, "r");
	if (f == NULL)
		fail_msg("%s: %s", path, strerror(errno));
	static char buf[1 << 16];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	return buf;
}

static bool has_key(const struct ini_key *keys, size_t n, const char *section, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(keys[i].name, name) == 0 &&
		    (section ? strcmp(keys[i].section, section) == 0 : strncmp(keys[i].section, "job.", 4) == 0))
			return true;
	return false;
}

/* Every key of the shipped example (commented or not) is a row of
 * config_keys[] or config_job_keys[], and every row is in the example: a
 * key added to the table is documented there. */
static void test_example_keys_match_table(void **state)
{
	(void)state;
	char path[1024];
	snprintf(path, sizeof(path), "%s/deploy/ckptd.conf.example", getenv("CKPT_SOURCE_ROOT"));
	static struct ini_key keys[256];
	size_t n = scan_keys(read_text(path), keys, 256);
	assert_true(n > 30);
	for (size_t i = 0; i < n; i++)
		if (config_key_find(keys[i].section, keys[i].name) == NULL)
			fail_msg("%s: [%s] %s is not in config_keys[] (daemon/base/config.c)", path, keys[i].section,
				 keys[i].name);
	for (size_t i = 0; i < config_nkeys; i++) {
		const struct config_key *k = &config_keys[i];
		assert_non_null(k->help);
		if (strcmp(k->name, "*") != 0 && !has_key(keys, n, k->section, k->name))
			fail_msg("[%s] %s is not in %s", k->section, k->name, path);
	}
	/* A [job.NAME] key is in the example's job section, or its namesake
	 * that it overrides is ([retention] keep_every ...). */
	for (size_t i = 0; i < JOB_KEY_COUNT; i++) {
		const struct config_key *k = &config_job_keys[i];
		assert_non_null(k->name);
		assert_non_null(k->help);
		if (!has_key(keys, n, NULL, k->name) && !has_key(keys, n, "pool", k->name) &&
		    !has_key(keys, n, "limits", k->name) && !has_key(keys, n, "retention", k->name))
			fail_msg("[job.NAME] %s is not in %s", k->name, path);
	}
}

/* The ckptd.conf of the k8s ConfigMap: its keys are rows, and it loads. */
static void test_configmap_keys_in_table(void **state)
{
	(void)state;
	char path[1024];
	snprintf(path, sizeof(path), "%s/deploy/k8s/configmap.yaml", getenv("CKPT_SOURCE_ROOT"));
	const char *yaml = read_text(path);
	const char *p = strstr(yaml, "ckptd.conf: |\n");
	assert_non_null(p);
	p = strchr(p, '\n') + 1;
	size_t indent = strspn(p, " ");
	assert_true(indent > 0);
	static char conf[1 << 16];
	size_t m = 0;
	while (*p) {
		const char *e = strchr(p, '\n');
		size_t len = e ? (size_t)(e - p) + 1 : strlen(p);
		size_t sp = strspn(p, " ");
		if (sp < indent && p[sp] != '\n')
			break; /* the block ends */
		size_t skip = sp < indent ? sp : indent;
		memcpy(conf + m, p + skip, len - skip);
		m += len - skip;
		p += len;
	}
	conf[m] = '\0';
	static struct ini_key keys[256];
	size_t n = scan_keys(conf, keys, 256);
	assert_true(n > 5);
	for (size_t i = 0; i < n; i++)
		if (config_key_find(keys[i].section, keys[i].name) == NULL)
			fail_msg("%s: [%s] %s is not in config_keys[]", path, keys[i].section, keys[i].name);
	const char *tmp = write_ini(conf);
	struct config c;
	char err[512] = "";
	config_defaults(&c);
	int r = config_load(&c, tmp, err, sizeof(err));
	unlink(tmp);
	if (r != 0)
		fail_msg("%s: %s", path, err);
}

/* Inline comments as the example file writes them: '#' or ';' at the
 * start of a value or after white space ends it; elsewhere they are data. */
static void test_inline_comments(void **state)
{
	(void)state;
	struct config c;
	char err[512] = "";
	config_defaults(&c);
	const char *path = write_ini("[retention]\n"
				     "keep_last = 3          # the newest N complete steps\n"
				     "keep_every = 1000\t; and every step divisible by K\n"
				     "[server]\n"
				     "socket = /tmp/a#b;c.sock # a '#' inside a value stays\n"
				     "[log]\n"
				     "level = debug#\n");
	int r = config_load(&c, path, err, sizeof(err));
	unlink(path);
	/* "debug#" is not a level: the '#' touches the value, so it is data. */
	assert_int_equal(r, -EINVAL);
	assert_non_null(strstr(err, "debug#"));
	config_defaults(&c);
	path = write_ini("[retention]\n"
			 "keep_last = 3          # the newest N complete steps\n"
			 "keep_every = 1000\t; and every step divisible by K\n"
			 "[server]\n"
			 "socket = /tmp/a#b;c.sock # a '#' inside a value stays\n");
	r = config_load(&c, path, err, sizeof(err));
	unlink(path);
	if (r != 0)
		fail_msg("%s", err);
	assert_int_equal(c.retention.keep_last, 3);
	assert_int_equal(c.retention.keep_every, 1000);
	assert_string_equal(c.socket_path, "/tmp/a#b;c.sock");
	/* Flags and --set are values as given, comments are the file's. */
	config_defaults(&c);
	assert_int_equal(config_set(&c, "storage.url", "file:///mnt/x #1", err, sizeof(err)), 0);
	assert_string_equal(c.storage_url, "file:///mnt/x #1");
}

/* Every commented-out "# key = value   # what it does" line (and "# [section]"
 * header) of the example file, uncommented, loads: the example's own inline
 * comments parse. */
static void test_example_uncommented_loads(void **state)
{
	(void)state;
	char path[1024];
	snprintf(path, sizeof(path), "%s/deploy/ckptd.conf.example", getenv("CKPT_SOURCE_ROOT"));
	const char *text = read_text(path);
	static char conf[1 << 16];
	size_t m = 0, uncommented = 0;
	for (const char *p = text; *p;) {
		const char *e = strchr(p, '\n');
		size_t len = e ? (size_t)(e - p) + 1 : strlen(p);
		const char *q = p + 2;
		size_t id = strspn(q, "abcdefghijklmnopqrstuvwxyz_0123456789");
		bool section = strncmp(p, "# [", 3) == 0 && len > 4 && p[len - (e ? 2 : 1)] == ']';
		if ((strncmp(p, "# ", 2) == 0 && id > 0 && strncmp(q + id, " = ", 3) == 0) || section) {
			memcpy(conf + m, q, len - 2);
			m += len - 2;
			uncommented++;
		} else {
			memcpy(conf + m, p, len);
			m += len;
		}
		p += len;
	}
	conf[m] = '\0';
	assert_true(uncommented > 10);
	const char *tmp = write_ini(conf);
	struct config c;
	char err[512] = "";
	config_defaults(&c);
	int r = config_load(&c, tmp, err, sizeof(err));
	unlink(tmp);
	if (r != 0)
		fail_msg("%s uncommented: %s", path, err);
}

/* config_print writes every row so that loading it gives the same values. */
static void test_print_round_trip(void **state)
{
	(void)state;
	struct config c, back;
	char err[512] = "";
	config_defaults(&c);
	const char *path = write_ini(
		"[server]\nallowed_gids = 7, 8\n[storage]\nurl = s3://b/p\nlayout = spread\n"
		"region = eu-west-1\npart_size = 8M\n[pool]\nquota = 3G\nmemory_tier = no\n"
		"policy = coalesce\n[retention]\nmax_age = 2h\nkeep_every = 10\n"
		"[job.a]\nquota = 10%\nkeep_last = 2\nincomplete_grace = 1d\n[job.b]\npolicy = skip\n"
		"[log]\nlevel = warn\n[debug]\nstore_delay_ms = 5\n");
	assert_int_equal(config_load(&c, path, err, sizeof(err)), 0);
	unlink(path);
	char text[8192];
	FILE *f = fmemopen(text, sizeof(text), "w");
	assert_non_null(f);
	config_print(&c, f);
	fclose(f);
	path = write_ini(text);
	memset(&back, 0, sizeof(back));
	config_defaults(&back);
	back.n_allowed_uids = 0;
	int r = config_load(&back, path, err, sizeof(err));
	unlink(path);
	if (r != 0)
		fail_msg("%s\n%s", err, text);
	char kept[512];
	assert_int_equal(config_reload(&back, &c, kept, sizeof(kept)), 0);
	assert_string_equal(back.storage_opts, "region=eu-west-1&part_size=8M");
	assert_true(back.layout_spread);
	assert_false(back.memory_tier);
	assert_int_equal(back.quota_bytes, 3ull << 30);
	assert_int_equal(back.log_level, 4);
	assert_int_equal(back.debug_store_delay_ms, 5);
	assert_int_equal(back.njobs, 2);
	assert_int_equal(back.jobs[0].quota_pct, 10);
	assert_int_equal(back.jobs[0].retention.incomplete_grace_s, 86400);
	assert_int_equal(back.jobs[0].set,
			 (1u << JOB_KEY_QUOTA) | (1u << JOB_KEY_KEEP_LAST) | (1u << JOB_KEY_INCOMPLETE_GRACE));
	assert_int_equal(back.jobs[1].policy, POLICY_SKIP);
	assert_non_null(strstr(text, "\n[job.b]\npolicy = skip\n"));
	assert_null(strstr(text, "manifest_delay_ms = 5"));
}

/* SIGHUP: a restart-only key keeps its running value and is named; the
 * others, and the job sections, take the new one. */
static void test_reload(void **state)
{
	(void)state;
	struct config cur, next;
	char kept[512];
	valid_config(&cur);
	valid_config(&next);
	assert_int_equal(config_reload(&cur, &next, kept, sizeof(kept)), 0);
	assert_string_equal(kept, "");
	next.staging_bytes = 2 * cur.staging_bytes;
	snprintf(next.socket_path, sizeof(next.socket_path), "/tmp/other.sock");
	snprintf(next.storage_opts, sizeof(next.storage_opts), "region=x");
	next.policy = POLICY_SKIP;
	next.log_level = 7;
	next.retention.keep_last = 3;
	next.max_inflight_loads = 9;
	char err[256];
	assert_int_equal(config_set(&next, "job.j.quota", "1G", err, sizeof(err)), 0);
	assert_int_equal(config_reload(&cur, &next, kept, sizeof(kept)), 3);
	assert_non_null(strstr(kept, "[server] socket"));
	assert_non_null(strstr(kept, "[pool] staging_bytes"));
	assert_non_null(strstr(kept, "[storage] options"));
	assert_int_equal(cur.staging_bytes, DEFAULT_STAGING_BYTES);
	assert_string_equal(cur.socket_path, DEFAULT_SOCKET_PATH);
	assert_string_equal(cur.storage_opts, "");
	assert_int_equal(cur.policy, POLICY_SKIP);
	assert_int_equal(cur.log_level, 7);
	assert_int_equal(cur.retention.keep_last, 3);
	assert_int_equal(cur.max_inflight_loads, 9);
	assert_int_equal(cur.njobs, 1);
	assert_int_equal(cur.jobs[0].quota_bytes, 1ull << 30);
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
		cmocka_unit_test(test_example_keys_match_table),
		cmocka_unit_test(test_configmap_keys_in_table),
		cmocka_unit_test(test_inline_comments),
		cmocka_unit_test(test_example_uncommented_loads),
		cmocka_unit_test(test_print_round_trip),
		cmocka_unit_test(test_reload),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
