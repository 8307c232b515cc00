/* Incremental steps (docs/format.md "Pieces"), end to end through a real
 * ckptd on file:// with retention keep_last = 1: a frozen tensor and the
 * rows of an embedding table that did not change are stored once and
 * referred to by later steps; a step whose pieces lie in two earlier
 * steps restores bit-exact, whole and resharded, after retention ran
 * (it kept those steps); a flipped byte in a referenced object fails the
 * load naming that object; rm refuses a referenced step; after a restart
 * a save takes its base from storage; a save with incremental off stores
 * everything again and retention frees the rest. */
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

#define JOB "inc"
#define NT 4
#define CONF "incremental = true\nmemory_tier = false\n[job.inc]\nkeep_last = 1\n"

static struct dctx D;
static struct dctx *cur = &D; /* the daemon the helpers talk to */

static const uint64_t FROZEN_SHAPE[2] = { 2048, 1024 }, ADAPTER_SHAPE[2] = { 64, 1024 }, EMB_SHAPE[2] = { 4096, 1024 },
		      COUNT_SHAPE[1] = { 1 };
static const struct {
	const char *name;
	int dtype;
	uint32_t ndim;
	const uint64_t *shape;
	uint64_t nbytes;
} T[NT] = {
	{ "frozen", CKPT_F32, 2, FROZEN_SHAPE, 2048 * 1024 * 4 },
	{ "adapter", CKPT_F32, 2, ADAPTER_SHAPE, 64 * 1024 * 4 },
	{ "emb", CKPT_F32, 2, EMB_SHAPE, 4096 * 1024 * 4 },
	{ "count", CKPT_I64, 1, COUNT_SHAPE, 8 },
};

static uint64_t offset(int i)
{
	uint64_t o = 0;
	for (int k = 0; k < i; k++)
		o += (T[k].nbytes + 63) & ~63ull;
	return o;
}

static size_t total(void)
{
	return (size_t)(offset(NT - 1) + T[NT - 1].nbytes);
}

static uint32_t mix(uint64_t x)
{
	x ^= x >> 31;
	x *= 0xBF58476D1CE4E5B9ull;
	x ^= x >> 29;
	return (uint32_t)x;
}

/* The embedding rows each step changed: step 2 rows [10, 20), step 3
 * [3000, 3010), step 4 none (so after step 1, each row holds the value of
 * the last step that changed it). */
static uint64_t row_step(uint64_t row, uint64_t step)
{
	uint64_t s = 1;
	if (step >= 2 && row >= 10 && row < 20)
		s = 2;
	if (step >= 3 && row >= 3000 && row < 3010)
		s = 3;
	return s;
}

/* Step's state: frozen never changes, the adapter and count every step,
 * the embedding in a few rows (row_step). */
static void fill(uint8_t *p, uint64_t step)
{
	uint32_t *fr = (uint32_t *)(p + offset(0)), *ad = (uint32_t *)(p + offset(1)),
		 *em = (uint32_t *)(p + offset(2));
	for (uint64_t i = 0; i < T[0].nbytes / 4; i++)
		fr[i] = mix(i);
	for (uint64_t i = 0; i < T[1].nbytes / 4; i++)
		ad[i] = mix(i ^ step << 40);
	for (uint64_t i = 0; i < T[2].nbytes / 4; i++)
		em[i] = mix(i ^ row_step(i / 1024, step) << 44 ^ 1ull << 60);
	*(int64_t *)(p + offset(3)) = (int64_t)step;
}

static ckpt_client *connect_rank(uint32_t rank, uint32_t world)
{
	ckpt_hello h = { .job = JOB, .rank = rank, .world_size = world, .attempt_id = "a" };
	ckpt_client *c = NULL;
	int r = ckpt_connect(cur->sock, &h, &c);
	if (r < 0)
		fail_msg("connect: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	return c;
}

static void tensors(ckpt_tensor *t, ckpt_buffer *b)
{
	for (int i = 0; i < NT; i++)
		t[i] = (ckpt_tensor){ .name = T[i].name,
				      .dtype = T[i].dtype,
				      .ndim = T[i].ndim,
				      .global_shape = T[i].shape,
				      .buffer = b,
				      .offset = offset(i),
				      .nbytes = T[i].nbytes };
}

/* Save step as rank 0 of 1 with incremental (ckpt_setting: CKPT_BY_JOB
 * the daemon's, CKPT_OFF every piece stored); wait until durable. */
static void save_step_with(uint64_t step, int incremental)
{
	ckpt_client *c = connect_rank(0, 1);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, total(), &b), 0);
	fill(ckpt_buffer_data(b), step);
	ckpt_tensor t[NT];
	tensors(t, b);
	ckpt_save_opts o = { .incremental = incremental };
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save_ex(c, step, t, NT, NULL, 0, &o, &f), 0);
	int r = ckpt_future_wait(f, CKPT_DURABLE, 60000);
	if (r != 0)
		fail_msg("durable: %s: %s", ckpt_strerror(r), ckpt_future_message(f));
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);
}

static void save_step(uint64_t step)
{
	save_step_with(step, CKPT_BY_JOB);
}

static void step_dir(uint64_t step, char *out, size_t cap)
{
	snprintf(out, cap, "%s/" JOB "/step-%012llu", cur->store, (unsigned long long)step);
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

/* Raw bytes of step's pieces stored in step ref_step's shard (0: its own). */
static uint64_t bytes_in(const Ckpt__Manifest *m, uint64_t ref_step)
{
	char want[32];
	snprintf(want, sizeof(want), "step-%012llu/", (unsigned long long)ref_step);
	uint64_t n = 0;
	for (size_t i = 0; i < m->n_pieces; i++) {
		const Ckpt__ManifestPiece *p = m->pieces[i];
		assert_int_equal(p->hash.len, 16);
		assert_true(p->ref <= m->n_refs);
		if (ref_step == 0 ? p->ref == 0 : p->ref && strncmp(m->refs[p->ref - 1], want, strlen(want)) == 0)
			n += p->raw_bytes;
	}
	return n;
}

static bool exists(const char *rel)
{
	char p[700];
	snprintf(p, sizeof(p), "%s/" JOB "/%s", cur->store, rel);
	return access(p, F_OK) == 0;
}

static void steps_are(const uint64_t *want, size_t n)
{
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(D.sock, NULL, &c), 0);
	for (int tries = 0;; tries++) { /* retention runs after each durable step */
		ckpt_step_info *v = NULL;
		size_t k = 0;
		assert_int_equal(ckpt_list(c, JOB, &v, &k), 0);
		bool same = k == n;
		for (size_t i = 0; same && i < k; i++)
			same = v[i].step == want[i];
		free(v);
		if (same)
			break;
		if (tries == 100)
			fail_msg("the job holds %zu steps, not the %zu expected", k, n);
		usleep(50 * 1000);
	}
	ckpt_close(c);
}

static int group_setup(void **state)
{
	(void)state;
	h_init(&D);
	h_start(&D, CONF);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	h_cleanup(&D);
	return 0;
}

/* Steps 1-3: what each stores and refers to, and what retention keeps. */
static void test_unchanged_pieces_are_referred_to(void **state)
{
	(void)state;
	save_step(1);
	Ckpt__Manifest *m = read_manifest(1);
	assert_int_equal(bytes_in(m, 0), m->shard_bytes); /* the first: everything */
	ckpt__manifest__free_unpacked(m, NULL);
	save_step(2);
	m = read_manifest(2);
	/* frozen (8 MiB) and emb's pieces without rows 10..20 (12 MiB) are in
	 * step 1's shard; step 2 stores the adapter, the count and emb's
	 * first 4 MiB piece. */
	assert_int_equal(bytes_in(m, 1), 8u * 1048576 + 3 * 4u * 1048576);
	uint64_t own = bytes_in(m, 0);
	assert_true(own < 5u * 1048576);
	assert_int_equal(shard_size(2), own); /* raw pieces: stored as they are */
	ckpt__manifest__free_unpacked(m, NULL);
	save_step(3);
	m = read_manifest(3);
	/* Each piece refers to the shard that holds its bytes, not to step 2
	 * when step 2 only referred to them. */
	assert_int_equal(bytes_in(m, 1), 8u * 1048576 + 2 * 4u * 1048576);
	assert_int_equal(bytes_in(m, 2), 4u * 1048576);
	ckpt__manifest__free_unpacked(m, NULL);
	assert_true(exists("refs/step-000000000003/step-000000000001/rank-00000-of-00001.a"));
	assert_true(exists("refs/step-000000000003/step-000000000002/rank-00000-of-00001.a"));
	/* keep_last = 1: step 3, and the two it refers to. */
	static const uint64_t all[3] = { 1, 2, 3 };
	steps_are(all, 3);
}

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
	assert_int_equal(ckpt_load(c, 3, t, n, &f), 0);
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

/* Step 3 whole, and resharded over 2 ranks, from the three shards. */
static void test_restore_across_steps(void **state)
{
	(void)state;
	uint8_t *want = malloc(total());
	fill(want, 3);
	ckpt_tensor t[NT];
	tensors(t, NULL);
	uint8_t *w[NT];
	for (int i = 0; i < NT; i++)
		w[i] = want + offset(i);
	load_expect(0, 1, t, NT, w, 0, NULL);
	/* Rank 1 of 2: frozen's and emb's second halves (rows 3000..3010 are
	 * in step 3's shard, the rest in step 1's). */
	static uint64_t fo[2] = { 1024, 0 }, fl[2] = { 1024, 1024 }, eo[2] = { 2048, 0 }, el[2] = { 2048, 1024 };
	ckpt_tensor h[2] = {
		{ .name = "frozen",
		  .dtype = CKPT_F32,
		  .ndim = 2,
		  .global_shape = FROZEN_SHAPE,
		  .box_offsets = fo,
		  .box_lengths = fl,
		  .offset = 0,
		  .nbytes = 1024 * 1024 * 4 },
		{ .name = "emb",
		  .dtype = CKPT_F32,
		  .ndim = 2,
		  .global_shape = EMB_SHAPE,
		  .box_offsets = eo,
		  .box_lengths = el,
		  .offset = 1024 * 1024 * 4,
		  .nbytes = 2048 * 1024 * 4 },
	};
	uint8_t *hw[2] = { want + offset(0) + 1024 * 4096, want + offset(2) + 2048 * 4096 };
	load_expect(1, 2, h, 2, hw, 0, NULL);
	char out[4096];
	if (h_ctl(&D, "verify " JOB " 3", true, out, sizeof(out)) != 0)
		fail_msg("verify: %s", out);
	/* A ref gone (by hand): verify says retention may take the shard. */
	char ref[700], moved[720];
	snprintf(ref, sizeof(ref), "%s/" JOB "/refs/step-000000000003/step-000000000002/rank-00000-of-00001.a",
		 D.store);
	snprintf(moved, sizeof(moved), "%s.away", ref);
	assert_int_equal(rename(ref, moved), 0);
	assert_int_equal(h_ctl(&D, "verify " JOB " 3", true, out, sizeof(out)), 1);
	assert_non_null(strstr(out, "retention may remove"));
	assert_int_equal(rename(moved, ref), 0);
	free(want);
}

/* A flipped byte in step 1's shard, in frozen's bytes that step 3 refers
 * to: the load of step 3 fails naming the tensor and step 1's object. */
static void test_damaged_referenced_object(void **state)
{
	(void)state;
	char dir[600], path[700];
	step_dir(1, dir, sizeof(dir));
	h_rank_object(dir, 0, 1, "shard", path, sizeof(path));
	int fd = open(path, O_RDWR | O_CLOEXEC);
	assert_true(fd >= 0);
	uint8_t b;
	assert_int_equal(pread(fd, &b, 1, 4096), 1); /* frozen's first piece */
	b ^= 0x10;
	assert_int_equal(pwrite(fd, &b, 1, 4096), 1);
	uint8_t *want = malloc(total());
	fill(want, 3);
	ckpt_tensor t[NT];
	tensors(t, NULL);
	uint8_t *w[1] = { want };
	load_expect(0, 1, t, 1, w, -EIO, "step-000000000001/rank-00000-of-00001.a.");
	b ^= 0x10;
	assert_int_equal(pwrite(fd, &b, 1, 4096), 1);
	close(fd);
	load_expect(0, 1, t, 1, w, 0, NULL);
	free(want);
}

/* rm of a referenced step is refused. After a restart the daemon has no
 * base in memory: the first save takes it from storage (step 3's
 * manifest), so it refers to the shards step 3 did. A save with
 * incremental off stores everything, and retention then frees the steps
 * nobody refers to. */
static void test_rm_and_restart(void **state)
{
	(void)state;
	char out[4096];
	assert_int_equal(h_ctl(&D, "rm " JOB " 1", true, out, sizeof(out)), 1);
	assert_non_null(strstr(out, "step 3 refers to"));
	assert_int_equal(h_stop(&D), 0);
	h_start(&D, CONF);
	save_step(4);
	Ckpt__Manifest *m = read_manifest(4);
	assert_int_equal(bytes_in(m, 1), 8u * 1048576 + 2 * 4u * 1048576);
	assert_int_equal(bytes_in(m, 2), 4u * 1048576);
	assert_int_equal(bytes_in(m, 3), 4u * 1048576);
	assert_true(bytes_in(m, 0) < 5u * 1048576);
	ckpt__manifest__free_unpacked(m, NULL);
	assert_true(exists("refs/step-000000000004/step-000000000003/rank-00000-of-00001.a"));
	static const uint64_t upto4[4] = { 1, 2, 3, 4 };
	steps_are(upto4, 4);
	save_step_with(5, CKPT_OFF);
	m = read_manifest(5);
	assert_int_equal(m->n_refs, 0); /* no pieces at all: neither compressed nor incremental */
	assert_int_equal(m->n_pieces, 0);
	ckpt__manifest__free_unpacked(m, NULL);
	static const uint64_t five[1] = { 5 };
	steps_are(five, 1);
	/* The pass goes on after the manifests (what ckpt_list sees): the
	 * shards, then the refs, last. */
	for (int i = 0; i < 100 && (exists("refs/step-000000000003") || exists("refs/step-000000000004")); i++)
		usleep(50 * 1000);
	assert_false(exists("refs/step-000000000003"));
	assert_false(exists("refs/step-000000000004"));
	/* Step 5 has no pieces to refer to, and the base in memory is still
	 * step 4, whose pieces lie in steps being removed: step 6's save sees
	 * their manifests gone (the handshake) and stores everything; step 7
	 * refers to step 6. */
	save_step(6);
	m = read_manifest(6);
	assert_int_equal(bytes_in(m, 0), m->shard_bytes);
	ckpt__manifest__free_unpacked(m, NULL);
	save_step(7);
	m = read_manifest(7);
	assert_true(bytes_in(m, 6) > 20u * 1048576);
	ckpt__manifest__free_unpacked(m, NULL);
	/* Steps 1 to 3 lost their manifests to retention while a later step
	 * still referred to them (KEPT_NAME); with those gone, a pass takes
	 * the rest. */
	assert_int_equal(h_ctl(&D, "gc " JOB, true, out, sizeof(out)), 0);
	for (uint64_t k = 1; k <= 5; k++) {
		char rel[64];
		snprintf(rel, sizeof(rel), "step-%012llu", (unsigned long long)k);
		assert_false(exists(rel));
	}
}

/* With [storage] layout = spread, references name the spread directory
 * (shards/<hh>/step-<12>/...), and restores follow them. */
static void test_spread_layout(void **state)
{
	(void)state;
	struct dctx E;
	h_init(&E);
	h_start(&E, "incremental = true\nmemory_tier = false\n[storage]\nlayout = spread\n");
	cur = &E;
	save_step(1);
	save_step(2);
	Ckpt__Manifest *m = read_manifest(2);
	uint64_t refd = 0;
	for (size_t i = 0; i < m->n_pieces; i++)
		if (m->pieces[i]->ref) {
			assert_int_equal(strncmp(m->refs[m->pieces[i]->ref - 1], "shards/00/step-000000000001/", 28),
					 0);
			refd += m->pieces[i]->raw_bytes;
		}
	assert_int_equal(refd, 8u * 1048576 + 3 * 4u * 1048576);
	ckpt__manifest__free_unpacked(m, NULL);
	uint8_t *want = malloc(total());
	fill(want, 2);
	ckpt_client *c = connect_rank(0, 1);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, total(), &b), 0);
	ckpt_tensor t[NT];
	tensors(t, b);
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_load(c, 2, t, NT, &f), 0);
	int r = ckpt_future_wait(f, CKPT_LOADED, 60000);
	if (r != 0)
		fail_msg("load: %s", ckpt_future_message(f));
	assert_memory_equal(ckpt_buffer_data(b), want, total());
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);
	free(want);
	cur = &D;
	h_cleanup(&E);
}

/* A memory save persisted later is incremental too: its pieces refer to
 * the rank's previous durable step, and a restore from storage alone
 * follows them. */
static void test_persist_refers(void **state)
{
	(void)state;
	struct dctx E;
	h_init(&E);
	h_start(&E, "incremental = true\n");
	cur = &E;
	save_step(1);
	ckpt_client *c = connect_rank(0, 1);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, total(), &b), 0);
	fill(ckpt_buffer_data(b), 2);
	ckpt_tensor t[NT];
	tensors(t, b);
	ckpt_save_opts o = { .tier = CKPT_TIER_MEMORY };
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save_ex(c, 2, t, NT, NULL, 0, &o, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 60000), 0);
	ckpt_future_free(f);
	assert_int_equal(ckpt_persist(c, NULL, 2, &f), 0);
	int r = ckpt_future_wait(f, CKPT_DURABLE, 60000);
	if (r != 0)
		fail_msg("persist: %s", ckpt_future_message(f));
	ckpt_future_free(f);
	Ckpt__Manifest *m = read_manifest(2);
	assert_int_equal(bytes_in(m, 1), 8u * 1048576 + 3 * 4u * 1048576);
	ckpt__manifest__free_unpacked(m, NULL);
	uint8_t *want = malloc(total());
	fill(want, 2);
	memset(ckpt_buffer_data(b), 0xEE, total());
	assert_int_equal(ckpt_load_ex(c, 2, t, NT, CKPT_LOAD_STORAGE_ONLY, &f), 0);
	r = ckpt_future_wait(f, CKPT_LOADED, 60000);
	if (r != 0)
		fail_msg("load: %s", ckpt_future_message(f));
	assert_memory_equal(ckpt_buffer_data(b), want, total());
	ckpt_future_free(f);
	free(want);
	ckpt_buffer_free(b);
	ckpt_close(c);
	cur = &D;
	h_cleanup(&E);
}

/* A shard written for over half the job's in-flight window
 * (incomplete_grace, 2 s here; each shard write paused 2 s): its refs,
 * written before it, may have been taken by a removal of this step as a
 * dead save's (removal.c), so the save writes them again, and looks at
 * the step they name again, before its manifest (upload.c recheck_refs).
 * A ref taken meanwhile is back afterwards; a step referred to that was
 * removed meanwhile fails the save (ESTALE), and the next save stores
 * every piece; so does one whose attempt a removal marked as taken
 * (upload.c check_not_taken). */
static void wait_for(const char *rel)
{
	for (int i = 0; i < 2000 && !exists(rel); i++)
		usleep(5000);
	assert_true(exists(rel));
}

static ckpt_future *start_save(ckpt_client *c, ckpt_buffer *b, uint64_t step)
{
	fill(ckpt_buffer_data(b), step);
	ckpt_tensor t[NT];
	tensors(t, b);
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save_ex(c, step, t, NT, NULL, 0, &(ckpt_save_opts){ 0 }, &f), 0);
	return f;
}

static void test_slow_shard_rechecks_its_refs(void **state)
{
	(void)state;
	struct dctx E;
	h_init(&E);
	h_start(&E, "incremental = true\nmemory_tier = false\n[job.inc]\nincomplete_grace = 2s\n[debug]\n"
		    "store_delay_ms = 2000\n");
	cur = &E;
	save_step(1);
	ckpt_client *c = connect_rank(0, 1);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, total(), &b), 0);
	const char *ref2 = "refs/step-000000000002/step-000000000001/rank-00000-of-00001.a";
	ckpt_future *f = start_save(c, b, 2);
	wait_for(ref2);
	assert_int_equal(h_sh("rm '%s/" JOB "/%s'", cur->store, ref2), 0); /* a removal took it */
	int r = ckpt_future_wait(f, CKPT_DURABLE, 60000);
	if (r != 0)
		fail_msg("durable: %s", ckpt_future_message(f));
	ckpt_future_free(f);
	assert_true(exists(ref2)); /* written again */

	const char *ref3 = "refs/step-000000000003/step-000000000002/rank-00000-of-00001.a";
	f = start_save(c, b, 3);
	wait_for(ref3);
	char dir[600];
	step_dir(2, dir, sizeof(dir));
	assert_int_equal(h_sh("rm '%s/" JOB "/%s' '%s'/*.manifest", cur->store, ref3, dir), 0); /* step 2 removed */
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 60000), -ESTALE);
	assert_non_null(strstr(ckpt_future_message(f), "was removed while its shard was written"));
	ckpt_future_free(f);
	assert_false(exists(ref3));
	step_dir(3, dir, sizeof(dir));
	assert_int_equal(h_sh("ls '%s' 2>/dev/null | grep -q shard", dir), 256); /* its shard went too */
	f = start_save(c, b, 4);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 60000), 0);
	ckpt_future_free(f);
	Ckpt__Manifest *m = read_manifest(4);
	assert_int_equal(m->n_refs, 0); /* every piece stored */
	ckpt__manifest__free_unpacked(m, NULL);

	/* A removal of step 5 judged this slow save dead and marked its
	 * attempt (removal.c): the save, once its manifest is written, sees
	 * the marker, fails, and takes back what it wrote. */
	const char *ref5 = "refs/step-000000000005/step-000000000004/rank-00000-of-00001.a";
	f = start_save(c, b, 5);
	wait_for(ref5);
	step_dir(5, dir, sizeof(dir));
	assert_int_equal(h_sh("mkdir -p '%s' && touch '%s/dead.a'", dir, dir), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 60000), -ESTALE);
	assert_non_null(strstr(ckpt_future_message(f), "a removal of this step took attempt 'a'"));
	ckpt_future_free(f);
	assert_int_equal(h_sh("ls '%s' | grep -q 'manifest\\|shard'", dir), 256);
	assert_false(exists(ref5));

	/* A marker from before this save began (its time inside) is about
	 * an earlier save of the attempt: this slow one is durable. */
	step_dir(6, dir, sizeof(dir));
	assert_int_equal(h_sh("mkdir -p '%s' && printf 1 > '%s/dead.a'", dir, dir), 0);
	f = start_save(c, b, 6);
	r = ckpt_future_wait(f, CKPT_DURABLE, 60000);
	if (r != 0)
		fail_msg("durable: %s", ckpt_future_message(f));
	ckpt_future_free(f);
	/* Unless its refs' names were there before it (an earlier save of
	 * this rank and attempt left them, which a removal may have listed):
	 * then any marker fails it. */
	step_dir(7, dir, sizeof(dir));
	char refs7[700];
	snprintf(refs7, sizeof(refs7), "%s/" JOB "/refs/step-000000000007/step-000000000004", cur->store);
	/* Step 4 stored every piece: step 7's unchanged ones are in its shard. */
	assert_int_equal(h_sh("mkdir -p '%s' '%s' && printf 1 > '%s/dead.a' && touch '%s/rank-00000-of-00001.a'", dir,
			      refs7, dir, refs7),
			 0);
	f = start_save(c, b, 7);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 60000), -ESTALE);
	assert_non_null(strstr(ckpt_future_message(f), "an earlier save of this rank and attempt left its refs"));
	ckpt_future_free(f);
	/* The same with a removal of the step under way (its kept.<attempt>
	 * marker), which may delete the names it listed: ours. */
	step_dir(8, dir, sizeof(dir));
	snprintf(refs7, sizeof(refs7), "%s/" JOB "/refs/step-000000000008/step-000000000004", cur->store);
	assert_int_equal(
		h_sh("mkdir -p '%s' '%s' && touch '%s/kept.a' '%s/rank-00000-of-00001.a'", dir, refs7, dir, refs7), 0);
	f = start_save(c, b, 8);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 60000), -ESTALE);
	ckpt_future_free(f);
	assert_true(exists("refs/step-000000000008/step-000000000004/rank-00000-of-00001.a")); /* not ours to take */
	ckpt_buffer_free(b);
	ckpt_close(c);
	cur = &D;
	h_cleanup(&E);
}

/* A save that takes over twice the job's in-flight window (1 s here; its
 * shard write paused 2.5 s) is past the life of a removal's marker for
 * it: it fails before its manifest (upload.c too_slow). */
static void test_save_past_twice_the_window_fails(void **state)
{
	(void)state;
	struct dctx E;
	h_init(&E);
	h_start(&E, "incremental = true\nmemory_tier = false\n[job.inc]\nincomplete_grace = 1s\n[debug]\n"
		    "store_delay_ms = 2500\n");
	cur = &E;
	save_step(1);
	ckpt_client *c = connect_rank(0, 1);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, total(), &b), 0);
	ckpt_future *f = start_save(c, b, 2);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 60000), -ESTALE);
	assert_non_null(strstr(ckpt_future_message(f), "over twice the job's in-flight window"));
	ckpt_future_free(f);
	char dir[600];
	step_dir(2, dir, sizeof(dir));
	assert_int_equal(h_sh("ls '%s' 2>/dev/null | grep -q 'manifest\\|shard'", dir), 256);
	ckpt_buffer_free(b);
	ckpt_close(c);
	cur = &D;
	h_cleanup(&E);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_unchanged_pieces_are_referred_to),
		cmocka_unit_test(test_restore_across_steps),
		cmocka_unit_test(test_damaged_referenced_object),
		cmocka_unit_test(test_rm_and_restart),
		cmocka_unit_test(test_spread_layout),
		cmocka_unit_test(test_persist_refers),
		cmocka_unit_test(test_slow_shard_rechecks_its_refs),
		cmocka_unit_test(test_save_past_twice_the_window_fails),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
