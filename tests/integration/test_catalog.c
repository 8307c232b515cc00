/* The catalogue: resharding restore (save at world size 4, load at 1, 2, 3
 * and 8) for row, flat (FSDP) and 2-D block layouts, from memory and from
 * storage, byte-exact against the full tensors; every planner error; and
 * ckptctl show / verify / rm / gc with the retention policy. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "harness.h"

static struct dctx D;

enum {
	L_ROW,
	L_FLAT,
	L_BLOCK,
	NLAYOUT
};
static const char *const lname[NLAYOUT] = { "row", "flat", "block" };
/* row: [37, 5]; flat: a [13, 7] parameter flattened to [91]; block: [10, 12] */
static const uint64_t gshape[NLAYOUT][2] = { { 37, 5 }, { 91, 0 }, { 10, 12 } };
static const uint32_t gndim[NLAYOUT] = { 2, 1, 2 };

static uint32_t value(int layout, uint64_t idx)
{
	uint64_t x = (uint64_t)layout * 0x9E3779B97F4A7C15ull + idx * 0xBF58476D1CE4E5B9ull + 12345;
	x ^= x >> 29;
	return (uint32_t)x;
}

static uint64_t nelem(int l)
{
	return gndim[l] == 1 ? gshape[l][0] : gshape[l][0] * gshape[l][1];
}

static void split(uint64_t n, uint32_t parts, uint32_t i, uint64_t *off, uint64_t *len)
{
	*off = n * i / parts;
	*len = n * (i + 1) / parts - *off;
}

/* The box rank holds of layout at world size w. Saving uses the 2x2 grid
 * for blocks; loading at w uses a (w/c) x c grid. */
static void box_for(int l, uint32_t w, uint32_t rank, bool saving, uint64_t *off, uint64_t *len)
{
	if (l == L_ROW) {
		split(gshape[l][0], w, rank, &off[0], &len[0]);
		off[1] = 0;
		len[1] = gshape[l][1];
	} else if (l == L_FLAT) {
		split(gshape[l][0], w, rank, &off[0], &len[0]);
	} else {
		uint32_t c = saving ? 2 : (w % 2 == 0 && w >= 4 ? 2 : 1);
		uint32_t rows = w / c;
		split(gshape[l][0], rows, rank / c, &off[0], &len[0]);
		split(gshape[l][1], c, rank % c, &off[1], &len[1]);
	}
}

static uint64_t box_n(int l, const uint64_t *len)
{
	return gndim[l] == 1 ? len[0] : len[0] * len[1];
}

static uint64_t global_index(int l, const uint64_t *off, const uint64_t *len, uint64_t i)
{
	if (gndim[l] == 1)
		return off[0] + i;
	uint64_t r = i / len[1], c = i % len[1];
	return (off[0] + r) * gshape[l][1] + off[1] + c;
}

struct rank_view {
	ckpt_client *c;
	ckpt_buffer *b;
	ckpt_tensor t[NLAYOUT];
	uint64_t off[NLAYOUT][2], len[NLAYOUT][2];
};

static void view_open(struct rank_view *v, const char *job, uint32_t w, uint32_t rank, bool saving, const char *attempt)
{
	memset(v, 0, sizeof(*v));
	ckpt_hello h = { .job = job, .rank = rank, .world_size = w, .attempt_id = attempt };
	int r = ckpt_connect(D.sock, &h, &v->c);
	if (r < 0)
		fail_msg("connect: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	uint64_t total = 0;
	for (int l = 0; l < NLAYOUT; l++) {
		box_for(l, w, rank, saving, v->off[l], v->len[l]);
		total += box_n(l, v->len[l]) * 4;
	}
	assert_int_equal(ckpt_buffer_alloc(v->c, total ? total : 4, &v->b), 0);
	uint64_t at = 0;
	for (int l = 0; l < NLAYOUT; l++) {
		uint64_t nb = box_n(l, v->len[l]) * 4;
		v->t[l] = (ckpt_tensor){ .name = lname[l],
					 .dtype = CKPT_I32,
					 .ndim = gndim[l],
					 .global_shape = gshape[l],
					 .box_offsets = v->off[l],
					 .box_lengths = v->len[l],
					 .buffer = v->b,
					 .offset = at,
					 .nbytes = nb };
		at += nb;
	}
}

static void view_close(struct rank_view *v)
{
	ckpt_buffer_free(v->b);
	ckpt_close(v->c);
}

static void save_world4(const char *job, uint64_t step)
{
	struct rank_view v[4];
	ckpt_future *f[4];
	for (uint32_t r = 0; r < 4; r++) {
		view_open(&v[r], job, 4, r, true, "s4");
		uint32_t *p = ckpt_buffer_data(v[r].b);
		for (int l = 0; l < NLAYOUT; l++) {
			uint32_t *q = (uint32_t *)((uint8_t *)p + v[r].t[l].offset);
			for (uint64_t i = 0; i < box_n(l, v[r].len[l]); i++)
				q[i] = value(l, global_index(l, v[r].off[l], v[r].len[l], i));
		}
		assert_int_equal(ckpt_save(v[r].c, step, v[r].t, NLAYOUT, NULL, 0, &f[r]), 0);
	}
	for (uint32_t r = 0; r < 4; r++) {
		int rc = ckpt_future_wait(f[r], CKPT_DURABLE, 60000);
		if (rc != 0)
			fail_msg("save rank %u: %s", r, ckpt_future_message(f[r]));
		ckpt_future_free(f[r]);
		view_close(&v[r]);
	}
}

/* Load at world size w, assemble every rank's boxes into full tensors and
 * compare them byte for byte with the originals. Returns the sources seen
 * ("memory", "storage" or "mixed" of the first rank). */
static void load_world(const char *job, uint32_t w, char *source, size_t srclen)
{
	uint32_t *full[NLAYOUT];
	uint8_t *seen[NLAYOUT];
	for (int l = 0; l < NLAYOUT; l++) {
		full[l] = calloc(nelem(l), 4);
		seen[l] = calloc(nelem(l), 1);
		assert_non_null(full[l]);
		assert_non_null(seen[l]);
	}
	for (uint32_t r = 0; r < w; r++) {
		struct rank_view v;
		view_open(&v, job, w, r, false, "load");
		memset(ckpt_buffer_data(v.b), 0xAB, ckpt_buffer_size(v.b));
		ckpt_future *f = NULL;
		assert_int_equal(ckpt_load(v.c, CKPT_LATEST, v.t, NLAYOUT, &f), 0);
		int rc = ckpt_future_wait(f, CKPT_LOADED, 60000);
		if (rc != 0)
			fail_msg("load at world %u rank %u: %s", w, r, ckpt_future_message(f));
		if (r == 0)
			snprintf(source, srclen, "%s", ckpt_future_source(f));
		ckpt_future_free(f);
		uint8_t *p = ckpt_buffer_data(v.b);
		for (int l = 0; l < NLAYOUT; l++) {
			uint32_t *q = (uint32_t *)(p + v.t[l].offset);
			for (uint64_t i = 0; i < box_n(l, v.len[l]); i++) {
				uint64_t g = global_index(l, v.off[l], v.len[l], i);
				full[l][g] = q[i];
				seen[l][g]++;
			}
		}
		view_close(&v);
	}
	for (int l = 0; l < NLAYOUT; l++) {
		uint32_t *want = malloc(nelem(l) * 4);
		assert_non_null(want);
		for (uint64_t g = 0; g < nelem(l); g++) {
			want[g] = value(l, g);
			if (seen[l][g] != 1)
				fail_msg("%s element %llu loaded %u times at world %u", lname[l], (unsigned long long)g,
					 seen[l][g], w);
		}
		if (memcmp(full[l], want, nelem(l) * 4) != 0)
			fail_msg("%s differs from the original at world %u", lname[l], w);
		free(want);
		free(full[l]);
		free(seen[l]);
	}
}

static int group_setup(void **state)
{
	(void)state;
	h_init(&D);
	h_start(&D, "[job.gcjob]\nkeep_last = 2\nkeep_every = 10\n[job.grace]\nincomplete_grace = 1s\n");
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	h_cleanup(&D);
	return 0;
}

static void test_reshard_from_memory_and_storage(void **state)
{
	(void)state;
	save_world4("rs", 1);
	static const uint32_t worlds[] = { 1, 2, 3, 8 };
	char src[16];
	for (size_t i = 0; i < 4; i++) {
		load_world("rs", worlds[i], src, sizeof(src));
		assert_string_equal(src, "memory");
	}
	/* Restart: nothing in memory, everything from storage. */
	assert_int_equal(h_stop(&D), 0);
	h_start(&D, "[job.gcjob]\nkeep_last = 2\nkeep_every = 10\n[job.grace]\nincomplete_grace = 1s\n");
	for (size_t i = 0; i < 4; i++) {
		load_world("rs", worlds[i], src, sizeof(src));
		assert_string_equal(src, "storage");
	}
}

/* Load one tensor with the given shape/dtype/box; return the status and
 * copy the message. */
static int load_one(const char *job, int64_t step, const char *name, int dtype, uint32_t ndim, const uint64_t *shape,
		    const uint64_t *off, const uint64_t *len, char *msg, size_t msglen)
{
	ckpt_hello h = { .job = job, .rank = 1, .world_size = 2, .attempt_id = "e" };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
	uint64_t n = 1;
	for (uint32_t i = 0; i < ndim; i++)
		n *= len ? len[i] : shape[i];
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, n * 4, &b), 0);
	ckpt_tensor t = { .name = name,
			  .dtype = dtype,
			  .ndim = ndim,
			  .global_shape = shape,
			  .box_offsets = off,
			  .box_lengths = len,
			  .buffer = b,
			  .nbytes = n * 4 };
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_load(c, step, &t, 1, &f), 0);
	int r = ckpt_future_wait(f, CKPT_LOADED, 60000);
	snprintf(msg, msglen, "%s", ckpt_future_message(f));
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);
	return r;
}

static void test_planner_errors(void **state)
{
	(void)state;
	char msg[512];
	/* Unknown tensor. */
	assert_int_equal(load_one("rs", CKPT_LATEST, "nope", CKPT_I32, 1, gshape[L_FLAT], NULL, NULL, msg, sizeof(msg)),
			 -ENOENT);
	assert_non_null(strstr(msg, "'nope'"));
	assert_non_null(strstr(msg, "rank 1"));
	/* Shape mismatch. */
	static const uint64_t wrong[2] = { 37, 6 };
	assert_int_equal(load_one("rs", CKPT_LATEST, "row", CKPT_I32, 2, wrong, NULL, NULL, msg, sizeof(msg)), -EINVAL);
	assert_non_null(strstr(msg, "'row'"));
	assert_non_null(strstr(msg, "shape"));
	/* Dtype mismatch. */
	assert_int_equal(load_one("rs", CKPT_LATEST, "row", CKPT_F32, 2, gshape[L_ROW], NULL, NULL, msg, sizeof(msg)),
			 -EINVAL);
	assert_non_null(strstr(msg, "dtype"));
	/* Incomplete step: only rank 0 of world 2 saved step 5. */
	{
		ckpt_hello h = { .job = "rs", .rank = 0, .world_size = 2, .attempt_id = "inc" };
		ckpt_client *c = NULL;
		assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
		ckpt_buffer *b = NULL;
		assert_int_equal(ckpt_buffer_alloc(c, 91 * 4, &b), 0);
		ckpt_tensor t = { .name = "flat",
				  .dtype = CKPT_I32,
				  .ndim = 1,
				  .global_shape = gshape[L_FLAT],
				  .buffer = b,
				  .nbytes = 91 * 4 };
		ckpt_future *f = NULL;
		assert_int_equal(ckpt_save(c, 5, &t, 1, NULL, 0, &f), 0);
		assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 60000), 0);
		ckpt_future_free(f);
		ckpt_buffer_free(b);
		ckpt_close(c);
	}
	assert_int_equal(load_one("rs", 5, "flat", CKPT_I32, 1, gshape[L_FLAT], NULL, NULL, msg, sizeof(msg)), -ENOENT);
	assert_non_null(strstr(msg, "not complete"));
	/* Incomplete coverage: a complete step whose ranks saved only part
	 * of "part" (rows [0,2) and [4,6) of [8]). */
	static const uint64_t pshape[1] = { 8 };
	for (uint32_t r = 0; r < 2; r++) {
		ckpt_hello h = { .job = "cov", .rank = r, .world_size = 2, .attempt_id = "c" };
		ckpt_client *c = NULL;
		assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
		ckpt_buffer *b = NULL;
		assert_int_equal(ckpt_buffer_alloc(c, 2 * 4, &b), 0);
		uint64_t off[1] = { r * 4 }, len[1] = { 2 };
		ckpt_tensor t = { .name = "part",
				  .dtype = CKPT_I32,
				  .ndim = 1,
				  .global_shape = pshape,
				  .box_offsets = off,
				  .box_lengths = len,
				  .buffer = b,
				  .nbytes = 8 };
		ckpt_future *f = NULL;
		assert_int_equal(ckpt_save(c, 1, &t, 1, NULL, 0, &f), 0);
		assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 60000), 0);
		ckpt_future_free(f);
		ckpt_buffer_free(b);
		ckpt_close(c);
	}
	assert_int_equal(load_one("cov", CKPT_LATEST, "part", CKPT_I32, 1, pshape, NULL, NULL, msg, sizeof(msg)),
			 -ENOENT);
	assert_non_null(strstr(msg, "'part'"));
	assert_non_null(strstr(msg, "covers only part"));
	assert_non_null(strstr(msg, "rank 1"));
	/* ... while a box inside what was saved loads fine. */
	uint64_t off[1] = { 4 }, len[1] = { 2 };
	assert_int_equal(load_one("cov", CKPT_LATEST, "part", CKPT_I32, 1, pshape, off, len, msg, sizeof(msg)), 0);
}

/* Run ckptctl; return its exit status, output (stdout) in out. */
static int ctl_run(const char *args, char *out, size_t outlen)
{
	return h_ctl(&D, args, false, out, outlen);
}

static void save_steps(const char *job, uint64_t from, uint64_t to)
{
	ckpt_hello h = { .job = job, .rank = 0, .world_size = 1, .attempt_id = "g" };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, 4096, &b), 0);
	uint64_t shape[1] = { 4096 };
	ckpt_tensor t = { .name = "w", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = b, .nbytes = 4096 };
	for (uint64_t s = from; s <= to; s++) {
		ckpt_future *f = NULL;
		assert_int_equal(ckpt_save(c, s, &t, 1, NULL, 0, &f), 0);
		assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 60000), 0);
		ckpt_future_free(f);
	}
	ckpt_buffer_free(b);
	ckpt_close(c);
}

static void steps_of(const char *job, uint64_t *out, size_t *n)
{
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(D.sock, NULL, &c), 0);
	ckpt_step_info *v = NULL;
	size_t k = 0;
	assert_int_equal(ckpt_list(c, job, &v, &k), 0);
	for (size_t i = 0; i < k; i++)
		out[i] = v[i].step;
	*n = k;
	free(v);
	ckpt_close(c);
}

/* First in the group, on the empty store: ls of every job says nothing
 * is there and exits 0; ls of a job with no steps (a mistyped name, most
 * often) says so on stderr and exits 1, with --json an empty array. */
static void test_ctl_ls_empty(void **state)
{
	(void)state;
	static char out[1 << 16];
	assert_int_equal(ctl_run("ls", out, sizeof(out)), 0);
	assert_int_equal(ctl_run("ls --json", out, sizeof(out)), 0);
	json_object *a = json_tokener_parse(out);
	assert_non_null(a);
	assert_int_equal(json_object_array_length(a), 0);
	json_object_put(a);
	assert_int_equal(ctl_run("ls nosuchjob 2>&1", out, sizeof(out)), 1);
	assert_non_null(strstr(out, "ckptctl: job 'nosuchjob' has no steps (ckptctl ls lists every job)"));
	assert_null(strstr(out, "STEP")); /* no header without rows */
	assert_int_equal(ctl_run("ls --json nosuchjob 2>/dev/null", out, sizeof(out)), 1);
	a = json_tokener_parse(out);
	assert_non_null(a);
	assert_int_equal(json_object_array_length(a), 0);
	json_object_put(a);
}

static void test_show_and_verify(void **state)
{
	(void)state;
	static char out[1 << 16];
	assert_int_equal(ctl_run("show --json rs 1", out, sizeof(out)), 0);
	json_object *o = json_tokener_parse(out), *v;
	assert_non_null(o);
	assert_true(json_object_object_get_ex(o, "tensors", &v));
	assert_int_equal(json_object_array_length(v), 4 * NLAYOUT);
	json_object *t0 = json_object_array_get_idx(v, 0), *x;
	assert_true(json_object_object_get_ex(t0, "dtype", &x));
	assert_string_equal(json_object_get_string(x), "i32");
	assert_true(json_object_object_get_ex(t0, "box_lengths", &x));
	json_object_put(o);

	assert_int_equal(ctl_run("verify rs 1", out, sizeof(out)), 0);
	assert_non_null(strstr(out, "OK"));
	/* Flip one byte inside "block" of rank 2's shard. */
	char path[600], dir[600];
	snprintf(dir, sizeof(dir), "%s/rs/step-000000000001", D.store);
	h_rank_object(dir, 2, 4, "shard", path, sizeof(path));
	FILE *f = fopen(path, "r+b");
	assert_non_null(f);
	/* row (10 rows x 5 x 4 = 200 B) and flat (23 x 4 = 92 B) come first,
	 * each 64-aligned: block starts at 320. */
	assert_int_equal(fseek(f, 330, SEEK_SET), 0);
	int ch = fgetc(f);
	assert_int_equal(fseek(f, 330, SEEK_SET), 0);
	fputc(ch ^ 0x10, f);
	fclose(f);
	assert_int_equal(ctl_run("verify --json rs 1", out, sizeof(out)), 1);
	o = json_tokener_parse(out);
	assert_non_null(o);
	assert_true(json_object_object_get_ex(o, "ok", &v));
	assert_false(json_object_get_boolean(v));
	assert_true(json_object_object_get_ex(o, "problems", &v));
	bool named = false;
	for (size_t i = 0; i < json_object_array_length(v); i++) {
		const char *p = json_object_get_string(json_object_array_get_idx(v, i));
		if (strstr(p, "rank 2") && strstr(p, "'block'"))
			named = true;
	}
	assert_true(named);
	json_object_put(o);
	/* Restore the byte; verify passes again. */
	f = fopen(path, "r+b");
	assert_non_null(f);
	assert_int_equal(fseek(f, 330, SEEK_SET), 0);
	fputc(ch, f);
	fclose(f);
	assert_int_equal(ctl_run("verify rs 1", out, sizeof(out)), 0);
	/* Errors exit non-zero. */
	assert_int_equal(ctl_run("verify rs 999 2>/dev/null", out, sizeof(out)), 1);
	assert_int_equal(ctl_run("show nosuchjob 1 2>/dev/null", out, sizeof(out)), 1);
}

/* ckptctl show keeps its columns in line whatever the names: Lightning's
 * callback state keys run past any fixed width. The name comes last and
 * starts under "TENSOR" in every row, each dtype under "DTYPE", and the
 * columns before the name are as wide as their widest entry (a 4-D shape
 * included). */
static void test_ctl_show_long_names(void **state)
{
	(void)state;
	static const char *const names[] = {
		"callbacks/ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 8, "
		"'every_n_epochs': 0, 'train_time_interval': None}/best_model_path",
		"w",
		"gr\xc3\xb6\xc3\x9f" /* ß, then e */ "e/\xc3\xa4",
		"layers.0.attention.wq.weight",
	};
	enum {
		NT = sizeof(names) / sizeof(names[0])
	};
	ckpt_hello h = { .job = "longnames", .rank = 0, .world_size = 1, .attempt_id = "g" };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, 4096 * NT, &b), 0);
	uint64_t shape[NT][4] = { { 1 }, { 4096 }, { 2, 2048 }, { 4, 4, 4, 64 } };
	uint32_t ndim[NT] = { 1, 1, 2, 4 };
	uint64_t nbytes[NT] = { 1, 4096, 4096, 4096 };
	ckpt_tensor t[NT];
	for (size_t i = 0; i < NT; i++)
		t[i] = (ckpt_tensor){ .name = names[i],
				      .dtype = CKPT_U8,
				      .ndim = ndim[i],
				      .global_shape = shape[i],
				      .buffer = b,
				      .offset = 4096 * i,
				      .nbytes = nbytes[i] };
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, 1, t, NT, NULL, 0, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 60000), 0);
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);

	static char out[1 << 16];
	assert_int_equal(ctl_run("show longnames 1", out, sizeof(out)), 0);
	char *line = strchr(out, '\n'); /* past "longnames step 1: ..." */
	assert_non_null(line);
	line++;
	const char *dt = strstr(line, "DTYPE"), *tn = strstr(line, "TENSOR");
	assert_non_null(dt);
	assert_non_null(tn);
	assert_non_null(strstr(line, "[4,4,4,64] [0,0,0,0] [4,4,4,64]")); /* no column runs into the next */
	size_t dcol = (size_t)(dt - line), tcol = (size_t)(tn - line), rows = 0;
	bool seen[NT] = { false };
	for (char *nl; (nl = strchr(line, '\n')) != NULL; line = nl + 1, rows++) {
		*nl = '\0';
		if ((size_t)(nl - line) <= tcol || line[tcol - 1] != ' ' || line[tcol] == ' ')
			fail_msg("row %zu: no name starting at column %zu: %s", rows, tcol, line);
		if (strncmp(line + dcol, rows ? "u8 " : "DTYPE", rows ? 3 : 5) != 0)
			fail_msg("row %zu: no dtype at column %zu: %s", rows, dcol, line);
		for (size_t i = 0; i < NT && rows; i++)
			seen[i] |= strcmp(line + tcol, names[i]) == 0;
	}
	assert_int_equal(rows, 1 + NT);
	for (size_t i = 0; i < NT; i++)
		if (!seen[i])
			fail_msg("no row names '%s' whole at column %zu", names[i], tcol);
}

/* ckptctl ls marks each job's latest complete step (not a higher incomplete
 * one) and gives the time saved and the age; show and verify take
 * "latest" for that step; verify checks every rank, one or several at
 * once, with the same result; options go before or after the command, and
 * bad ones exit 2. */
static void test_ctl_ls_and_parallel_verify(void **state)
{
	(void)state;
	static char out[1 << 16];
	save_steps("lsj", 1, 3);
	/* Step 4: rank 0 of 2 only, so incomplete. */
	ckpt_hello h = { .job = "lsj", .rank = 0, .world_size = 2, .attempt_id = "g" };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, 4096, &b), 0);
	uint64_t shape[1] = { 8192 }, off[1] = { 0 }, len[1] = { 4096 };
	ckpt_tensor t = { .name = "w",
			  .dtype = CKPT_U8,
			  .ndim = 1,
			  .global_shape = shape,
			  .box_offsets = off,
			  .box_lengths = len,
			  .buffer = b,
			  .nbytes = 4096 };
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, 4, &t, 1, NULL, 0, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 60000), 0);
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);

	assert_int_equal(ctl_run("ls lsj --json", out, sizeof(out)), 0); /* an option after the command */
	json_object *a = json_tokener_parse(out);
	assert_non_null(a);
	assert_int_equal(json_object_array_length(a), 4);
	time_t now = time(NULL);
	for (size_t i = 0; i < 4; i++) {
		json_object *e = json_object_array_get_idx(a, i), *v;
		assert_true(json_object_object_get_ex(e, "step", &v));
		uint64_t step = (uint64_t)json_object_get_int64(v);
		assert_true(json_object_object_get_ex(e, "latest", &v));
		if (json_object_get_boolean(v) != (step == 3))
			fail_msg("step %" PRIu64 ": latest is %d", step, json_object_get_boolean(v));
		assert_true(json_object_object_get_ex(e, "saved_unix_ns", &v));
		int64_t saved = json_object_get_int64(v) / 1000000000;
		assert_true(saved > now - 600 && saved <= now + 5);
		assert_true(json_object_object_get_ex(e, "age_s", &v));
		assert_true(json_object_get_int64(v) >= 0 && json_object_get_int64(v) < 600);
		assert_true(json_object_object_get_ex(e, "saved", &v));
		assert_int_equal(strlen(json_object_get_string(v)), 19);
	}
	json_object_put(a);
	assert_int_equal(ctl_run("ls lsj", out, sizeof(out)), 0);
	assert_non_null(strstr(out, "SAVED (UTC)"));
	assert_non_null(strstr(out, " 3* "));
	assert_null(strstr(out, " 4* "));
	assert_null(strstr(out, " 2* "));
	assert_int_equal(ctl_run("ls lsx 2>&1", out, sizeof(out)), 1); /* not a prefix match */
	assert_non_null(strstr(out, "job 'lsx' has no steps"));
	/* STEP "latest": the step a restore of latest loads (3, not the
	 * incomplete 4), said on stderr; stdout as for the number. */
	assert_int_equal(ctl_run("show lsj latest 2>&1", out, sizeof(out)), 0);
	assert_non_null(strstr(out, "lsj latest: step 3 "));
	assert_non_null(strstr(out, "lsj step 3: complete"));
	assert_int_equal(ctl_run("show --json lsj latest 2>/dev/null", out, sizeof(out)), 0);
	a = json_tokener_parse(out);
	assert_non_null(a);
	json_object *jv;
	assert_true(json_object_object_get_ex(a, "step", &jv));
	assert_int_equal(json_object_get_int64(jv), 3);
	json_object_put(a);
	assert_int_equal(ctl_run("verify lsj latest 2>&1", out, sizeof(out)), 0);
	assert_non_null(strstr(out, "lsj latest: step 3 "));
	assert_non_null(strstr(out, "lsj step 3: OK"));
	assert_int_equal(ctl_run("show lsj 2", out, sizeof(out)), 0); /* numbers as before */
	assert_non_null(strstr(out, "lsj step 2: complete"));
	/* A job without a complete step: the daemon's reason, exit 1. */
	assert_int_equal(ctl_run("show nosuchjob latest 2>&1", out, sizeof(out)), 1);
	assert_non_null(strstr(out, "show nosuchjob latest"));
	assert_non_null(strstr(out, "job 'nosuchjob' has no complete step"));
	assert_int_equal(ctl_run("verify nosuchjob latest 2>&1", out, sizeof(out)), 1);
	assert_non_null(strstr(out, "has no complete step"));
	assert_int_equal(ctl_run("show lsj newest 2>&1", out, sizeof(out)), 2);
	assert_non_null(strstr(out, "'newest' is not a step number (nor 'latest')"));
	assert_int_equal(ctl_run("rm lsj latest 2>/dev/null", out, sizeof(out)), 2); /* rm: numbers only */
	/* resolve takes it too, as it takes no step at all. */
	assert_int_equal(ctl_run("resolve lsj latest", out, sizeof(out)), 0);
	assert_non_null(strstr(out, "lsj step 3 attempt g"));

	/* rs step 1 has 4 ranks: one at a time and four at once agree. */
	uint64_t bytes[2];
	for (int k = 0; k < 2; k++) {
		assert_int_equal(
			ctl_run(k ? "--jobs 4 verify --json rs 1" : "-j 1 verify --json rs 1", out, sizeof(out)), 0);
		json_object *o = json_tokener_parse(out), *v;
		assert_non_null(o);
		assert_true(json_object_object_get_ex(o, "ok", &v) && json_object_get_boolean(v));
		assert_true(json_object_object_get_ex(o, "ranks_checked", &v));
		assert_int_equal(json_object_get_int64(v), 4);
		assert_true(json_object_object_get_ex(o, "bytes_checked", &v));
		bytes[k] = (uint64_t)json_object_get_int64(v);
		json_object_put(o);
	}
	assert_true(bytes[0] > 0 && bytes[0] == bytes[1]);
	/* The incomplete step: rank 0 checked, and its incompleteness named. */
	assert_int_equal(ctl_run("verify lsj 4", out, sizeof(out)), 1);
	assert_non_null(strstr(out, "step is not complete: 1 of 2 ranks"));
	assert_non_null(strstr(out, "1 of 2 ranks"));
	/* A format 1 step (manifest names without the attempt): every rank is
	 * found by its old name, and the step verifies. */
	save_steps("leg", 1, 1);
	char from[1024], to[1024], commit[1024];
	snprintf(from, sizeof(from), "%s/leg/step-000000000001/rank-00000-of-00001.g.manifest", D.store);
	snprintf(to, sizeof(to), "%s/leg/step-000000000001/rank-00000-of-00001.manifest", D.store);
	snprintf(commit, sizeof(commit), "%s/leg/step-000000000001/commit", D.store);
	assert_int_equal(rename(from, to), 0);
	(void)unlink(commit);
	assert_int_equal(ctl_run("verify leg 1", out, sizeof(out)), 0);
	assert_non_null(strstr(out, "OK"));
	assert_non_null(strstr(out, "1 of 1 ranks"));
	/* Bad options and arguments: exit 2. */
	assert_int_equal(ctl_run("--bogus ls 2>/dev/null", out, sizeof(out)), 2);
	assert_int_equal(ctl_run("-j 0 verify rs 1 2>/dev/null", out, sizeof(out)), 2);
	assert_int_equal(ctl_run("verify rs 2>/dev/null", out, sizeof(out)), 2);
	assert_int_equal(ctl_run("--dry-run ls 2>/dev/null", out, sizeof(out)), 2);
	assert_int_equal(ctl_run("frobnicate 2>/dev/null", out, sizeof(out)), 2);
	assert_int_equal(ctl_run("--version", out, sizeof(out)), 0);
	assert_non_null(strstr(out, "ckptctl "));
}

static void test_retention_after_durable(void **state)
{
	(void)state;
	/* gcjob: keep_last 2, keep_every 10. GC runs after each durable step. */
	save_steps("gcjob", 7, 13);
	uint64_t s[32];
	size_t n = 0;
	for (int i = 0; i < 100; i++) { /* gc runs in the background */
		steps_of("gcjob", s, &n);
		if (n == 3)
			break;
		usleep(50 * 1000);
	}
	assert_int_equal(n, 3);
	assert_int_equal(s[0], 10);
	assert_int_equal(s[1], 12);
	assert_int_equal(s[2], 13);
}

/* More jobs finish a step while a retention pass runs (slowed to 3 s by
 * [debug] gc_delay_ms) than a fixed list of 16 held: every job's retention
 * still runs, none waits for its next step. */
static void test_retention_of_many_jobs_waiting_for_a_pass(void **state)
{
	(void)state;
	const char *group = "[job.gcjob]\nkeep_last = 2\nkeep_every = 10\n[job.grace]\nincomplete_grace = 1s\n";
	assert_int_equal(h_stop(&D), 0);
	h_start(&D, "[retention]\nkeep_last = 1\n[debug]\ngc_delay_ms = 3000\n");
	save_steps("many-first", 1, 1); /* a pass starts, and sleeps */
	char job[32];
	for (int j = 0; j < 24; j++) {
		snprintf(job, sizeof(job), "many%02d", j);
		save_steps(job, 1, 2);
	}
	for (int j = 0; j < 24; j++) {
		snprintf(job, sizeof(job), "many%02d", j);
		uint64_t s[8];
		size_t n = 0;
		for (int i = 0; i < 300; i++) { /* the passes run in the background */
			steps_of(job, s, &n);
			if (n == 1)
				break;
			usleep(50 * 1000);
		}
		assert_int_equal(n, 1);
		assert_int_equal(s[0], 2);
	}
	assert_int_equal(h_stop(&D), 0);
	h_start(&D, group);
}

static void test_gc_dry_run_and_rm(void **state)
{
	(void)state;
	static char out[1 << 16];
	/* A job without a policy: gc removes nothing. */
	save_steps("keepall", 1, 3);
	assert_int_equal(ctl_run("gc --json keepall", out, sizeof(out)), 0);
	json_object *o = json_tokener_parse(out), *v;
	assert_non_null(o);
	assert_true(json_object_object_get_ex(o, "removed", &v));
	assert_int_equal(json_object_array_length(v), 0);
	json_object_put(o);
	/* grace: incomplete steps older than 1 s go, but not before. */
	{
		ckpt_hello h = { .job = "grace", .rank = 0, .world_size = 2, .attempt_id = "g" };
		ckpt_client *c = NULL;
		assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
		ckpt_buffer *b = NULL;
		assert_int_equal(ckpt_buffer_alloc(c, 64, &b), 0);
		uint64_t shape[1] = { 64 };
		ckpt_tensor t = {
			.name = "w", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = b, .nbytes = 64
		};
		ckpt_future *f = NULL;
		assert_int_equal(ckpt_save(c, 4, &t, 1, NULL, 0, &f), 0);
		assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 60000), 0);
		ckpt_future_free(f);
		ckpt_buffer_free(b);
		ckpt_close(c);
	}
	/* Step 5 completes (both ranks): step 4, older and incomplete, may go
	 * once past its grace; a newer incomplete step never would. */
	for (uint32_t r = 0; r < 2; r++) {
		ckpt_hello h = { .job = "grace", .rank = r, .world_size = 2, .attempt_id = "g" };
		ckpt_client *c = NULL;
		assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
		ckpt_buffer *b = NULL;
		assert_int_equal(ckpt_buffer_alloc(c, 64, &b), 0);
		uint64_t shape[1] = { 64 };
		ckpt_tensor t = {
			.name = "w", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = b, .nbytes = 64
		};
		ckpt_future *f = NULL;
		assert_int_equal(ckpt_save(c, 5, &t, 1, NULL, 0, &f), 0);
		assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 60000), 0);
		ckpt_future_free(f);
		ckpt_buffer_free(b);
		ckpt_close(c);
	}
	assert_int_equal(ctl_run("gc --dry-run --json grace", out, sizeof(out)), 0);
	o = json_tokener_parse(out);
	assert_true(json_object_object_get_ex(o, "removed", &v));
	assert_int_equal(json_object_array_length(v), 0);
	json_object_put(o);
	sleep(2);
	assert_int_equal(ctl_run("gc --dry-run --json grace", out, sizeof(out)), 0);
	o = json_tokener_parse(out);
	assert_true(json_object_object_get_ex(o, "removed", &v));
	assert_int_equal(json_object_array_length(v), 1);
	json_object_put(o);
	uint64_t s[8];
	size_t n = 0;
	steps_of("grace", s, &n);
	assert_int_equal(n, 2); /* dry run removed nothing */
	assert_int_equal(ctl_run("gc grace", out, sizeof(out)), 0);
	assert_non_null(strstr(out, "removed grace step 4"));
	steps_of("grace", s, &n);
	assert_int_equal(n, 1);
	assert_int_equal(s[0], 5);
	/* rm */
	assert_int_equal(ctl_run("rm --json keepall 2", out, sizeof(out)), 0);
	steps_of("keepall", s, &n);
	assert_int_equal(n, 2);
	assert_int_equal(s[0], 1);
	assert_int_equal(s[1], 3);
	assert_int_equal(ctl_run("rm keepall 2 2>/dev/null", out, sizeof(out)), 1);
}

/* A save of a step in flight on another node while retention removes
 * that step's old, incomplete attempt (past incomplete_grace, an hour
 * here, which is also the job's in-flight window): the pass takes the old
 * attempt and leaves the new one (incomplete, younger than the window:
 * removal.c), marking the step; once the new one is old (its save died),
 * a later pass takes it. */
static void test_retention_leaves_a_save_in_flight(void **state)
{
	(void)state;
	static char out[1 << 16];
	const char *group = "[job.gcjob]\nkeep_last = 2\nkeep_every = 10\n[job.grace]\nincomplete_grace = 1s\n";
	char conf[512], dir[600];
	snprintf(conf, sizeof(conf), "%s[job.flight]\nincomplete_grace = 1h\n", group);
	assert_int_equal(h_stop(&D), 0);
	h_start(&D, conf);
	snprintf(dir, sizeof(dir), "%s/flight/step-000000000008", D.store);
	assert_int_equal(h_sh("mkdir -p '%s' && echo m > '%s/rank-00000-of-00002.old.manifest' && "
			      "touch -d '-2 hours' '%s/rank-00000-of-00002.old.manifest' && "
			      "echo s > '%s/rank-00001-of-00002.new.00000000000000aa.shard'",
			      dir, dir, dir, dir),
			 0);
	save_steps("flight", 9, 9); /* complete and newer: step 8 may go */
	assert_int_equal(ctl_run("gc flight 2>&1", out, sizeof(out)), 0);
	/* The pass after step 9's durable may hold the step (this gc then
	 * passed it over): wait for it. */
	for (int i = 0; i < 200 && h_sh("test -e '%s/removal-pending'", dir) != 0; i++)
		usleep(25000);
	assert_int_equal(h_sh("test ! -e '%s/rank-00000-of-00002.old.manifest'", dir), 0);
	assert_int_equal(h_sh("test -e '%s/rank-00001-of-00002.new.00000000000000aa.shard'", dir), 0);
	assert_int_equal(h_sh("test -e '%s/removal-pending' && test -e '%s/dead.old'", dir, dir), 0);
	assert_int_equal(ctl_run("gc flight 2>&1", out, sizeof(out)), 0);
	assert_int_equal(h_sh("test -e '%s/rank-00001-of-00002.new.00000000000000aa.shard'", dir), 0);
	/* The save died: its shard grows old, and the next pass finishes. */
	assert_int_equal(h_sh("touch -d '-2 hours' '%s/rank-00001-of-00002.new.00000000000000aa.shard'", dir), 0);
	assert_int_equal(ctl_run("gc flight 2>&1", out, sizeof(out)), 0);
	assert_int_equal(h_sh("ls -A '%s' | grep -v '^dead\\.' | grep -q .", dir), 256); /* markers only */
	/* The dead saves' markers go once older than twice the window. */
	assert_int_equal(h_sh("touch -d '-3 hours' '%s'/dead.*", dir), 0);
	assert_int_equal(ctl_run("gc flight 2>&1", out, sizeof(out)), 0);
	assert_int_equal(access(dir, F_OK), -1);
	assert_int_equal(h_stop(&D), 0);
	h_start(&D, group);
}

/* References between steps (manifest.h REFS_DIR), as incremental saves
 * write them, before their manifests: retention keeps a step that a kept
 * step refers to (and what that one refers to in turn), and removes a
 * step's refs with it; rm refuses a step another refers to. */
static void ref(uint64_t from, uint64_t to)
{
	assert_int_equal(h_sh("mkdir -p '%s/refjob/refs/step-%012llu/step-%012llu' && "
			      "touch '%s/refjob/refs/step-%012llu/step-%012llu/rank-00000-of-00001.g'",
			      D.store, (unsigned long long)from, (unsigned long long)to, D.store,
			      (unsigned long long)from, (unsigned long long)to),
			 0);
}

static bool refs_dir_exists(uint64_t step)
{
	char p[600];
	snprintf(p, sizeof(p), "%s/refjob/refs/step-%012llu", D.store, (unsigned long long)step);
	return access(p, F_OK) == 0;
}

static void test_references_keep_steps(void **state)
{
	(void)state;
	static char out[1 << 16];
	const char *group = "[job.gcjob]\nkeep_last = 2\nkeep_every = 10\n[job.grace]\nincomplete_grace = 1s\n";
	char conf[512];
	snprintf(conf, sizeof(conf), "%s[job.refjob]\nkeep_last = 1\n", group);
	assert_int_equal(h_stop(&D), 0);
	h_start(&D, conf);
	uint64_t s[8];
	size_t n = 0;
	save_steps("refjob", 1, 1);
	ref(2, 1); /* step 2 will keep bytes in step 1's shard */
	save_steps("refjob", 2, 2);
	assert_int_equal(ctl_run("gc refjob", out, sizeof(out)), 0);
	steps_of("refjob", s, &n);
	assert_int_equal(n, 2); /* keep_last 1, but 2 refers to 1 */
	/* Step 4 refers to 1 (a frozen base) and 3; 3 refers to 1 too. Only 3
	 * and 1 stay when 4 is the one kept... */
	ref(3, 1);
	save_steps("refjob", 3, 3);
	ref(4, 1);
	ref(4, 3);
	save_steps("refjob", 4, 4);
	assert_int_equal(ctl_run("gc refjob", out, sizeof(out)), 0);
	steps_of("refjob", s, &n);
	assert_int_equal(n, 3);
	assert_int_equal(s[0], 1);
	assert_int_equal(s[1], 3);
	assert_int_equal(s[2], 4);
	/* ...and step 2's refs went with it. */
	assert_false(refs_dir_exists(2));
	assert_true(refs_dir_exists(4));
	/* rm of a step another refers to: refused, naming the newest. */
	assert_int_equal(ctl_run("rm refjob 1 2>&1", out, sizeof(out)), 1);
	assert_non_null(strstr(out, "step 4 refers to"));
	assert_int_equal(ctl_run("rm refjob 3 2>&1", out, sizeof(out)), 1);
	/* Once the newest is gone, retention keeps what 3 (now newest) still
	 * refers to. */
	assert_int_equal(ctl_run("rm refjob 4", out, sizeof(out)), 0);
	assert_false(refs_dir_exists(4));
	assert_int_equal(ctl_run("gc refjob", out, sizeof(out)), 0);
	steps_of("refjob", s, &n);
	assert_int_equal(n, 2);
	assert_int_equal(ctl_run("rm refjob 3", out, sizeof(out)), 0);
	assert_int_equal(ctl_run("rm refjob 1", out, sizeof(out)), 0);
	steps_of("refjob", s, &n);
	assert_int_equal(n, 0);
	/* A save of step 7 in flight (its refs written, no manifest yet):
	 * retention after step 6 removes step 5's manifests, sees the refs,
	 * and keeps its shard (catalog_delete_step), so the save either
	 * finds the manifest gone or its bytes still there. */
	save_steps("refjob", 5, 5);
	ref(7, 5);
	save_steps("refjob", 6, 6);
	assert_int_equal(ctl_run("gc refjob", out, sizeof(out)), 0);
	char dir[600], path[700];
	snprintf(dir, sizeof(dir), "%s/refjob/step-000000000005", D.store);
	/* The pass after step 6's durable may still be at it (this gc then
	 * found the step locked): wait for the manifest to go. */
	for (int i = 0; i < 200 && h_sh("ls '%s' | grep -q manifest", dir) == 0; i++)
		usleep(25000);
	assert_int_equal(h_sh("ls '%s' | grep -q manifest", dir), 256); /* gone */
	h_rank_object(dir, 0, 1, "shard", path, sizeof(path));          /* still there */
	/* The save of 7 failed: rm of step 7 (no manifest) leaves its refs
	 * while they are young (a save of 7 may still be writing them:
	 * removal.c), and --force removes them; then step 5's shard can go. */
	assert_int_equal(ctl_run("rm refjob 7 2>&1", out, sizeof(out)), 1);
	assert_non_null(strstr(out, "a save may be writing it"));
	assert_true(refs_dir_exists(7));
	assert_int_equal(ctl_run("rm --force refjob 7", out, sizeof(out)), 0);
	assert_false(refs_dir_exists(7));
	/* Step 5's marker covers what is more than a second older than it
	 * (removal.c): here the save and its removal came within one. */
	assert_int_equal(h_sh("touch -d '-10 seconds' '%s'/*.shard", dir), 0);
	assert_int_equal(ctl_run("gc refjob", out, sizeof(out)), 0);
	assert_int_equal(access(dir, F_OK), -1);
	assert_int_equal(h_sh("rm -rf '%s/refjob'", D.store), 0);
	assert_int_equal(h_stop(&D), 0);
	h_start(&D, group);
}

static void test_example_restores_at_other_world_size(void **state)
{
	(void)state;
	const char *ex = getenv("CKPT_EXAMPLE_BIN");
	char cmd[2048];
	snprintf(cmd, sizeof(cmd),
		 "set -e; for r in 0 1 2 3; do '%s' --socket '%s' --job exw --world-size 4 --rank $r --steps 2 "
		 "--size-mb 4 --tensors 3 >/dev/null & done; wait; "
		 "for r in 0 1 2; do '%s' --socket '%s' --job exw --world-size 3 --rank $r --size-mb 4 --tensors 3 "
		 "--restore-only; done",
		 ex, D.sock, ex, D.sock);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	char out[8192];
	size_t n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	assert_int_equal(pclose(p), 0);
	int ok = 0;
	for (char *q = out; (q = strstr(q, "verified OK")) != NULL; q++)
		ok++;
	assert_int_equal(ok, 3);
}

/* Issue "Security": a FIFO planted as a manifest hung every `ckptctl ls`
 * (all workers blocked in open()) and kept an unrelated job's save from
 * becoming durable; a step directory replaced by a symbolic link made
 * `ckptctl rm` delete the link's target's files. Now the FIFO is an error
 * naming it, and the link is refused. */
static void test_planted_fifo_and_symlink(void **state)
{
	(void)state;
	static char out[1 << 16];
	char path[600], cmd[1024];
	save_steps("planted", 1, 1);
	snprintf(path, sizeof(path), "%s/planted/step-000000000002", D.store);
	assert_int_equal(mkdir(path, 0700), 0);
	snprintf(path, sizeof(path), "%s/planted/step-000000000002/rank-00000-of-00001.manifest", D.store);
	assert_int_equal(mkfifo(path, 0666), 0);
	/* More requests than worker threads, each bounded: none may hang. */
	for (int i = 0; i < 6; i++) {
		snprintf(cmd, sizeof(cmd), "timeout 20 '%s' --socket '%s' show planted 2 2>&1", getenv("CKPTCTL_BIN"),
			 D.sock);
		FILE *p = popen(cmd, "r");
		assert_non_null(p);
		size_t n = fread(out, 1, sizeof(out) - 1, p);
		out[n] = '\0';
		int st = pclose(p);
		assert_true(WIFEXITED(st));
		assert_int_not_equal(WEXITSTATUS(st), 124); /* timed out: hung */
		assert_int_not_equal(WEXITSTATUS(st), 0);
		assert_non_null(strstr(out, "not a regular file"));
		/* ls of the job fails too, loudly and naming the object: bad
		 * data from storage is never read as "missing". */
		assert_int_equal(ctl_run("ls planted 2>&1", out, sizeof(out)), 1);
		assert_non_null(strstr(out, "step-000000000002/rank-00000-of-00001.manifest is not a regular file"));
	}
	save_steps("unrelated", 1, 2); /* durable within save_steps' wait */

	/* A step directory that is a link to elsewhere: rm refuses, the
	 * target's files stay. */
	char outside[600], victim[700];
	snprintf(outside, sizeof(outside), "%s/outside", D.dir);
	assert_int_equal(mkdir(outside, 0700), 0);
	snprintf(victim, sizeof(victim), "%s/rank-00000-of-00001.manifest", outside);
	FILE *fp = fopen(victim, "w");
	assert_non_null(fp);
	fputs("precious", fp);
	fclose(fp);
	snprintf(path, sizeof(path), "%s/planted/step-000000000003", D.store);
	assert_int_equal(symlink(outside, path), 0);
	snprintf(cmd, sizeof(cmd), "rm planted 3 2>&1");
	assert_int_not_equal(ctl_run(cmd, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "symbolic link"));
	assert_int_equal(access(victim, F_OK), 0);
	/* The step that is real is still served and removable. */
	assert_int_equal(ctl_run("rm planted 1 2>&1", out, sizeof(out)), 0);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(unlink(victim), 0);
	assert_int_equal(rmdir(outside), 0);
}

static void read_file(const char *path, char *buf, size_t cap, size_t *len)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	*len = fread(buf, 1, cap, f);
	assert_true(*len > 0 && *len < cap);
	fclose(f);
}

static void write_file(const char *path, const void *buf, size_t len)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(buf, 1, len, f), len);
	fclose(f);
}

/* Load the latest step of job (rank 0 of 1, one 4096-byte tensor "w")
 * from storage; the status, the message in msg. */
static int load_latest_storage(const char *job, char *msg, size_t cap)
{
	ckpt_hello h = { .job = job, .rank = 0, .world_size = 1, .attempt_id = "g" };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, 4096, &b), 0);
	uint64_t shape[1] = { 4096 };
	ckpt_tensor t = { .name = "w", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = b, .nbytes = 4096 };
	ckpt_future *f = NULL;
	int r = ckpt_load_ex(c, CKPT_LATEST, &t, 1, CKPT_LOAD_STORAGE_ONLY, &f);
	if (r == 0) {
		r = ckpt_future_wait(f, CKPT_LOADED, 60000);
		snprintf(msg, cap, "step %" PRIu64 ": %s", ckpt_future_step(f), ckpt_future_message(f));
		ckpt_future_free(f);
	} else {
		snprintf(msg, cap, "%s", ckpt_errmsg());
	}
	ckpt_buffer_free(b);
	ckpt_close(c);
	return r;
}

/* Issue "Security": bad data from storage is an error naming the object,
 * never "missing". The newest step's manifest is replaced, in turn, by a
 * truncated copy, one with a flipped byte, another job's and another
 * step's; each load of latest fails with EBADMSG naming it, never taking
 * step 1; put back, step 2 loads again. */
static void test_planted_bad_manifests_fail_loudly(void **state)
{
	(void)state;
	save_steps("planted2", 1, 2);
	save_steps("otherjob", 2, 2);
	char dir[600], man[900], other[900], step1[900], msg[1024];
	snprintf(dir, sizeof(dir), "%s/planted2/step-000000000002", D.store);
	h_rank_object(dir, 0, 1, "manifest", man, sizeof(man));
	snprintf(dir, sizeof(dir), "%s/otherjob/step-000000000002", D.store);
	h_rank_object(dir, 0, 1, "manifest", other, sizeof(other));
	snprintf(dir, sizeof(dir), "%s/planted2/step-000000000001", D.store);
	h_rank_object(dir, 0, 1, "manifest", step1, sizeof(step1));
	static char good[1 << 16], bad[1 << 16];
	size_t n, on, sn;
	read_file(man, good, sizeof(good), &n);
	assert_int_equal(load_latest_storage("planted2", msg, sizeof(msg)), 0);
	const char *base = strrchr(man, '/') + 1;
	for (int kind = 0; kind < 4; kind++) {
		size_t len = n;
		memcpy(bad, good, n);
		if (kind == 0)
			len = n / 2; /* truncated */
		else if (kind == 1)
			bad[n / 2] ^= 0x20; /* a flipped byte: the CRC fails */
		else if (kind == 2)
			read_file(other, bad, sizeof(bad), &on), len = on; /* another job's */
		else
			read_file(step1, bad, sizeof(bad), &sn), len = sn; /* another step's */
		write_file(man, bad, len);
		int r = load_latest_storage("planted2", msg, sizeof(msg));
		if (r != -EBADMSG || strstr(msg, base) == NULL || strstr(msg, "step 1:") != NULL)
			fail_msg("bad manifest %d: load latest gave %d (%s); want EBADMSG naming %s", kind, r, msg,
				 base);
	}
	write_file(man, good, n);
	assert_int_equal(load_latest_storage("planted2", msg, sizeof(msg)), 0);
	assert_non_null(strstr(msg, "step 2:"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ctl_ls_empty),
		cmocka_unit_test(test_reshard_from_memory_and_storage),
		cmocka_unit_test(test_planner_errors),
		cmocka_unit_test(test_show_and_verify),
		cmocka_unit_test(test_ctl_ls_and_parallel_verify),
		cmocka_unit_test(test_ctl_show_long_names),
		cmocka_unit_test(test_retention_after_durable),
		cmocka_unit_test(test_retention_of_many_jobs_waiting_for_a_pass),
		cmocka_unit_test(test_gc_dry_run_and_rm),
		cmocka_unit_test(test_retention_leaves_a_save_in_flight),
		cmocka_unit_test(test_references_keep_steps),
		cmocka_unit_test(test_example_restores_at_other_world_size),
		cmocka_unit_test(test_planted_fifo_and_symlink),
		cmocka_unit_test(test_planted_bad_manifests_fail_loudly),
	};
	return cmocka_run_group_tests_name("catalog", tests, group_setup, group_teardown);
}
