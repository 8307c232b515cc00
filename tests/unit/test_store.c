/* The scheme table (store.c): which backend serves a URL, its label, the
 * errors that list the table, and the options check main.c asks for. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "objstore.h"
#include "backends.h"
#include "store.h"

static void test_scheme_rows(void **state)
{
	(void)state;
	const struct store_scheme *r = store_scheme_of("file:///tmp/x");
	assert_non_null(r);
	assert_string_equal(r->label, "file");
	assert_null(r->dialect);
	r = store_scheme_of("s3://bucket/p");
	assert_non_null(r);
	assert_string_equal(r->label, "s3");
	assert_ptr_equal(r->dialect, &store_s3_dialect);
	r = store_scheme_of("gs://bucket");
	assert_non_null(r);
	assert_string_equal(r->label, "gcs");
	assert_ptr_equal(r->dialect, &store_gcs_dialect);
	assert_null(store_scheme_of("s3:/bucket"));
	assert_null(store_scheme_of("s3x://bucket"));
	assert_null(store_scheme_of("gs"));
	assert_null(store_scheme_of(""));
}

static void test_unknown_scheme_lists_the_table(void **state)
{
	(void)state;
	struct store *s = NULL;
	char err[512];
	assert_int_equal(store_open("ftp://host/x", &s, err, sizeof(err)), -EPROTONOSUPPORT);
	assert_null(s);
	assert_string_equal(err, "storage URL 'ftp://host/x': unsupported scheme (supported: file:///abs/path, "
				 "s3://bucket/prefix, gs://bucket/prefix)");
}

static void test_options_only_where_taken(void **state)
{
	(void)state;
	char err[512] = "";
	assert_int_equal(store_check_options("file:///tmp/x", "", err, sizeof(err)), 0);
	assert_int_equal(store_check_options("s3://b/p?region=x", "region=x", err, sizeof(err)), 0);
	assert_int_equal(store_check_options("gs://b/p?part_size=8M", "part_size=8M", err, sizeof(err)), 0);
	assert_int_equal(store_check_options("file:///tmp/x?region=x", "region=x", err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "[storage] options (region=x) apply to s3:// and gs:// only");
	assert_int_equal(store_check_options("ftp://h?a=b", "a=b", err, sizeof(err)), -EINVAL);
}

static void test_open_sets_backend_label(void **state)
{
	(void)state;
	char dir[] = "/tmp/ckptd-test-store-XXXXXX", url[64], err[512];
	assert_non_null(mkdtemp(dir));
	snprintf(url, sizeof(url), "file://%s", dir);
	struct store *s = NULL;
	assert_int_equal(store_open(url, &s, err, sizeof(err)), 0);
	assert_string_equal(s->backend, "file");
	store_free(s);
	rmdir(dir);
}

/* URL errors come before any credentials or connection. */
static void test_object_store_url_errors(void **state)
{
	(void)state;
	struct store *s = NULL;
	char err[512];
	assert_int_equal(store_open("gs://Bad_Bucket/p", &s, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "storage URL 'gs://Bad_Bucket/p': bad bucket name 'Bad_Bucket'"));
	assert_int_equal(store_open("s3://bucket/p?bogus=1", &s, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "storage URL option bogus: unknown option (known: endpoint region"));
	assert_int_equal(store_open("s3://bucket/p?part_size=1M", &s, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "storage URL option part_size: part_size must be 5M..5G");
	assert_int_equal(store_open("gs://bucket?endpoint=ftp://x", &s, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "storage URL option endpoint: endpoint must start with http:// or https://");
	assert_null(s);
}

/* --check-config's storage rules (store_check), one by one: each refused
 * with -errno and a message naming the part, with no I/O; good URLs pass. */
static void check_bad(const char *url, const char *opts, int want, const char *says)
{
	char err[1024] = "";
	int r = store_check(url, opts, err, sizeof(err));
	if (r != want || strstr(err, says) == NULL)
		fail_msg("store_check(%s, %s) = %d '%s'; want %d and '%s'", url, opts, r, err, want, says);
}

static void test_check_scheme(void **state)
{
	(void)state;
	check_bad("ftp://x", "", -EPROTONOSUPPORT, "unsupported scheme");
	check_bad("s3:/bucket", "", -EPROTONOSUPPORT, "unsupported scheme");
}

static void test_check_bucket_names(void **state)
{
	(void)state;
	check_bad("s3://Upper/p", "", -EINVAL, "bad bucket name 'Upper'");
	check_bad("gs://under_score", "", -EINVAL, "bad bucket name 'under_score'");
	check_bad("s3://ab", "", -EINVAL, "bad bucket name 'ab'");
	check_bad("s3://-leading", "", -EINVAL, "bad bucket name '-leading'");
	check_bad("s3://trailing-", "", -EINVAL, "bad bucket name 'trailing-'");
	check_bad("s3://two..dots", "", -EINVAL, "bad bucket name 'two..dots'");
	char url[128];
	snprintf(url, sizeof(url), "s3://%064d/p", 0); /* 64 characters, no dot */
	check_bad(url, "", -EINVAL, "bad bucket name");
	char err[256];
	assert_int_equal(store_check("s3://my-bucket.example/p", "", err, sizeof(err)), 0);
	assert_int_equal(store_check("gs://abc", "", err, sizeof(err)), 0);
}

static void test_check_options(void **state)
{
	(void)state;
	check_bad("s3://bucket/p?endpiont=http://x", "endpiont=http://x", -EINVAL, "option endpiont: unknown option");
	check_bad("s3://bucket/p?part_size=1x", "part_size=1x", -EINVAL, "part_size must be 5M..5G");
	check_bad("s3://bucket/p?concurrency=0", "concurrency=0", -EINVAL,
		  "value out of range: concurrency=0 (1..256)");
	check_bad("s3://bucket/p?list_page=1001", "list_page=1001", -EINVAL,
		  "value out of range: list_page=1001 (1..1000)");
	check_bad("s3://bucket/p?payload=md5", "payload=md5", -EINVAL, "payload must be unsigned or sha256");
	check_bad("gs://bucket?endpoint=ftp://x", "endpoint=ftp://x", -EINVAL, "must start with http://");
	check_bad("s3://bucket/p?region", "region", -EINVAL, "option 'region' has no value");
	check_bad("file:///tmp/x?part_size=8M", "part_size=8M", -EINVAL, "s3:// and gs://");
	char err[256];
	assert_int_equal(store_check("s3://bucket/p?endpoint=http://127.0.0.1:9000&region=us-east-1&path_style=1&"
				     "part_size=8M&concurrency=4&payload=sha256",
				     "x", err, sizeof(err)),
			 0);
}

static void test_check_file_paths(void **state)
{
	(void)state;
	check_bad("file://relative/dir", "", -EINVAL, "want file:///absolute/path");
	static char url[8192];
	snprintf(url, sizeof(url), "file:///%05000d", 0);
	char err[256];
	assert_int_equal(store_check(url, "", err, sizeof(err)), -ENAMETOOLONG);
	assert_int_equal(store_check("file:///var/lib/ckptd/checkpoints", "", err, sizeof(err)), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_scheme_rows),
		cmocka_unit_test(test_unknown_scheme_lists_the_table),
		cmocka_unit_test(test_options_only_where_taken),
		cmocka_unit_test(test_open_sets_backend_label),
		cmocka_unit_test(test_object_store_url_errors),
		cmocka_unit_test(test_check_scheme),
		cmocka_unit_test(test_check_bucket_names),
		cmocka_unit_test(test_check_options),
		cmocka_unit_test(test_check_file_paths),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
