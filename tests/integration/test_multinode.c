/* Several daemons on one machine stand for several nodes sharing one
 * storage directory: one job's ranks spread over them; completeness, the
 * commit pin, no-overwrite and restore across nodes; two attempts racing
 * for one step; 64 ranks of a job on one daemon with the default config. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "harness.h"

#define NODES 3
#define WORLD 6    /* 2 ranks per node */
#define ELEMS 1024 /* of "w" per rank */
#define JOB "mn"

static struct dctx N[NODES];
static const uint64_t W_SHAPE[1] = { WORLD * ELEMS };
static const uint64_t R_SHAPE[1] = { 16 };

static uint32_t value(uint64_t step, char attempt, uint64_t idx)
{
	uint64_t x = step * 0x9E3779B97F4A7C15ull ^ (uint64_t)attempt << 48 ^ idx;
	x ^= x >> 31;
	x *= 0xBF58476D1CE4E5B9ull;
	return (uint32_t)(x ^ x >> 29);
}

struct rank {
	uint64_t shape[1]; /* of "w": world * elems */
	ckpt_client *c;
	ckpt_buffer *b;
	uint64_t off[1], len[1];
	ckpt_tensor t[2];
	ckpt_future *f;
};

static void rank_open_at(struct rank *r, const char *sock, const char *job, uint32_t rank, uint32_t world,
			 const char *attempt, uint64_t elems)
{
	memset(r, 0, sizeof(*r));
	ckpt_hello h = { .job = job, .rank = rank, .world_size = world, .attempt_id = attempt };
	int e = ckpt_connect(sock, &h, &r->c);
	if (e < 0)
		fail_msg("connect to %s: %s (%s)", sock, ckpt_strerror(e), ckpt_errmsg());
	r->shape[0] = world * elems;
	r->off[0] = r->shape[0] * rank / world;
	r->len[0] = r->shape[0] * (rank + 1) / world - r->off[0];
	assert_int_equal(ckpt_buffer_alloc(r->c, r->len[0] * 4 + 64 + 64, &r->b), 0);
	r->t[0] = (ckpt_tensor){ .name = "w",
				 .dtype = CKPT_F32,
				 .ndim = 1,
				 .global_shape = r->shape,
				 .box_offsets = r->off,
				 .box_lengths = r->len,
				 .buffer = r->b,
				 .nbytes = r->len[0] * 4 };
	r->t[1] = (ckpt_tensor){ .name = "r",
				 .dtype = CKPT_F32,
				 .ndim = 1,
				 .global_shape = R_SHAPE,
				 .buffer = r->b,
				 .offset = (r->len[0] * 4 + 63) & ~63ull,
				 .nbytes = 64 };
}

static void rank_open(struct rank *r, int node, const char *job, uint32_t rank, uint32_t world, const char *attempt)
{
	rank_open_at(r, N[node].sock, job, rank, world, attempt, W_SHAPE[0] / world);
}

static void rank_fill(struct rank *r, uint64_t step, char attempt)
{
	uint32_t *p = ckpt_buffer_data(r->b);
	for (uint64_t i = 0; i < r->len[0]; i++)
		p[i] = value(step, attempt, r->off[0] + i);
	uint32_t *q = (uint32_t *)((uint8_t *)ckpt_buffer_data(r->b) + r->t[1].offset);
	for (uint64_t i = 0; i < 16; i++)
		q[i] = value(step, attempt, 1000000 + i);
}

static void rank_check(struct rank *r, uint64_t step, char attempt)
{
	const uint32_t *p = ckpt_buffer_data(r->b);
	for (uint64_t i = 0; i < r->len[0]; i++)
		if (p[i] != value(step, attempt, r->off[0] + i))
			fail_msg("w[%llu]: step %llu attempt %c expected", (unsigned long long)(r->off[0] + i),
				 (unsigned long long)step, attempt);
	const uint32_t *q = (const uint32_t *)((const uint8_t *)ckpt_buffer_data(r->b) + r->t[1].offset);
	for (uint64_t i = 0; i < 16; i++)
		assert_int_equal(q[i], value(step, attempt, 1000000 + i));
}

static void rank_close(struct rank *r)
{
	if (r->f)
		ckpt_future_free(r->f);
	ckpt_buffer_free(r->b);
	ckpt_close(r->c);
}

static void save_start(struct rank *r, uint64_t step, char attempt)
{
	rank_fill(r, step, attempt);
	int e = ckpt_save(r->c, step, r->t, 2, NULL, 0, &r->f);
	if (e < 0)
		fail_msg("save: %s (%s)", ckpt_strerror(e), ckpt_errmsg());
}

/* 0, or the save's failure (-errno). */
static int save_wait(struct rank *r)
{
	int e = ckpt_future_wait(r->f, CKPT_DURABLE, 60000);
	ckpt_future_free(r->f);
	r->f = NULL;
	return e;
}

static void load_check(struct rank *r, int64_t step, uint64_t want_step, char attempt, unsigned flags)
{
	memset(ckpt_buffer_data(r->b), 0xEE, ckpt_buffer_size(r->b));
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_load_ex(r->c, step, r->t, 2, flags, &f), 0);
	int e = ckpt_future_wait(f, CKPT_LOADED, 60000);
	if (e != 0)
		fail_msg("load: %s: %s", ckpt_strerror(e), ckpt_future_message(f));
	assert_int_equal(ckpt_future_step(f), want_step);
	ckpt_future_free(f);
	rank_check(r, want_step, attempt);
}

static void step_info(int node, uint64_t step, ckpt_step_info *out)
{
	ckpt_hello h = { 0 };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(N[node].sock, &h, &c), 0);
	ckpt_step_info *v = NULL;
	size_t n = 0;
	assert_int_equal(ckpt_list(c, JOB, &v, &n), 0);
	memset(out, 0, sizeof(*out));
	for (size_t i = 0; i < n; i++)
		if (v[i].step == step)
			*out = v[i];
	free(v);
	ckpt_close(c);
}

static int setup(void **state)
{
	(void)state;
	for (int i = 0; i < NODES; i++) {
		h_init(&N[i]);
		if (i > 0) /* one storage directory for every "node" */
			snprintf(N[i].store, sizeof(N[i].store), "%s", N[0].store);
		h_start(&N[i], "[pool]\nstaging_bytes = 256M\nchunk_bytes = 4M\n");
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	for (int i = 0; i < NODES; i++) {
		h_stop(&N[i]);
		h_cleanup(&N[i]);
	}
	return 0;
}

/* Step 1 of attempt 'a': ranks 2n and 2n+1 on node n. The step is
 * incomplete, for every node, until the last rank's manifest lands. */
static void test_save_across_nodes(void **state)
{
	(void)state;
	struct rank r[WORLD];
	for (uint32_t i = 0; i < WORLD; i++)
		rank_open(&r[i], (int)(i / 2), JOB, i, WORLD, "a");
	for (uint32_t i = 0; i + 1 < WORLD; i++)
		save_start(&r[i], 1, 'a');
	for (uint32_t i = 0; i + 1 < WORLD; i++)
		assert_int_equal(save_wait(&r[i]), 0);
	ckpt_step_info si;
	step_info(1, 1, &si);
	assert_int_equal(si.step, 1);
	assert_false(si.complete);
	assert_int_equal(si.ranks_present, WORLD - 1);
	save_start(&r[WORLD - 1], 1, 'a');
	assert_int_equal(save_wait(&r[WORLD - 1]), 0);
	for (int n = 0; n < NODES; n++) {
		step_info(n, 1, &si);
		assert_true(si.complete);
		assert_int_equal(si.ranks_present, WORLD);
		assert_string_equal(si.attempt_id, "a");
	}
	for (uint32_t i = 0; i < WORLD; i++)
		rank_close(&r[i]);
}

/* Resolved once (on node 2), loaded on every node from storage, and
 * resharded onto 3 ranks on node 1. */
static void test_restore_across_nodes(void **state)
{
	(void)state;
	struct rank r[WORLD];
	rank_open(&r[0], 2, JOB, 0, WORLD, "a");
	ckpt_step_info si;
	assert_int_equal(ckpt_resolve(r[0].c, NULL, CKPT_LATEST, &si), 0);
	assert_int_equal(si.step, 1);
	assert_true(si.complete);
	rank_close(&r[0]);
	for (uint32_t i = 0; i < WORLD; i++) {
		rank_open(&r[i], (int)((i + 1) % NODES), JOB, i, WORLD, "a");
		load_check(&r[i], (int64_t)si.step, 1, 'a', CKPT_LOAD_STORAGE_ONLY);
		rank_close(&r[i]);
	}
	for (uint32_t i = 0; i < 3; i++) {
		rank_open(&r[i], 1, JOB, i, 3, "a");
		load_check(&r[i], 1, 1, 'a', CKPT_LOAD_STORAGE_ONLY);
		rank_close(&r[i]);
	}
}

/* Pinned step 1: a second save of it, by the same attempt or another, on
 * any node, is refused, and what every node loads is unchanged. */
static void test_no_overwrite_across_nodes(void **state)
{
	(void)state;
	struct rank r;
	const char *att[] = { "a", "b" };
	for (int k = 0; k < 2; k++) {
		rank_open(&r, 2 - k, JOB, 3, WORLD, att[k]);
		save_start(&r, 1, 'z');
		int e = save_wait(&r);
		assert_int_equal(e, -EEXIST);
		rank_close(&r);
	}
	for (uint32_t i = 0; i < WORLD; i++) {
		rank_open(&r, (int)(i % NODES), JOB, i, WORLD, "a");
		load_check(&r, 1, 1, 'a', CKPT_LOAD_STORAGE_ONLY);
		rank_close(&r);
	}
}

/* Two attempts race for step 2, both complete before anyone reads it:
 * neither overwrites the other, every node agrees on one of them, and
 * once it is pinned a third attempt cannot write the step. */
static void test_concurrent_attempts_race(void **state)
{
	(void)state;
	struct rank a[WORLD], b[WORLD];
	for (uint32_t i = 0; i < WORLD; i++) {
		rank_open(&a[i], (int)(i % NODES), JOB, i, WORLD, "a");
		rank_open(&b[i], (int)((i + 1) % NODES), JOB, i, WORLD, "b");
	}
	for (uint32_t i = 0; i < WORLD; i++) {
		save_start(&a[i], 2, 'a');
		save_start(&b[i], 2, 'b');
	}
	for (uint32_t i = 0; i < WORLD; i++) {
		assert_int_equal(save_wait(&a[i]), 0);
		assert_int_equal(save_wait(&b[i]), 0);
	}
	ckpt_step_info si[NODES];
	for (int n = 0; n < NODES; n++) {
		ckpt_client *c = a[n].c;
		assert_int_equal(ckpt_resolve(c, NULL, 2, &si[n]), 0);
		assert_true(si[n].complete);
		assert_string_equal(si[n].attempt_id, si[0].attempt_id);
	}
	char won = si[0].attempt_id[0];
	for (uint32_t i = 0; i < WORLD; i++) {
		load_check(&a[i], CKPT_LATEST, 2, won, CKPT_LOAD_STORAGE_ONLY);
		rank_close(&a[i]);
		rank_close(&b[i]);
	}
	/* Both attempts' manifests are all there: nothing was overwritten. */
	char dir[600], path[700];
	snprintf(dir, sizeof(dir), "%s/" JOB "/step-000000000002", N[0].store);
	for (uint32_t i = 0; i < WORLD; i++) {
		snprintf(path, sizeof(path), "%s/rank-%05u-of-%05u.a.manifest", dir, i, WORLD);
		assert_int_equal(access(path, R_OK), 0);
		snprintf(path, sizeof(path), "%s/rank-%05u-of-%05u.b.manifest", dir, i, WORLD);
		assert_int_equal(access(path, R_OK), 0);
	}
	struct rank c;
	rank_open(&c, 1, JOB, 0, WORLD, "c");
	save_start(&c, 2, 'c');
	assert_int_equal(save_wait(&c), -EEXIST);
	rank_close(&c);
}

/* More than 8 ranks of one job on one node (the old per-job cap), each
 * with a save in flight and the next queued: default config. */
/* 64 ranks of one job on one daemon with the default pool and limits
 * (1 GiB of 64 MiB chunks, 4 saves in flight per rank), 1 MiB each: every
 * rank has step 1 in flight and step 2 queued behind it. A shard takes
 * the slots it needs, not a chunk each: 128 saves of a chunk each would
 * need 8 GiB. Then restore, from memory and, after a restart, from storage. */
static void test_sixty_four_ranks_one_node(void **state)
{
	(void)state;
	enum {
		R = 64,
		ELEMS_1M = 256 * 1024
	};
	static struct dctx wide;
	static struct rank r[R];
	h_init(&wide);
	wide.default_pool = true;
	h_start(&wide, NULL); /* the defaults, but for the harness's admit_timeout_ms */
	for (uint32_t i = 0; i < R; i++)
		rank_open_at(&r[i], wide.sock, "wide", i, R, "a", ELEMS_1M);
	ckpt_future *f2[R];
	for (uint32_t i = 0; i < R; i++) {
		save_start(&r[i], 1, 'a');
		int e = ckpt_future_wait(r[i].f, CKPT_STAGED, 60000);
		if (e != 0)
			fail_msg("rank %u step 1 staged: %s", i, ckpt_strerror(e));
		rank_fill(&r[i], 2, 'a');
		e = ckpt_save(r[i].c, 2, r[i].t, 2, NULL, 0, &f2[i]);
		if (e < 0)
			fail_msg("rank %u step 2: %s (%s)", i, ckpt_strerror(e), ckpt_errmsg());
	}
	for (uint32_t i = 0; i < R; i++) {
		int e = save_wait(&r[i]);
		if (e != 0)
			fail_msg("rank %u step 1: %s", i, ckpt_strerror(e));
		if ((e = ckpt_future_wait(f2[i], CKPT_DURABLE, 60000)) != 0)
			fail_msg("rank %u step 2: %s: %s", i, ckpt_strerror(e), ckpt_future_message(f2[i]));
		ckpt_future_free(f2[i]);
	}
	/* The memory tier holds step 2 of every rank in 2 MiB (1 MiB and the
	 * next slot for the small tensor), not a 64 MiB chunk each. */
	ckpt_status_info si;
	assert_int_equal(ckpt_status(r[0].c, &si), 0);
	assert_int_equal(si.chunk_bytes, 64ull << 20);
	assert_true(si.pool_held_bytes <= (uint64_t)R * (2ull << 20));
	assert_true(si.pool_held_bytes >= (uint64_t)R * (1ull << 20));
	for (uint32_t i = 0; i < R; i++)
		load_check(&r[i], CKPT_LATEST, 2, 'a', 0);
	for (uint32_t i = 0; i < R; i++)
		rank_close(&r[i]);

	assert_int_equal(h_stop(&wide), 0);
	h_start(&wide, NULL);
	for (uint32_t i = 0; i < R; i++)
		rank_open_at(&r[i], wide.sock, "wide", i, R, "a", ELEMS_1M);
	for (uint32_t i = 0; i < R; i++) {
		load_check(&r[i], 1, 1, 'a', 0);
		load_check(&r[i], CKPT_LATEST, 2, 'a', 0);
		rank_close(&r[i]);
	}
	h_stop(&wide);
	h_cleanup(&wide);
}

/* Before a step is complete (so not pinned), a rank's manifest is still
 * never replaced: the same rank of the same attempt saving the step again,
 * on another node, fails with EEXIST and the first save's bytes stay. */
static void test_own_manifest_not_replaced(void **state)
{
	(void)state;
	struct rank r;
	rank_open(&r, 0, JOB, 1, WORLD, "a");
	save_start(&r, 7, 'a');
	assert_int_equal(save_wait(&r), 0);
	rank_close(&r);
	rank_open(&r, 1, JOB, 1, WORLD, "a");
	save_start(&r, 7, 'z');
	assert_int_equal(save_wait(&r), -EEXIST);
	rank_close(&r);
	ckpt_step_info si;
	step_info(2, 7, &si);
	assert_false(si.complete);
	assert_int_equal(si.ranks_present, 1);
	/* The rest of the ranks complete it: rank 1 holds the first bytes. */
	for (uint32_t i = 0; i < WORLD; i++) {
		if (i == 1)
			continue;
		rank_open(&r, (int)(i % NODES), JOB, i, WORLD, "a");
		save_start(&r, 7, 'a');
		assert_int_equal(save_wait(&r), 0);
		rank_close(&r);
	}
	rank_open(&r, 2, JOB, 1, WORLD, "a");
	load_check(&r, 7, 7, 'a', CKPT_LOAD_STORAGE_ONLY);
	rank_close(&r);
}

/* max_inflight_saves counts per rank: with 1, a rank whose save is still
 * uploading is refused a second one (EBUSY, naming the cap), while another
 * rank of the same job on the same node saves at once. And a step being
 * written cannot be removed. */
static void test_inflight_cap_per_rank(void **state)
{
	(void)state;
	static struct dctx slow;
	h_init(&slow);
	/* The upload takes 4 s: long enough that the checks below run while it
	 * is in flight even on a loaded machine (1.5 s was not, once). */
	h_start(&slow, "[limits]\nmax_inflight_saves = 1\n[debug]\nstore_delay_ms = 4000\n");
	struct rank a, b;
	/* 2 MiB a rank: two of the harness's 1 MiB chunks, so the shard is
	 * written in two parts and store_delay_ms applies between them. */
	rank_open_at(&a, slow.sock, "cap", 0, 2, "a", 1 << 19);
	rank_open_at(&b, slow.sock, "cap", 1, 2, "a", 1 << 19);
	save_start(&a, 1, 'a');
	assert_int_equal(ckpt_future_wait(a.f, CKPT_STAGED, 60000), 0);
	/* A step being written cannot be removed meanwhile (steplock). */
	ckpt_client *ctl = NULL;
	ckpt_hello h0 = { 0 };
	assert_int_equal(ckpt_connect(slow.sock, &h0, &ctl), 0);
	assert_int_equal(ckpt_delete(ctl, "cap", 1), -EBUSY);
	ckpt_close(ctl);
	ckpt_future *f2 = NULL;
	rank_fill(&a, 2, 'a');
	assert_int_equal(ckpt_save(a.c, 2, a.t, 2, NULL, 0, &f2), 0);
	int e = ckpt_future_wait(f2, CKPT_DURABLE, 60000);
	assert_int_equal(e, -EBUSY);
	assert_non_null(strstr(ckpt_future_message(f2), "max_inflight_saves"));
	ckpt_future_free(f2);
	save_start(&b, 1, 'a'); /* rank 1: its own cap */
	assert_int_equal(save_wait(&b), 0);
	assert_int_equal(save_wait(&a), 0);
	rank_close(&a);
	rank_close(&b);
	h_stop(&slow);
	h_cleanup(&slow);
}

/* Layout spread on two nodes: shards under job/shards/<rank % 256>/,
 * manifests and the commit in the step's directory. Complete from the
 * listing (with bytes unlisted), shown with bytes from the manifests,
 * verified, restored after a restart and resharded, and deleted shards
 * and all. */
static bool exists(const char *path)
{
	return access(path, F_OK) == 0;
}

static size_t count_ext(const char *dir, const char *ext)
{
	char cmd[700];
	snprintf(cmd, sizeof(cmd), "ls '%s' 2>/dev/null | grep -c '\\.%s$'", dir, ext);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	size_t n = 0;
	if (fscanf(p, "%zu", &n) != 1)
		n = 0;
	pclose(p);
	return n;
}

static void test_spread_layout(void **state)
{
	(void)state;
	enum {
		W = 4
	};
	static struct dctx S[2];
	for (int i = 0; i < 2; i++) {
		h_init(&S[i]);
		if (i > 0)
			snprintf(S[i].store, sizeof(S[i].store), "%s", S[0].store);
		h_start(&S[i], "[storage]\nlayout = spread\n");
	}
	struct rank r[W];
	for (uint64_t step = 1; step <= 2; step++) {
		for (uint32_t i = 0; i < W; i++) {
			rank_open_at(&r[i], S[i % 2].sock, "sp", i, W, "a", 1000);
			save_start(&r[i], step, 'a');
		}
		for (uint32_t i = 0; i < W; i++) {
			assert_int_equal(save_wait(&r[i]), 0);
			rank_close(&r[i]);
		}
	}
	char dir[700];
	for (uint32_t i = 0; i < W; i++) {
		snprintf(dir, sizeof(dir), "%s/sp/shards/%02x/step-000000000001", S[0].store, i);
		assert_int_equal(count_ext(dir, "shard"), 1);
	}
	snprintf(dir, sizeof(dir), "%s/sp/step-000000000001", S[0].store);
	assert_int_equal(count_ext(dir, "shard"), 0);
	assert_int_equal(count_ext(dir, "manifest"), W);

	ckpt_client *c = NULL;
	ckpt_hello h = { 0 };
	assert_int_equal(ckpt_connect(S[1].sock, &h, &c), 0);
	ckpt_step_info *v = NULL;
	size_t n = 0;
	assert_int_equal(ckpt_list(c, "sp", &v, &n), 0);
	assert_int_equal(n, 2);
	for (size_t i = 0; i < n; i++) {
		assert_true(v[i].complete);
		assert_true(v[i].bytes_unlisted);
		assert_int_equal(v[i].bytes, 0);
	}
	free(v);
	ckpt_step_detail *d = NULL;
	assert_int_equal(ckpt_show(c, "sp", 2, &d), 0);
	assert_false(d->info.bytes_unlisted);
	assert_true(d->info.bytes >= (uint64_t)W * 1000 * 4);
	ckpt_step_detail_free(d);
	ckpt_verify_result *vr = NULL;
	assert_int_equal(ckpt_verify(c, "sp", 2, &vr), 0);
	assert_true(vr->ok);
	ckpt_verify_result_free(vr);
	ckpt_close(c);

	/* After a restart: from storage, at the same world size and resharded. */
	for (int i = 0; i < 2; i++) {
		assert_int_equal(h_stop(&S[i]), 0);
		h_start(&S[i], "[storage]\nlayout = spread\n");
	}
	for (uint32_t i = 0; i < W; i++) {
		rank_open_at(&r[i], S[(i + 1) % 2].sock, "sp", i, W, "a", 1000);
		load_check(&r[i], CKPT_LATEST, 2, 'a', 0);
		load_check(&r[i], 1, 1, 'a', 0);
		rank_close(&r[i]);
	}
	for (uint32_t i = 0; i < 2; i++) {
		rank_open_at(&r[i], S[0].sock, "sp", i, 2, "a", 2000);
		load_check(&r[i], 2, 2, 'a', 0);
		rank_close(&r[i]);
	}

	/* Deleting step 1 removes its spread shards, not step 2's. */
	assert_int_equal(ckpt_connect(S[0].sock, &h, &c), 0);
	assert_int_equal(ckpt_delete(c, "sp", 1), 0);
	ckpt_close(c);
	for (uint32_t i = 0; i < W; i++) {
		snprintf(dir, sizeof(dir), "%s/sp/shards/%02x/step-000000000001", S[0].store, i);
		assert_false(exists(dir));
		snprintf(dir, sizeof(dir), "%s/sp/shards/%02x/step-000000000002", S[0].store, i);
		assert_int_equal(count_ext(dir, "shard"), 1);
	}
	snprintf(dir, sizeof(dir), "%s/sp/step-000000000001", S[0].store);
	assert_false(exists(dir));
	for (int i = 0; i < 2; i++) {
		h_stop(&S[i]);
		h_cleanup(&S[i]);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_save_across_nodes),         cmocka_unit_test(test_restore_across_nodes),
		cmocka_unit_test(test_no_overwrite_across_nodes), cmocka_unit_test(test_concurrent_attempts_race),
		cmocka_unit_test(test_own_manifest_not_replaced), cmocka_unit_test(test_inflight_cap_per_rank),
		cmocka_unit_test(test_sixty_four_ranks_one_node), cmocka_unit_test(test_spread_layout),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
