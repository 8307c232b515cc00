/* Compression on upload (docs/format.md "Pieces"), end to end through a
 * real ckptd on file://: a save of trained-like weights is stored in
 * pieces, smaller than its raw bytes; restores from storage are bit-exact,
 * whole and resharded (rows, columns, a row cut in several pieces);
 * verify passes; a damaged compressed piece and a damaged raw piece each
 * fail the load and verify loudly; a save may turn compression on or off
 * against the daemon's setting; coded pieces stay within their memory
 * budget. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.pb-c.h"
#include "ckpt/ckpt.h"
#include "harness.h"

#define JOB "cz"
#define NT 7

static struct dctx D;

static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* A weight as training leaves it: about normal (a sum of four uniforms),
 * small. */
static float normal(uint64_t *s)
{
	double x = 0;
	for (int i = 0; i < 4; i++)
		x += (double)(rng_next(s) >> 11) / 9007199254740992.0;
	return (float)(0.02 * (x - 2.0) * 1.7320508);
}

static uint16_t bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	return (uint16_t)(x >> 16);
}

/* The tensors, packed in one buffer in this order (small ones first). */
static const uint64_t LN_SHAPE[1] = { 1024 }, NOISE_SHAPE[1] = { 100000 }, COUNT_SHAPE[1] = { 1 },
		      W32_SHAPE[2] = { 1024, 1024 }, W16_SHAPE[2] = { 2048, 1536 }, EMB_SHAPE[1] = { 600000 },
		      WIDE_SHAPE[2] = { 2, 3000000 };
static const struct {
	const char *name;
	int dtype;
	uint32_t ndim;
	const uint64_t *shape;
	size_t es;
} T[NT] = {
	{ "ln", CKPT_F32, 1, LN_SHAPE, 4 },       { "noise", CKPT_U8, 1, NOISE_SHAPE, 1 },
	{ "count", CKPT_I64, 1, COUNT_SHAPE, 8 }, { "w32", CKPT_F32, 2, W32_SHAPE, 4 },
	{ "w16", CKPT_BF16, 2, W16_SHAPE, 2 },    { "emb", CKPT_F32, 1, EMB_SHAPE, 4 },
	{ "wide", CKPT_BF16, 2, WIDE_SHAPE, 2 },
};

static uint64_t nbytes(int i)
{
	uint64_t n = T[i].es;
	for (uint32_t k = 0; k < T[i].ndim; k++)
		n *= T[i].shape[k];
	return n;
}

static uint64_t offset(int i)
{
	uint64_t o = 0;
	for (int k = 0; k < i; k++)
		o += (nbytes(k) + 63) & ~63ull;
	return o;
}

/* Every tensor's bytes for step, the whole of them, at p. */
static void fill(uint8_t *p, uint64_t step)
{
	uint64_t s = step * 1000;
	float *ln = (float *)(p + offset(0));
	for (int i = 0; i < 1024; i++)
		ln[i] = 1.0f;
	uint8_t *noise = p + offset(1);
	for (uint64_t i = 0; i < nbytes(1); i++)
		noise[i] = (uint8_t)rng_next(&s);
	*(int64_t *)(p + offset(2)) = (int64_t)step;
	float *w32 = (float *)(p + offset(3));
	for (uint64_t i = 0; i < nbytes(3) / 4; i++)
		w32[i] = normal(&s);
	uint16_t *w16 = (uint16_t *)(p + offset(4));
	for (uint64_t i = 0; i < nbytes(4) / 2; i++)
		w16[i] = bf16(normal(&s));
	float *emb = (float *)(p + offset(5));
	for (uint64_t i = 0; i < nbytes(5) / 4; i++)
		emb[i] = normal(&s);
	uint16_t *wide = (uint16_t *)(p + offset(6));
	for (uint64_t i = 0; i < nbytes(6) / 2; i++)
		wide[i] = bf16(normal(&s));
}

static ckpt_client *connect_rank(uint32_t rank, uint32_t world)
{
	ckpt_hello h = { .job = JOB, .rank = rank, .world_size = world, .attempt_id = "a" };
	ckpt_client *c = NULL;
	int r = ckpt_connect(D.sock, &h, &c);
	if (r < 0)
		fail_msg("connect: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	return c;
}

/* The NT tensors, in b at their offsets. */
static void tensors(ckpt_tensor *t, ckpt_buffer *b)
{
	for (int i = 0; i < NT; i++)
		t[i] = (ckpt_tensor){ .name = T[i].name,
				      .dtype = T[i].dtype,
				      .ndim = T[i].ndim,
				      .global_shape = T[i].shape,
				      .buffer = b,
				      .offset = offset(i),
				      .nbytes = nbytes(i) };
}

static uint8_t *expect; /* fill(., 1), the saved bytes */
static size_t total;

/* Save step as rank 0 of 1 with compress (ckpt_compress); wait durable. */
static void save_step(uint64_t step, int compress)
{
	ckpt_client *c = connect_rank(0, 1);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, total, &b), 0);
	fill(ckpt_buffer_data(b), step);
	ckpt_tensor t[NT];
	tensors(t, b);
	ckpt_save_opts o = { .compress = compress };
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save_ex(c, step, t, NT, NULL, 0, &o, &f), 0);
	int r = ckpt_future_wait(f, CKPT_DURABLE, 60000);
	if (r != 0)
		fail_msg("durable: %s: %s", ckpt_strerror(r), ckpt_future_message(f));
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);
}

static void step_dir(uint64_t step, char *out, size_t cap)
{
	snprintf(out, cap, "%s/" JOB "/step-%012llu", D.store, (unsigned long long)step);
}

static Ckpt__Manifest *read_manifest(uint64_t step)
{
	char dir[600];
	step_dir(step, dir, sizeof(dir));
	return h_rank_manifest(dir);
}

static uint64_t shard_size(uint64_t step)
{
	char dir[600];
	step_dir(step, dir, sizeof(dir));
	return h_rank_shard_size(dir);
}

static int group_setup(void **state)
{
	(void)state;
	for (int i = 0; i < NT; i++)
		total = offset(i) + nbytes(i);
	expect = malloc(total);
	fill(expect, 1);
	h_init(&D);
	/* Restores come from storage: no memory tier. */
	h_start(&D, "compress = true\nmemory_tier = false\n");
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	h_cleanup(&D);
	free(expect);
	return 0;
}

/* The manifest has pieces of both kinds, format 2, and the object is the
 * pieces' stored bytes: smaller than the raw shard. */
static void test_stored_in_pieces(void **state)
{
	(void)state;
	save_step(1, CKPT_BY_JOB);
	Ckpt__Manifest *m = read_manifest(1);
	assert_int_equal(m->format_version, 2);
	assert_true(m->n_pieces >= 8);
	uint64_t raw = 0, stored = 0;
	size_t coded = 0, plain = 0;
	for (size_t i = 0; i < m->n_pieces; i++) {
		raw += m->pieces[i]->raw_bytes;
		stored += m->pieces[i]->stored_bytes;
		assert_true(m->pieces[i]->raw_bytes <= (4u << 20) + 64);
		if (m->pieces[i]->codec == CKPT__CODEC__CODEC_PLANES_ZSTD)
			coded++;
		else
			plain++;
	}
	assert_int_equal(raw, m->shard_bytes);
	assert_int_equal(stored, shard_size(1));
	assert_true(coded >= 6); /* the weights */
	assert_true(plain >= 1); /* the noise */
	/* bf16 and f32 weights of a normal law: a tenth smaller at least. */
	assert_true(stored * 10 < m->shard_bytes * 9);
	/* The metrics count both. */
	assert_int_equal(h_metric(&D, "ckptd_bytes_uploaded_total"), m->shard_bytes);
	assert_int_equal(h_metric(&D, "ckptd_bytes_stored_total"), stored);
	ckpt__manifest__free_unpacked(m, NULL);
}

/* Load tensors t[0..n) and compare each with expect (bytes at want[i]). */
static void load_expect(uint32_t rank, uint32_t world, ckpt_tensor *t, size_t n, uint8_t *const *want, int status,
			const char *needle)
{
	ckpt_client *c = connect_rank(rank, world);
	ckpt_buffer *b = NULL;
	uint64_t sz = 0;
	for (size_t i = 0; i < n; i++)
		sz = t[i].offset + t[i].nbytes > sz ? t[i].offset + t[i].nbytes : sz;
	assert_int_equal(ckpt_buffer_alloc(c, sz, &b), 0);
	memset(ckpt_buffer_data(b), 0xEE, sz);
	for (size_t i = 0; i < n; i++)
		t[i].buffer = b;
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_load(c, 1, t, n, &f), 0);
	int r = ckpt_future_wait(f, CKPT_LOADED, 60000);
	if (r != status)
		fail_msg("load: %d, want %d: %s", r, status, ckpt_future_message(f));
	if (needle && strstr(ckpt_future_message(f), needle) == NULL)
		fail_msg("load message '%s' lacks '%s'", ckpt_future_message(f), needle);
	for (size_t i = 0; i < n && status == 0; i++)
		if (memcmp((uint8_t *)ckpt_buffer_data(b) + t[i].offset, want[i], t[i].nbytes) != 0)
			fail_msg("tensor '%s' differs", t[i].name);
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);
}

/* The whole step, as saved. */
static void test_restore_whole(void **state)
{
	(void)state;
	ckpt_tensor t[NT];
	uint8_t *want[NT];
	for (int i = 0; i < NT; i++) {
		t[i] = (ckpt_tensor){ .name = T[i].name,
				      .dtype = T[i].dtype,
				      .ndim = T[i].ndim,
				      .global_shape = T[i].shape,
				      .offset = offset(i),
				      .nbytes = nbytes(i) };
		want[i] = expect + offset(i);
	}
	load_expect(0, 1, t, NT, want, 0, NULL);
}

/* Resharded: rank 1 of 2 takes the second half of w32's rows, columns
 * [100, 900) of w16, the middle of emb and of wide's second row (a row
 * stored in several pieces). */
static void test_restore_resharded(void **state)
{
	(void)state;
	static uint64_t o0[2] = { 512, 0 }, l0[2] = { 512, 1024 };
	static uint64_t o1[2] = { 0, 100 }, l1[2] = { 2048, 800 };
	static uint64_t o2[1] = { 150000 }, l2[1] = { 300000 };
	static uint64_t o3[2] = { 1, 1000000 }, l3[2] = { 1, 1500000 };
	uint64_t n0 = 512 * 1024 * 4, n1 = 2048 * 800 * 2, n2 = 300000 * 4, n3 = 1500000 * 2;
	ckpt_tensor t[4] = {
		{ .name = "w32",
		  .dtype = CKPT_F32,
		  .ndim = 2,
		  .global_shape = W32_SHAPE,
		  .box_offsets = o0,
		  .box_lengths = l0,
		  .offset = 0,
		  .nbytes = n0 },
		{ .name = "w16",
		  .dtype = CKPT_BF16,
		  .ndim = 2,
		  .global_shape = W16_SHAPE,
		  .box_offsets = o1,
		  .box_lengths = l1,
		  .offset = n0,
		  .nbytes = n1 },
		{ .name = "emb",
		  .dtype = CKPT_F32,
		  .ndim = 1,
		  .global_shape = EMB_SHAPE,
		  .box_offsets = o2,
		  .box_lengths = l2,
		  .offset = n0 + n1,
		  .nbytes = n2 },
		{ .name = "wide",
		  .dtype = CKPT_BF16,
		  .ndim = 2,
		  .global_shape = WIDE_SHAPE,
		  .box_offsets = o3,
		  .box_lengths = l3,
		  .offset = n0 + n1 + n2,
		  .nbytes = n3 },
	};
	uint8_t *w16 = malloc(n1);
	for (uint64_t r = 0; r < 2048; r++)
		memcpy(w16 + r * 1600, expect + offset(4) + (r * 1536 + 100) * 2, 1600);
	uint8_t *want[4] = { expect + offset(3) + 512 * 4096, w16, expect + offset(5) + 150000 * 4,
			     expect + offset(6) + (3000000 + 1000000) * 2 };
	load_expect(1, 2, t, 4, want, 0, NULL);
	free(w16);
}

static void verify_expect(bool ok, const char *needle)
{
	char out[8192];
	int rc = h_ctl(&D, "verify " JOB " 1", true, out, sizeof(out));
	if ((rc == 0) != ok)
		fail_msg("ckptctl verify exited %d:\n%s", rc, out);
	if (needle && strstr(out, needle) == NULL)
		fail_msg("ckptctl verify said:\n%s\nwithout '%s'", out, needle);
}

static void test_verify_passes(void **state)
{
	(void)state;
	verify_expect(true, NULL);
}

/* show of the pinned step writes its index; the index's manifests leave
 * the pieces out (show reads no shard), and show from it still works. */
static void test_index_without_pieces(void **state)
{
	(void)state;
	char out[8192], path[700];
	assert_int_equal(h_ctl(&D, "show " JOB " 1", true, out, sizeof(out)), 0);
	snprintf(path, sizeof(path), "%s/" JOB "/step-000000000001/index", D.store);
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	static uint8_t buf[1 << 20];
	size_t n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	Ckpt__StepIndex *ix = ckpt__step_index__unpack(NULL, n, buf);
	assert_non_null(ix);
	assert_int_equal(ix->n_manifests, 1);
	assert_int_equal(ix->manifests[0]->n_pieces, 0);
	assert_int_equal(ix->manifests[0]->format_version, 1);
	ckpt__step_index__free_unpacked(ix, NULL);
	assert_int_equal(h_ctl(&D, "show " JOB " 1", true, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "w32"));
}

/* Flip one byte of the object at off; flip it back with the same call. */
static void flip(uint64_t off)
{
	char dir[600], path[700];
	step_dir(1, dir, sizeof(dir));
	h_rank_object(dir, 0, 1, "shard", path, sizeof(path));
	int fd = open(path, O_RDWR | O_CLOEXEC);
	assert_true(fd >= 0);
	uint8_t b;
	assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
	b ^= 0x40;
	assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
	close(fd);
}

/* Where piece want_codec's (the first after raw byte from) stored bytes
 * begin, and its tensor's name. */
static uint64_t piece_at(int want_codec, uint64_t from, uint64_t *len)
{
	Ckpt__Manifest *m = read_manifest(1);
	uint64_t raw = 0, st = 0, at = UINT64_MAX;
	for (size_t i = 0; i < m->n_pieces && at == UINT64_MAX; i++) {
		if ((int)m->pieces[i]->codec == want_codec && raw >= from) {
			at = st;
			*len = m->pieces[i]->stored_bytes;
		}
		raw += m->pieces[i]->raw_bytes;
		st += m->pieces[i]->stored_bytes;
	}
	ckpt__manifest__free_unpacked(m, NULL);
	assert_true(at != UINT64_MAX);
	return at;
}

/* A damaged compressed piece of w32: the load fails (the piece does not
 * decode, or its bytes fail w32's CRC32C), and so does verify. */
static void test_damaged_compressed_piece(void **state)
{
	(void)state;
	uint64_t len, at = piece_at(CKPT__CODEC__CODEC_PLANES_ZSTD, offset(3), &len);
	/* In its header: the planes' stored lengths no longer add up. */
	flip(at + 16 + 8);
	ckpt_tensor t = {
		.name = "w32", .dtype = CKPT_F32, .ndim = 2, .global_shape = W32_SHAPE, .offset = 0, .nbytes = nbytes(3)
	};
	uint8_t *want[1] = { expect + offset(3) };
	load_expect(0, 1, &t, 1, want, -EIO, "does not decode");
	verify_expect(false, "does not decode");
	flip(at + 16 + 8);
	/* In a plane's data: whatever zstd makes of it, w32 does not load. */
	flip(at + len / 2);
	load_expect(0, 1, &t, 1, want, -EIO, "w32");
	verify_expect(false, NULL);
	flip(at + len / 2);
	load_expect(0, 1, &t, 1, want, 0, NULL);
}

/* A damaged raw piece (the noise): its tensor's CRC32C catches it. */
static void test_damaged_raw_piece(void **state)
{
	(void)state;
	uint64_t len, at = piece_at(CKPT__CODEC__CODEC_NONE, offset(1), &len);
	flip(at + len / 2);
	ckpt_tensor t = { .name = "noise",
			  .dtype = CKPT_U8,
			  .ndim = 1,
			  .global_shape = NOISE_SHAPE,
			  .offset = 0,
			  .nbytes = nbytes(1) };
	uint8_t *want[1] = { expect + offset(1) };
	load_expect(0, 1, &t, 1, want, -EIO, "checksum mismatch in tensor 'noise'");
	verify_expect(false, "tensor 'noise' crc32c mismatch");
	flip(at + len / 2);
	verify_expect(true, NULL);
}

/* A memory save with compression on, persisted later: its upload stores
 * it compressed too, and a restore from storage alone is bit-exact. */
static void test_persist_compresses(void **state)
{
	(void)state;
	struct dctx E;
	h_init(&E);
	h_start(&E, NULL);
	ckpt_hello h = { .job = JOB, .rank = 0, .world_size = 1, .attempt_id = "a" };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(E.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, total, &b), 0);
	fill(ckpt_buffer_data(b), 1);
	ckpt_tensor t[NT];
	tensors(t, b);
	ckpt_save_opts o = { .tier = CKPT_TIER_MEMORY, .compress = CKPT_ON };
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save_ex(c, 7, t, NT, NULL, 0, &o, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 60000), 0);
	ckpt_future_free(f);
	assert_int_equal(ckpt_persist(c, NULL, 7, &f), 0);
	int r = ckpt_future_wait(f, CKPT_DURABLE, 60000);
	if (r != 0)
		fail_msg("persist: %s: %s", ckpt_strerror(r), ckpt_future_message(f));
	ckpt_future_free(f);
	uint64_t stored = h_metric(&E, "ckptd_bytes_stored_total");
	assert_true(stored * 10 < total * 9);
	memset(ckpt_buffer_data(b), 0xEE, total);
	assert_int_equal(ckpt_load_ex(c, 7, t, NT, CKPT_LOAD_STORAGE_ONLY, &f), 0);
	r = ckpt_future_wait(f, CKPT_LOADED, 60000);
	if (r != 0)
		fail_msg("load: %s: %s", ckpt_strerror(r), ckpt_future_message(f));
	ckpt_future_free(f);
	for (int i = 0; i < NT; i++)
		assert_memory_equal((uint8_t *)ckpt_buffer_data(b) + offset(i), expect + offset(i), nbytes(i));
	ckpt_buffer_free(b);
	ckpt_close(c);
	h_cleanup(&E);
}

/* Coded pieces wait outside the pool for their upload, within a budget
 * (compress.h; here [debug] compress_budget_bytes = 4M): a save whose
 * coded pieces would need more stores the rest as they are, restores
 * bit-exact, and gives the budget back for the next save. */
static uint64_t coded_stored(const Ckpt__Manifest *m, size_t *n)
{
	uint64_t s = 0;
	*n = 0;
	for (size_t i = 0; i < m->n_pieces; i++)
		if (m->pieces[i]->codec == CKPT__CODEC__CODEC_PLANES_ZSTD) {
			s += m->pieces[i]->stored_bytes;
			(*n)++;
		}
	return s;
}

static void test_budget_for_coded_pieces(void **state)
{
	(void)state;
	struct dctx E;
	h_init(&E);
	h_start(&E, "compress = true\nmemory_tier = false\n[debug]\ncompress_budget_bytes = 4M\n");
	ckpt_hello h = { .job = JOB, .rank = 0, .world_size = 1, .attempt_id = "a" };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(E.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, total, &b), 0);
	fill(ckpt_buffer_data(b), 1);
	ckpt_tensor t[NT];
	tensors(t, b);
	for (uint64_t step = 1; step <= 2; step++) {
		ckpt_future *f = NULL;
		assert_int_equal(ckpt_save(c, step, t, NT, NULL, 0, &f), 0);
		int r = ckpt_future_wait(f, CKPT_DURABLE, 60000);
		if (r != 0)
			fail_msg("durable: %s: %s", ckpt_strerror(r), ckpt_future_message(f));
		ckpt_future_free(f);
		char dir[600];
		snprintf(dir, sizeof(dir), "%s/" JOB "/step-%012llu", E.store, (unsigned long long)step);
		Ckpt__Manifest *m = h_rank_manifest(dir);
		size_t n = 0;
		uint64_t coded = coded_stored(m, &n);
		assert_true(n >= 1);            /* what fits is coded, at every save */
		assert_true(coded <= 4u << 20); /* within the budget */
		assert_true(n < m->n_pieces - 1);
		ckpt__manifest__free_unpacked(m, NULL);
	}
	memset(ckpt_buffer_data(b), 0xEE, total);
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_load_ex(c, 2, t, NT, CKPT_LOAD_STORAGE_ONLY, &f), 0);
	int r = ckpt_future_wait(f, CKPT_LOADED, 60000);
	if (r != 0)
		fail_msg("load: %s: %s", ckpt_strerror(r), ckpt_future_message(f));
	ckpt_future_free(f);
	for (int i = 0; i < NT; i++)
		assert_memory_equal((uint8_t *)ckpt_buffer_data(b) + offset(i), expect + offset(i), nbytes(i));
	ckpt_buffer_free(b);
	ckpt_close(c);
	char log[700];
	snprintf(log, sizeof(log), "%s/ckptd.log", E.dir);
	assert_int_equal(h_sh("grep -q 'stored uncompressed: the memory for coded pieces' %s", log), 0);
	h_cleanup(&E);
}

/* A save may say otherwise than the daemon: off gives a format 1
 * manifest and a raw object. */
static void test_save_turns_it_off(void **state)
{
	(void)state;
	save_step(2, CKPT_OFF);
	Ckpt__Manifest *m = read_manifest(2);
	assert_int_equal(m->format_version, 1);
	assert_int_equal(m->n_pieces, 0);
	assert_int_equal(shard_size(2), m->shard_bytes);
	ckpt__manifest__free_unpacked(m, NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stored_in_pieces),     cmocka_unit_test(test_restore_whole),
		cmocka_unit_test(test_restore_resharded),    cmocka_unit_test(test_verify_passes),
		cmocka_unit_test(test_index_without_pieces), cmocka_unit_test(test_damaged_compressed_piece),
		cmocka_unit_test(test_damaged_raw_piece),    cmocka_unit_test(test_persist_compresses),
		cmocka_unit_test(test_save_turns_it_off),    cmocka_unit_test(test_budget_for_coded_pieces),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
