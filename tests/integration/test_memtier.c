/* The memory tier and admission policies: skip, coalesce (superseded),
 * reclaim order of held copies, quota isolation between jobs, a trainer
 * killed after staged, a restarted trainer restoring from memory, and a
 * daemon killed mid-write that recovers on restart. Uploads are slowed with
 * [debug] store_delay_ms so that the pool really holds data that is not yet
 * durable while the test acts. */
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
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "harness.h"

#define MIB (1u << 20)

#define fill h_fill
#define rank_client h_rank
#define rc_close h_rank_close

/* "blob.<rank>", which only that rank saves (harness.h). */
static void rc_open(struct dctx *d, struct rank_client *rc, const char *job, uint32_t rank, uint32_t world,
		    size_t n, const char *policy)
{
	h_rank_open(d, rc, job, rank, world, n, "m", policy, false);
}

static ckpt_future *rc_save(struct rank_client *rc, uint64_t step)
{
	fill(ckpt_buffer_data(rc->b), rc->n, step);
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(rc->c, step, &rc->t, 1, NULL, 0, &f), 0);
	return f;
}

/* Load step into rc's buffer and check it; returns the source. */
static const char *rc_load_check(struct rank_client *rc, int64_t step, uint64_t want_step, char *src,
				 size_t srclen)
{
	memset(ckpt_buffer_data(rc->b), 0, rc->n);
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_load(rc->c, step, &rc->t, 1, &f), 0);
	int r = ckpt_future_wait(f, CKPT_LOADED, 60000);
	if (r != 0)
		fail_msg("load: %s (%s)", ckpt_strerror(r), ckpt_future_message(f));
	assert_int_equal(ckpt_future_step(f), want_step);
	uint8_t *want = malloc(rc->n);
	assert_non_null(want);
	fill(want, rc->n, want_step);
	assert_memory_equal(ckpt_buffer_data(rc->b), want, rc->n);
	free(want);
	const char *name = NULL;
	const char *ts = ckpt_future_tensor_source(f, 0, &name);
	assert_non_null(ts);
	assert_string_equal(name, rc->name);
	assert_string_equal(ts, ckpt_future_source(f));
	snprintf(src, srclen, "%s", ckpt_future_source(f));
	ckpt_future_free(f);
	return src;
}

static void status(struct dctx *d, ckpt_status_info *st)
{
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d->sock, NULL, &c), 0);
	assert_int_equal(ckpt_status(c, st), 0);
	ckpt_close(c);
}

static bool held(const ckpt_status_info *st, const char *job, uint32_t rank, uint64_t step)
{
	for (uint32_t i = 0; i < st->nheld; i++)
		if (strcmp(st->held[i].job, job) == 0 && st->held[i].rank == rank && st->held[i].step == step)
			return true;
	return false;
}

/* ---- policies ---- */

static void test_skip_fails_fast(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, "[debug]\nstore_delay_ms = 1500\n");
	struct rank_client a, b;
	rc_open(&d, &a, "skipjob", 0, 2, 40 * MIB, "skip");
	rc_open(&d, &b, "skipjob", 1, 2, 40 * MIB, "skip");
	ckpt_future *fa = rc_save(&a, 1);
	assert_int_equal(ckpt_future_wait(fa, CKPT_STAGED, 30000), 0);
	/* 40 + 40 MiB > 64 MiB and rank 0's upload is slow: skip. */
	ckpt_future *fb = rc_save(&b, 1);
	assert_int_equal(ckpt_future_wait(fb, CKPT_STAGED, 30000), -EBUSY);
	assert_non_null(strstr(ckpt_future_message(fb), "policy skip"));
	assert_int_equal(ckpt_future_poll(fa, CKPT_DURABLE), 0); /* it was really not durable yet */
	assert_int_equal(ckpt_future_wait(fa, CKPT_DURABLE, 30000), 0);
	ckpt_status_info st;
	status(&d, &st);
	assert_int_equal(st.saves_skipped, 1);
	ckpt_future_free(fa);
	ckpt_future_free(fb);
	rc_close(&a);
	rc_close(&b);
	h_cleanup(&d);
}

static void test_coalesce_supersedes(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, "[debug]\nstore_delay_ms = 1500\n[pool]\nmax_parallel_uploads = 1\n");
	/* Rank 0 of job "co" stages step 1 (uploading, slow), then step 2
	 * (staged, queued behind it), then step 3, which does not fit: step
	 * 2 has not started uploading, so step 3 replaces it. */
	struct rank_client r0[3];
	for (int i = 0; i < 3; i++)
		rc_open(&d, &r0[i], "co", 0, 1, 20 * MIB, "coalesce");
	ckpt_future *f1 = rc_save(&r0[0], 1);
	assert_int_equal(ckpt_future_wait(f1, CKPT_STAGED, 30000), 0);
	ckpt_future *f2 = rc_save(&r0[1], 2);
	assert_int_equal(ckpt_future_wait(f2, CKPT_STAGED, 30000), 0);
	ckpt_future *f3 = rc_save(&r0[2], 3);
	/* 3 x 20 MiB = 60 MiB fits in 64 MiB; a fourth overflows. */
	assert_int_equal(ckpt_future_wait(f3, CKPT_STAGED, 30000), 0);
	struct rank_client r4;
	rc_open(&d, &r4, "co", 0, 1, 20 * MIB, "coalesce");
	ckpt_future *f4 = rc_save(&r4, 4);
	assert_int_equal(ckpt_future_wait(f4, CKPT_STAGED, 30000), 0);
	/* Steps 2 and 3 were staged but had not started uploading: both
	 * superseded, with the distinct status. */
	assert_int_equal(ckpt_future_wait(f2, CKPT_DURABLE, 30000), CKPT_SUPERSEDED);
	assert_non_null(strstr(ckpt_future_message(f2), "superseded by step 4"));
	assert_int_equal(ckpt_future_wait(f3, CKPT_DURABLE, 30000), CKPT_SUPERSEDED);
	assert_int_equal(ckpt_future_wait(f1, CKPT_DURABLE, 30000), 0);
	assert_int_equal(ckpt_future_wait(f4, CKPT_DURABLE, 30000), 0);
	ckpt_status_info st;
	status(&d, &st);
	assert_int_equal(st.saves_superseded, 2);
	char src[16];
	rc_load_check(&r4, 4, 4, src, sizeof(src));
	ckpt_future_free(f1);
	ckpt_future_free(f2);
	ckpt_future_free(f3);
	ckpt_future_free(f4);
	for (int i = 0; i < 3; i++)
		rc_close(&r0[i]);
	rc_close(&r4);
	h_cleanup(&d);
}

static void test_block_waits_with_slow_upload(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, "[debug]\nstore_delay_ms = 800\n");
	struct rank_client a, b;
	rc_open(&d, &a, "blk", 0, 2, 40 * MIB, "block");
	rc_open(&d, &b, "blk", 1, 2, 40 * MIB, "block");
	ckpt_future *fa = rc_save(&a, 1);
	assert_int_equal(ckpt_future_wait(fa, CKPT_STAGED, 30000), 0);
	ckpt_future *fb = rc_save(&b, 1);
	/* b waits: not staged while a is not durable. */
	assert_int_equal(ckpt_future_wait(fb, CKPT_STAGED, 200), -ETIMEDOUT);
	ckpt_status_info st;
	status(&d, &st);
	assert_int_equal(st.waiting_saves, 1);
	assert_int_equal(ckpt_future_wait(fb, CKPT_STAGED, 30000), 0);
	assert_int_equal(ckpt_future_poll(fa, CKPT_DURABLE), 1);
	assert_int_equal(ckpt_future_wait(fb, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(fa);
	ckpt_future_free(fb);
	rc_close(&a);
	rc_close(&b);
	h_cleanup(&d);
}

/* ---- memory tier ---- */

static void test_reclaim_oldest_first(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, NULL);
	/* Three jobs leave 20 MiB each in the memory tier (60 of 64 MiB). */
	const char *jobs[4] = { "ra", "rb", "rc", "rd" };
	struct rank_client c[4];
	for (int i = 0; i < 4; i++)
		rc_open(&d, &c[i], jobs[i], 0, 1, 20 * MIB, NULL);
	for (int i = 0; i < 3; i++) {
		ckpt_future *f = rc_save(&c[i], 1);
		assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
		ckpt_future_free(f);
	}
	ckpt_status_info st;
	status(&d, &st);
	assert_int_equal(st.nheld, 3);
	assert_int_equal(st.pool_held_bytes, 60 * MIB);
	/* A fourth needs room: the oldest held copy (ra) goes, only it. */
	ckpt_future *f = rc_save(&c[3], 1);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(f);
	status(&d, &st);
	assert_false(held(&st, "ra", 0, 1));
	assert_true(held(&st, "rb", 0, 1));
	assert_true(held(&st, "rc", 0, 1));
	assert_true(held(&st, "rd", 0, 1));
	assert_int_equal(st.reclaimed_bytes, 20 * MIB);
	/* ra restores from storage now, rb from memory. */
	char src[16];
	assert_string_equal(rc_load_check(&c[0], CKPT_LATEST, 1, src, sizeof(src)), "storage");
	assert_string_equal(rc_load_check(&c[1], CKPT_LATEST, 1, src, sizeof(src)), "memory");
	/* A newer durable step of the same job and rank replaces the older. */
	f = rc_save(&c[1], 2);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(f);
	status(&d, &st);
	assert_false(held(&st, "rb", 0, 1));
	assert_true(held(&st, "rb", 0, 2));
	for (int i = 0; i < 4; i++)
		rc_close(&c[i]);
	h_cleanup(&d);
}

static void test_quota_isolation(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	/* Job "greedy" may stage at most 24 MiB at once; its uploads are
	 * slow. Job "other" must not wait behind it. */
	h_start(&d, "[debug]\nstore_delay_ms = 1500\n[job.greedy]\nquota = 24M\npolicy = block\n");
	struct rank_client g0, g1, o0;
	rc_open(&d, &g0, "greedy", 0, 3, 20 * MIB, NULL);
	rc_open(&d, &g1, "greedy", 1, 3, 20 * MIB, NULL);
	rc_open(&d, &o0, "other", 0, 1, 20 * MIB, NULL);
	ckpt_future *fg0 = rc_save(&g0, 1);
	assert_int_equal(ckpt_future_wait(fg0, CKPT_STAGED, 30000), 0);
	ckpt_future *fg1 = rc_save(&g1, 1); /* over greedy's quota: waits */
	ckpt_future *fo = rc_save(&o0, 1);
	assert_int_equal(ckpt_future_wait(fo, CKPT_STAGED, 30000), 0);
	assert_int_equal(ckpt_future_poll(fg1, CKPT_STAGED), 0);
	assert_int_equal(ckpt_future_poll(fg0, CKPT_DURABLE), 0); /* greedy's first is still uploading */
	/* A save that can never fit the quota fails at once. */
	struct rank_client g2;
	rc_open(&d, &g2, "greedy", 2, 3, 30 * MIB, NULL);
	ckpt_future *fg2 = rc_save(&g2, 1);
	assert_int_equal(ckpt_future_wait(fg2, CKPT_STAGED, 30000), -E2BIG);
	assert_non_null(strstr(ckpt_future_message(fg2), "quota"));
	assert_int_equal(ckpt_future_wait(fg1, CKPT_DURABLE, 30000), 0);
	assert_int_equal(ckpt_future_wait(fg0, CKPT_DURABLE, 30000), 0);
	assert_int_equal(ckpt_future_wait(fo, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(fg0);
	ckpt_future_free(fg1);
	ckpt_future_free(fg2);
	ckpt_future_free(fo);
	rc_close(&g0);
	rc_close(&g1);
	rc_close(&g2);
	rc_close(&o0);
	h_cleanup(&d);
}

/* ---- crashes ---- */

static void test_trainer_sigkill_after_staged(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, "[debug]\nstore_delay_ms = 500\n");
	int pipefd[2];
	assert_int_equal(pipe(pipefd), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* The trainer: save, wait for staged, tell the parent, die. */
		struct rank_client rc;
		rc_open(&d, &rc, "crash", 0, 1, 24 * MIB, NULL);
		ckpt_future *f = rc_save(&rc, 7);
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
	assert_int_equal(WTERMSIG(st), SIGKILL);
	/* The save had not become durable when the trainer died (the upload
	 * takes 500 ms); the daemon finishes it. */
	ckpt_status_info s;
	bool done = false;
	for (int i = 0; i < 600 && !done; i++) {
		status(&d, &s);
		done = held(&s, "crash", 0, 7);
		if (!done)
			usleep(50 * 1000);
	}
	assert_true(done);
	/* A new trainer process, same job and rank, restores bit-exact from
	 * memory, and the daemon counts it. */
	uint64_t before = s.restores_from_memory;
	struct rank_client rc;
	rc_open(&d, &rc, "crash", 0, 1, 24 * MIB, NULL);
	char src[16];
	assert_string_equal(rc_load_check(&rc, 7, 7, src, sizeof(src)), "memory");
	status(&d, &s);
	assert_int_equal(s.restores_from_memory, before + 1);
	assert_int_equal(s.bytes_restored_memory, 24 * MIB);
	rc_close(&rc);
	h_cleanup(&d);
}

/* A held copy is CRC-checked on restore like storage: a byte flipped in the
 * pool ([debug] corrupt_held) never reaches the trainer. The load reads
 * the step from storage at once, bit-exact (source "storage"), the copy
 * is dropped and counted, and the log names the memory tier.
 * (test_guarantees.py is the Python side.) */
static void test_corrupt_held_copy_falls_back_to_storage(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, "[debug]\ncorrupt_held = true\n");
	struct rank_client rc;
	rc_open(&d, &rc, "badmem", 0, 1, 8 * MIB, NULL);
	ckpt_future *f = rc_save(&rc, 3);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(f);
	ckpt_status_info s;
	bool held_now = false;
	for (int i = 0; i < 100 && !held_now; i++) {
		status(&d, &s);
		held_now = held(&s, "badmem", 0, 3);
		if (!held_now)
			usleep(20 * 1000);
	}
	assert_true(held_now);
	assert_int_equal(h_metric(&d, "ckptd_memory_copies_failed_total"), 0);
	char src[16];
	assert_string_equal(rc_load_check(&rc, 3, 3, src, sizeof(src)), "storage");
	assert_int_equal(h_metric(&d, "ckptd_memory_copies_failed_total"), 1);
	status(&d, &s);
	assert_false(held(&s, "badmem", 0, 3));
	char cmd[600];
	snprintf(cmd, sizeof(cmd),
		 "grep -q 'checksum mismatch.*memory tier.*a copy held here.*reading the step from storage' "
		 "'%s/ckptd.log'",
		 d.dir);
	assert_int_equal(system(cmd), 0);
	/* Dropped: the next load reads storage too. */
	assert_string_equal(rc_load_check(&rc, 3, 3, src, sizeof(src)), "storage");
	assert_int_equal(h_metric(&d, "ckptd_memory_copies_failed_total"), 1);
	rc_close(&rc);
	h_cleanup(&d);
}

static void test_example_reports_memory_source(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, NULL);
	const char *ex = getenv("CKPT_EXAMPLE_BIN");
	assert_non_null(ex);
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' --job exm --steps 2 --size-mb 8 >/dev/null && "
		 "'%s' --socket '%s' --job exm --size-mb 8 --restore-only", ex, d.sock, ex, d.sock);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	char out[4096];
	size_t n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	assert_int_equal(pclose(p), 0);
	assert_non_null(strstr(out, "source: memory"));
	assert_non_null(strstr(out, "verified OK"));
	/* After a daemon restart the same restore comes from storage. */
	assert_int_equal(h_stop(&d), 0);
	h_start(&d, NULL);
	snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' --job exm --size-mb 8 --restore-only", ex, d.sock);
	p = popen(cmd, "r");
	assert_non_null(p);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	assert_int_equal(pclose(p), 0);
	assert_non_null(strstr(out, "source: storage"));
	h_cleanup(&d);
}

/* Files under dir (recursively) whose name contains ".tmp.". */
static int count_tmp(const char *dir)
{
	DIR *dp = opendir(dir);
	if (dp == NULL)
		return 0;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(dp)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		char p[1024];
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		if (strstr(e->d_name, ".tmp."))
			n++;
		else if (e->d_type == DT_DIR)
			n += count_tmp(p);
	}
	closedir(dp);
	return n;
}

static void test_daemon_sigkill_mid_write_recovers(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, "[debug]\nstore_delay_ms = 3000\n");
	struct rank_client rc;
	rc_open(&d, &rc, "dk", 0, 8, 16 * MIB, NULL);
	/* Step 1 complete (8 ranks: save all of them from one process). */
	struct rank_client others[7];
	for (uint32_t r = 1; r < 8; r++)
		rc_open(&d, &others[r - 1], "dk", r, 8, 1 * MIB, NULL);
	ckpt_future *f = rc_save(&rc, 1);
	ckpt_future *fo[7];
	for (int i = 0; i < 7; i++)
		fo[i] = rc_save(&others[i], 1);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 60000), 0);
	for (int i = 0; i < 7; i++) {
		assert_int_equal(ckpt_future_wait(fo[i], CKPT_DURABLE, 60000), 0);
		ckpt_future_free(fo[i]);
	}
	ckpt_future_free(f);
	/* Step 2: all other ranks durable, rank 0's shard write is stalled
	 * half-way when the daemon dies. */
	for (int i = 0; i < 7; i++)
		fo[i] = rc_save(&others[i], 2);
	for (int i = 0; i < 7; i++) {
		assert_int_equal(ckpt_future_wait(fo[i], CKPT_DURABLE, 60000), 0);
		ckpt_future_free(fo[i]);
	}
	f = rc_save(&rc, 2);
	assert_int_equal(ckpt_future_wait(f, CKPT_STAGED, 60000), 0);
	usleep(500 * 1000); /* well inside the 3 s stall */
	assert_true(count_tmp(d.store) >= 1);
	kill(d.pid, SIGKILL);
	waitpid(d.pid, NULL, 0);
	d.pid = -1;
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 60000), -ECONNRESET);
	ckpt_future_free(f);
	for (int i = 0; i < 7; i++)
		rc_close(&others[i]);
	rc_close(&rc);

	h_start(&d, NULL);
	/* No temporary file is left, step 2 is not complete, latest is 1. */
	assert_int_equal(count_tmp(d.store), 0);
	ckpt_status_info st;
	status(&d, &st);
	assert_true(st.recovered_files >= 1);
	assert_true(st.nrecovered >= 1);
	assert_non_null(strstr(st.recovered[0], "dk/step-000000000002/rank-00000-of-00008"));
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d.sock, NULL, &c), 0);
	ckpt_step_info *steps = NULL;
	size_t n = 0;
	assert_int_equal(ckpt_list(c, "dk", &steps, &n), 0);
	assert_int_equal(n, 2);
	assert_int_equal(steps[0].step, 1);
	assert_true(steps[0].complete);
	assert_int_equal(steps[1].step, 2);
	assert_false(steps[1].complete);
	assert_int_equal(steps[1].ranks_present, 7);
	free(steps);
	ckpt_close(c);
	rc_open(&d, &rc, "dk", 0, 8, 16 * MIB, NULL);
	char src[16];
	assert_string_equal(rc_load_check(&rc, CKPT_LATEST, 1, src, sizeof(src)), "storage");
	rc_close(&rc);
	h_assert_serves(&d);
	h_cleanup(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_skip_fails_fast),
		cmocka_unit_test(test_coalesce_supersedes),
		cmocka_unit_test(test_block_waits_with_slow_upload),
		cmocka_unit_test(test_reclaim_oldest_first),
		cmocka_unit_test(test_quota_isolation),
		cmocka_unit_test(test_trainer_sigkill_after_staged),
		cmocka_unit_test(test_example_reports_memory_source),
		cmocka_unit_test(test_corrupt_held_copy_falls_back_to_storage),
		cmocka_unit_test(test_daemon_sigkill_mid_write_recovers),
	};
	return cmocka_run_group_tests_name("memtier", tests, NULL, NULL);
}
