/* Tiers (docs/tiers.md "Tiers"): memory-only saves are kept in the daemon's pool
 * and not written to storage; they restore from memory (after the trainer
 * died too), show in ckpt_held, ckpt_list and ckpt_show, are never dropped
 * for space while they are their rank's newest, and become durable on
 * ckpt_persist. A replicated save without peers is kept and reported as
 * not replicated, with the reason. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "harness.h"

#define MIB (1u << 20)

#define fill h_fill
#define rank_client h_rank
#define rc_close h_rank_close

/* "blob.<rank>" (harness.h). */
static void rc_open(struct dctx *d, struct rank_client *rc, const char *job, uint32_t rank, uint32_t world, size_t n,
		    const char *policy)
{
	h_rank_open(d, rc, job, rank, world, n, "t", policy, false);
}

static ckpt_future *rc_save_tier(struct rank_client *rc, uint64_t step, int tier)
{
	fill(ckpt_buffer_data(rc->b), rc->n, step * 131 + rc->t.name[5]);
	ckpt_save_opts o = { .tier = tier };
	ckpt_future *f = NULL;
	char extra[32];
	snprintf(extra, sizeof(extra), "extra-%llu", (unsigned long long)step);
	int r = ckpt_save_ex(rc->c, step, &rc->t, 1, extra, strlen(extra), &o, &f);
	if (r < 0)
		fail_msg("save: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	return f;
}

/* Load step into rc's buffer: 0 and checked bit-exact (with its extra
 * state), its source in src; or the failure, its message in msg. */
static int rc_load(struct rank_client *rc, int64_t step, unsigned flags, char *src, size_t srclen, char *msg,
		   size_t msglen)
{
	memset(ckpt_buffer_data(rc->b), 0, rc->n);
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_load_ex(rc->c, step, &rc->t, 1, flags, &f), 0);
	int r = ckpt_future_wait(f, CKPT_LOADED, 60000);
	if (r != 0) {
		snprintf(msg, msglen, "%s", ckpt_future_message(f));
		ckpt_future_free(f);
		return r;
	}
	uint64_t got = ckpt_future_step(f);
	uint8_t *want = malloc(rc->n);
	assert_non_null(want);
	fill(want, rc->n, got * 131 + rc->t.name[5]);
	assert_memory_equal(ckpt_buffer_data(rc->b), want, rc->n);
	free(want);
	char extra[32];
	snprintf(extra, sizeof(extra), "extra-%llu", (unsigned long long)got);
	size_t xl = 0;
	const char *x = ckpt_future_extra(f, &xl);
	assert_int_equal(xl, strlen(extra));
	assert_memory_equal(x, extra, xl);
	snprintf(src, srclen, "%s", ckpt_future_source(f));
	ckpt_future_free(f);
	return 0;
}

static void expect_load_from(struct rank_client *rc, int64_t step, unsigned flags, const char *source)
{
	char src[16], msg[512];
	int r = rc_load(rc, step, flags, src, sizeof(src), msg, sizeof(msg));
	if (r != 0)
		fail_msg("load %lld: %s (%s)", (long long)step, ckpt_strerror(r), msg);
	assert_string_equal(src, source);
}

/* The copies of job this daemon holds, for every rank. */
static size_t held_copies(struct dctx *d, const char *job, ckpt_held_info **v)
{
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d->sock, NULL, &c), 0);
	size_t n = 0;
	int r = ckpt_held(c, job, 1, v, &n);
	if (r < 0)
		fail_msg("held: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	ckpt_close(c);
	return n;
}

/* The one listed step of job numbered step, copied into out; false if none. */
static bool listed(struct dctx *d, const char *job, uint64_t step, ckpt_step_info *out)
{
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d->sock, NULL, &c), 0);
	ckpt_step_info *v = NULL;
	size_t n = 0;
	assert_int_equal(ckpt_list(c, job, &v, &n), 0);
	bool found = false;
	for (size_t i = 0; i < n; i++)
		if (v[i].step == step && strcmp(v[i].job, job) == 0) {
			*out = v[i];
			found = true;
		}
	free(v);
	ckpt_close(c);
	return found;
}

static bool step_dir_exists(struct dctx *d, const char *job, uint64_t step)
{
	char p[600];
	snprintf(p, sizeof(p), "%s/%s/step-%012llu", d->store, job, (unsigned long long)step);
	struct stat st;
	return stat(p, &st) == 0;
}

/* A memory save: staged, then kept; never durable (waiting for it is
 * EINVAL); nothing in storage; restored from memory bit-exact with its
 * extra state; held, listed and shown as tier memory. */
static void test_memory_save_kept_not_stored(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, NULL);
	struct rank_client rc;
	rc_open(&d, &rc, "mem", 0, 1, 3 * MIB + 77, NULL);
	assert_true(ckpt_capabilities(rc.c) & CKPT_CAP_TIERS);
	ckpt_future *f = rc_save_tier(&rc, 10, CKPT_TIER_MEMORY);
	assert_int_equal(ckpt_future_wait(f, CKPT_STAGED, 30000), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), 0);
	assert_int_equal(ckpt_future_bytes(f), 3 * MIB + 77);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 0), -EINVAL);
	assert_non_null(strstr(ckpt_errmsg(), "ckpt_persist"));
	assert_int_equal(ckpt_future_wait(f, CKPT_REPLICATED, 0), -EINVAL);
	ckpt_future_free(f);
	assert_false(step_dir_exists(&d, "mem", 10));

	ckpt_held_info *h = NULL;
	assert_int_equal(held_copies(&d, "mem", &h), 1);
	assert_int_equal(h[0].step, 10);
	assert_int_equal(h[0].tier, CKPT_TIER_MEMORY);
	assert_int_equal(h[0].durable, 0);
	assert_int_equal(h[0].bytes, 3 * MIB + 77);
	free(h);
	/* The session's own rank, without a job named. */
	size_t n = 0;
	assert_int_equal(ckpt_held(rc.c, NULL, 0, &h, &n), 0);
	assert_int_equal(n, 1);
	free(h);

	ckpt_step_info si;
	assert_true(listed(&d, "mem", 10, &si));
	assert_string_equal(si.tier, "memory");
	assert_string_equal(si.where, "memory here: 1 of 1 ranks");
	assert_int_equal(si.complete, 1);
	assert_int_equal(si.bytes, 3 * MIB + 77);
	ckpt_step_detail *det = NULL;
	assert_int_equal(ckpt_show_rank(rc.c, "mem", 10, 0, &det), 0);
	assert_int_equal(det->ntensors, 1);
	assert_string_equal(det->tensors[0].name, "blob.0");
	assert_string_equal(det->info.tier, "memory");
	ckpt_step_detail_free(det);
	assert_true(h_metric(&d, "ckptd_pool_memory_only_bytes") >= 3 * MIB);

	expect_load_from(&rc, 10, 0, "memory");
	/* "latest" is storage's (docs/tiers.md "Tiers": ranks agree on a memory
	 * step through ckpt_held): there is none. */
	char src[16], msg[512];
	assert_int_equal(rc_load(&rc, CKPT_LATEST, 0, src, sizeof(src), msg, sizeof(msg)), -ENOENT);
	/* Storage only: not there. */
	assert_int_equal(rc_load(&rc, 10, CKPT_LOAD_STORAGE_ONLY, src, sizeof(src), msg, sizeof(msg)), -ENOENT);
	rc_close(&rc);
	h_cleanup(&d);
}

/* A table save takes a tier too. */
static void test_table_memory_save(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, NULL);
	struct rank_client rc;
	rc_open(&d, &rc, "tabmem", 0, 1, MIB, NULL);
	ckpt_table *t = NULL;
	assert_int_equal(ckpt_table_create(rc.c, &rc.t, 1, &t), 0);
	fill(ckpt_buffer_data(rc.b), rc.n, 4 * 131 + rc.t.name[5]);
	ckpt_save_opts o = { .tier = CKPT_TIER_MEMORY };
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save_table_ex(rc.c, 4, t, "extra-4", 7, &o, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), 0);
	ckpt_future_free(f);
	o.tier = 7;
	assert_int_equal(ckpt_save_table_ex(rc.c, 5, t, NULL, 0, &o, &f), -EINVAL);
	assert_non_null(strstr(ckpt_errmsg(), "unknown tier"));
	ckpt_table_free(t);
	assert_false(step_dir_exists(&d, "tabmem", 4));
	expect_load_from(&rc, 4, 0, "memory");
	rc_close(&rc);
	h_cleanup(&d);
}

/* The trainer is SIGKILLed right after staged: the daemon still checksums
 * and keeps the copy, and a new trainer process restores it. */
static void test_memory_step_survives_trainer_crash(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, NULL);
	int pipefd[2];
	assert_int_equal(pipe(pipefd), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct rank_client rc;
		rc_open(&d, &rc, "crash", 0, 1, 24 * MIB, NULL);
		ckpt_future *f = rc_save_tier(&rc, 7, CKPT_TIER_MEMORY);
		if (ckpt_future_wait(f, CKPT_STAGED, 30000) != 0)
			_exit(3);
		if (write(pipefd[1], "s", 1) != 1)
			_exit(4);
		raise(SIGKILL);
		_exit(5);
	}
	close(pipefd[1]);
	char ch = 0;
	assert_int_equal(read(pipefd[0], &ch, 1), 1);
	close(pipefd[0]);
	int st = 0;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFSIGNALED(st));
	ckpt_held_info *h = NULL;
	size_t n = 0;
	for (int i = 0; i < 400 && n == 0; i++) {
		n = held_copies(&d, "crash", &h);
		if (n == 0) {
			free(h);
			usleep(25 * 1000);
		}
	}
	assert_int_equal(n, 1);
	assert_int_equal(h[0].step, 7);
	free(h);
	struct rank_client rc;
	rc_open(&d, &rc, "crash", 0, 1, 24 * MIB, NULL);
	expect_load_from(&rc, 7, 0, "memory");
	rc_close(&rc);
	h_cleanup(&d);
}

/* Two ranks on one node keep step 5 in memory; one persist from rank 0
 * makes both durable (a storage-only load then works for each), the copies
 * stay held, and rank 1's own persist is answered at once. A persist of a
 * step not held here is ENOENT. */
static void test_persist(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, NULL);
	struct rank_client r0, r1;
	rc_open(&d, &r0, "pers", 0, 2, 2 * MIB, NULL);
	rc_open(&d, &r1, "pers", 1, 2, 3 * MIB, NULL);
	ckpt_future *f0 = rc_save_tier(&r0, 5, CKPT_TIER_MEMORY);
	ckpt_future *f1 = rc_save_tier(&r1, 5, CKPT_TIER_MEMORY);
	assert_int_equal(ckpt_future_wait(f0, CKPT_KEPT, 30000), 0);
	assert_int_equal(ckpt_future_wait(f1, CKPT_KEPT, 30000), 0);
	ckpt_future_free(f0);
	ckpt_future_free(f1);
	ckpt_step_info si;
	assert_true(listed(&d, "pers", 5, &si));
	assert_string_equal(si.tier, "memory");
	assert_string_equal(si.where, "memory here: 2 of 2 ranks");
	assert_int_equal(si.bytes, 5 * MIB);

	ckpt_future *p = NULL;
	assert_int_equal(ckpt_persist(r0.c, NULL, 5, &p), 0);
	int r = ckpt_future_wait(p, CKPT_DURABLE, 30000);
	if (r != 0)
		fail_msg("persist: %s (%s)", ckpt_strerror(r), ckpt_future_message(p));
	assert_int_equal(ckpt_future_bytes(p), 5 * MIB);
	ckpt_future_free(p);
	assert_true(step_dir_exists(&d, "pers", 5));
	char obj[700];
	char dir[600];
	snprintf(dir, sizeof(dir), "%s/pers/step-%012d", d.store, 5);
	h_rank_object(dir, 0, 2, "manifest", obj, sizeof(obj));
	h_rank_object(dir, 1, 2, "manifest", obj, sizeof(obj));

	ckpt_held_info *h = NULL;
	assert_int_equal(held_copies(&d, "pers", &h), 2);
	assert_int_equal(h[0].durable, 1);
	assert_int_equal(h[1].durable, 1);
	assert_int_equal(h[0].tier, CKPT_TIER_MEMORY);
	free(h);
	assert_true(listed(&d, "pers", 5, &si));
	assert_string_equal(si.tier, "durable");
	assert_string_equal(si.where, "storage, memory here: 2 of 2 ranks");
	assert_int_equal(si.complete, 1);

	/* Rank 1 asks too: its copy is durable already. */
	assert_int_equal(ckpt_persist(r1.c, NULL, 5, &p), 0);
	assert_int_equal(ckpt_future_wait(p, CKPT_DURABLE, 10000), 0);
	assert_int_equal(ckpt_future_bytes(p), 5 * MIB);
	ckpt_future_free(p);

	expect_load_from(&r0, 5, CKPT_LOAD_STORAGE_ONLY, "storage");
	expect_load_from(&r1, 5, CKPT_LOAD_STORAGE_ONLY, "storage");
	expect_load_from(&r1, 5, 0, "memory");
	expect_load_from(&r0, CKPT_LATEST, 0, "memory");

	assert_int_equal(ckpt_persist(r0.c, NULL, 99, &p), 0);
	assert_int_equal(ckpt_future_wait(p, CKPT_DURABLE, 10000), -ENOENT);
	assert_non_null(strstr(ckpt_future_message(p), "no copy of this step"));
	ckpt_future_free(p);
	rc_close(&r0);
	rc_close(&r1);
	h_cleanup(&d);
}

/* A newer memory step of a rank keeps the one before it (ranks that did
 * not all finish the newest can agree on it) and drops older ones, which
 * are then restorable from nowhere (never in storage). */
static void test_newer_memory_step_replaces_older(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, NULL);
	struct rank_client rc;
	rc_open(&d, &rc, "newer", 0, 1, MIB, NULL);
	for (uint64_t step = 1; step <= 3; step++) {
		ckpt_future *f = rc_save_tier(&rc, step, CKPT_TIER_MEMORY);
		assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), 0);
		ckpt_future_free(f);
	}
	ckpt_held_info *h = NULL;
	assert_int_equal(held_copies(&d, "newer", &h), 2);
	assert_int_equal(h[0].step + h[1].step, 5); /* steps 2 and 3 */
	free(h);
	char src[16], msg[512];
	assert_int_equal(rc_load(&rc, 1, 0, src, sizeof(src), msg, sizeof(msg)), -ENOENT);
	expect_load_from(&rc, 2, 0, "memory");
	expect_load_from(&rc, 3, 0, "memory");
	/* An older step saved after a newer one is not kept over it. */
	ckpt_future *f = rc_save_tier(&rc, 2, CKPT_TIER_MEMORY);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), -ECANCELED);
	assert_non_null(strstr(ckpt_future_message(f), "newer"));
	ckpt_future_free(f);
	expect_load_from(&rc, 3, 0, "memory");
	rc_close(&rc);
	h_cleanup(&d);
}

/* The pool (64 MiB) holds a durable copy of job "dur" and a memory-only
 * copy of job "mem". A new save needing space reclaims the durable copy,
 * never the memory-only one; one that would need it fails (skip) or times
 * out (block) saying so; once persisted, it is reclaimable like any
 * durable copy. */
static void test_memory_only_never_reclaimed(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, "[pool]\nadmit_timeout_ms = 1500\n");
	struct rank_client dur, mem, other, skip;
	rc_open(&d, &dur, "dur", 0, 1, 24 * MIB, NULL);
	rc_open(&d, &mem, "mem", 0, 1, 24 * MIB, NULL);
	rc_open(&d, &other, "other", 0, 1, 24 * MIB, "block");
	rc_open(&d, &skip, "skip", 0, 1, 24 * MIB, "skip");
	ckpt_future *f = rc_save_tier(&dur, 1, CKPT_TIER_DURABLE);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(f);
	f = rc_save_tier(&mem, 1, CKPT_TIER_MEMORY);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), 0);
	ckpt_future_free(f);
	/* 24 + 24 held; 24 more: the durable copy goes. */
	f = rc_save_tier(&other, 1, CKPT_TIER_MEMORY);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), 0);
	ckpt_future_free(f);
	ckpt_held_info *h = NULL;
	assert_int_equal(held_copies(&d, "dur", &h), 0);
	free(h);
	assert_int_equal(held_copies(&d, "mem", &h), 1);
	free(h);
	/* 48 MiB of memory-only copies: another 24 cannot fit. */
	f = rc_save_tier(&skip, 1, CKPT_TIER_DURABLE);
	assert_int_equal(ckpt_future_wait(f, CKPT_STAGED, 30000), -EBUSY);
	assert_non_null(strstr(ckpt_future_message(f), "memory-only"));
	ckpt_future_free(f);
	f = rc_save_tier(&dur, 2, CKPT_TIER_DURABLE);
	assert_int_equal(ckpt_future_wait(f, CKPT_STAGED, 30000), -ETIMEDOUT);
	assert_non_null(strstr(ckpt_future_message(f), "memory-only copies"));
	ckpt_future_free(f);
	expect_load_from(&mem, 1, 0, "memory");
	/* Persisted, it is a durable copy like any other: reclaimable. */
	ckpt_future *p = NULL;
	assert_int_equal(ckpt_persist(mem.c, NULL, 1, &p), 0);
	assert_int_equal(ckpt_future_wait(p, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(p);
	f = rc_save_tier(&dur, 3, CKPT_TIER_DURABLE);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(f);
	assert_int_equal(held_copies(&d, "mem", &h), 0);
	free(h);
	expect_load_from(&mem, 1, 0, "storage");
	expect_load_from(&other, 1, 0, "memory");
	rc_close(&dur);
	rc_close(&mem);
	rc_close(&other);
	rc_close(&skip);
	h_cleanup(&d);
}

/* The copy kept behind a rank's newest memory step is reclaimable: a save
 * that needs the room drops it, never the newest. Persisting the newest
 * drops the one behind it (the newest is durable now). */
static void test_copy_behind_newest_is_reclaimable(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, NULL);
	struct rank_client p, q;
	rc_open(&d, &p, "behind", 0, 1, 24 * MIB, NULL);
	rc_open(&d, &q, "needy", 0, 1, 24 * MIB, "skip");
	for (uint64_t step = 1; step <= 2; step++) {
		ckpt_future *f = rc_save_tier(&p, step, CKPT_TIER_MEMORY);
		assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), 0);
		ckpt_future_free(f);
	}
	ckpt_held_info *h = NULL;
	assert_int_equal(held_copies(&d, "behind", &h), 2);
	free(h);
	ckpt_future *f = rc_save_tier(&q, 1, CKPT_TIER_DURABLE);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(f);
	assert_int_equal(held_copies(&d, "behind", &h), 1);
	assert_int_equal(h[0].step, 2);
	free(h);
	expect_load_from(&p, 2, 0, "memory");
	/* Again with the copy behind in place: persisting the newest drops it. */
	f = rc_save_tier(&p, 3, CKPT_TIER_MEMORY);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), 0);
	ckpt_future_free(f);
	assert_int_equal(held_copies(&d, "behind", &h), 2);
	free(h);
	ckpt_future *pf = NULL;
	assert_int_equal(ckpt_persist(p.c, NULL, 3, &pf), 0);
	assert_int_equal(ckpt_future_wait(pf, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(pf);
	assert_int_equal(held_copies(&d, "behind", &h), 1);
	assert_int_equal(h[0].step, 3);
	assert_int_equal(h[0].durable, 1);
	free(h);
	rc_close(&p);
	rc_close(&q);
	h_cleanup(&d);
}

/* Without peers a replicated save is kept here and reported as not
 * replicated, with the reason; the save does not fail. */
static void test_replicated_without_peers(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, NULL);
	struct rank_client rc;
	rc_open(&d, &rc, "repl", 0, 1, MIB, NULL);
	ckpt_future *f = rc_save_tier(&rc, 3, CKPT_TIER_REPLICATED);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_REPLICATED, 30000), -ENOTSUP);
	assert_non_null(strstr(ckpt_errmsg(), "not replicated"));
	assert_non_null(strstr(ckpt_future_message(f), "peer replication is off"));
	assert_int_equal(ckpt_future_replicas(f), 0);
	assert_int_equal(ckpt_future_poll(f, CKPT_KEPT), 1);
	ckpt_future_free(f);
	ckpt_held_info *h = NULL;
	assert_int_equal(held_copies(&d, "repl", &h), 1);
	assert_int_equal(h[0].tier, CKPT_TIER_REPLICATED);
	free(h);
	ckpt_step_info si;
	assert_true(listed(&d, "repl", 3, &si));
	assert_string_equal(si.tier, "replicated");
	expect_load_from(&rc, 3, 0, "memory");
	rc_close(&rc);
	h_cleanup(&d);
}

/* A daemon whose memory tier is off refuses memory saves, saying why. */
static void test_memory_tier_off_refuses(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, "[pool]\nmemory_tier = false\n");
	struct rank_client rc;
	rc_open(&d, &rc, "off", 0, 1, MIB, NULL);
	ckpt_future *f = rc_save_tier(&rc, 1, CKPT_TIER_MEMORY);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), -ENOTSUP);
	assert_non_null(strstr(ckpt_future_message(f), "memory_tier"));
	ckpt_future_free(f);
	rc_close(&rc);
	h_cleanup(&d);
}

/* A persist that fails (the disk is full) leaves the copy in memory only,
 * restorable; the failure names the copy. */
static void test_persist_failure_keeps_copy(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	d.store_tmpfs = "6M";
	h_start(&d, NULL);
	struct rank_client rc;
	rc_open(&d, &rc, "full", 0, 1, 8 * MIB, NULL);
	ckpt_future *f = rc_save_tier(&rc, 2, CKPT_TIER_MEMORY);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), 0);
	ckpt_future_free(f);
	ckpt_future *p = NULL;
	assert_int_equal(ckpt_persist(rc.c, NULL, 2, &p), 0);
	assert_int_equal(ckpt_future_wait(p, CKPT_DURABLE, 30000), -ENOSPC);
	assert_non_null(strstr(ckpt_future_message(p), "rank 0's copy of step 2"));
	ckpt_future_free(p);
	ckpt_held_info *h = NULL;
	assert_int_equal(held_copies(&d, "full", &h), 1);
	assert_int_equal(h[0].durable, 0);
	free(h);
	expect_load_from(&rc, 2, 0, "memory");
	rc_close(&rc);
	h_cleanup(&d);
}

/* Run ckptctl against d; its exit status, output (stdout and stderr) in out. */
static int ctl(struct dctx *d, const char *args, char *out, size_t outlen)
{
	int st = h_ctl(d, args, true, out, outlen);
	assert_true(st >= 0);
	return st;
}

/* ckptctl ls shows the tier and where the copies are, status the held
 * copies' tiers, and persist makes the step durable (and says ENOENT for
 * a step not held). */
static void test_ckptctl_tiers(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, NULL);
	struct rank_client rc;
	rc_open(&d, &rc, "ctl", 0, 1, MIB, NULL);
	ckpt_future *f = rc_save_tier(&rc, 1, CKPT_TIER_DURABLE);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(f);
	f = rc_save_tier(&rc, 2, CKPT_TIER_MEMORY);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), 0);
	ckpt_future_free(f);
	char out[8192];
	assert_int_equal(ctl(&d, "ls ctl", out, sizeof(out)), 0);
	/* Step 1 is the latest in storage; step 2 is in memory only. */
	const char *l1 = strstr(out, " 1* yes ");
	const char *l2 = strstr(out, " 2  yes ");
	if (l1 == NULL || l2 == NULL)
		fail_msg("ckptctl ls:\n%s", out);
	assert_non_null(strstr(l1, "durable"));
	assert_non_null(strstr(l2, "memory "));
	assert_non_null(strstr(l2, "memory here: 1 of 1 ranks"));
	assert_int_equal(ctl(&d, "--json ls ctl", out, sizeof(out)), 0);
	assert_non_null(strstr(out, "\"tier\":\"memory\""));
	assert_int_equal(ctl(&d, "status", out, sizeof(out)), 0);
	assert_non_null(strstr(out, "step 2 (1.0 MiB, memory only)"));
	assert_int_equal(ctl(&d, "persist ctl 2", out, sizeof(out)), 0);
	assert_non_null(strstr(out, "ctl step 2: durable"));
	assert_int_equal(ctl(&d, "status", out, sizeof(out)), 0);
	assert_non_null(strstr(out, "step 2 (1.0 MiB, memory, persisted)"));
	assert_int_equal(ctl(&d, "ls ctl", out, sizeof(out)), 0);
	assert_non_null(strstr(out, " 2* yes      durable"));
	assert_int_equal(ctl(&d, "persist ctl 9", out, sizeof(out)), 1);
	assert_non_null(strstr(out, "no copy of this step"));
	rc_close(&rc);
	h_cleanup(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_memory_save_kept_not_stored),
		cmocka_unit_test(test_table_memory_save),
		cmocka_unit_test(test_memory_step_survives_trainer_crash),
		cmocka_unit_test(test_persist),
		cmocka_unit_test(test_newer_memory_step_replaces_older),
		cmocka_unit_test(test_copy_behind_newest_is_reclaimable),
		cmocka_unit_test(test_memory_only_never_reclaimed),
		cmocka_unit_test(test_replicated_without_peers),
		cmocka_unit_test(test_memory_tier_off_refuses),
		cmocka_unit_test(test_persist_failure_keeps_copy),
		cmocka_unit_test(test_ckptctl_tiers),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
