/* The replica ring (daemon/peer/ring.h): sorted, unique names; a node's
 * successors wrap around and never include itself; a replacement node
 * with the same name gets the same successors whatever the list's order
 * or duplicates; bad names are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "ring.h"

static void test_successors_wrap_and_skip_self(void **state)
{
	(void)state;
	struct ring r;
	assert_int_equal(ring_build(&r, "b:1", "c:1, a:1,b:1 ,d:1", NULL, 0), 0);
	assert_int_equal(r.n, 4);
	assert_string_equal(r.names[0], "a:1");
	assert_string_equal(r.names[3], "d:1");
	const char *out[8];
	assert_int_equal(ring_successors(&r, "b:1", 2, out, 8), 2);
	assert_string_equal(out[0], "c:1");
	assert_string_equal(out[1], "d:1");
	assert_int_equal(ring_successors(&r, "d:1", 2, out, 8), 2);
	assert_string_equal(out[0], "a:1");
	assert_string_equal(out[1], "b:1");
	/* K larger than the ring: every other node once, never itself. */
	assert_int_equal(ring_successors(&r, "a:1", 9, out, 8), 3);
	for (int i = 0; i < 3; i++)
		assert_string_not_equal(out[i], "a:1");
	/* Not in the ring: none. */
	assert_int_equal(ring_successors(&r, "z:1", 1, out, 8), 0);
	ring_free(&r);
}

static void test_same_name_same_place(void **state)
{
	(void)state;
	struct ring a, b;
	const char *dns[] = { "10.0.0.7:7070", "10.0.0.5:7070" };
	assert_int_equal(ring_build(&a, "10.0.0.6:7070", "10.0.0.5:7070,10.0.0.6:7070,10.0.0.7:7070", NULL, 0), 0);
	assert_int_equal(ring_build(&b, "10.0.0.6:7070", "", dns, 2), 0);
	const char *x[2], *y[2];
	assert_int_equal(ring_successors(&a, "10.0.0.6:7070", 1, x, 2), 1);
	assert_int_equal(ring_successors(&b, "10.0.0.6:7070", 1, y, 2), 1);
	assert_string_equal(x[0], "10.0.0.7:7070");
	assert_string_equal(y[0], "10.0.0.7:7070");
	ring_free(&a);
	ring_free(&b);
}

static void test_alone_and_bad_names(void **state)
{
	(void)state;
	struct ring r;
	const char *out[2];
	assert_int_equal(ring_build(&r, "me:1", NULL, NULL, 0), 0);
	assert_int_equal(ring_successors(&r, "me:1", 1, out, 2), 0);
	ring_free(&r);
	char longname[300];
	memset(longname, 'x', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	assert_int_equal(ring_build(&r, "me:1", longname, NULL, 0), -EINVAL);
	assert_int_equal(ring_build(&r, "", "a:1", NULL, 0), -EINVAL);
	assert_int_equal(ring_build(&r, " \t", "a:1", NULL, 0), -EINVAL);
	assert_null(r.names);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_successors_wrap_and_skip_self),
		cmocka_unit_test(test_same_name_same_place),
		cmocka_unit_test(test_alone_and_bad_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
