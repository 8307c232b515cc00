/* Tensor tables (DeclareTable; ckpt_table_create): saves made from a table
 * restore bit-exact with their own extra state, step after step; a buffer
 * in a table cannot be unregistered until the table is dropped, and a
 * save in flight outlives both; every malformed
 * table, unknown id and cap is refused with the right errno and a message
 * naming what is wrong, and the session goes on. Registering many fds at
 * once (ckpt_buffer_register_fds) is all or none. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "harness.h"

static struct dctx D;

#define NT 300 /* tensors: enough that the table spans several chunks' pieces */
#define ELEMS 1500

static ckpt_client *connect_job(const char *job)
{
	ckpt_hello h = { .job = job, .rank = 0, .world_size = 1 };
	ckpt_client *c = NULL;
	int r = ckpt_connect(D.sock, &h, &c);
	if (r < 0)
		fail_msg("connect: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	return c;
}

struct state {
	ckpt_buffer *a, *b; /* even tensors in a, odd ones in b */
	uint64_t shape[NT][1];
	char names[NT][32];
	ckpt_tensor t[NT];
};

static void state_init(struct state *s, ckpt_client *c)
{
	assert_int_equal(ckpt_buffer_alloc(c, NT / 2 * ELEMS * 4, &s->a), 0);
	assert_int_equal(ckpt_buffer_alloc(c, NT / 2 * ELEMS * 4, &s->b), 0);
	for (int i = 0; i < NT; i++) {
		s->shape[i][0] = ELEMS;
		snprintf(s->names[i], sizeof(s->names[i]), "layers.%d.weight", i);
		s->t[i] = (ckpt_tensor){ .name = s->names[i],
					 .dtype = CKPT_F32,
					 .ndim = 1,
					 .global_shape = s->shape[i],
					 .buffer = i % 2 ? s->b : s->a,
					 .offset = (uint64_t)(i / 2) * ELEMS * 4,
					 .nbytes = ELEMS * 4 };
	}
}

static void state_fill(struct state *s, uint32_t seed)
{
	uint32_t *a = ckpt_buffer_data(s->a), *b = ckpt_buffer_data(s->b);
	for (size_t i = 0; i < NT / 2 * ELEMS; i++) {
		a[i] = seed * 2654435761u ^ (uint32_t)i;
		b[i] = seed * 40503u + (uint32_t)i * 7u;
	}
}

static void save_and_wait(ckpt_client *c, uint64_t step, const ckpt_table *t, const char *extra)
{
	ckpt_future *f = NULL;
	int r = ckpt_save_table(c, step, t, extra, strlen(extra), &f);
	if (r < 0)
		fail_msg("save_table: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	r = ckpt_future_wait(f, CKPT_DURABLE, 30000);
	if (r < 0)
		fail_msg("save %llu: %s: %s", (unsigned long long)step, ckpt_strerror(r), ckpt_future_message(f));
	uint64_t stall = ckpt_future_stall_ns(f);
	assert_true(stall > 0 && stall < 60ull * 1000000000ull);
	/* Each tensor starts 64-aligned in the shard. */
	assert_int_equal(ckpt_future_bytes(f), (uint64_t)(NT - 1) * 6016 + ELEMS * 4);
	ckpt_future_free(f);
}

static void load_and_check(ckpt_client *c, struct state *s, uint64_t step, uint32_t seed, const char *extra)
{
	struct state want;
	state_init(&want, c);
	state_fill(&want, seed);
	memset(ckpt_buffer_data(s->a), 0xEE, ckpt_buffer_size(s->a));
	memset(ckpt_buffer_data(s->b), 0xEE, ckpt_buffer_size(s->b));
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_load(c, (int64_t)step, s->t, NT, &f), 0);
	int r = ckpt_future_wait(f, CKPT_LOADED, 30000);
	if (r < 0)
		fail_msg("load %llu: %s: %s", (unsigned long long)step, ckpt_strerror(r), ckpt_future_message(f));
	size_t xl = 0;
	const char *x = ckpt_future_extra(f, &xl);
	assert_int_equal(xl, strlen(extra));
	assert_memory_equal(x, extra, xl);
	assert_memory_equal(ckpt_buffer_data(s->a), ckpt_buffer_data(want.a), ckpt_buffer_size(s->a));
	assert_memory_equal(ckpt_buffer_data(s->b), ckpt_buffer_data(want.b), ckpt_buffer_size(s->b));
	ckpt_future_free(f);
	ckpt_buffer_free(want.a);
	ckpt_buffer_free(want.b);
}

/* Three saves from one table, each with other bytes and extra state; each
 * step restores exactly. */
static void test_table_saves_restore(void **state)
{
	(void)state;
	ckpt_client *c = connect_job("tab");
	assert_true(ckpt_capabilities(c) & CKPT_CAP_TABLES);
	struct state s;
	state_init(&s, c);
	ckpt_table *t = NULL;
	int r = ckpt_table_create(c, s.t, NT, &t);
	if (r < 0)
		fail_msg("table: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	assert_int_equal(ckpt_table_size(t), NT);
	for (uint32_t step = 1; step <= 3; step++) {
		char extra[32];
		snprintf(extra, sizeof(extra), "extra %u", step);
		state_fill(&s, step);
		save_and_wait(c, step, t, extra);
	}
	for (uint32_t step = 1; step <= 3; step++) {
		char extra[32];
		snprintf(extra, sizeof(extra), "extra %u", step);
		load_and_check(c, &s, step, step, extra);
	}
	ckpt_table_free(t);
	ckpt_buffer_free(s.a);
	ckpt_buffer_free(s.b);
	ckpt_close(c);
}

/* A DeclareTable's per-tensor arrays, n entries each; dims holds 3 *
 * ndim[i] values per tensor. */
static void set_tensors(Ckpt__DeclareTable *dt, size_t n, Ckpt__DType *dtype, uint32_t *ndim, uint64_t *dims,
			uint64_t *bid, uint64_t *off, uint64_t *nb)
{
	dt->n_dtype = dt->n_ndim = dt->n_buffer_id = dt->n_offset = dt->n_nbytes = n;
	dt->dtype = dtype, dt->ndim = ndim, dt->dims = dims;
	dt->buffer_id = bid, dt->offset = off, dt->nbytes = nb;
	dt->n_dims = 0;
	for (size_t i = 0; i < n; i++)
		dt->n_dims += 3 * (size_t)ndim[i];
}

/* A table's buffer stays registered while the table lives (EBUSY); a
 * save made from it completes after the table and the buffer are gone,
 * with the memfd's bytes (raw frames). */
static void test_table_holds_buffers(void **state)
{
	(void)state;
	int fd = raw_connect(D.sock);
	assert_true(fd >= 0);
	raw_hello(fd, "tabraw", 0, 1);
	int mfd = make_memfd(8192, 0x5A);
	raw_register(fd, 7, mfd, 8192);
	uint8_t *p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	assert_true(p != MAP_FAILED);
	for (int i = 0; i < 8192; i++)
		p[i] = (uint8_t)(i * 31);

	Ckpt__DeclareTable dt = CKPT__DECLARE_TABLE__INIT;
	Ckpt__DType dtype[2] = { CKPT__DTYPE__U8, CKPT__DTYPE__U8 };
	uint32_t ndim[2] = { 1, 2 };
	uint64_t dims[] = { 4096, 0, 4096, /* t0: [4096] */ 64, 64, 0, 0, 64, 64 /* t1: [64, 64] */ };
	uint64_t bid[2] = { 7, 7 }, off[2] = { 0, 4096 }, nb[2] = { 4096, 4096 };
	dt.table_id = 5;
	dt.names.data = (uint8_t *)"t0\0t1";
	dt.names.len = 6;
	set_tensors(&dt, 2, dtype, ndim, dims, bid, off, nb);
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_DECLARE_TABLE;
	f.declare_table = &dt;
	assert_int_equal(raw_send(fd, &f, 3, NULL, 0), 0);
	raw_expect_reply(fd, 0, NULL, 10000);

	Ckpt__Unregister un = CKPT__UNREGISTER__INIT;
	un.buffer_id = 7;
	Ckpt__Frame uf = CKPT__FRAME__INIT;
	uf.body_case = CKPT__FRAME__BODY_UNREGISTER;
	uf.unregister = &un;
	assert_int_equal(raw_send(fd, &uf, 4, NULL, 0), 0);
	raw_expect_reply(fd, EBUSY, "drop the table first", 10000);

	/* Save, then drop the table and unregister the buffer at once: the
	 * save holds what it reads. */
	Ckpt__Save sv = CKPT__SAVE__INIT;
	sv.step = 1;
	sv.table_id = 5;
	f.body_case = CKPT__FRAME__BODY_SAVE;
	f.save = &sv;
	assert_int_equal(raw_send(fd, &f, 5, NULL, 0), 0);
	Ckpt__DropTable drop = CKPT__DROP_TABLE__INIT;
	drop.table_id = 5;
	Ckpt__Frame df = CKPT__FRAME__INIT;
	df.body_case = CKPT__FRAME__BODY_DROP_TABLE;
	df.drop_table = &drop;
	assert_int_equal(raw_send(fd, &df, 6, NULL, 0), 0);
	assert_int_equal(raw_send(fd, &uf, 7, NULL, 0), 0);
	bool staged = false, durable = false;
	int replies = 0;
	while (!durable) {
		Ckpt__Frame *ev = raw_recv(fd, 30000, NULL);
		assert_non_null(ev);
		if (ev->body_case == CKPT__FRAME__BODY_REPLY) {
			assert_int_equal(ev->reply->status, 0); /* the drop, then the unregister */
			replies++;
		} else if (ev->body_case == CKPT__FRAME__BODY_SAVE_STAGED) {
			assert_int_equal(ev->save_staged->bytes, 8192);
			staged = true;
		} else {
			assert_int_equal(ev->body_case, CKPT__FRAME__BODY_SAVE_DURABLE);
			assert_true(staged);
			durable = true;
		}
		ckpt__frame__free_unpacked(ev, NULL);
	}
	while (replies < 2) {
		raw_expect_reply(fd, 0, NULL, 10000);
		replies++;
	}
	close(fd);

	/* What was saved is the memfd's bytes, both tensors. */
	ckpt_client *c = connect_job("tabraw");
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, 8192, &b), 0);
	uint64_t s0[1] = { 4096 }, s1[2] = { 64, 64 };
	ckpt_tensor lt[2] = {
		{ .name = "t0", .dtype = CKPT_U8, .ndim = 1, .global_shape = s0, .buffer = b, .nbytes = 4096 },
		{ .name = "t1",
		  .dtype = CKPT_U8,
		  .ndim = 2,
		  .global_shape = s1,
		  .buffer = b,
		  .offset = 4096,
		  .nbytes = 4096 },
	};
	ckpt_future *lf = NULL;
	assert_int_equal(ckpt_load(c, 1, lt, 2, &lf), 0);
	assert_int_equal(ckpt_future_wait(lf, CKPT_LOADED, 30000), 0);
	assert_memory_equal(ckpt_buffer_data(b), p, 8192);
	ckpt_future_free(lf);
	ckpt_buffer_free(b);
	ckpt_close(c);
	munmap(p, 8192);
	close(mfd);
}

/* One malformed DeclareTable on a fresh session: status and message. */
static void expect_declare(Ckpt__DeclareTable *dt, int status, const char *needle)
{
	int fd = raw_connect(D.sock);
	assert_true(fd >= 0);
	raw_hello(fd, "tabbad", 0, 1);
	int mfd = make_memfd(4096, 1);
	raw_register(fd, 1, mfd, 4096);
	close(mfd);
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_DECLARE_TABLE;
	f.declare_table = dt;
	assert_int_equal(raw_send(fd, &f, 9, NULL, 0), 0);
	raw_expect_reply(fd, status, needle, 10000);
	raw_expect_alive(fd);
	close(fd);
}

static void test_bad_tables_refused(void **state)
{
	(void)state;
	Ckpt__DType dtype[2] = { CKPT__DTYPE__F32, CKPT__DTYPE__F32 };
	uint32_t ndim[2] = { 1, 1 };
	uint64_t dims[6] = { 256, 0, 256, 256, 0, 256 };
	uint64_t bid[2] = { 1, 1 }, off[2] = { 0, 1024 }, nb[2] = { 1024, 1024 };
	Ckpt__DeclareTable good = CKPT__DECLARE_TABLE__INIT;
	good.table_id = 1;
	good.names.data = (uint8_t *)"a\0b";
	good.names.len = 4;
	set_tensors(&good, 2, dtype, ndim, dims, bid, off, nb);
	expect_declare(&good, 0, NULL);

	Ckpt__DeclareTable t = good;
	t.table_id = 0;
	expect_declare(&t, EINVAL, "table id 0");
	t = good;
	t.n_offset = 1;
	expect_declare(&t, EINVAL, "one of each per tensor");
	t = good;
	t.names.len = 3; /* "a\0b": the second name is not ended */
	expect_declare(&t, EINVAL, "NUL-ended names");
	t = good;
	t.n_dims = 5;
	expect_declare(&t, EINVAL, "dims given");
	uint32_t deep[2] = { 9, 1 };
	t = good;
	t.ndim = deep;
	expect_declare(&t, EINVAL, "9 dims");
	t = good;
	t.names.data = (uint8_t *)"a\0a";
	expect_declare(&t, EINVAL, "appears twice");
	uint64_t other[2] = { 1, 2 };
	t = good;
	t.buffer_id = other;
	expect_declare(&t, ENOENT, "buffer 2 is not registered");
	uint64_t far[2] = { 0, 3500 };
	t = good;
	t.offset = far;
	expect_declare(&t, ERANGE, "outside buffer 1");
	uint64_t wrong[2] = { 1024, 1000 };
	t = good;
	t.nbytes = wrong;
	expect_declare(&t, EINVAL, "does not match its box");
	Ckpt__DType odd[2] = { CKPT__DTYPE__F32, (Ckpt__DType)99 };
	t = good;
	t.dtype = odd;
	expect_declare(&t, EINVAL, "unknown dtype");
	t = good;
	t.names.data = (uint8_t *)"a\0\x01";
	expect_declare(&t, EINVAL, "tensor 1");
}

/* Ids: in use, unknown, dropped; the cap; a save that names no table or
 * both a table and tensors. */
static void test_table_ids_and_cap(void **state)
{
	(void)state;
	int fd = raw_connect(D.sock);
	assert_true(fd >= 0);
	raw_hello(fd, "tabcap", 0, 1);
	int mfd = make_memfd(4096, 3);
	raw_register(fd, 1, mfd, 4096);
	close(mfd);
	Ckpt__DType dtype[1] = { CKPT__DTYPE__U8 };
	uint32_t ndim[1] = { 1 };
	uint64_t dims[3] = { 16, 0, 16 }, bid[1] = { 1 }, off[1] = { 0 }, nb[1] = { 16 };
	Ckpt__DeclareTable dt = CKPT__DECLARE_TABLE__INIT;
	dt.names.data = (uint8_t *)"x";
	dt.names.len = 2;
	set_tensors(&dt, 1, dtype, ndim, dims, bid, off, nb);
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_DECLARE_TABLE;
	f.declare_table = &dt;
	for (uint64_t id = 1; id <= 16; id++) {
		dt.table_id = id;
		assert_int_equal(raw_send(fd, &f, id, NULL, 0), 0);
		raw_expect_reply(fd, 0, NULL, 10000);
	}
	assert_int_equal(raw_send(fd, &f, 99, NULL, 0), 0);
	raw_expect_reply(fd, EEXIST, "already declared", 10000);
	dt.table_id = 17;
	assert_int_equal(raw_send(fd, &f, 99, NULL, 0), 0);
	raw_expect_reply(fd, ENOBUFS, "at most 16 tables", 10000);

	Ckpt__DropTable drop = CKPT__DROP_TABLE__INIT;
	drop.table_id = 16;
	Ckpt__Frame df = CKPT__FRAME__INIT;
	df.body_case = CKPT__FRAME__BODY_DROP_TABLE;
	df.drop_table = &drop;
	assert_int_equal(raw_send(fd, &df, 100, NULL, 0), 0);
	raw_expect_reply(fd, 0, NULL, 10000);
	assert_int_equal(raw_send(fd, &df, 101, NULL, 0), 0);
	raw_expect_reply(fd, ENOENT, "table 16 is not declared", 10000);
	assert_int_equal(raw_send(fd, &f, 102, NULL, 0), 0); /* 17 fits now */
	raw_expect_reply(fd, 0, NULL, 10000);

	/* A save of a dropped table, and one naming a table and tensors. */
	Ckpt__Save sv = CKPT__SAVE__INIT;
	sv.step = 1;
	sv.table_id = 16;
	Ckpt__Frame sf = CKPT__FRAME__INIT;
	sf.body_case = CKPT__FRAME__BODY_SAVE;
	sf.save = &sv;
	Ckpt__Frame *ev = raw_call(fd, &sf, 103, CKPT__FRAME__BODY_SAVE_FAILED);
	assert_int_equal(ev->save_failed->status, ENOENT);
	assert_non_null(strstr(ev->save_failed->message, "table 16 is not declared"));
	ckpt__frame__free_unpacked(ev, NULL);
	Ckpt__TensorRef tr = CKPT__TENSOR_REF__INIT;
	Ckpt__TensorRef *trs[1] = { &tr };
	tr.name = "x";
	tr.dtype = CKPT__DTYPE__U8;
	tr.n_global_shape = 1;
	tr.global_shape = dims;
	tr.buffer_id = 1;
	tr.nbytes = 16;
	sv.table_id = 17;
	sv.n_tensors = 1;
	sv.tensors = trs;
	ev = raw_call(fd, &sf, 104, CKPT__FRAME__BODY_SAVE_FAILED);
	assert_int_equal(ev->save_failed->status, EINVAL);
	assert_non_null(strstr(ev->save_failed->message, "not both"));
	ckpt__frame__free_unpacked(ev, NULL);
	raw_expect_alive(fd);
	close(fd);
}

/* A session's tables together hold at most max_tensors (1000 here). */
static void declare_n(int fd, uint64_t id, size_t n, int status, const char *needle)
{
	Ckpt__DType *dtype = calloc(n, sizeof(*dtype));
	uint32_t *ndim = calloc(n, sizeof(*ndim));
	uint64_t *dims = calloc(3 * n, sizeof(*dims)), *bid = calloc(n, sizeof(*bid));
	uint64_t *off = calloc(n, sizeof(*off)), *nb = calloc(n, sizeof(*nb));
	char *names = calloc(n, 8);
	assert_true(dtype && ndim && dims && bid && off && nb && names);
	size_t len = 0;
	for (size_t i = 0; i < n; i++) {
		dtype[i] = CKPT__DTYPE__U8;
		ndim[i] = 1;
		dims[3 * i] = 1, dims[3 * i + 2] = 1;
		bid[i] = 1, off[i] = i, nb[i] = 1;
		len += (size_t)snprintf(names + len, 8, "t%zu", i) + 1;
	}
	Ckpt__DeclareTable dt = CKPT__DECLARE_TABLE__INIT;
	dt.table_id = id;
	dt.names.data = (uint8_t *)names;
	dt.names.len = len;
	set_tensors(&dt, n, dtype, ndim, dims, bid, off, nb);
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_DECLARE_TABLE;
	f.declare_table = &dt;
	assert_int_equal(raw_send(fd, &f, id, NULL, 0), 0);
	raw_expect_reply(fd, status, needle, 10000);
	free(dtype), free(ndim), free(dims), free(bid), free(off), free(nb), free(names);
}

static void test_tables_share_max_tensors(void **state)
{
	(void)state;
	int fd = raw_connect(D.sock);
	assert_true(fd >= 0);
	raw_hello(fd, "tabsum", 0, 1);
	int mfd = make_memfd(4096, 3);
	raw_register(fd, 1, mfd, 4096);
	close(mfd);
	declare_n(fd, 1, 600, 0, NULL);
	declare_n(fd, 2, 600, ENOBUFS, "would hold 1200 tensors, at most 1000");
	declare_n(fd, 3, 1001, E2BIG, "at most 1000 per save");
	declare_n(fd, 4, 400, 0, NULL);
	Ckpt__DropTable drop = CKPT__DROP_TABLE__INIT;
	drop.table_id = 1;
	Ckpt__Frame df = CKPT__FRAME__INIT;
	df.body_case = CKPT__FRAME__BODY_DROP_TABLE;
	df.drop_table = &drop;
	assert_int_equal(raw_send(fd, &df, 9, NULL, 0), 0);
	raw_expect_reply(fd, 0, NULL, 10000);
	declare_n(fd, 2, 600, 0, NULL);
	raw_expect_alive(fd);
	close(fd);
}

/* libckpt's own checks: a control session, a bad tensor, NULLs. */
static void test_client_refusals(void **state)
{
	(void)state;
	ckpt_client *ctl = NULL;
	ckpt_hello h = { 0 };
	assert_int_equal(ckpt_connect(D.sock, &h, &ctl), 0);
	ckpt_table *t = NULL;
	assert_int_equal(ckpt_table_create(ctl, NULL, 0, &t), -EINVAL);
	assert_null(t);
	ckpt_close(ctl);

	ckpt_client *c = connect_job("tabcli");
	struct state s;
	state_init(&s, c);
	s.t[5].nbytes = 4; /* not its box */
	assert_int_equal(ckpt_table_create(c, s.t, NT, &t), -EINVAL);
	assert_non_null(strstr(ckpt_errmsg(), "layers.5.weight"));
	assert_int_equal(ckpt_table_create(c, NULL, 3, &t), -EINVAL);
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save_table(c, 1, NULL, NULL, 0, &f), -EINVAL);
	ckpt_table_free(NULL);
	assert_int_equal(ckpt_table_size(NULL), 0);
	ckpt_buffer_free(s.a);
	ckpt_buffer_free(s.b);
	ckpt_close(c);
}

/* 300 memfds in one call (three round trips), each saved and restored;
 * then a batch whose 201st fd the daemon refuses (a file on disk, not
 * shared memory): the call fails naming it and none of the 300 stays
 * registered, as the session's cap of 400 buffers shows when 300 more
 * register after it. */
#define MANY 300
static void test_register_fds_batches(void **state)
{
	(void)state;
	ckpt_client *c = connect_job("tabfds");
	int fds[MANY];
	size_t sizes[MANY];
	ckpt_buffer *bufs[MANY];
	for (int i = 0; i < MANY; i++) {
		fds[i] = make_memfd(4096, i & 0xff);
		sizes[i] = 4096;
	}
	int r = ckpt_buffer_register_fds(c, fds, sizes, MANY, bufs);
	if (r < 0)
		fail_msg("register_fds: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	uint64_t shape[1] = { 4096 };
	char names[MANY][16];
	ckpt_tensor t[MANY];
	for (int i = 0; i < MANY; i++) {
		assert_non_null(bufs[i]);
		snprintf(names[i], sizeof(names[i]), "b%d", i);
		t[i] = (ckpt_tensor){ .name = names[i],
				      .dtype = CKPT_U8,
				      .ndim = 1,
				      .global_shape = shape,
				      .buffer = bufs[i],
				      .nbytes = 4096 };
	}
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, 1, t, MANY, NULL, 0, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(f);
	ckpt_buffer *back = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, 4096, &back), 0);
	ckpt_tensor lt = {
		.name = "b77", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = back, .nbytes = 4096
	};
	assert_int_equal(ckpt_load(c, 1, &lt, 1, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_LOADED, 30000), 0);
	ckpt_future_free(f);
	for (int i = 0; i < 4096; i++)
		assert_int_equal(((uint8_t *)ckpt_buffer_data(back))[i], 77);
	ckpt_buffer_free(back);
	for (int i = 0; i < MANY; i++)
		ckpt_buffer_free(bufs[i]);

	char path[400];
	snprintf(path, sizeof(path), "%s/not-shm", D.dir);
	int disk = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	assert_true(disk >= 0);
	assert_int_equal(ftruncate(disk, 4096), 0);
	int keep = fds[200];
	fds[200] = disk;
	r = ckpt_buffer_register_fds(c, fds, sizes, MANY, bufs);
	assert_int_equal(r, -EBADF);
	assert_non_null(strstr(ckpt_errmsg(), "buffer 200"));
	for (int i = 0; i < MANY; i++)
		assert_null(bufs[i]);
	fds[200] = keep;
	r = ckpt_buffer_register_fds(c, fds, sizes, MANY, bufs);
	if (r < 0)
		fail_msg("register_fds after a failed batch: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	for (int i = 0; i < MANY; i++)
		ckpt_buffer_free(bufs[i]);
	assert_int_equal(ckpt_buffer_register_fds(c, NULL, sizes, 3, bufs), -EINVAL);
	close(disk);
	for (int i = 0; i < MANY; i++)
		close(fds[i]);
	ckpt_close(c);
}

static int group_setup(void **state)
{
	(void)state;
	h_init(&D);
	h_start(&D, "[limits]\nmax_buffers = 400\nmax_tensors = 1000\n");
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	h_assert_serves(&D);
	h_cleanup(&D);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table_saves_restore),      cmocka_unit_test(test_table_holds_buffers),
		cmocka_unit_test(test_bad_tables_refused),       cmocka_unit_test(test_table_ids_and_cap),
		cmocka_unit_test(test_tables_share_max_tensors), cmocka_unit_test(test_client_refusals),
		cmocka_unit_test(test_register_fds_batches),
	};
	return cmocka_run_group_tests_name("tables", tests, group_setup, group_teardown);
}
