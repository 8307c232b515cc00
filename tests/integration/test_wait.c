/* Waiting for a step (ckpt_wait_complete, ckptctl wait): many waiters of
 * one step share one poll of storage (counted by ckptd_wait_polls_total),
 * a step seen complete is answered with no poll at all, an incomplete
 * step times out saying how far it got, a waiter whose session goes is
 * dropped, and a drain answers every waiter at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "harness.h"

static struct dctx D;
static struct dctx E; /* test_joiner_mid_listing_gets_its_own_look's own daemon */

#define WAITERS 12

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void save_durable(struct h_rank *r, uint64_t step)
{
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(r->c, step, &r->t, 1, NULL, 0, &f), 0);
	int e = ckpt_future_wait(f, CKPT_DURABLE, 60000);
	if (e != 0)
		fail_msg("save of step %" PRIu64 ": %s (%s)", step, ckpt_strerror(e), ckpt_errmsg());
	ckpt_future_free(f);
}

struct waiter {
	pthread_t th;
	const char *sock; /* NULL: D's */
	const char *job;
	uint64_t step;
	int64_t timeout_ms;
	int r;
	ckpt_step_info info;
	char msg[512];
};

static void *wait_thread(void *arg)
{
	struct waiter *w = arg;
	ckpt_client *c = NULL;
	w->r = ckpt_connect(w->sock ? w->sock : D.sock, NULL, &c);
	if (w->r == 0) {
		w->r = ckpt_wait_complete(c, w->job, w->step, w->timeout_ms, &w->info);
		snprintf(w->msg, sizeof(w->msg), "%s", ckpt_errmsg());
		ckpt_close(c);
	}
	return NULL;
}

/* w waits, and times out within lo to hi ms with a message that says
 * how far the step got. */
static void expect_timeout(struct waiter *w, const char *says, int64_t lo, int64_t hi)
{
	int64_t t0 = now_ms();
	wait_thread(w);
	int64_t took = now_ms() - t0;
	assert_int_equal(w->r, -ETIMEDOUT);
	if (strstr(w->msg, says) == NULL)
		fail_msg("timeout message: %s", w->msg);
	if (took < lo || took > hi)
		fail_msg("a %" PRId64 " ms wait took %" PRId64 " ms", w->timeout_ms, took);
}

/* WAITERS sessions wait for step 1 of a 2-rank job whose rank 1 saves a
 * second later: every one is answered complete, and the daemon polled
 * storage a handful of times in all, where each waiter polling every
 * 50 ms alone would have listed the step WAITERS x 20 times. */
static void test_waiters_share_one_poll(void **state)
{
	(void)state;
	struct h_rank r0, r1;
	h_rank_open(&D, &r0, "shared", 0, 2, 4096, "a", NULL, false);
	h_rank_open(&D, &r1, "shared", 1, 2, 4096, "a", NULL, false);
	save_durable(&r0, 1);
	uint64_t polls0 = h_metric(&D, "ckptd_wait_polls_total");
	struct waiter w[WAITERS];
	for (int i = 0; i < WAITERS; i++) {
		w[i] = (struct waiter){ .job = "shared", .step = 1, .timeout_ms = 30000 };
		assert_int_equal(pthread_create(&w[i].th, NULL, wait_thread, &w[i]), 0);
	}
	usleep(1000 * 1000);
	int64_t t0 = now_ms();
	save_durable(&r1, 1);
	for (int i = 0; i < WAITERS; i++) {
		pthread_join(w[i].th, NULL);
		if (w[i].r != 0)
			fail_msg("waiter %d: %s (%s)", i, ckpt_strerror(w[i].r), w[i].msg);
		assert_int_equal(w[i].info.step, 1);
		assert_true(w[i].info.complete);
		assert_int_equal(w[i].info.world_size, 2);
		assert_int_equal(w[i].info.ranks_present, 2);
		assert_string_equal(w[i].info.attempt_id, "a");
		assert_string_equal(w[i].info.job, "shared");
	}
	/* The last rank's durable here started the backoff over. */
	int64_t late = now_ms() - t0;
	uint64_t polls = h_metric(&D, "ckptd_wait_polls_total") - polls0;
	if (polls < 2 || polls > 12)
		fail_msg("%d waiters for about a second cost %" PRIu64 " polls; want 2 to 12", WAITERS, polls);
	if (late > 5000)
		fail_msg("answered %" PRId64 " ms after the last rank's durable", late);

	/* Seen complete: answered at once, with no poll. */
	struct waiter again = { .job = "shared", .step = 1, .timeout_ms = 0 };
	wait_thread(&again);
	assert_int_equal(again.r, 0);
	assert_int_equal(again.info.world_size, 2);
	assert_int_equal(h_metric(&D, "ckptd_wait_polls_total") - polls0, polls);
	h_rank_close(&r0);
	h_rank_close(&r1);
}

/* A step one rank of two saved times out with a message saying so; a
 * step with nothing in storage too; timeout 0 looks exactly once. */
static void test_timeout_says_how_far(void **state)
{
	(void)state;
	struct h_rank r0;
	h_rank_open(&D, &r0, "half", 0, 2, 4096, "b", NULL, false);
	save_durable(&r0, 3);
	uint64_t polls0 = h_metric(&D, "ckptd_wait_polls_total");
	struct waiter w = { .job = "half", .step = 3, .timeout_ms = 400 };
	expect_timeout(&w, "1 of 2 ranks of attempt 'b'", 350, 10000);

	struct waiter once = { .job = "half", .step = 9, .timeout_ms = 0 };
	uint64_t before = h_metric(&D, "ckptd_wait_polls_total");
	wait_thread(&once);
	assert_int_equal(once.r, -ETIMEDOUT);
	if (strstr(once.msg, "no manifest in storage yet") == NULL)
		fail_msg("timeout message: %s", once.msg);
	assert_int_equal(h_metric(&D, "ckptd_wait_polls_total") - before, 1);
	assert_true(before > polls0);
	h_rank_close(&r0);
}

static int ctl_run(const char *args, char *out, size_t outlen)
{
	return h_ctl(&D, args, true, out, outlen);
}

/* ckptctl wait: complete, a timeout, --json, a removed step, and
 * --timeout refused on another command. */
static void test_ctl_wait(void **state)
{
	(void)state;
	char out[4096];
	struct h_rank r0;
	h_rank_open(&D, &r0, "ctl", 0, 1, 4096, "c", NULL, false);
	save_durable(&r0, 5);
	assert_int_equal(ctl_run("wait ctl 5 --timeout 10", out, sizeof(out)), 0);
	if (strstr(out, "ctl step 5 complete: 1 ranks, attempt c") == NULL)
		fail_msg("ckptctl wait said: %s", out);
	assert_int_equal(ctl_run("--json wait ctl 5", out, sizeof(out)), 0);
	assert_non_null(strstr(out, "\"complete\""));
	assert_int_not_equal(ctl_run("wait ctl 6 --timeout 0.2", out, sizeof(out)), 0);
	if (strstr(out, "not complete within the wait's timeout") == NULL)
		fail_msg("ckptctl wait of a missing step said: %s", out);
	/* A step removed through this daemon is not answered from memory. */
	assert_int_equal(ctl_run("rm ctl 5", out, sizeof(out)), 0);
	assert_int_equal(ctl_run("wait ctl 5 --timeout 0", out, sizeof(out)), 1);
	if (strstr(out, "no manifest in storage yet") == NULL)
		fail_msg("ckptctl wait of a removed step said: %s", out);
	assert_int_equal(ctl_run("ls ctl --timeout 1", out, sizeof(out)), 2);
	assert_int_equal(ctl_run("wait ctl 5 --timeout -1", out, sizeof(out)), 2);
	h_rank_close(&r0);
}

/* A waiter that joins while a listing is under way is not answered by
 * it: that listing began before the waiter came (here before the last
 * rank was durable), so even with timeout 0 the group looks again for
 * it. A daemon of its own, whose listings answer 600 ms late. */
static void test_joiner_mid_listing_gets_its_own_look(void **state)
{
	(void)state;
	h_init(&E);
	h_start(&E, "[debug]\nwait_delay_ms = 600\n");
	struct h_rank r0, r1;
	h_rank_open(&E, &r0, "mid", 0, 2, 4096, "m", NULL, false);
	h_rank_open(&E, &r1, "mid", 1, 2, 4096, "m", NULL, false);
	save_durable(&r0, 1);
	struct waiter first = { .sock = E.sock, .job = "mid", .step = 1, .timeout_ms = 30000 };
	assert_int_equal(pthread_create(&first.th, NULL, wait_thread, &first), 0);
	usleep(200 * 1000); /* its first listing (1 of 2 ranks) is under way */
	save_durable(&r1, 1);
	struct waiter late = { .sock = E.sock, .job = "mid", .step = 1, .timeout_ms = 0 };
	wait_thread(&late);
	if (late.r != 0)
		fail_msg("a look-once waiter that came after the last rank: %s (%s)", ckpt_strerror(late.r), late.msg);
	assert_int_equal(late.info.ranks_present, 2);
	pthread_join(first.th, NULL);
	assert_int_equal(first.r, 0);
	h_rank_close(&r0);
	h_rank_close(&r1);
	h_cleanup(&E);
}

/* The backoff does not look while this node still saves the step: the
 * step cannot be complete before its ranks here are. Rank 1's save is
 * slow (store_delay_ms); while it is in flight a waiter's group lists
 * nothing, except the look each waiter is owed by its deadline (timeout
 * 0: at once), and rank 1's durable brings the look that answers. A
 * daemon of its own. */
static void test_no_look_while_saving_here(void **state)
{
	(void)state;
	h_init(&E);
	h_start(&E, "[debug]\nstore_delay_ms = 4000\n");
	struct h_rank r0, r1;
	h_rank_open(&E, &r0, "here", 0, 2, 8 << 20, "h", NULL, false);
	h_rank_open(&E, &r1, "here", 1, 2, 8 << 20, "h", NULL, false);
	save_durable(&r0, 1);
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(r1.c, 1, &r1.t, 1, NULL, 0, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_STAGED, 30000), 0);
	uint64_t p0 = h_metric(&E, "ckptd_wait_polls_total");
	struct waiter w = { .sock = E.sock, .job = "here", .step = 1, .timeout_ms = 30000 };
	assert_int_equal(pthread_create(&w.th, NULL, wait_thread, &w), 0);
	usleep(1000 * 1000);
	assert_int_equal(ckpt_future_poll(f, CKPT_DURABLE), 0); /* still saving */
	assert_int_equal(h_metric(&E, "ckptd_wait_polls_total"), p0);
	struct waiter once = { .sock = E.sock, .job = "here", .step = 1, .timeout_ms = 0 };
	wait_thread(&once);
	assert_int_equal(once.r, -ETIMEDOUT);
	if (strstr(once.msg, "1 of 2 ranks of attempt 'h'") == NULL)
		fail_msg("timeout message: %s", once.msg);
	assert_int_equal(h_metric(&E, "ckptd_wait_polls_total"), p0 + 1);
	/* One with a timeout is looked for by its deadline, not after. */
	struct waiter soon = { .sock = E.sock, .job = "here", .step = 1, .timeout_ms = 300 };
	expect_timeout(&soon, "1 of 2 ranks of attempt 'h'", 250, 1200);
	assert_int_equal(h_metric(&E, "ckptd_wait_polls_total"), p0 + 2);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(f);
	pthread_join(w.th, NULL);
	if (w.r != 0)
		fail_msg("waiter: %s (%s)", ckpt_strerror(w.r), w.msg);
	assert_int_equal(w.info.ranks_present, 2);
	uint64_t polls = h_metric(&E, "ckptd_wait_polls_total") - p0;
	if (polls < 3 || polls > 4)
		fail_msg("%" PRIu64 " polls; want the two timed-out waiters' looks and one or two after rank 1", polls);
	h_rank_close(&r0);
	h_rank_close(&r1);
	h_cleanup(&E);
}

/* A control session on D waiting for step 1 of job with no limit, sent
 * raw as request req_id; its fd. */
static int raw_wait_forever(const char *job, uint64_t req_id)
{
	int fd = raw_connect(D.sock);
	raw_hello(fd, "", 0, 0);
	Ckpt__WaitRequest m = CKPT__WAIT_REQUEST__INIT;
	m.job = (char *)job;
	m.step = 1;
	m.timeout_ms = UINT32_MAX;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_WAIT;
	f.wait = &m;
	assert_int_equal(raw_send(fd, &f, req_id, NULL, 0), 0);
	return fd;
}

/* A waiter whose session closes is dropped; the daemon goes on serving,
 * and its next poll ends the group. */
static void test_waiter_that_leaves(void **state)
{
	(void)state;
	int fd = raw_wait_forever("gone", 7);
	usleep(200 * 1000);
	close(fd);
	uint64_t p0 = h_metric(&D, "ckptd_wait_polls_total");
	usleep(2500 * 1000); /* the backoff's next look, or two */
	uint64_t p1 = h_metric(&D, "ckptd_wait_polls_total");
	usleep(2500 * 1000);
	/* The group ended at its next tick: no more polls. */
	assert_int_equal(h_metric(&D, "ckptd_wait_polls_total"), p1);
	assert_true(p1 - p0 <= 2);
	h_assert_serves(&D);
}

/* A drain answers a waiter without a limit at once (ESHUTDOWN), and the
 * daemon exits cleanly. Last: it stops the daemon. */
static void test_drain_answers_waiters(void **state)
{
	(void)state;
	int fd = raw_wait_forever("never", 9);
	usleep(300 * 1000);
	int64_t t0 = now_ms();
	kill(D.pid, SIGTERM);
	raw_expect_reply(fd, ESHUTDOWN, "wait ended", 5000);
	close(fd);
	int st = 0;
	assert_int_equal(waitpid(D.pid, &st, 0), D.pid);
	D.pid = -1;
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	assert_true(now_ms() - t0 < 5000);
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
	h_cleanup(&E); /* if a failed test left it */
	h_cleanup(&D);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_waiters_share_one_poll),
		cmocka_unit_test(test_timeout_says_how_far),
		cmocka_unit_test(test_ctl_wait),
		cmocka_unit_test(test_joiner_mid_listing_gets_its_own_look),
		cmocka_unit_test(test_no_look_while_saving_here),
		cmocka_unit_test(test_waiter_that_leaves),
		cmocka_unit_test(test_drain_answers_waiters),
	};
	return cmocka_run_group_tests_name("wait", tests, group_setup, group_teardown);
}
