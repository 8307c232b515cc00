#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <errno.h>

#include "daemon.h"
#include "save.h"
#include "tensor.h"
#include "testutil.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static void test_box_whole_default(void **state)
{
	(void)state;
	struct box b;
	uint64_t nelem = 0;
	char err[128];
	uint64_t shape[] = { 3, 4, 5 };
	assert_int_equal(box_from_fields(&b, 3, shape, 0, NULL, 0, NULL, &nelem, err, sizeof(err)), 0);
	assert_int_equal(nelem, 60);
	assert_int_equal(b.ndim, 3);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(b.shape[i], shape[i]);
		assert_int_equal(b.off[i], 0);
		assert_int_equal(b.len[i], shape[i]);
	}
	assert_int_equal(box_volume(&b), 60);

	uint64_t off[] = { 1, 0, 2 }, len[] = { 2, 4, 3 };
	assert_int_equal(box_from_fields(&b, 3, shape, 3, off, 3, len, &nelem, err, sizeof(err)), 0);
	assert_int_equal(nelem, 24);
	assert_int_equal(b.off[0], 1);
	assert_int_equal(b.off[2], 2);
	assert_int_equal(b.len[2], 3);

	/* A box may end exactly at the edge, and may be empty there. */
	uint64_t off2[] = { 3, 4, 5 }, len2[] = { 0, 0, 0 };
	assert_int_equal(box_from_fields(&b, 3, shape, 3, off2, 3, len2, &nelem, err, sizeof(err)), 0);
	assert_int_equal(nelem, 0);
}

static void test_box_scalar(void **state)
{
	(void)state;
	struct box b;
	uint64_t nelem = 0;
	char err[128];
	assert_int_equal(box_from_fields(&b, 0, NULL, 0, NULL, 0, NULL, &nelem, err, sizeof(err)), 0);
	assert_int_equal(b.ndim, 0);
	assert_int_equal(nelem, 1);
	assert_int_equal(box_volume(&b), 1);
}

static void test_box_errors(void **state)
{
	(void)state;
	struct box b;
	uint64_t nelem = 99;
	char err[128];
	uint64_t shape[] = { 4, 4 };
	uint64_t off[] = { 0, 0 }, len[] = { 4, 4 };

	err[0] = '\0';
	assert_int_equal(box_from_fields(&b, 2, shape, 2, off, 0, NULL, &nelem, err, sizeof(err)), -EINVAL);
	assert_true(err[0] != '\0');
	assert_int_equal(box_from_fields(&b, 2, shape, 0, NULL, 2, len, &nelem, err, sizeof(err)), -EINVAL);
	assert_int_equal(box_from_fields(&b, 2, shape, 1, off, 1, len, &nelem, err, sizeof(err)), -EINVAL);
	assert_int_equal(box_from_fields(&b, 1, shape, 2, off, 2, len, &nelem, err, sizeof(err)), -EINVAL);

	uint64_t o1[] = { 3, 0 }, l1[] = { 2, 4 }; /* 3 + 2 > 4 */
	assert_int_equal(box_from_fields(&b, 2, shape, 2, o1, 2, l1, &nelem, err, sizeof(err)), -ERANGE);
	uint64_t o2[] = { 0, 5 }, l2[] = { 1, 0 }; /* offset past the end */
	assert_int_equal(box_from_fields(&b, 2, shape, 2, o2, 2, l2, &nelem, err, sizeof(err)), -ERANGE);
	uint64_t o3[] = { UINT64_MAX, 0 }, l3[] = { 2, 1 }; /* off + len wraps */
	assert_int_equal(box_from_fields(&b, 2, shape, 2, o3, 2, l3, &nelem, err, sizeof(err)), -ERANGE);
	uint64_t o4[] = { 1, 0 }, l4[] = { UINT64_MAX, 1 };
	assert_int_equal(box_from_fields(&b, 2, shape, 2, o4, 2, l4, &nelem, err, sizeof(err)), -ERANGE);

	uint64_t nine[9] = { 1, 1, 1, 1, 1, 1, 1, 1, 1 };
	assert_int_equal(box_from_fields(&b, 9, nine, 0, NULL, 0, NULL, &nelem, err, sizeof(err)), -EINVAL);
	assert_int_equal(box_from_fields(&b, 8, nine, 0, NULL, 0, NULL, &nelem, err, sizeof(err)), 0);
	assert_int_equal(nelem, 1);

	nelem = 99;
	uint64_t big[] = { 1ull << 32, 1ull << 32 };
	assert_int_equal(box_from_fields(&b, 2, big, 0, NULL, 0, NULL, &nelem, err, sizeof(err)), -EOVERFLOW);
	uint64_t big3[] = { 1ull << 21, 1ull << 21, 1ull << 22 };
	assert_int_equal(box_from_fields(&b, 3, big3, 0, NULL, 0, NULL, &nelem, err, sizeof(err)), -EOVERFLOW);
	assert_int_equal(nelem, 99); /* untouched on failure */
	uint64_t justfits[] = { 1ull << 31, 1ull << 32 };
	assert_int_equal(box_from_fields(&b, 2, justfits, 0, NULL, 0, NULL, &nelem, err, sizeof(err)), 0);
	assert_int_equal(nelem, 1ull << 63);
}

static void test_validate_name(void **state)
{
	(void)state;
	char err[128];
	assert_int_equal(tensor_validate_name("layer.0.weight", 64, err, sizeof(err)), 0);
	assert_int_equal(tensor_validate_name("optim/state 0:exp_avg", 64, err, sizeof(err)), 0);
	assert_int_equal(tensor_validate_name("gr\xc3\xb6\xc3\x9f" "e", 64, err, sizeof(err)), 0);
	assert_int_equal(tensor_validate_name("x", 1, err, sizeof(err)), 0);

	err[0] = '\0';
	assert_int_equal(tensor_validate_name("", 64, err, sizeof(err)), -EINVAL);
	assert_true(err[0] != '\0');

	char name[1026];
	memset(name, 'a', sizeof(name));
	name[1024] = '\0';
	assert_int_equal(tensor_validate_name(name, 1024, err, sizeof(err)), 0);
	name[1024] = 'a';
	name[1025] = '\0';
	assert_int_equal(tensor_validate_name(name, 1024, err, sizeof(err)), -EINVAL);
	assert_int_equal(tensor_validate_name("ab", 1, err, sizeof(err)), -EINVAL);

	static const char *ctl[] = { "a\tb", "a\nb", "\x01", "end\x1f", "del\x7f", "\x1b[31mred" };
	for (size_t i = 0; i < ARRAY_LEN(ctl); i++)
		assert_int_equal(tensor_validate_name(ctl[i], 64, err, sizeof(err)), -EINVAL);
}

static struct box mkbox(uint32_t nd, const uint64_t *shape, const uint64_t *off, const uint64_t *len)
{
	struct box b;
	uint64_t nelem;
	char err[128];
	assert_int_equal(box_from_fields(&b, nd, shape, nd, off, nd, len, &nelem, err, sizeof(err)), 0);
	return b;
}

static void test_intersect_equal(void **state)
{
	(void)state;
	uint64_t shape[] = { 10, 8 };
	uint64_t oa[] = { 0, 2 }, la[] = { 6, 4 };
	uint64_t ob[] = { 4, 0 }, lb[] = { 6, 5 };
	struct box a = mkbox(2, shape, oa, la), b = mkbox(2, shape, ob, lb), r;
	assert_true(box_intersect(&a, &b, &r));
	assert_int_equal(r.ndim, 2);
	assert_int_equal(r.off[0], 4);
	assert_int_equal(r.len[0], 2);
	assert_int_equal(r.off[1], 2);
	assert_int_equal(r.len[1], 3);
	assert_int_equal(r.shape[0], 10);
	assert_int_equal(box_volume(&r), 6);
	struct box r2;
	assert_true(box_intersect(&b, &a, &r2));
	assert_true(box_equal(&r, &r2));
	assert_true(box_intersect(&a, &a, &r2));
	assert_true(box_equal(&r2, &a));

	/* Touching but not overlapping. */
	uint64_t oc[] = { 6, 2 }, lc[] = { 4, 4 };
	struct box c = mkbox(2, shape, oc, lc);
	assert_false(box_intersect(&a, &c, &r));
	/* Overlap in one dim only. */
	uint64_t od[] = { 0, 6 }, ld[] = { 6, 2 };
	struct box d = mkbox(2, shape, od, ld);
	assert_false(box_intersect(&a, &d, &r));
	/* Different global shapes never intersect. */
	uint64_t shape2[] = { 10, 9 };
	struct box e = mkbox(2, shape2, oa, la);
	assert_false(box_intersect(&a, &e, &r));
	assert_false(box_equal(&a, &e));
	uint64_t shape1[] = { 10 };
	struct box f = mkbox(1, shape1, oa, la);
	assert_false(box_intersect(&a, &f, &r));
	assert_false(box_equal(&a, &f));

	/* Scalars: the whole (single element) box. */
	struct box s1 = mkbox(0, NULL, NULL, NULL), s2 = mkbox(0, NULL, NULL, NULL);
	assert_true(box_intersect(&s1, &s2, &r));
	assert_int_equal(box_volume(&r), 1);
	assert_true(box_equal(&s1, &s2));

	struct box a2 = mkbox(2, shape, oa, la);
	assert_true(box_equal(&a, &a2));
	a2.off[1] = 3;
	assert_false(box_equal(&a, &a2));
	a2.off[1] = 2;
	a2.len[0] = 5;
	assert_false(box_equal(&a, &a2));
}

/* --- box_copy_runs against an element-by-element reference --- */

struct copy_ctx {
	uint8_t *dst;
	const uint8_t *src;
	uint64_t dst_bytes, src_bytes, total, calls;
	int fail_at; /* call number that fails, 0: never */
};

static int emit_copy(void *p, uint64_t dst_off, uint64_t src_off, uint64_t n)
{
	struct copy_ctx *x = p;
	x->calls++;
	if (x->fail_at && x->calls == (uint64_t)x->fail_at)
		return -EIO;
	assert_true(n > 0);
	assert_true(dst_off <= x->dst_bytes && n <= x->dst_bytes - dst_off);
	assert_true(src_off <= x->src_bytes && n <= x->src_bytes - src_off);
	memcpy(x->dst + dst_off, x->src + src_off, n);
	x->total += n;
	return 0;
}

static uint64_t lin(const struct box *b, const uint64_t *c)
{
	uint64_t idx = 0;
	for (uint32_t i = 0; i < b->ndim; i++)
		idx = idx * b->len[i] + (c[i] - b->off[i]);
	return idx;
}

static int inside(const struct box *b, const uint64_t *c)
{
	for (uint32_t i = 0; i < b->ndim; i++)
		if (c[i] < b->off[i] || c[i] >= b->off[i] + b->len[i])
			return 0;
	return 1;
}

/* Naive: for every element of dst, take it from src if src holds it. */
static void ref_copy(const struct box *src, const struct box *dst, size_t elem,
		     const uint8_t *s, uint8_t *d)
{
	uint64_t c[TENSOR_MAX_DIMS];
	uint64_t n = box_volume(dst);
	for (uint64_t k = 0; k < n; k++) {
		uint64_t rem = k;
		for (int i = (int)dst->ndim - 1; i >= 0; i--) {
			c[i] = dst->off[i] + rem % dst->len[i];
			rem /= dst->len[i];
		}
		if (inside(src, c))
			memcpy(d + lin(dst, c) * elem, s + lin(src, c) * elem, elem);
	}
}

static struct box random_box(uint64_t *seed, uint32_t nd, const uint64_t *shape)
{
	uint64_t off[TENSOR_MAX_DIMS], len[TENSOR_MAX_DIMS];
	for (uint32_t i = 0; i < nd; i++) {
		if (tu_below(seed, 3) == 0) { /* often whole, to merge dims */
			off[i] = 0;
			len[i] = shape[i];
		} else {
			off[i] = tu_below(seed, shape[i]);
			len[i] = 1 + tu_below(seed, shape[i] - off[i]);
		}
	}
	return mkbox(nd, shape, off, len);
}

static void test_copy_runs_random(void **state)
{
	(void)state;
	uint64_t seed = 0xC0FFEE;
	static const size_t elems[] = { 1, 2, 4, 8 };
	unsigned intersecting = 0, merged = 0;
	for (int iter = 0; iter < 4000; iter++) {
		uint32_t nd = 1 + (uint32_t)tu_below(&seed, 4);
		uint64_t shape[TENSOR_MAX_DIMS];
		for (uint32_t i = 0; i < nd; i++)
			shape[i] = 1 + tu_below(&seed, nd <= 2 ? 12 : 6);
		size_t elem = elems[tu_below(&seed, ARRAY_LEN(elems))];
		struct box src = random_box(&seed, nd, shape);
		struct box dst = random_box(&seed, nd, shape);
		struct box region;
		if (!box_intersect(&src, &dst, &region))
			continue;
		intersecting++;
		if (nd > 1 && region.len[nd - 1] == src.len[nd - 1] &&
		    region.len[nd - 1] == dst.len[nd - 1])
			merged++;

		size_t sb = box_volume(&src) * elem, db = box_volume(&dst) * elem;
		uint8_t *s = malloc(sb), *d = malloc(db), *want = malloc(db);
		assert_true(s && d && want);
		tu_fill(&seed, s, sb);
		memset(d, 0xA5, db);
		memset(want, 0xA5, db);
		ref_copy(&src, &dst, elem, s, want);

		struct copy_ctx x = { .dst = d, .src = s, .dst_bytes = db, .src_bytes = sb };
		assert_int_equal(box_copy_runs(&region, &src, &dst, elem, emit_copy, &x), 0);
		/* Each region element copied exactly once ... */
		assert_int_equal(x.total, box_volume(&region) * elem);
		/* ... to the right place, and nothing else touched. */
		if (memcmp(d, want, db) != 0)
			fail_msg("iteration %d: nd %u elem %zu: copy differs from reference", iter, nd, elem);
		free(s);
		free(d);
		free(want);
	}
	/* The random boxes did exercise both paths. */
	assert_true(intersecting > 1000);
	assert_true(merged > 100);
}

static void test_copy_runs_merges_whole_rows(void **state)
{
	(void)state;
	/* Region, src and dst all whole in the last two dims: one run per
	 * index of dim 0. */
	uint64_t shape[] = { 6, 3, 5 };
	uint64_t os[] = { 0, 0, 0 }, ls[] = { 4, 3, 5 };
	uint64_t od[] = { 2, 0, 0 }, ld[] = { 4, 3, 5 };
	struct box src = mkbox(3, shape, os, ls), dst = mkbox(3, shape, od, ld), region;
	assert_true(box_intersect(&src, &dst, &region));
	size_t sb = box_volume(&src) * 4, db = box_volume(&dst) * 4;
	uint8_t *s = malloc(sb), *d = calloc(1, db), *want = calloc(1, db);
	assert_true(s && d && want);
	uint64_t seed = 5;
	tu_fill(&seed, s, sb);
	ref_copy(&src, &dst, 4, s, want);
	struct copy_ctx x = { .dst = d, .src = s, .dst_bytes = db, .src_bytes = sb };
	assert_int_equal(box_copy_runs(&region, &src, &dst, 4, emit_copy, &x), 0);
	/* dims 1 and 2 whole everywhere, and dim 0 whole-region too: a
	 * single run of 2*3*5 elements. */
	assert_int_equal(x.calls, 1);
	assert_memory_equal(d, want, db);
	free(s);
	free(d);
	free(want);
}

static void test_copy_runs_scalar_and_error(void **state)
{
	(void)state;
	struct box s = mkbox(0, NULL, NULL, NULL);
	uint8_t src[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, dst[8] = { 0 };
	struct copy_ctx x = { .dst = dst, .src = src, .dst_bytes = 8, .src_bytes = 8 };
	assert_int_equal(box_copy_runs(&s, &s, &s, 8, emit_copy, &x), 0);
	assert_int_equal(x.calls, 1);
	assert_memory_equal(dst, src, 8);

	/* An emit failure stops the walk and is returned. */
	uint64_t shape[] = { 4, 4 };
	uint64_t o[] = { 0, 0 }, l[] = { 4, 2 }, od[] = { 0, 1 }, ld[] = { 4, 3 };
	struct box a = mkbox(2, shape, o, l), b = mkbox(2, shape, od, ld), r;
	assert_true(box_intersect(&a, &b, &r));
	uint8_t sa[32] = { 0 }, db[48] = { 0 };
	struct copy_ctx y = { .dst = db, .src = sa, .dst_bytes = sizeof(db),
			      .src_bytes = sizeof(sa), .fail_at = 2 };
	assert_int_equal(box_copy_runs(&r, &a, &b, 4, emit_copy, &y), -EIO);
	assert_int_equal(y.calls, 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_box_whole_default),
		cmocka_unit_test(test_box_scalar),
		cmocka_unit_test(test_box_errors),
		cmocka_unit_test(test_validate_name),
		cmocka_unit_test(test_intersect_equal),
		cmocka_unit_test(test_copy_runs_random),
		cmocka_unit_test(test_copy_runs_merges_whole_rows),
		cmocka_unit_test(test_copy_runs_scalar_and_error),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
