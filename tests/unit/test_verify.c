/* verify.c on file://: a shard checked against its manifest, the chunk
 * and tensor crcs from one pass, and what verify says of a shard that is
 * damaged, short or missing, and of a manifest whose tensors overlap. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <sys/uio.h>

#include "crc32c.h"
#include "manifest.h"
#include "manifest_util.h"
#include "store.h"
#include "storefix.h"
#include "testutil.h"
#include "verify.h"

/* A rank's manifest (manifest_util.h: "w" at 0, 48 bytes; "b" at 4096, 12
 * bytes; two chunks of 4096) and its shard's bytes, the crcs true. */
struct shard {
	struct tm_manifest tm;
	uint8_t bytes[TM_SHARD_BYTES];
	char key[768];
};

static void make(struct shard *sh)
{
	tm_init(&sh->tm, "j", 7, 0, 1, "a");
	uint64_t seed = 42;
	tu_fill(&seed, sh->bytes, sizeof(sh->bytes));
	Ckpt__Manifest *m = &sh->tm.m;
	for (size_t i = 0; i < m->n_tensors; i++)
		m->tensors[i]->crc32c = crc32c_update(0, sh->bytes + m->tensors[i]->shard_offset,
						      m->tensors[i]->nbytes);
	for (size_t c = 0; c < m->n_chunk_crc32c; c++)
		m->chunk_crc32c[c] = crc32c_update(0, sh->bytes + c * TM_CHUNK_BYTES, TM_CHUNK_BYTES);
	assert_int_equal(manifest_shard_of(m, sh->key, sizeof(sh->key)), 0);
}

static void store(struct store_fixture *f, struct shard *sh, size_t len)
{
	struct iovec iov = { .iov_base = sh->bytes, .iov_len = len };
	assert_int_equal(f->s->ops->put(f->s, sh->key, &iov, 1, NULL), 0);
}

/* Verify sh's manifest against what f holds; the problems joined by '|'. */
static bool check(struct store_fixture *f, struct shard *sh, uint64_t *checked, char *said, size_t cap)
{
	struct verify v;
	assert_int_equal(verify_init(&v, f->s), 0);
	verify_shard(&v, &sh->tm.m);
	said[0] = '\0';
	for (size_t i = 0; i < v.nproblems; i++)
		snprintf(said + strlen(said), cap - strlen(said), "%s%s", i ? "|" : "", v.problems[i]);
	bool ok = v.ok;
	*checked = v.bytes_checked;
	verify_free(&v);
	return ok;
}

static void test_a_true_shard_passes(void **state)
{
	struct store_fixture *f = *state;
	struct shard sh;
	make(&sh);
	store(f, &sh, sizeof(sh.bytes));
	uint64_t n;
	char said[4096];
	assert_true(check(f, &sh, &n, said, sizeof(said)));
	assert_string_equal(said, "");
	assert_int_equal(n, TM_SHARD_BYTES);
}

/* A flipped byte inside a tensor fails that tensor and its chunk, and
 * nothing else; one between tensors fails its chunk only. */
static void test_a_flipped_byte_names_its_tensor_and_chunk(void **state)
{
	struct store_fixture *f = *state;
	struct shard sh;
	make(&sh);
	sh.bytes[4100] ^= 1; /* in "b", chunk 1 */
	store(f, &sh, sizeof(sh.bytes));
	uint64_t n;
	char said[4096];
	assert_false(check(f, &sh, &n, said, sizeof(said)));
	assert_non_null(strstr(said, "tensor 'b' crc32c mismatch"));
	assert_non_null(strstr(said, "chunk 1 crc32c mismatch"));
	const char *bar = strchr(said, '|');
	assert_non_null(bar);
	assert_null(strchr(bar + 1, '|')); /* two problems */
	assert_int_equal(n, TM_SHARD_BYTES);

	make(&sh);
	sh.bytes[1000] ^= 0x80; /* past "w", in chunk 0 */
	store(f, &sh, sizeof(sh.bytes));
	assert_false(check(f, &sh, &n, said, sizeof(said)));
	assert_ptr_equal(strstr(said, "rank 0: chunk 0 crc32c mismatch: manifest "), said);
	assert_null(strchr(said, '|')); /* the chunk only */
}

static void test_a_short_or_missing_shard_is_a_problem(void **state)
{
	struct store_fixture *f = *state;
	struct shard sh;
	make(&sh);
	uint64_t n;
	char said[4096];
	assert_false(check(f, &sh, &n, said, sizeof(said)));
	assert_non_null(strstr(said, sh.key));
	assert_int_equal(n, 0);
	store(f, &sh, TM_SHARD_BYTES / 2);
	assert_false(check(f, &sh, &n, said, sizeof(said)));
	assert_non_null(strstr(said, "the shard is shorter than its manifest says"));
	assert_int_equal(n, 0);
}

/* What a manifest says is checked before the bytes: tensors that overlap,
 * an empty tensor with a crc. */
static void test_overlapping_tensors_are_a_problem(void **state)
{
	struct store_fixture *f = *state;
	struct shard sh;
	make(&sh);
	store(f, &sh, sizeof(sh.bytes));
	sh.tm.t[1].shard_offset = 40; /* into "w" */
	uint64_t n;
	char said[4096];
	assert_false(check(f, &sh, &n, said, sizeof(said)));
	assert_non_null(strstr(said, "tensors 'w' and 'b' overlap in the shard"));

	make(&sh);
	sh.tm.t[1].nbytes = 0; /* empty, with a crc */
	assert_false(check(f, &sh, &n, said, sizeof(said)));
	assert_non_null(strstr(said, "tensor 'b' is empty but has crc32c"));
}

/* A shard of more than one read (VERIFY_BLOCK), chunks of 1 MiB: tensor
 * "w" spans many chunks and the block boundary, so its crc is folded from
 * many segments, and the second block is checked where it lies. */
static void test_a_shard_of_several_blocks(void **state)
{
	struct store_fixture *f = *state;
	const uint64_t cb = 1u << 20, n = VERIFY_BLOCK + 3 * 4096 + 100;
	struct shard *sh = calloc(1, sizeof(*sh));
	uint8_t *bytes = malloc(n);
	uint32_t crcs[17];
	assert_non_null(sh);
	assert_non_null(bytes);
	uint64_t seed = 7;
	tu_fill(&seed, bytes, n);
	tm_init(&sh->tm, "j", 9, 0, 1, "a");
	Ckpt__Manifest *m = &sh->tm.m;
	m->shard_bytes = n;
	m->chunk_bytes = cb;
	m->n_chunk_crc32c = (n + cb - 1) / cb;
	assert_int_equal(m->n_chunk_crc32c, 17);
	m->chunk_crc32c = crcs;
	sh->tm.t[0].shard_offset = 100;
	sh->tm.t[0].nbytes = VERIFY_BLOCK;
	sh->tm.t[1].shard_offset = VERIFY_BLOCK + 200;
	sh->tm.t[1].nbytes = 5000;
	assert_int_equal(manifest_shard_of(m, sh->key, sizeof(sh->key)), 0);
	for (int bad = 0; bad < 2; bad++) {
		for (size_t i = 0; i < 2; i++)
			sh->tm.t[i].crc32c = crc32c_update(0, bytes + sh->tm.t[i].shard_offset, sh->tm.t[i].nbytes);
		for (uint64_t c = 0; c < m->n_chunk_crc32c; c++)
			crcs[c] = crc32c_update(0, bytes + c * cb, (c + 1) * cb <= n ? cb : n - c * cb);
		if (bad)
			bytes[VERIFY_BLOCK + 50] ^= 4; /* in "w", chunk 16, the second block */
		struct iovec iov = { .iov_base = bytes, .iov_len = n };
		assert_int_equal(f->s->ops->put(f->s, sh->key, &iov, 1, NULL), 0);
		uint64_t checked;
		char said[4096];
		bool ok = check(f, sh, &checked, said, sizeof(said));
		assert_int_equal(checked, n);
		if (!bad) {
			assert_true(ok);
			assert_string_equal(said, "");
			continue;
		}
		assert_false(ok);
		assert_non_null(strstr(said, "tensor 'w' crc32c mismatch"));
		assert_non_null(strstr(said, "chunk 16 crc32c mismatch"));
		assert_null(strstr(said, "tensor 'b'"));
	}
	free(bytes);
	free(sh);
}

/* verify keeps the first VERIFY_MAX_PROBLEMS lines, and is not ok. */
static void test_problems_are_capped(void **state)
{
	struct store_fixture *f = *state;
	struct verify v;
	assert_int_equal(verify_init(&v, f->s), 0);
	assert_true(v.ok);
	for (int i = 0; i < VERIFY_MAX_PROBLEMS + 50; i++)
		verify_problem(&v, "problem %d", i);
	assert_false(v.ok);
	assert_int_equal(v.nproblems, VERIFY_MAX_PROBLEMS);
	assert_string_equal(v.problems[VERIFY_MAX_PROBLEMS - 1], "problem 99");
	verify_free(&v);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, sf_setup, sf_teardown)
	const struct CMUnitTest tests[] = {
		T(test_a_true_shard_passes),
		T(test_a_flipped_byte_names_its_tensor_and_chunk),
		T(test_a_short_or_missing_shard_is_a_problem),
		T(test_overlapping_tensors_are_a_problem),
		T(test_a_shard_of_several_blocks),
		T(test_problems_are_capped),
	};
#undef T
	return cmocka_run_group_tests(tests, NULL, NULL);
}
