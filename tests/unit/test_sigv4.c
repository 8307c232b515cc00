/* SigV4 against AWS's documented examples. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <errno.h>

#include "sigv4.h"

#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* AWS SigV4 test suite, "get-vanilla". */
static void test_get_vanilla(void **state)
{
	(void)state;
	struct sigv4_header h[] = { { "Host", "example.amazonaws.com" }, { "X-Amz-Date", "20150830T123600Z" } };
	struct sigv4_request rq = { .method = "GET", .path = "/", .headers = h, .nheaders = 2,
				    .payload_sha256 = EMPTY_SHA256, .amz_date = "20150830T123600Z",
				    .region = "us-east-1", .service = "service", .double_encode_path = 1 };
	char auth[512];
	assert_int_equal(sigv4_authorization(&rq, "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", auth,
					     sizeof(auth)), 0);
	assert_string_equal(auth, "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
				  "SignedHeaders=host;x-amz-date, "
				  "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
}

/* The S3 developer guide's "GET object" example (Range header). */
static void test_s3_get_object(void **state)
{
	(void)state;
	struct sigv4_header h[] = {
		{ "Host", "examplebucket.s3.amazonaws.com" },
		{ "Range", "bytes=0-9" },
		{ "x-amz-content-sha256", EMPTY_SHA256 },
		{ "x-amz-date", "20130524T000000Z" },
	};
	struct sigv4_request rq = { .method = "GET", .path = "/test.txt", .headers = h, .nheaders = 4,
				    .payload_sha256 = EMPTY_SHA256, .amz_date = "20130524T000000Z",
				    .region = "us-east-1", .service = "s3" };
	char *cr = NULL;
	assert_int_equal(sigv4_canonical_request(&rq, &cr), 0);
	assert_string_equal(cr, "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
				"x-amz-content-sha256:" EMPTY_SHA256 "\nx-amz-date:20130524T000000Z\n\n"
				"host;range;x-amz-content-sha256;x-amz-date\n" EMPTY_SHA256);
	free(cr);
	char auth[512];
	assert_int_equal(sigv4_authorization(&rq, "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
					     auth, sizeof(auth)), 0);
	assert_non_null(strstr(auth, "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"));
}

/* Query strings: sorted, encoded, valueless keys get "=" (?uploads). */
static void test_canonical_query_and_path(void **state)
{
	(void)state;
	struct sigv4_header h[] = { { "host", "b.s3.amazonaws.com" }, { "x-amz-date", "20130524T000000Z" } };
	struct sigv4_header q[] = { { "uploads", NULL }, { "prefix", "a/b c&d=e" }, { "max", "2" } };
	struct sigv4_request rq = { .method = "POST", .path = "/my key/a+b=c", .query = q, .nquery = 3,
				    .headers = h, .nheaders = 2, .payload_sha256 = "UNSIGNED-PAYLOAD",
				    .amz_date = "20130524T000000Z", .region = "us-east-1", .service = "s3" };
	char *cr = NULL;
	assert_int_equal(sigv4_canonical_request(&rq, &cr), 0);
	assert_non_null(strstr(cr, "POST\n/my%20key/a%2Bb%3Dc\nmax=2&prefix=a%2Fb%20c%26d%3De&uploads=\n"));
	free(cr);
	char enc[64];
	assert_int_equal(sigv4_uri_encode("a b/~", 1, enc, sizeof(enc)), 7);
	assert_string_equal(enc, "a%20b/~");
	assert_int_equal(sigv4_uri_encode("a b/~", 0, enc, sizeof(enc)), 9);
	assert_string_equal(enc, "a%20b%2F~");
	assert_int_equal(sigv4_uri_encode("abcdef", 0, enc, 4), -ENAMETOOLONG);
}

/* Header values are trimmed and inner spaces folded; names lower-cased. */
static void test_header_normalisation(void **state)
{
	(void)state;
	struct sigv4_header h[] = { { "My-Header", "  a   b  c " }, { "Host", "h" }, { "x-amz-date", "20130524T000000Z" } };
	struct sigv4_request rq = { .method = "PUT", .path = "/", .headers = h, .nheaders = 3,
				    .payload_sha256 = "UNSIGNED-PAYLOAD", .amz_date = "20130524T000000Z",
				    .region = "r", .service = "s3" };
	char *cr = NULL;
	assert_int_equal(sigv4_canonical_request(&rq, &cr), 0);
	assert_non_null(strstr(cr, "host:h\nmy-header:a b c\nx-amz-date:20130524T000000Z\n\nhost;my-header;x-amz-date\n"));
	free(cr);
	/* Bad requests are refused. */
	char auth[512];
	rq.path = "no-slash";
	assert_int_equal(sigv4_authorization(&rq, "k", "s", auth, sizeof(auth)), -EINVAL);
	rq.path = "/";
	rq.amz_date = "2013";
	assert_int_equal(sigv4_authorization(&rq, "k", "s", auth, sizeof(auth)), -EINVAL);
	rq.amz_date = "20130524T000000Z";
	assert_int_equal(sigv4_authorization(&rq, "k", "s", auth, 10), -ENAMETOOLONG);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_get_vanilla),
		cmocka_unit_test(test_s3_get_object),
		cmocka_unit_test(test_canonical_query_and_path),
		cmocka_unit_test(test_header_normalisation),
	};
	return cmocka_run_group_tests_name("sigv4", tests, NULL, NULL);
}
