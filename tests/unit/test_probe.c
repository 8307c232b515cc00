/* The storage probe (daemon/store/probe.c) against an in-memory store that
 * misbehaves on command, as stores do: one that ignores create-only
 * writes (overwriting, or only saying it wrote), one that ignores byte
 * ranges, one whose listing stops after the first page, and one that
 * cannot be reached. Each is caught by its own check, named, with the
 * guarantee it breaks; the others pass; nothing the probe wrote is left. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe.h"

#define MAXOBJ 16

struct fake {
	struct store base;
	bool overwrite_on_create; /* create-only ignored: replaces */
	bool say_created;         /* create-only ignored: says 0, keeps the old bytes */
	bool ignore_range;        /* a ranged GET answered 200 with the whole object */
	bool first_page_only;     /* a listing that stops after one page */
	bool down;                /* every request fails */
	unsigned requests;
	struct {
		char key[320];
		char body[128];
		size_t len;
	} obj[MAXOBJ];
};

static int find(struct fake *f, const char *key)
{
	for (int i = 0; i < MAXOBJ; i++)
		if (f->obj[i].key[0] && strcmp(f->obj[i].key, key) == 0)
			return i;
	return -1;
}

static int put(struct store *s, const char *key, const struct iovec *iov, size_t n, const uint32_t *crcs)
{
	(void)crcs;
	struct fake *f = (struct fake *)s;
	f->requests++;
	if (f->down) {
		store_set_error("PUT %s: connection refused", key);
		return -ECONNREFUSED;
	}
	int i = find(f, key);
	for (int k = 0; i < 0 && k < MAXOBJ; k++)
		if (f->obj[k].key[0] == '\0')
			i = k;
	assert_true(i >= 0 && n == 1 && iov[0].iov_len < sizeof(f->obj[i].body));
	snprintf(f->obj[i].key, sizeof(f->obj[i].key), "%s", key);
	memcpy(f->obj[i].body, iov[0].iov_base, iov[0].iov_len);
	f->obj[i].len = iov[0].iov_len;
	return 0;
}

static int create(struct store *s, const char *key, const struct iovec *iov, size_t n, const uint32_t *crcs)
{
	struct fake *f = (struct fake *)s;
	if (!f->down && find(f, key) >= 0) {
		if (f->say_created) {
			f->requests++;
			return 0;
		}
		if (!f->overwrite_on_create) {
			f->requests++;
			store_set_error("PUT %s: HTTP 412 PreconditionFailed", key);
			return -EEXIST;
		}
	}
	return put(s, key, iov, n, crcs);
}

static int get_range(struct store *s, const char *key, uint64_t off, void *buf, size_t len)
{
	struct fake *f = (struct fake *)s;
	f->requests++;
	int i = find(f, key);
	if (i < 0)
		return -ENOENT;
	if (f->ignore_range && off != 0) {
		store_set_error("GET %s bytes %llu-: HTTP 200 instead of 206", key, (unsigned long long)off);
		return -EIO;
	}
	if (off + len > f->obj[i].len)
		return -ENODATA;
	memcpy(buf, f->obj[i].body + off, len);
	return 0;
}

static int list_entries(struct store *s, const char *prefix, struct store_entry **out, size_t *n)
{
	struct fake *f = (struct fake *)s;
	assert_int_equal(s->list_page, 1); /* the probe pages one name at a time */
	*out = calloc(MAXOBJ, sizeof(**out));
	*n = 0;
	size_t pl = strlen(prefix);
	for (int i = 0; i < MAXOBJ; i++) {
		if (!f->obj[i].key[0] || strncmp(f->obj[i].key, prefix, pl) != 0 || f->obj[i].key[pl] != '/')
			continue;
		f->requests++;
		(*out)[(*n)++].name = strdup(f->obj[i].key + pl + 1);
		if (f->first_page_only)
			break;
	}
	return 0;
}

static int remove_key(struct store *s, const char *key)
{
	struct fake *f = (struct fake *)s;
	f->requests++;
	int i = find(f, key);
	if (i < 0)
		return -ENOENT;
	f->obj[i].key[0] = '\0';
	return 0;
}

static int remove_dir(struct store *s, const char *prefix)
{
	(void)s;
	(void)prefix;
	return 0;
}

static const struct store_ops fake_ops = {
	.put = put,
	.create = create,
	.get_range = get_range,
	.list_entries = list_entries,
	.remove = remove_key,
	.remove_dir = remove_dir,
};

static struct fake *fake_new(void)
{
	struct fake *f = calloc(1, sizeof(*f));
	f->base.ops = &fake_ops;
	f->base.backend = "fake";
	return f;
}

static void assert_nothing_left(struct fake *f)
{
	for (int i = 0; i < MAXOBJ; i++)
		if (f->obj[i].key[0])
			fail_msg("left behind: %s", f->obj[i].key);
	assert_int_equal(f->base.list_page, 0); /* put back */
}

static int run(struct fake *f, unsigned *failed, char *report, size_t len)
{
	int r = store_probe(&f->base, failed, report, len);
	assert_nothing_left(f);
	return r;
}

static void test_a_good_store_passes(void **state)
{
	(void)state;
	struct fake *f = fake_new();
	char report[2048];
	unsigned failed = 99;
	assert_int_equal(run(f, &failed, report, sizeof(report)), 0);
	assert_int_equal(failed, 0);
	assert_non_null(strstr(report, "create-only PUT of an existing object refused"));
	assert_non_null(strstr(report, "a listing one name a page gave all 3 names"));
	assert_true(f->requests <= 16);
	free(f);
}

static void test_ignored_create_only_is_caught(void **state)
{
	(void)state;
	for (int say = 0; say < 2; say++) {
		struct fake *f = fake_new();
		f->overwrite_on_create = !say;
		f->say_created = say;
		char report[2048];
		unsigned failed = 0;
		assert_int_equal(run(f, &failed, report, sizeof(report)), -EPROTO);
		assert_int_equal(failed, PROBE_CREATE_ONLY); /* the other checks still ran, and passed */
		assert_non_null(strstr(report, "FAILED: the store accepted a create-only write"));
		assert_non_null(strstr(report, say ? "left the old bytes" : "replaced it"));
		assert_non_null(strstr(report, "a complete step can be overwritten"));
		assert_non_null(strstr(report, "ranged GET gave its bytes"));
		free(f);
	}
}

static void test_ignored_range_is_caught(void **state)
{
	(void)state;
	struct fake *f = fake_new();
	f->ignore_range = true;
	char report[2048];
	unsigned failed = 0;
	assert_int_equal(run(f, &failed, report, sizeof(report)), -EPROTO);
	assert_int_equal(failed, PROBE_RANGE);
	assert_non_null(strstr(report, "instead of 206"));
	assert_non_null(strstr(report, "restores read the ranges"));
	free(f);
}

static void test_listing_without_pages_is_caught(void **state)
{
	(void)state;
	struct fake *f = fake_new();
	f->first_page_only = true;
	char report[2048];
	unsigned failed = 0;
	assert_int_equal(run(f, &failed, report, sizeof(report)), -EPROTO);
	assert_int_equal(failed, PROBE_LISTING);
	assert_non_null(strstr(report, "gave 1 names"));
	assert_non_null(strstr(report, "would miss steps past the first page"));
	free(f);
}

static void test_store_that_cannot_be_asked(void **state)
{
	(void)state;
	struct fake *f = fake_new();
	f->down = true;
	char report[2048];
	unsigned failed = 0;
	int r = run(f, &failed, report, sizeof(report));
	assert_int_equal(r, -ECONNREFUSED);
	assert_int_equal(failed, 0);
	assert_int_equal(f->requests, 1); /* not asked again to remove what it never wrote */
	assert_non_null(strstr(report, "connection refused"));
	free(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_a_good_store_passes),
		cmocka_unit_test(test_ignored_create_only_is_caught),
		cmocka_unit_test(test_ignored_range_is_caught),
		cmocka_unit_test(test_listing_without_pages_is_caught),
		cmocka_unit_test(test_store_that_cannot_be_asked),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
