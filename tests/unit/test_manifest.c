#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <errno.h>

#include "manifest.h"
#include "manifest_util.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static void test_key_format(void **state)
{
	(void)state;
	char buf[256];
	assert_int_equal(manifest_key(buf, sizeof(buf), "job", 123, 3, 8, "manifest"), 0);
	assert_string_equal(buf, "job/step-000000000123/rank-00003-of-00008.manifest");
	assert_int_equal(manifest_key(buf, sizeof(buf), "job", 123, 3, 8, "shard"), 0);
	assert_string_equal(buf, "job/step-000000000123/rank-00003-of-00008.shard");
	assert_int_equal(manifest_step_dir(buf, sizeof(buf), "job", 123), 0);
	assert_string_equal(buf, "job/step-000000000123");
	assert_int_equal(manifest_step_dir(buf, sizeof(buf), "my-job.v2", 0), 0);
	assert_string_equal(buf, "my-job.v2/step-000000000000");

	/* Exactly fitting, and one byte short. */
	const char *want = "job/step-000000000123/rank-00003-of-00008.manifest";
	size_t n = strlen(want);
	assert_int_equal(manifest_key(buf, n + 1, "job", 123, 3, 8, "manifest"), 0);
	assert_string_equal(buf, want);
	assert_int_equal(manifest_key(buf, n, "job", 123, 3, 8, "manifest"), -ENAMETOOLONG);
	assert_int_equal(manifest_step_dir(buf, 21, "job", 123), -ENAMETOOLONG);
	assert_int_equal(manifest_step_dir(buf, 22, "job", 123), 0);

	/* References between steps: outside the step directories. */
	assert_int_equal(manifest_refs_dir(buf, sizeof(buf), "job", 12), 0);
	assert_string_equal(buf, "job/refs/step-000000000012");
	assert_int_equal(manifest_ref_key(buf, sizeof(buf), "job", 12, 3, 5, 8, "run.7"), 0);
	assert_string_equal(buf, "job/refs/step-000000000012/step-000000000003/rank-00005-of-00008.run.7");
	assert_int_equal(manifest_ref_key(buf, 40, "job", 12, 3, 5, 8, "run.7"), -ENAMETOOLONG);
	assert_int_equal(manifest_refs_dir(buf, 26, "job", 12), -ENAMETOOLONG);
}

static void test_parse_step_dir(void **state)
{
	(void)state;
	uint64_t step = 0;
	assert_int_equal(manifest_parse_step_dir("step-000000000123", &step), 0);
	assert_int_equal(step, 123);
	assert_int_equal(manifest_parse_step_dir("step-000000000000", &step), 0);
	assert_int_equal(step, 0);
	assert_int_equal(manifest_parse_step_dir("step-999999999999", &step), 0);
	assert_int_equal(step, 999999999999ull);
	/* Steps past 12 digits keep their natural width. */
	assert_int_equal(manifest_parse_step_dir("step-12345678901234567890", &step), 0);
	assert_int_equal(step, 12345678901234567890ull);

	/* What manifest_step_dir writes parses back. */
	char dir[64];
	assert_int_equal(manifest_step_dir(dir, sizeof(dir), "j", 4242), 0);
	assert_int_equal(manifest_parse_step_dir(strchr(dir, '/') + 1, &step), 0);
	assert_int_equal(step, 4242);

	static const char *bad[] = {
		"", "step-", "step-123", "step-00000000012", "step-000000000012a",
		"step-00000000012a", "stepp000000000123", "Step-000000000123",
		"step-+00000000012", "step--00000000012", "step- 00000000012",
		"step-000000000000000000001", "x/step-000000000123",
		"step-000000000123.tmp",
	};
	for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
		step = 77;
		if (manifest_parse_step_dir(bad[i], &step) == 0)
			fail_msg("accepted step dir \"%s\"", bad[i]);
	}
}

/* A format 1 manifest name, as manifest_parse_object reads it: 0 or -EINVAL. */
static int manifest_parse_name(const char *name, uint32_t *rank, uint32_t *world_size)
{
	struct step_name sn;
	manifest_parse_object(name, &sn);
	if (sn.kind != OBJ_MANIFEST || sn.attempt[0])
		return -EINVAL;
	*rank = sn.rank;
	*world_size = sn.world_size;
	return 0;
}

static void test_parse_name(void **state)
{
	(void)state;
	uint32_t rank = 99, ws = 99;
	assert_int_equal(manifest_parse_name("rank-00003-of-00008.manifest", &rank, &ws), 0);
	assert_int_equal(rank, 3);
	assert_int_equal(ws, 8);
	assert_int_equal(manifest_parse_name("rank-00000-of-00001.manifest", &rank, &ws), 0);
	assert_int_equal(rank, 0);
	assert_int_equal(ws, 1);
	assert_int_equal(manifest_parse_name("rank-99998-of-99999.manifest", &rank, &ws), 0);
	assert_int_equal(rank, 99998);
	assert_int_equal(ws, 99999);

	static const char *bad[] = {
		"", "rank-0003-of-00008.manifest", "rank-000003-of-00008.manifest",
		"rank-00003-of-0008.manifest", "rank-00003-of-000008.manifest",
		"rank-00008-of-00008.manifest", "rank-00009-of-00008.manifest",
		"rank-00000-of-00000.manifest", "rank-00003-of-00008.shard",
		"rank-00003-of-00008.manifest.tmp.1.2", "rank-00003-of-00008.manifesx",
		"rank-0000a-of-00008.manifest", "rank-00003-of-0000b.manifest",
		"rank-00003_of-00008.manifest", "Rank-00003-of-00008.manifest",
		"rank--0003-of-00008.manifest", "rank-00003-of--0008.manifest",
		"rank-00003-of-00008manifest.",
	};
	for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
		if (manifest_parse_name(bad[i], &rank, &ws) == 0)
			fail_msg("accepted manifest name \"%s\"", bad[i]);
	}
}

/* Format 2 names: what a LIST of a step directory is parsed into. */
static void test_parse_object(void **state)
{
	(void)state;
	char key[512];
	struct step_name sn;
	assert_int_equal(manifest_key_attempt(key, sizeof(key), "j", 3, 2, 8, "run.7-x_1"), 0);
	assert_string_equal(key, "j/step-000000000003/rank-00002-of-00008.run.7-x_1.manifest");
	manifest_parse_object(strrchr(key, '/') + 1, &sn);
	assert_int_equal(sn.kind, OBJ_MANIFEST);
	assert_int_equal(sn.rank, 2);
	assert_int_equal(sn.world_size, 8);
	assert_string_equal(sn.attempt, "run.7-x_1");
	assert_int_equal(manifest_shard_key(key, sizeof(key), "j", 3, 2, 8, "run.7", 0x1f, false), 0);
	assert_string_equal(key, "j/step-000000000003/rank-00002-of-00008.run.7.000000000000001f.shard");
	assert_int_equal(manifest_shard_key(key, sizeof(key), "j", 3, 258, 300, "run.7", 0x1f, true), 0);
	assert_string_equal(key, "j/shards/02/step-000000000003/rank-00258-of-00300.run.7.000000000000001f.shard");
	manifest_parse_object(strrchr(key, '/') + 1, &sn);
	assert_int_equal(sn.kind, OBJ_SHARD);
	assert_int_equal(sn.rank, 258);
	assert_int_equal(manifest_shard_key(key, sizeof(key), "j", 3, 2, 8, "run.7", 0x1f, false), 0);
	manifest_parse_object(strrchr(key, '/') + 1, &sn);
	assert_int_equal(sn.kind, OBJ_SHARD);
	assert_string_equal(sn.attempt, "run.7");
	/* An attempt named like a suffix is still an attempt. */
	manifest_parse_object("rank-00000-of-00001.manifest.manifest", &sn);
	assert_int_equal(sn.kind, OBJ_MANIFEST);
	assert_string_equal(sn.attempt, "manifest");
	/* Format 1 names: no attempt. */
	manifest_parse_object("rank-00003-of-00008.manifest", &sn);
	assert_int_equal(sn.kind, OBJ_MANIFEST);
	assert_string_equal(sn.attempt, "");
	manifest_parse_object("rank-00003-of-00008.shard", &sn);
	assert_int_equal(sn.kind, OBJ_SHARD);
	assert_int_equal(manifest_commit_key(key, sizeof(key), "j", 3), 0);
	assert_string_equal(key, "j/step-000000000003/commit");
	manifest_parse_object("commit", &sn);
	assert_int_equal(sn.kind, OBJ_COMMIT);
	assert_int_equal(manifest_index_key(key, sizeof(key), "j", 3), 0);
	assert_string_equal(key, "j/step-000000000003/index");
	manifest_parse_object("index", &sn);
	assert_int_equal(sn.kind, OBJ_INDEX);
	static const char *other[] = {
		"", "commit.tmp.h.1.2", "index.tmp.h.1.2", "indexx", "rank-00003-of-00008..manifest", "rank-00003-of-00008.a b.manifest",
		"rank-00003-of-00008..a.manifest", "rank-00008-of-00008.a.manifest",
		"rank-00003-of-00008.a.manifest.tmp.host.1.2", "rank-00003-of-00008.a.shard",
		"rank-00003-of-00008.a.000000000000001F.shard", "rank-00003-of-00008.000000000000001f.shard",
		"rank-00003-of-00008.a.00000000000001f.shard", "rank-00003-of-00008a.manifest",
	};
	for (size_t i = 0; i < ARRAY_LEN(other); i++) {
		manifest_parse_object(other[i], &sn);
		if (sn.kind != OBJ_OTHER)
			fail_msg("took \"%s\" for a step object (kind %d)", other[i], sn.kind);
	}
}

static void test_name_valid(void **state)
{
	(void)state;
	assert_true(manifest_name_valid("job", 128));
	assert_true(manifest_name_valid("llama-70B_run.3", 128));
	assert_true(manifest_name_valid("a", 1));
	char name[131];
	memset(name, 'x', sizeof(name));
	name[128] = '\0';
	assert_true(manifest_name_valid(name, 128));
	name[128] = 'x';
	name[129] = '\0';
	assert_false(manifest_name_valid(name, 128));

	static const char *bad[] = { "", ".hidden", ".", "..", "a..b", "x..", "a/b", "a b", "a\nb",
				     "caf\xc3\xa9", "a:b", "a*", "$HOME" };
	for (size_t i = 0; i < ARRAY_LEN(bad); i++)
		if (manifest_name_valid(bad[i], 128))
			fail_msg("accepted name \"%s\"", bad[i]);
}

static void test_round_trip(void **state)
{
	(void)state;
	struct tm_manifest x;
	tm_init(&x, "job", 123, 1, 2, "attempt-7");
	size_t len;
	uint8_t *buf = tm_pack(&x.m, &len);
	assert_non_null(buf);
	Ckpt__Manifest *m = NULL;
	char err[256] = "";
	assert_int_equal(manifest_decode(buf, len, &m, err, sizeof(err)), 0);
	assert_non_null(m);
	assert_int_equal(m->format_version, 1);
	assert_string_equal(m->job, "job");
	assert_int_equal(m->step, 123);
	assert_int_equal(m->rank, 1);
	assert_int_equal(m->world_size, 2);
	assert_string_equal(m->attempt_id, "attempt-7");
	assert_int_equal(m->created_unix_ns, x.m.created_unix_ns);
	assert_string_equal(m->shard_name, "rank-00001-of-00002.shard");
	assert_int_equal(m->shard_bytes, TM_SHARD_BYTES);
	assert_int_equal(m->chunk_bytes, TM_CHUNK_BYTES);
	assert_int_equal(m->n_chunk_crc32c, 2);
	assert_int_equal(m->chunk_crc32c[0], x.crcs[0]);
	assert_int_equal(m->chunk_crc32c[1], x.crcs[1]);
	assert_int_equal(m->extra_state.len, 5);
	assert_memory_equal(m->extra_state.data, "rng42", 5);
	assert_int_equal(m->n_tensors, 2);
	for (size_t i = 0; i < 2; i++) {
		const Ckpt__ManifestTensor *a = m->tensors[i], *b = &x.t[i];
		assert_string_equal(a->name, b->name);
		assert_int_equal(a->dtype, b->dtype);
		assert_int_equal(a->n_global_shape, b->n_global_shape);
		assert_memory_equal(a->global_shape, b->global_shape, b->n_global_shape * 8);
		assert_int_equal(a->n_box_offsets, b->n_box_offsets);
		assert_int_equal(a->n_box_lengths, b->n_box_lengths);
		if (b->n_box_offsets) {
			assert_memory_equal(a->box_offsets, b->box_offsets, b->n_box_offsets * 8);
			assert_memory_equal(a->box_lengths, b->box_lengths, b->n_box_lengths * 8);
		}
		assert_int_equal(a->shard_offset, b->shard_offset);
		assert_int_equal(a->nbytes, b->nbytes);
		assert_int_equal(a->crc32c, b->crc32c);
	}
	ckpt__manifest__free_unpacked(m, NULL);
	free(buf);
}

/* One way to break a valid manifest. */
typedef void (*breaker)(struct tm_manifest *x);

static void b_version(struct tm_manifest *x) { x->m.format_version = 2; }
static void b_version0(struct tm_manifest *x) { x->m.format_version = 0; }
static void b_rank(struct tm_manifest *x) { x->m.rank = 2; x->m.world_size = 2; }
static void b_world0(struct tm_manifest *x) { x->m.rank = 0; x->m.world_size = 0; }
static void b_job(struct tm_manifest *x) { x->m.job = "../etc"; }
static void b_job_empty(struct tm_manifest *x) { x->m.job = ""; }
static void b_attempt(struct tm_manifest *x) { x->m.attempt_id = ""; }
static void b_chunk0(struct tm_manifest *x) { x->m.chunk_bytes = 0; }
static void b_crc_few(struct tm_manifest *x) { x->m.n_chunk_crc32c = 1; }
static void b_crc_ragged(struct tm_manifest *x) { x->m.shard_bytes = TM_SHARD_BYTES + 1; }
static void b_past_shard(struct tm_manifest *x) { x->t[1].shard_offset = TM_SHARD_BYTES - 8; }
static void b_offset_huge(struct tm_manifest *x) { x->t[1].shard_offset = UINT64_MAX - 4; }
static void b_nbytes(struct tm_manifest *x) { x->t[0].nbytes = 47; }
static void b_nbytes_whole(struct tm_manifest *x) { x->t[1].nbytes = 24; }
static void b_dtype(struct tm_manifest *x) { x->t[1].dtype = (Ckpt__DType)13; }
static void b_dtype0(struct tm_manifest *x) { x->t[0].dtype = CKPT__DTYPE__DTYPE_UNSPECIFIED; }
static void b_name(struct tm_manifest *x) { x->t[0].name = ""; }
static void b_box(struct tm_manifest *x) { x->off0[0] = 3; }
static void b_box_count(struct tm_manifest *x) { x->t[0].n_box_lengths = 1; }
static void b_dup_name(struct tm_manifest *x) { x->t[1].name = x->t[0].name; }
static void b_overlap(struct tm_manifest *x) { x->t[1].shard_offset = x->t[0].shard_offset + 1; }
static void b_shard_other_rank(struct tm_manifest *x)
{
	snprintf(x->shard, sizeof(x->shard), "rank-00001-of-00002.a.0000000000000001.shard");
}
static void b_shard_other_attempt(struct tm_manifest *x)
{
	snprintf(x->shard, sizeof(x->shard), "rank-00000-of-00002.b.0000000000000001.shard");
}
static void b_spread_format1(struct tm_manifest *x) { x->m.shard_dir = "shards/00/step-000000000005"; }
static void b_spread_up(struct tm_manifest *x)
{
	snprintf(x->shard, sizeof(x->shard), "rank-00000-of-00002.a.0000000000000001.shard");
	x->m.shard_dir = "../../other/step-000000000005";
}
static void b_spread_rank(struct tm_manifest *x)
{
	snprintf(x->shard, sizeof(x->shard), "rank-00000-of-00002.a.0000000000000001.shard");
	x->m.shard_dir = "shards/01/step-000000000005";
}
static void b_spread_step(struct tm_manifest *x)
{
	snprintf(x->shard, sizeof(x->shard), "rank-00000-of-00002.a.0000000000000001.shard");
	x->m.shard_dir = "shards/00/step-000000000004";
}

static void test_check_rejects(void **state)
{
	(void)state;
	static const struct { const char *what; breaker fn; } cases[] = {
		{ "format version 2", b_version },
		{ "format version 0", b_version0 },
		{ "rank >= world", b_rank },
		{ "world 0", b_world0 },
		{ "job with a slash", b_job },
		{ "empty job", b_job_empty },
		{ "empty attempt", b_attempt },
		{ "chunk_bytes 0", b_chunk0 },
		{ "too few chunk crcs", b_crc_few },
		{ "shard needs one more chunk", b_crc_ragged },
		{ "tensor past the shard", b_past_shard },
		{ "tensor offset wraps", b_offset_huge },
		{ "nbytes != box * dtype", b_nbytes },
		{ "nbytes of whole tensor wrong", b_nbytes_whole },
		{ "unknown dtype", b_dtype },
		{ "unspecified dtype", b_dtype0 },
		{ "empty tensor name", b_name },
		{ "box leaves the shape", b_box },
		{ "box count mismatch", b_box_count },
		{ "tensor name twice", b_dup_name },
		{ "tensors overlap in the shard", b_overlap },
		{ "shard of another rank", b_shard_other_rank },
		{ "shard of another attempt", b_shard_other_attempt },
		{ "spread shard with a format 1 name", b_spread_format1 },
		{ "spread directory outside the job's shards", b_spread_up },
		{ "spread directory of another rank", b_spread_rank },
		{ "spread directory of another step", b_spread_step },
	};
	struct tm_manifest x;
	char err[256];
	tm_init(&x, "job", 5, 0, 2, "a");
	assert_int_equal(manifest_check(&x.m, err, sizeof(err)), 0);
	for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
		tm_init(&x, "job", 5, 0, 2, "a");
		cases[i].fn(&x);
		err[0] = '\0';
		int r = manifest_check(&x.m, err, sizeof(err));
		if (r != -EBADMSG)
			fail_msg("%s: manifest_check = %d, want -EBADMSG", cases[i].what, r);
		if (err[0] == '\0')
			fail_msg("%s: no reason given", cases[i].what);

		/* The same through the bytes: decode refuses it. */
		size_t len;
		uint8_t *buf = tm_pack(&x.m, &len);
		assert_non_null(buf);
		Ckpt__Manifest *m = NULL;
		r = manifest_decode(buf, len, &m, err, sizeof(err));
		if (r != -EBADMSG || m != NULL)
			fail_msg("%s: manifest_decode = %d", cases[i].what, r);
		free(buf);
	}
	/* The spread directory of the manifest's own rank and step is fine. */
	tm_init(&x, "job", 5, 0, 2, "a");
	snprintf(x.shard, sizeof(x.shard), "rank-00000-of-00002.a.0000000000000001.shard");
	x.m.shard_dir = "shards/00/step-000000000005";
	assert_int_equal(manifest_check(&x.m, err, sizeof(err)), 0);
	char key[256];
	assert_int_equal(manifest_shard_of(&x.m, key, sizeof(key)), 0);
	assert_string_equal(key, "job/shards/00/step-000000000005/rank-00000-of-00002.a.0000000000000001.shard");
	/* A shard that ends exactly at its last tensor is fine. */
	tm_init(&x, "job", 5, 0, 2, "a");
	x.m.shard_bytes = 4096 + 12;
	assert_int_equal(manifest_check(&x.m, err, sizeof(err)), 0);
}

static void test_decode_garbage(void **state)
{
	(void)state;
	Ckpt__Manifest *m = NULL;
	char err[256] = "";
	static const uint8_t g1[] = { 0x12, 0x40, 'j', 'o', 'b' }; /* job claims 64 bytes */
	assert_int_equal(manifest_decode(g1, sizeof(g1), &m, err, sizeof(err)), -EBADMSG);
	assert_null(m);
	assert_true(err[0] != '\0');
	static const uint8_t g2[] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };
	assert_int_equal(manifest_decode(g2, sizeof(g2), &m, err, sizeof(err)), -EBADMSG);
	/* Empty input parses (all defaults) but fails the checks. */
	assert_int_equal(manifest_decode("", 0, &m, err, sizeof(err)), -EBADMSG);
	assert_null(m);

	/* A truncated valid manifest. */
	struct tm_manifest x;
	tm_init(&x, "job", 1, 0, 1, "a");
	size_t len;
	uint8_t *buf = tm_pack(&x.m, &len);
	assert_non_null(buf);
	assert_int_equal(manifest_decode(buf, len - 3, &m, err, sizeof(err)), -EBADMSG);
	assert_null(m);
	free(buf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_key_format),
		cmocka_unit_test(test_parse_step_dir),
		cmocka_unit_test(test_parse_name),
		cmocka_unit_test(test_parse_object),
		cmocka_unit_test(test_name_valid),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_check_rejects),
		cmocka_unit_test(test_decode_garbage),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
