/* The daemon's manifest cache, counted where it matters: the manifest files
 * ckptd opens in storage (inotify on the step directory) and its metrics.
 * A step saved by 4 ranks is restored by 8 ranks of one daemon after a
 * restart: each manifest is read once, however often the ranks' plans ask
 * for it; a repeat restore and ckpt.dcp's show (read_metadata) on every
 * rank read none; verify reads storage; after rm and a new save under the
 * same names, on this daemon or another "node" sharing the storage, the
 * new manifests are read and the new bytes loaded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "harness.h"

#define JOB "mc"
#define SAVED 4  /* world size of the save */
#define LOADED 8 /* ... and of the restore */
#define ELEMS (LOADED * 1024)

static struct dctx A, B; /* two "nodes", one storage directory */
static const uint64_t W_SHAPE[1] = { ELEMS };
static const uint64_t R_SHAPE[1] = { 16 };

static uint32_t value(char version, uint64_t idx)
{
	uint64_t x = 0x9E3779B97F4A7C15ull ^ (uint64_t)version << 48 ^ idx;
	x ^= x >> 31;
	x *= 0xBF58476D1CE4E5B9ull;
	return (uint32_t)(x ^ x >> 29);
}

struct rank {
	ckpt_client *c;
	ckpt_buffer *b;
	uint64_t off[1], len[1];
	ckpt_tensor t[2];
	ckpt_future *f;
};

/* "w" sharded by rank, "r" replicated: saved whole by every rank. */
static void rank_open(struct rank *r, struct dctx *d, uint32_t rank, uint32_t world)
{
	memset(r, 0, sizeof(*r));
	ckpt_hello h = { .job = JOB, .rank = rank, .world_size = world, .attempt_id = "a" };
	int e = ckpt_connect(d->sock, &h, &r->c);
	if (e < 0)
		fail_msg("connect: %s (%s)", ckpt_strerror(e), ckpt_errmsg());
	r->off[0] = ELEMS / world * rank;
	r->len[0] = ELEMS / world;
	assert_int_equal(ckpt_buffer_alloc(r->c, r->len[0] * 4 + 128, &r->b), 0);
	r->t[0] = (ckpt_tensor){ .name = "w", .dtype = CKPT_F32, .ndim = 1, .global_shape = W_SHAPE,
				 .box_offsets = r->off, .box_lengths = r->len, .buffer = r->b, .nbytes = r->len[0] * 4 };
	r->t[1] = (ckpt_tensor){ .name = "r", .dtype = CKPT_F32, .ndim = 1, .global_shape = R_SHAPE, .buffer = r->b,
				 .offset = (r->len[0] * 4 + 63) & ~63ull, .nbytes = 64 };
}

static uint32_t *r_data(struct rank *r)
{
	return (uint32_t *)((uint8_t *)ckpt_buffer_data(r->b) + r->t[1].offset);
}

static void rank_close(struct rank *r)
{
	ckpt_buffer_free(r->b);
	ckpt_close(r->c);
}

/* SAVED ranks on d save step 1 with values of version v. */
static void save_step(struct dctx *d, char v)
{
	struct rank r[SAVED];
	for (uint32_t i = 0; i < SAVED; i++) {
		rank_open(&r[i], d, i, SAVED);
		uint32_t *p = ckpt_buffer_data(r[i].b);
		for (uint64_t k = 0; k < r[i].len[0]; k++)
			p[k] = value(v, r[i].off[0] + k);
		for (uint64_t k = 0; k < 16; k++)
			r_data(&r[i])[k] = value(v, ELEMS + k);
		int e = ckpt_save(r[i].c, 1, r[i].t, 2, NULL, 0, &r[i].f);
		if (e < 0)
			fail_msg("save: %s (%s)", ckpt_strerror(e), ckpt_errmsg());
	}
	for (uint32_t i = 0; i < SAVED; i++) {
		int e = ckpt_future_wait(r[i].f, CKPT_DURABLE, 60000);
		if (e != 0)
			fail_msg("save rank %u: %s: %s", i, ckpt_strerror(e), ckpt_future_message(r[i].f));
		ckpt_future_free(r[i].f);
		rank_close(&r[i]);
	}
}

/* LOADED ranks on d restore step 1 from storage, all at once, and find
 * version v. */
static void restore_all_ex(struct dctx *d, char v, unsigned flags)
{
	struct rank r[LOADED];
	for (uint32_t i = 0; i < LOADED; i++) {
		rank_open(&r[i], d, i, LOADED);
		memset(ckpt_buffer_data(r[i].b), 0xEE, ckpt_buffer_size(r[i].b));
		assert_int_equal(ckpt_load_ex(r[i].c, 1, r[i].t, 2, flags, &r[i].f), 0);
	}
	for (uint32_t i = 0; i < LOADED; i++) {
		int e = ckpt_future_wait(r[i].f, CKPT_LOADED, 60000);
		if (e != 0)
			fail_msg("load rank %u: %s: %s", i, ckpt_strerror(e), ckpt_future_message(r[i].f));
		ckpt_future_free(r[i].f);
		const uint32_t *p = ckpt_buffer_data(r[i].b);
		for (uint64_t k = 0; k < r[i].len[0]; k++)
			if (p[k] != value(v, r[i].off[0] + k))
				fail_msg("rank %u: w[%llu] is not version %c", i, (unsigned long long)(r[i].off[0] + k), v);
		for (uint64_t k = 0; k < 16; k++)
			assert_int_equal(r_data(&r[i])[k], value(v, ELEMS + k));
		rank_close(&r[i]);
	}
}

static void restore_all(struct dctx *d, char v)
{
	restore_all_ex(d, v, CKPT_LOAD_STORAGE_ONLY);
}

/* inotify on step 1's directory: the manifests any process opens. */
static int watch_step(void)
{
	char dir[600];
	snprintf(dir, sizeof(dir), "%s/" JOB "/step-000000000001", A.store);
	int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	assert_true(fd >= 0);
	assert_true(inotify_add_watch(fd, dir, IN_OPEN) >= 0);
	return fd;
}

/* Opens of each rank's manifest since watch_step; closes fd. */
static void manifest_opens(int fd, unsigned opens[SAVED])
{
	memset(opens, 0, SAVED * sizeof(*opens));
	char buf[65536] __attribute__((aligned(__alignof__(struct inotify_event))));
	ssize_t n;
	while ((n = read(fd, buf, sizeof(buf))) > 0) {
		for (char *p = buf; p < buf + n;) {
			const struct inotify_event *ev = (const struct inotify_event *)p;
			unsigned rank, ws;
			size_t l = ev->len ? strlen(ev->name) : 0;
			if (l > 9 && strcmp(ev->name + l - 9, ".manifest") == 0 &&
			    sscanf(ev->name, "rank-%5u-of-%5u.", &rank, &ws) == 2 && ws == SAVED && rank < SAVED)
				opens[rank]++;
			p += sizeof(*ev) + ev->len;
		}
	}
	close(fd);
}

/* Each manifest opened want times since watch_step, and the daemon's own
 * count of manifest GETs went up by want x SAVED since *reads (then set
 * to the new count). inotify merges identical events still unread, so it
 * alone could hide a second open; with the total both are exact. */
static void assert_reads(int fd, unsigned want, uint64_t *reads, const char *when)
{
	unsigned opens[SAVED];
	manifest_opens(fd, opens);
	for (uint32_t i = 0; i < SAVED; i++)
		if (opens[i] != want)
			fail_msg("%s: rank %u's manifest was opened %u times, want %u", when, i, opens[i], want);
	uint64_t now = h_metric(&A, "ckptd_manifest_reads_total");
	if (now - *reads != want * SAVED)
		fail_msg("%s: %" PRIu64 " manifest GETs, want %u", when, now - *reads, want * SAVED);
	*reads = now;
}

static int setup(void **state)
{
	(void)state;
	h_init(&A);
	h_init(&B);
	snprintf(B.store, sizeof(B.store), "%s", A.store);
	/* Every fetch of A's cache takes 200 ms: concurrent loads meet in
	 * flight, so sharing one fetch is tested, not just keeping it. */
	h_start(&A, "[debug]\nmanifest_delay_ms = 200\n");
	h_start(&B, NULL);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	h_stop(&A);
	h_stop(&B);
	h_cleanup(&A);
	h_cleanup(&B);
	return 0;
}

static void test_reshard_after_restart(void **state)
{
	(void)state;
	save_step(&A, 'a');
	/* A restart: nothing in memory, neither the memory tier nor the cache. */
	assert_int_equal(h_stop(&A), 0);
	h_start(&A, "[debug]\nmanifest_delay_ms = 200\n");

	uint64_t reads = 0;
	int fd = watch_step();
	restore_all(&A, 'a');
	assert_reads(fd, 1, &reads, "8 ranks resharding 4 -> 8 after a restart");
	uint64_t hits = h_metric(&A, "ckptd_manifest_cache_hits_total");
	uint64_t misses = h_metric(&A, "ckptd_manifest_cache_misses_total");
	assert_int_equal(misses, SAVED);
	/* Without the cache every lookup is a GET. A rank looks up the
	 * manifest at its place in the order (rank x 4/8), which holds its
	 * share, and its own for its extra state (rank 0's past rank 3): 15,
	 * where starting at its own and going on in order took 26. */
	print_message("# restore 4 -> 8: %u manifest GETs for %" PRIu64 " manifest lookups\n", SAVED, hits + misses);
	assert_true(hits + misses > LOADED);
	assert_true(hits + misses <= 2 * LOADED);

	/* Again: every manifest from the cache. */
	fd = watch_step();
	restore_all(&A, 'a');
	assert_reads(fd, 0, &reads, "a repeat restore");
	assert_int_equal(h_metric(&A, "ckptd_manifest_cache_misses_total"), SAVED);
	assert_true(h_metric(&A, "ckptd_manifest_cache_hits_total") > hits);

	/* ckpt.dcp's read_metadata: every rank shows every manifest. */
	fd = watch_step();
	for (uint32_t i = 0; i < LOADED; i++) {
		ckpt_hello h = { .job = JOB, .rank = i, .world_size = LOADED };
		ckpt_client *c = NULL;
		assert_int_equal(ckpt_connect(A.sock, &h, &c), 0);
		ckpt_step_detail *sd = NULL;
		assert_int_equal(ckpt_show(c, JOB, 1, &sd), 0);
		assert_int_equal(sd->ntensors, 2 * SAVED);
		ckpt_step_detail_free(sd);
		ckpt_close(c);
	}
	assert_reads(fd, 0, &reads, "show on 8 ranks of a restored step");
	/* The first show wrote the step's index, the next ones read it (once)
	 * and keep it beside the manifests (test_step_index.c). */
	assert_int_equal(h_metric(&A, "ckptd_step_index_writes_total"), 1);
	assert_int_equal(h_metric(&A, "ckptd_step_index_reads_total"), 1);
	assert_int_equal(h_metric(&A, "ckptd_manifest_cache_entries"), SAVED + 1);
	assert_true(h_metric(&A, "ckptd_manifest_cache_bytes") > 0);

	/* verify reads storage, not the cache. */
	ckpt_hello h0 = { 0 };
	ckpt_client *ctl = NULL;
	assert_int_equal(ckpt_connect(A.sock, &h0, &ctl), 0);
	ckpt_verify_result *vr = NULL;
	fd = watch_step();
	assert_int_equal(ckpt_verify(ctl, JOB, 1, &vr), 0);
	assert_true(vr->ok);
	ckpt_verify_result_free(vr);
	assert_reads(fd, 1, &reads, "verify");

	/* rm drops the step from the cache; saved again under the same names
	 * (same attempt and world size), its new manifests are read. */
	assert_int_equal(ckpt_delete(ctl, JOB, 1), 0);
	assert_int_equal(h_metric(&A, "ckptd_manifest_cache_entries"), 0);
	assert_int_equal(h_metric(&A, "ckptd_manifest_cache_bytes"), 0);
	save_step(&A, 'b');
	fd = watch_step();
	restore_all(&A, 'b');
	assert_reads(fd, 1, &reads, "after rm and a new save");
	assert_int_equal(h_metric(&A, "ckptd_manifest_cache_misses_total"), 2 * SAVED);

	/* Removed and saved again on another node: A's entries of the old
	 * manifests are not used (the listing shows other objects). */
	ckpt_client *ctl_b = NULL;
	assert_int_equal(ckpt_connect(B.sock, &h0, &ctl_b), 0);
	assert_int_equal(ckpt_delete(ctl_b, JOB, 1), 0);
	ckpt_close(ctl_b);
	save_step(&B, 'c');
	fd = watch_step();
	/* A still holds its copies of version 'b' in memory, of the same step,
	 * ranks, attempt and sizes: they name other shards, so are not used. */
	restore_all_ex(&A, 'c', 0);
	assert_reads(fd, 1, &reads, "after rm and a new save on another node");
	assert_int_equal(h_metric(&A, "ckptd_manifest_cache_misses_total"), 3 * SAVED);
	assert_int_equal(h_metric(&A, "ckptd_manifest_cache_entries"), SAVED);
	ckpt_close(ctl);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reshard_after_restart),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
