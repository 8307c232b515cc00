/* End to end: two ranks save several tensors over three steps through a real
 * ckptd; restore latest and a named step; restart the daemon and restore
 * from disk; reshard 2 -> 1 and 2 -> 3 ranks; ckptctl ls --json; a corrupt
 * shard is refused naming the tensor; a complete step is never
 * overwritten; no callback runs once its future is freed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "harness.h"

#define WORLD 2
#define STEPS 3
#define JOB "it"

static struct dctx D;

/* Global tensors: A f32 [96, 300] sharded by rows; B i64 [1000] sharded;
 * C bf16 [7, 5, 3] replicated (each rank saves all of it). */
static const uint64_t A_SHAPE[2] = { 96, 300 };
static const uint64_t B_SHAPE[1] = { 1000 };
static const uint64_t C_SHAPE[3] = { 7, 5, 3 };

static uint32_t value(uint64_t step, int tensor, uint64_t idx)
{
	uint64_t x = step * 0x9E3779B97F4A7C15ull ^ (uint64_t)tensor << 40 ^ idx;
	x ^= x >> 31;
	x *= 0xBF58476D1CE4E5B9ull;
	x ^= x >> 29;
	return (uint32_t)x;
}

/* One rank's view: its rows of A and B, all of C, packed in one buffer. */
struct view {
	uint64_t a_off[2], a_len[2], b_off[1], b_len[1];
	uint64_t a_bytes, b_bytes, c_bytes;
	ckpt_buffer *buf;
	ckpt_tensor t[3];
};

static void view_init(struct view *v, ckpt_client *c, uint32_t rank, uint32_t world)
{
	memset(v, 0, sizeof(*v));
	v->a_off[0] = A_SHAPE[0] * rank / world;
	v->a_len[0] = A_SHAPE[0] * (rank + 1) / world - v->a_off[0];
	v->a_off[1] = 0;
	v->a_len[1] = A_SHAPE[1];
	v->b_off[0] = B_SHAPE[0] * rank / world;
	v->b_len[0] = B_SHAPE[0] * (rank + 1) / world - v->b_off[0];
	v->a_bytes = v->a_len[0] * v->a_len[1] * 4;
	v->b_bytes = v->b_len[0] * 8;
	v->c_bytes = 7 * 5 * 3 * 2;
	assert_int_equal(ckpt_buffer_alloc(c, v->a_bytes + v->b_bytes + v->c_bytes + 64, &v->buf), 0);
	v->t[0] = (ckpt_tensor){ .name = "model.A", .dtype = CKPT_F32, .ndim = 2, .global_shape = A_SHAPE,
				 .box_offsets = v->a_off, .box_lengths = v->a_len, .buffer = v->buf,
				 .offset = 0, .nbytes = v->a_bytes };
	v->t[1] = (ckpt_tensor){ .name = "model.B", .dtype = CKPT_I64, .ndim = 1, .global_shape = B_SHAPE,
				 .box_offsets = v->b_off, .box_lengths = v->b_len, .buffer = v->buf,
				 .offset = v->a_bytes, .nbytes = v->b_bytes };
	v->t[2] = (ckpt_tensor){ .name = "optim.C", .dtype = CKPT_BF16, .ndim = 3, .global_shape = C_SHAPE,
				 .buffer = v->buf, .offset = v->a_bytes + v->b_bytes, .nbytes = v->c_bytes };
}

static void view_fill(struct view *v, uint64_t step)
{
	uint8_t *p = ckpt_buffer_data(v->buf);
	uint32_t *a = (uint32_t *)p;
	for (uint64_t i = 0; i < v->a_len[0] * v->a_len[1]; i++)
		a[i] = value(step, 0, v->a_off[0] * A_SHAPE[1] + i);
	uint64_t *b = (uint64_t *)(p + v->a_bytes);
	for (uint64_t i = 0; i < v->b_len[0]; i++)
		b[i] = value(step, 1, v->b_off[0] + i) * 3ull;
	uint16_t *cc = (uint16_t *)(p + v->a_bytes + v->b_bytes);
	for (uint64_t i = 0; i < 105; i++)
		cc[i] = (uint16_t)value(step, 2, i);
}

/* Every byte equals what view_fill(step) would write. */
static void view_check(struct view *v, uint64_t step)
{
	uint8_t *got = ckpt_buffer_data(v->buf);
	size_t n = v->a_bytes + v->b_bytes + v->c_bytes;
	uint8_t *copy = malloc(n);
	assert_non_null(copy);
	memcpy(copy, got, n);
	view_fill(v, step);
	assert_memory_equal(copy, got, n);
	free(copy);
}

static ckpt_client *connect_rank(uint32_t rank, uint32_t world, const char *attempt)
{
	ckpt_hello h = { .job = JOB, .rank = rank, .world_size = world, .attempt_id = attempt };
	ckpt_client *c = NULL;
	int r = ckpt_connect(D.sock, &h, &c);
	if (r < 0)
		fail_msg("connect: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	return c;
}

static void load_and_check(uint32_t rank, uint32_t world, int64_t step, uint64_t expect_step)
{
	ckpt_client *c = connect_rank(rank, world, "x");
	struct view v;
	view_init(&v, c, rank, world);
	memset(ckpt_buffer_data(v.buf), 0xEE, ckpt_buffer_size(v.buf));
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_load(c, step, v.t, 3, &f), 0);
	int r = ckpt_future_wait(f, CKPT_LOADED, 30000);
	if (r != 0)
		fail_msg("load: %s: %s", ckpt_strerror(r), ckpt_future_message(f));
	assert_int_equal(ckpt_future_step(f), expect_step);
	size_t xl = 0;
	const char *x = ckpt_future_extra(f, &xl);
	char want[64];
	snprintf(want, sizeof(want), "step=%llu", (unsigned long long)expect_step);
	assert_int_equal(xl, strlen(want));
	assert_memory_equal(x, want, xl);
	assert_int_equal(ckpt_future_bytes(f), v.a_bytes + v.b_bytes + v.c_bytes);
	view_check(&v, expect_step);
	ckpt_future_free(f);
	ckpt_buffer_free(v.buf);
	ckpt_close(c);
}

static int group_setup(void **state)
{
	(void)state;
	h_init(&D);
	h_start(&D, NULL);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	h_cleanup(&D);
	return 0;
}

static void test_save_two_ranks_three_steps(void **state)
{
	(void)state;
	ckpt_client *c[WORLD];
	struct view v[WORLD];
	for (uint32_t r = 0; r < WORLD; r++) {
		c[r] = connect_rank(r, WORLD, "a1");
		view_init(&v[r], c[r], r, WORLD);
	}
	for (uint64_t step = 1; step <= STEPS; step++) {
		ckpt_future *f[WORLD];
		char extra[32];
		snprintf(extra, sizeof(extra), "step=%llu", (unsigned long long)step);
		for (uint32_t r = 0; r < WORLD; r++) {
			view_fill(&v[r], step);
			assert_int_equal(ckpt_save(c[r], step, v[r].t, 3, extra, strlen(extra), &f[r]), 0);
		}
		for (uint32_t r = 0; r < WORLD; r++) {
			assert_int_equal(ckpt_future_wait(f[r], CKPT_STAGED, 30000), 0);
			/* After staged the trainer may scribble over its buffers. */
			memset(ckpt_buffer_data(v[r].buf), 0x5A, ckpt_buffer_size(v[r].buf));
		}
		for (uint32_t r = 0; r < WORLD; r++) {
			int rc = ckpt_future_wait(f[r], CKPT_DURABLE, 30000);
			if (rc != 0)
				fail_msg("durable: %s: %s", ckpt_strerror(rc), ckpt_future_message(f[r]));
			assert_int_equal(ckpt_future_poll(f[r], CKPT_DURABLE), 1);
			ckpt_future_free(f[r]);
		}
	}
	for (uint32_t r = 0; r < WORLD; r++) {
		ckpt_buffer_free(v[r].buf);
		ckpt_close(c[r]);
	}
	/* The files are where DESIGN §5 says. */
	char path[600], dir[600];
	snprintf(dir, sizeof(dir), "%s/" JOB "/step-000000000003", D.store);
	h_rank_object(dir, 1, 2, "manifest", path, sizeof(path));
	assert_int_equal(access(path, R_OK), 0);
	h_rank_object(dir, 1, 2, "shard", path, sizeof(path));
	assert_int_equal(access(path, R_OK), 0);
}

static void test_restore_latest(void **state)
{
	(void)state;
	for (uint32_t r = 0; r < WORLD; r++)
		load_and_check(r, WORLD, CKPT_LATEST, STEPS);
}

static void test_restore_named_step(void **state)
{
	(void)state;
	load_and_check(1, WORLD, 2, 2);
	/* A step that does not exist is an error, not a silent success. */
	ckpt_client *c = connect_rank(0, WORLD, "x");
	struct view v;
	view_init(&v, c, 0, WORLD);
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_load(c, 77, v.t, 3, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_LOADED, 30000), -ENOENT);
	assert_non_null(strstr(ckpt_future_message(f), "77"));
	ckpt_future_free(f);
	ckpt_buffer_free(v.buf);
	ckpt_close(c);
}

static void test_ckptctl_ls_json(void **state)
{
	(void)state;
	const char *bin = getenv("CKPTCTL_BIN");
	assert_non_null(bin);
	char cmd[800];
	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' ls --json " JOB, bin, D.sock);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	static char out[1 << 16];
	size_t n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	assert_int_equal(pclose(p), 0);
	json_object *arr = json_tokener_parse(out);
	assert_non_null(arr);
	assert_true(json_object_is_type(arr, json_type_array));
	assert_int_equal(json_object_array_length(arr), STEPS);
	bool found = false;
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		json_object *o = json_object_array_get_idx(arr, i), *v;
		assert_true(json_object_object_get_ex(o, "step", &v));
		if (json_object_get_int64(v) != STEPS)
			continue;
		found = true;
		assert_true(json_object_object_get_ex(o, "job", &v));
		assert_string_equal(json_object_get_string(v), JOB);
		assert_true(json_object_object_get_ex(o, "complete", &v));
		assert_true(json_object_get_boolean(v));
		assert_true(json_object_object_get_ex(o, "ranks_present", &v));
		assert_int_equal(json_object_get_int(v), WORLD);
		assert_true(json_object_object_get_ex(o, "world_size", &v));
		assert_int_equal(json_object_get_int(v), WORLD);
		assert_true(json_object_object_get_ex(o, "bytes", &v));
		assert_true(json_object_get_int64(v) >= (int64_t)(96 * 300 * 4 + 1000 * 8));
	}
	assert_true(found);
	json_object_put(arr);
}

static void test_restart_restores_from_disk(void **state)
{
	(void)state;
	assert_int_equal(h_stop(&D), 0);
	h_start(&D, NULL);
	for (uint32_t r = 0; r < WORLD; r++)
		load_and_check(r, WORLD, CKPT_LATEST, STEPS);
}

static void test_reshard(void **state)
{
	(void)state;
	load_and_check(0, 1, CKPT_LATEST, STEPS);
	for (uint32_t r = 0; r < 3; r++)
		load_and_check(r, 3, CKPT_LATEST, STEPS);
}

static void test_incomplete_step_is_not_latest(void **state)
{
	(void)state;
	/* Only rank 0 of a new attempt saves step 4: latest stays 3. */
	ckpt_client *c = connect_rank(0, WORLD, "a2");
	struct view v;
	view_init(&v, c, 0, WORLD);
	view_fill(&v, 4);
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, 4, v.t, 3, "step=4", 6, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(f);
	ckpt_buffer_free(v.buf);
	ckpt_close(c);
	load_and_check(1, WORLD, CKPT_LATEST, STEPS);
	/* ... and loading step 4 by name says why not. */
	c = connect_rank(0, WORLD, "x");
	view_init(&v, c, 0, WORLD);
	assert_int_equal(ckpt_load(c, 4, v.t, 3, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_LOADED, 30000), -ENOENT);
	assert_non_null(strstr(ckpt_future_message(f), "not complete"));
	ckpt_future_free(f);
	ckpt_buffer_free(v.buf);
	ckpt_close(c);
}

/* A callback that takes its time on the reader thread: started, then
 * finished 200 ms later, in memory the test frees after ckpt_future_free. */
struct slow_cb {
	atomic_int started, finished;
};

static void slow_cb(ckpt_future *f, ckpt_phase phase, int status, void *user)
{
	struct slow_cb *s = user;
	(void)f;
	(void)status;
	if (phase != CKPT_DURABLE)
		return;
	atomic_fetch_add(&s->started, 1);
	usleep(200 * 1000);
	atomic_fetch_add(&s->finished, 1);
}

/* ckpt_future_free returns only once a callback running on the reader
 * thread is done: a caller may then free what the callback writes (the
 * race ASan found in ckpt-example, whose callback wrote into a stack frame
 * that had returned). */
static void test_free_waits_for_a_running_callback(void **state)
{
	(void)state;
	ckpt_hello h = { .job = "callbacks", .rank = 0, .world_size = 1 };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
	struct view v;
	view_init(&v, c, 0, 1);
	view_fill(&v, 7);
	struct slow_cb *s = calloc(1, sizeof(*s));
	assert_non_null(s);
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, 1, v.t, 3, NULL, 0, &f), 0);
	assert_int_equal(ckpt_future_set_callback(f, slow_cb, s), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
	for (int i = 0; i < 3000 && atomic_load(&s->started) == 0; i++)
		usleep(1000);
	assert_int_equal(atomic_load(&s->started), 1);
	ckpt_future_free(f);
	assert_int_equal(atomic_load(&s->finished), 1);
	free(s);
	ckpt_buffer_free(v.buf);
	ckpt_close(c);
}

static void test_complete_step_never_overwritten(void **state)
{
	(void)state;
	ckpt_client *c = connect_rank(0, WORLD, "a3");
	struct view v;
	view_init(&v, c, 0, WORLD);
	view_fill(&v, 99);
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, STEPS, v.t, 3, NULL, 0, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), -EEXIST);
	assert_non_null(strstr(ckpt_future_message(f), "complete"));
	ckpt_future_free(f);
	ckpt_buffer_free(v.buf);
	ckpt_close(c);
	load_and_check(0, WORLD, CKPT_LATEST, STEPS);
}

static void test_corrupt_shard_names_tensor(void **state)
{
	(void)state;
	char path[600], dir[600];
	snprintf(dir, sizeof(dir), "%s/" JOB "/step-000000000003", D.store);
	h_rank_object(dir, 0, 2, "shard", path, sizeof(path));
	int fd = open(path, O_RDWR | O_CLOEXEC);
	assert_true(fd >= 0);
	uint8_t b;
	assert_int_equal(pread(fd, &b, 1, 100), 1); /* inside model.A */
	b ^= 0x01;
	assert_int_equal(pwrite(fd, &b, 1, 100), 1);
	ckpt_client *c = connect_rank(0, WORLD, "x");
	struct view v;
	view_init(&v, c, 0, WORLD);
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_load(c, CKPT_LATEST, v.t, 3, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_LOADED, 30000), -EIO);
	assert_non_null(strstr(ckpt_future_message(f), "model.A"));
	assert_non_null(strstr(ckpt_future_message(f), "checksum"));
	ckpt_future_free(f);
	ckpt_buffer_free(v.buf);
	ckpt_close(c);
	b ^= 0x01;
	assert_int_equal(pwrite(fd, &b, 1, 100), 1);
	close(fd);
	load_and_check(0, WORLD, CKPT_LATEST, STEPS);
}

/* Save one f32 tensor [12, 8] from 4 ranks with the given row boxes
 * (rank r holds rows [lo[r], lo[r] + n[r])) as job/step 1. */
static void save_rows(const char *job, const uint64_t *lo, const uint64_t *n)
{
	static const uint64_t shape[2] = { 12, 8 };
	for (uint32_t r = 0; r < 4; r++) {
		ckpt_hello h = { .job = job, .rank = r, .world_size = 4, .attempt_id = "hs" };
		ckpt_client *c = NULL;
		assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
		ckpt_buffer *b = NULL;
		assert_int_equal(ckpt_buffer_alloc(c, n[r] * 8 * 4, &b), 0);
		uint32_t *p = ckpt_buffer_data(b);
		for (uint64_t i = 0; i < n[r] * 8; i++)
			p[i] = value(1, 0, lo[r] * 8 + i);
		uint64_t off[2] = { lo[r], 0 }, len[2] = { n[r], 8 };
		ckpt_tensor t = { .name = "w",
				  .dtype = CKPT_F32,
				  .ndim = 2,
				  .global_shape = shape,
				  .box_offsets = off,
				  .box_lengths = len,
				  .buffer = b,
				  .nbytes = n[r] * 8 * 4 };
		ckpt_future *f = NULL;
		assert_int_equal(ckpt_save(c, 1, &t, 1, NULL, 0, &f), 0);
		assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
		ckpt_future_free(f);
		ckpt_buffer_free(b);
		ckpt_close(c);
	}
}

/* Load the whole [12, 8] tensor on one rank; returns the wait status. */
static int load_whole(const char *job, char *msg, size_t msglen)
{
	static const uint64_t shape[2] = { 12, 8 };
	ckpt_hello h = { .job = job, .rank = 0, .world_size = 1, .attempt_id = "x" };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, 12 * 8 * 4, &b), 0);
	memset(ckpt_buffer_data(b), 0xEE, 12 * 8 * 4);
	ckpt_tensor t = {
		.name = "w", .dtype = CKPT_F32, .ndim = 2, .global_shape = shape, .buffer = b, .nbytes = 12 * 8 * 4
	};
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_load(c, CKPT_LATEST, &t, 1, &f), 0);
	int r = ckpt_future_wait(f, CKPT_LOADED, 30000);
	snprintf(msg, msglen, "%s", ckpt_future_message(f));
	if (r == 0) {
		uint32_t *p = ckpt_buffer_data(b);
		for (uint64_t i = 0; i < 12 * 8; i++)
			if (p[i] != value(1, 0, i))
				fail_msg("element %llu differs", (unsigned long long)i);
	}
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);
	return r;
}

static void test_replicated_shards_load_whole(void **state)
{
	(void)state;
	/* HSDP-like: ranks 0 and 1 both hold rows [0, 6), ranks 2 and 3
	 * both hold [6, 12). Every row must be written once. */
	const uint64_t lo[4] = { 0, 0, 6, 6 }, n[4] = { 6, 6, 6, 6 };
	save_rows("hsdp", lo, n);
	char msg[512];
	int r = load_whole("hsdp", msg, sizeof(msg));
	if (r != 0)
		fail_msg("load: %d %s", r, msg);
}

/* Tensors that lie in one buffer as they will in the shard (ckpt.torch's
 * one file per plan) are copied as one run, gaps and all: the shard holds
 * every tensor's bytes, and zeroes in the gaps whatever the buffer has
 * there; it verifies and restores. */
static void test_run_of_neighbours_in_one_buffer(void **state)
{
	(void)state;
	ckpt_hello h = { .job = "runs", .rank = 0, .world_size = 1 };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, 1 << 20, &b), 0);
	uint8_t *p = ckpt_buffer_data(b);
	memset(p, 0xAB, 1 << 20);
	/* Sizes 100, 50, 64 and 300000 at 0, 128, 192 and 256: the shard's
	 * 64-byte layout; then one elsewhere in the buffer (a new run). */
	static const uint64_t at[5] = { 0, 128, 192, 256, 900000 }, len[5] = { 100, 50, 64, 300000, 1000 };
	uint64_t shape[5][1];
	char names[5][8];
	ckpt_tensor t[5];
	for (int i = 0; i < 5; i++) {
		for (uint64_t k = 0; k < len[i]; k++)
			p[at[i] + k] = (uint8_t)(i * 37 + k * 7 + 1);
		shape[i][0] = len[i];
		snprintf(names[i], sizeof(names[i]), "t%d", i);
		t[i] = (ckpt_tensor){ .name = names[i],
				      .dtype = CKPT_U8,
				      .ndim = 1,
				      .global_shape = shape[i],
				      .buffer = b,
				      .offset = at[i],
				      .nbytes = len[i] };
	}
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, 1, t, 5, NULL, 0, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(f);
	char dir[600], path[700];
	snprintf(dir, sizeof(dir), "%s/runs/step-000000000001", D.store);
	h_rank_object(dir, 0, 1, "shard", path, sizeof(path));
	FILE *fp = fopen(path, "rb");
	assert_non_null(fp);
	uint8_t *shard = malloc(302000);
	size_t n = fread(shard, 1, 302000, fp);
	fclose(fp);
	assert_int_equal(n, 256 + 300000 + 32 + 1000); /* t4 at 300288 */
	for (int i = 0; i < 4; i++)
		assert_memory_equal(shard + at[i], p + at[i], len[i]);
	assert_memory_equal(shard + 300288, p + 900000, 1000);
	for (uint64_t k = 100; k < 128; k++)
		assert_int_equal(shard[k], 0);
	for (uint64_t k = 178; k < 192; k++)
		assert_int_equal(shard[k], 0);
	for (uint64_t k = 300256; k < 300288; k++)
		assert_int_equal(shard[k], 0);
	free(shard);
	char cmd[900];
	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' verify runs 1 > /dev/null", getenv("CKPTCTL_BIN"), D.sock);
	assert_int_equal(system(cmd), 0);
	memset(p, 0, 1 << 20);
	assert_int_equal(ckpt_load(c, 1, t, 5, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_LOADED, 30000), 0);
	ckpt_future_free(f);
	for (int i = 0; i < 5; i++)
		for (uint64_t k = 0; k < len[i]; k++)
			if (p[at[i] + k] != (uint8_t)(i * 37 + k * 7 + 1))
				fail_msg("t%d byte %llu", i, (unsigned long long)k);
	ckpt_buffer_free(b);
	ckpt_close(c);
}

static void test_partial_overlap_refused(void **state)
{
	(void)state;
	/* Rows [0,6) [4,8) [8,12) [8,12): ranks 0 and 1 overlap in part. */
	const uint64_t lo[4] = { 0, 4, 8, 8 }, n[4] = { 6, 4, 4, 4 };
	save_rows("overlap", lo, n);
	char msg[512];
	assert_int_equal(load_whole("overlap", msg, sizeof(msg)), -EINVAL);
	assert_non_null(strstr(msg, "overlap"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_save_two_ranks_three_steps),
		cmocka_unit_test(test_restore_latest),
		cmocka_unit_test(test_restore_named_step),
		cmocka_unit_test(test_ckptctl_ls_json),
		cmocka_unit_test(test_restart_restores_from_disk),
		cmocka_unit_test(test_reshard),
		cmocka_unit_test(test_incomplete_step_is_not_latest),
		cmocka_unit_test(test_complete_step_never_overwritten),
		cmocka_unit_test(test_free_waits_for_a_running_callback),
		cmocka_unit_test(test_corrupt_shard_names_tensor),
		cmocka_unit_test(test_replicated_shards_load_whole),
		cmocka_unit_test(test_partial_overlap_refused),
		cmocka_unit_test(test_run_of_neighbours_in_one_buffer),
	};
	return cmocka_run_group_tests_name("data_path", tests, group_setup, group_teardown);
}
