/* A shard's pieces: how a save cuts them (compress_cut), what a manifest's
 * pieces may say (pieces_check), the raw-to-stored map (pieces_span) and
 * the decode of pieces back to raw bytes, damaged ones included. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "backends.h"
#include "catalog.h"
#include "compress.h"
#include "manifest.h"
#include "store.h"
#include "macro.h"
#include "pieces.h"
#include "planecodec.h"
#include "saveobj.h"
#include "testutil.h"

#define MIB (1ull << 20)

static struct save_tensor tensor(int dtype, uint64_t off, uint64_t rows, uint64_t cols)
{
	struct save_tensor t;
	memset(&t, 0, sizeof(t));
	t.dtype = dtype;
	t.box.ndim = 2;
	t.box.shape[0] = t.box.len[0] = rows;
	t.box.shape[1] = t.box.len[1] = cols;
	t.shard_off = off;
	t.nbytes = rows * cols * tensor_dtype_size(dtype);
	return t;
}

/* Small tensors share a piece per element size; a large one is cut in
 * units of whole rows; a row larger than a piece is cut every 4 MiB; a
 * run stops at 4 MiB; padding joins the piece before it; the pieces tile
 * the shard. */
static void test_cut(void **state)
{
	(void)state;
	struct save_tensor t[10];
	uint64_t off = 0;
	t[0] = tensor(CKPT__DTYPE__F32, off, 1, 256); /* 1 KiB */
	off += 1024;
	t[1] = tensor(CKPT__DTYPE__F32, off, 1, 250); /* 1000 B, padded to 1024 */
	off += 1024;
	t[2] = tensor(CKPT__DTYPE__BF16, off, 4, 100); /* 800 B: a new piece (elem 2) */
	off += 832;
	/* 3000 rows of 4 KiB: units of 1024 rows (4 MiB), the last 952 rows */
	t[3] = tensor(CKPT__DTYPE__F32, off, 3000, 1024);
	off += t[3].nbytes;
	/* 2 rows of 6,000,000 B: each row as 4 MiB + the rest */
	t[4] = tensor(CKPT__DTYPE__BF16, off, 2, 3000000);
	off += t[4].nbytes;
	/* five small i8 tensors of 900 KiB: the fifth passes 4 MiB, a new run */
	for (int i = 5; i < 10; i++) {
		t[i] = tensor(CKPT__DTYPE__I8, off, 900, 1024);
		off += t[i].nbytes;
	}
	off += 40; /* and 40 bytes of tail */
	struct piece_cut *c = NULL;
	size_t n = 0;
	assert_int_equal(compress_cut(t, 10, off, PIECE_BYTES, &c, &n), 0);
	uint64_t a = t[3].shard_off, b = t[4].shard_off, e = t[5].shard_off;
	const struct piece_cut want[] = {
		{ 2048, 4 },
		{ a, 2 },
		{ a + 1024 * 4096, 4 },
		{ a + 2048 * 4096, 4 },
		{ b, 4 }, /* 952 rows */
		{ b + 4 * MIB, 2 },
		{ b + 6000000, 2 },
		{ b + 6000000 + 4 * MIB, 2 },
		{ b + 12000000, 2 },
		{ e + 4 * 921600, 1 },
		{ off, 1 },
	};
	assert_int_equal(n, ELEMENTSOF(want));
	for (size_t i = 0; i < n; i++) {
		assert_int_equal(c[i].end, want[i].end);
		assert_int_equal(c[i].elem, want[i].elem);
	}
	free(c);
	/* Any order in, the same pieces out. */
	struct save_tensor r[10];
	for (int i = 0; i < 10; i++)
		r[i] = t[9 - i];
	assert_int_equal(compress_cut(r, 10, off, PIECE_BYTES, &c, &n), 0);
	assert_int_equal(n, ELEMENTSOF(want));
	for (size_t i = 0; i < n; i++)
		assert_int_equal(c[i].end, want[i].end);
	free(c);
	/* Nothing but padding, and an empty shard. */
	assert_int_equal(compress_cut(NULL, 0, 100, PIECE_BYTES, &c, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(c[0].end, 100);
	free(c);
	assert_int_equal(compress_cut(NULL, 0, 0, PIECE_BYTES, &c, &n), 0);
	assert_int_equal(n, 0);
	free(c);
}

/* A smaller piece size ([pool] piece_bytes): an embedding table of
 * 2 KiB rows in units of 32 rows, so that a changed row costs 64 KiB. */
static void test_cut_small_pieces(void **state)
{
	(void)state;
	struct save_tensor t[2];
	t[0] = tensor(CKPT__DTYPE__F32, 0, 1000, 512); /* 2,048,000 B: 31 units of 32 rows + 8 rows */
	t[1] = tensor(CKPT__DTYPE__F32, t[0].nbytes, 1, 100);
	struct piece_cut *c = NULL;
	size_t n = 0;
	assert_int_equal(compress_cut(t, 2, t[0].nbytes + 400, 64 << 10, &c, &n), 0);
	assert_int_equal(n, 33);
	for (size_t i = 0; i < 31; i++)
		assert_int_equal(c[i].end, (i + 1) * 32 * 2048);
	assert_int_equal(c[31].end, t[0].nbytes);
	assert_int_equal(c[32].end, t[0].nbytes + 400);
	free(c);
}

/* The unit the loader reads by matches the cut (pieces.h). */
static void test_unit(void **state)
{
	(void)state;
	assert_int_equal(piece_unit(4096, PIECE_BYTES), 4 * MIB);
	assert_int_equal(piece_unit(3072, PIECE_BYTES), 1365 * 3072);
	assert_int_equal(piece_unit(6000000, PIECE_BYTES), 6000000);
	assert_int_equal(piece_unit(0, PIECE_BYTES), PIECE_BYTES);
	assert_int_equal(piece_unit(2048, 64 << 10), 64 << 10);
	assert_int_equal(piece_unit(3000, 64 << 10), 21 * 3000);
}

static Ckpt__ManifestPiece P[4];
static Ckpt__ManifestPiece *PP[4];

static void manifest_with(Ckpt__Manifest *m, size_t n, uint64_t shard_bytes)
{
	ckpt__manifest__init(m);
	m->format_version = n ? MANIFEST_FORMAT_PIECES : 1;
	m->shard_bytes = shard_bytes;
	for (size_t i = 0; i < 4; i++)
		PP[i] = &P[i];
	m->n_pieces = n;
	m->pieces = PP;
}

static void piece(size_t i, uint64_t raw, uint64_t stored, int codec, uint32_t elem)
{
	ckpt__manifest_piece__init(&P[i]);
	P[i].raw_bytes = raw;
	P[i].stored_bytes = stored;
	P[i].codec = (Ckpt__Codec)codec;
	P[i].elem = elem;
}

static void check_fails(const Ckpt__Manifest *m, const char *needle)
{
	char err[256] = "";
	assert_int_equal(pieces_check(m, err, sizeof(err)), -EBADMSG);
	if (strstr(err, needle) == NULL)
		fail_msg("'%s' lacks '%s'", err, needle);
}

static void test_check(void **state)
{
	(void)state;
	Ckpt__Manifest m;
	char err[256];
	piece(0, 1000, 1000, CKPT__CODEC__CODEC_NONE, 0);
	piece(1, 4000, 900, CKPT__CODEC__CODEC_PLANES_ZSTD, 4);
	manifest_with(&m, 2, 5000);
	assert_int_equal(pieces_check(&m, err, sizeof(err)), 0);
	manifest_with(&m, 0, 5000);
	assert_int_equal(pieces_check(&m, err, sizeof(err)), 0); /* format 1, raw */
	m.format_version = MANIFEST_FORMAT_PIECES;
	check_fails(&m, "format version 2 with 0 pieces");
	manifest_with(&m, 2, 5000);
	m.format_version = 1;
	check_fails(&m, "format version 1 with 2 pieces");
	manifest_with(&m, 2, 5001);
	check_fails(&m, "hold 5000 of the shard's 5001");
	manifest_with(&m, 2, 4999);
	check_fails(&m, "piece 1");
	piece(0, 1000, 999, CKPT__CODEC__CODEC_NONE, 0); /* raw, but shorter */
	manifest_with(&m, 2, 5000);
	check_fails(&m, "piece 0");
	piece(0, 0, 0, CKPT__CODEC__CODEC_NONE, 0); /* empty */
	check_fails(&m, "piece 0");
	piece(0, 1000, 1000, 7, 0); /* unknown codec */
	check_fails(&m, "codec 7");
	piece(0, 1000, 1000, CKPT__CODEC__CODEC_NONE, 0);
	piece(1, 4000, 900, CKPT__CODEC__CODEC_PLANES_ZSTD, 3);
	check_fails(&m, "elem 3");
	piece(1, 4000, PLANECODEC_HDR(4) - 1, CKPT__CODEC__CODEC_PLANES_ZSTD, 4);
	check_fails(&m, "piece 1");
	piece(1, 4000, planecodec_bound(4000) + 1, CKPT__CODEC__CODEC_PLANES_ZSTD, 4);
	check_fails(&m, "piece 1");
	/* A piece past the most a reader allocates. */
	piece(0, PIECE_MAX_BYTES + 1, PIECE_MAX_BYTES + 1, CKPT__CODEC__CODEC_NONE, 0);
	manifest_with(&m, 1, PIECE_MAX_BYTES + 1);
	check_fails(&m, "piece 0");
	/* References: to an older shard of the same rank and world size. */
	piece(0, 1000, 1000, CKPT__CODEC__CODEC_NONE, 0);
	piece(1, 4000, 900, CKPT__CODEC__CODEC_PLANES_ZSTD, 4);
	manifest_with(&m, 2, 5000);
	m.step = 9;
	m.rank = 3;
	m.world_size = 8;
	char *refs[2] = { "step-000000000007/rank-00003-of-00008.a.0123456789abcdef.shard",
			  "shards/03/step-000000000002/rank-00003-of-00008.b.00000000000000ff.shard" };
	m.refs = refs;
	m.n_refs = 2;
	P[1].ref = 2;
	P[1].ref_offset = 77;
	assert_int_equal(pieces_check(&m, err, sizeof(err)), 0);
	struct pieces x;
	assert_int_equal(pieces_index(&x, &m), 0);
	assert_string_equal(x.ref[1], refs[1]);
	assert_int_equal(x.at[1], 77);
	assert_null(x.ref[0]);
	assert_int_equal(pieces_segment(&x, 0, 2), 1);
	char key[256];
	m.job = "j";
	x.job = "j";
	assert_int_equal(pieces_key(&x, 1, "own", key, sizeof(key)), 0);
	assert_string_equal(key, "j/shards/03/step-000000000002/rank-00003-of-00008.b.00000000000000ff.shard");
	pieces_free(&x);
	P[1].ref = 3; /* no such */
	check_fails(&m, "piece 1");
	P[1].ref = 1;
	P[1].hash.len = 5;
	check_fails(&m, "hash of 5 bytes");
	P[1].hash.len = 0;
	const char *bad[] = {
		"step-000000000009/rank-00003-of-00008.a.0123456789abcdef.shard",           /* not older */
		"step-000000000007/rank-00004-of-00008.a.0123456789abcdef.shard",           /* another rank */
		"step-000000000007/rank-00003-of-00016.a.0123456789abcdef.shard",           /* another world */
		"step-000000000007/rank-00003-of-00008.shard",                              /* format 1 name */
		"shards/04/step-000000000002/rank-00003-of-00008.b.00000000000000ff.shard", /* wrong spread */
		"step-000000000007/../rank-00003-of-00008.a.0123456789abcdef.shard",
		"x/step-000000000007/rank-00003-of-00008.a.0123456789abcdef.shard",
		"rank-00003-of-00008.a.0123456789abcdef.shard",
	};
	for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
		refs[0] = (char *)bad[i];
		check_fails(&m, "reference 1");
	}
	refs[0] = "step-000000000007/rank-00003-of-00008.a.0123456789abcdef.shard";
	m.piece_bytes = 5000; /* not a multiple of 4 KiB */
	check_fails(&m, "piece_bytes");
}

static void test_span(void **state)
{
	(void)state;
	Ckpt__Manifest m;
	piece(0, 100, 100, CKPT__CODEC__CODEC_NONE, 0);
	piece(1, 200, 50, CKPT__CODEC__CODEC_PLANES_ZSTD, 2);
	piece(2, 300, 300, CKPT__CODEC__CODEC_NONE, 0);
	manifest_with(&m, 3, 600);
	struct pieces x;
	assert_int_equal(pieces_index(&x, &m), 0);
	assert_int_equal(x.n, 3);
	assert_int_equal(x.at[1], 100);
	assert_int_equal(x.cum[1], 100);
	assert_int_equal(x.at[2], 150);
	assert_int_equal(x.cum[3], 450);
	assert_int_equal(pieces_segment(&x, 0, 3), 3);
	size_t p0, p1;
	pieces_span(&x, 0, 1, &p0, &p1);
	assert_int_equal(p0, 0);
	assert_int_equal(p1, 1);
	pieces_span(&x, 99, 2, &p0, &p1);
	assert_int_equal(p0, 0);
	assert_int_equal(p1, 2);
	pieces_span(&x, 100, 200, &p0, &p1);
	assert_int_equal(p0, 1);
	assert_int_equal(p1, 2);
	pieces_span(&x, 150, 450, &p0, &p1);
	assert_int_equal(p0, 1);
	assert_int_equal(p1, 3);
	pieces_span(&x, 599, 1, &p0, &p1);
	assert_int_equal(p0, 2);
	assert_int_equal(p1, 3);
	pieces_free(&x);
	manifest_with(&m, 0, 600);
	assert_int_equal(pieces_index(&x, &m), 0);
	assert_int_equal(x.n, 0);
	pieces_free(&x);
}

/* A raw piece and a coded one back to their bytes; a damaged coded piece
 * is -EBADMSG naming it. */
static void test_decode(void **state)
{
	(void)state;
	enum {
		N = 64 << 10
	};
	uint8_t *raw = malloc(2 * N), *obj = malloc(N + planecodec_bound(N)), *out = malloc(2 * N);
	uint64_t s = 7;
	for (size_t i = 0; i < N; i++)
		raw[i] = (uint8_t)tu_rand(&s);
	for (size_t i = N; i < 2 * N; i += 2) { /* bf16-like: a few exponents */
		raw[i] = (uint8_t)tu_rand(&s);
		raw[i + 1] = (uint8_t)(0x3c + tu_rand(&s) % 3);
	}
	struct planecodec c;
	assert_int_equal(planecodec_init(&c, 0), 0);
	memcpy(obj, raw, N);
	ssize_t k = planecodec_encode(&c, raw + N, N, 2, obj + N, planecodec_bound(N));
	assert_true(k > 0 && k < N);
	Ckpt__Manifest m;
	piece(0, N, N, CKPT__CODEC__CODEC_NONE, 0);
	piece(1, N, (uint64_t)k, CKPT__CODEC__CODEC_PLANES_ZSTD, 2);
	manifest_with(&m, 2, 2 * N);
	char err[256], why[300];
	assert_int_equal(pieces_check(&m, err, sizeof(err)), 0);
	struct pieces x;
	assert_int_equal(pieces_index(&x, &m), 0);
	assert_int_equal(pieces_decode(&x, &c, 0, 2, obj, out, why, sizeof(why)), 0);
	assert_memory_equal(out, raw, 2 * N);
	memset(out, 0, 2 * N);
	assert_int_equal(pieces_decode(&x, &c, 1, 2, obj + N, out, why, sizeof(why)), 0);
	assert_memory_equal(out, raw + N, N);
	obj[N + 9] ^= 1; /* the blob's raw length */
	assert_int_equal(pieces_decode(&x, &c, 0, 2, obj, out, why, sizeof(why)), -EBADMSG);
	assert_non_null(strstr(why, "piece 1"));
	assert_non_null(strstr(why, "does not decode"));
	pieces_free(&x);
	planecodec_free(&c);
	free(raw);
	free(obj);
	free(out);
}

static int sh(const char *fmt, const char *dir)
{
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), fmt, dir, dir, dir, dir);
	return system(cmd);
}

/* A removal that finds, once the manifests are gone, that a step refers
 * to this one (a save in flight, its refs written): -EBUSY, its shard
 * kept, with the spread layout's too, and a marker naming the manifests
 * taken; once the ref is gone, the next removal takes the rest, the
 * spread directory included. */
static void test_removal_stopped_for_a_ref(void **state)
{
	(void)state;
	char dir[64] = "/tmp/ckptd-kept-XXXXXX", url[128], err[256];
	assert_non_null(mkdtemp(dir));
	snprintf(url, sizeof(url), "file://%s", dir);
	struct store *s = NULL;
	assert_int_equal(store_open(url, &s, err, sizeof(err)), 0);
	assert_int_equal(sh("mkdir -p %s/j/step-000000000001 %s/j/shards/00/step-000000000001 "
			    "%s/j/refs/step-000000000002/step-000000000001 && cd %s/j && "
			    "echo m > step-000000000001/rank-00000-of-00001.a.manifest && "
			    "echo c > step-000000000001/commit && "
			    "echo s > shards/00/step-000000000001/rank-00000-of-00001.a.00000000000000aa.shard && "
			    "touch refs/step-000000000002/step-000000000001/rank-00000-of-00001.a && "
			    "touch -d '-10 seconds' step-000000000001/* shards/00/step-000000000001/*",
			    dir),
			 0);
	assert_int_equal(catalog_delete_step(s, NULL, "j", 1, CATALOG_REMOVE, 0), -EBUSY);
	assert_non_null(strstr(store_error(-EBUSY), "step 2 refers to"));
	char p[256];
	snprintf(p, sizeof(p), "%s/j/step-000000000001/rank-00000-of-00001.a.manifest", dir);
	assert_int_equal(access(p, F_OK), -1); /* the manifest went first */
	snprintf(p, sizeof(p), "%s/j/shards/00/step-000000000001/rank-00000-of-00001.a.00000000000000aa.shard", dir);
	assert_int_equal(access(p, F_OK), 0); /* the shard stays */
	assert_true(catalog_step_kept(s, "j", 1));
	/* Still referred to: stopped again. */
	assert_int_equal(catalog_delete_step(s, NULL, "j", 1, CATALOG_REMOVE, 0), -EBUSY);
	assert_int_equal(access(p, F_OK), 0);
	assert_int_equal(sh("rm -r %s/j/refs/step-000000000002", dir), 0);
	assert_int_equal(catalog_delete_step(s, NULL, "j", 1, CATALOG_REMOVE, 0), 0);
	assert_int_equal(access(p, F_OK), -1); /* the spread shard too */
	snprintf(p, sizeof(p), "%s/j/step-000000000001", dir);
	assert_int_equal(access(p, F_OK), -1);
	store_free(s);
	assert_int_equal(sh("rm -rf %s", dir), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cut),    cmocka_unit_test(test_cut_small_pieces),
		cmocka_unit_test(test_unit),   cmocka_unit_test(test_check),
		cmocka_unit_test(test_span),   cmocka_unit_test(test_removal_stopped_for_a_ref),
		cmocka_unit_test(test_decode),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
