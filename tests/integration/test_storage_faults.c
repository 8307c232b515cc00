/* Storage faults: a full disk fails the save with a clear error, leaves no
 * temporary file and frees the pool; a daemon killed mid-upload leaves
 * storage consistent after restart. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "harness.h"

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)((i * 2654435761u) >> 13 ^ seed);
}

/* Save one u8 tensor of n bytes as job/step; returns the durable status. */
static int save_blob(struct dctx *d, const char *job, uint64_t step, size_t n, char *msg, size_t msglen)
{
	ckpt_hello h = { .job = job, .rank = 0, .world_size = 1, .attempt_id = "f" };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d->sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, n, &b), 0);
	fill(ckpt_buffer_data(b), n, step);
	uint64_t shape[1] = { n };
	ckpt_tensor t = { .name = "blob", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = b, .nbytes = n };
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, step, &t, 1, NULL, 0, &f), 0);
	int r = ckpt_future_wait(f, CKPT_DURABLE, 60000);
	if (msg)
		snprintf(msg, msglen, "%s", ckpt_future_message(f));
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);
	return r;
}

static int load_blob(struct dctx *d, const char *job, int64_t step, size_t n, uint64_t *got_step)
{
	ckpt_hello h = { .job = job, .rank = 0, .world_size = 1, .attempt_id = "f" };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d->sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, n, &b), 0);
	uint64_t shape[1] = { n };
	ckpt_tensor t = { .name = "blob", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = b, .nbytes = n };
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_load(c, step, &t, 1, &f), 0);
	int r = ckpt_future_wait(f, CKPT_LOADED, 60000);
	if (r == 0) {
		*got_step = ckpt_future_step(f);
		uint8_t *want = malloc(n);
		assert_non_null(want);
		fill(want, n, *got_step);
		assert_memory_equal(ckpt_buffer_data(b), want, n);
		free(want);
	}
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);
	return r;
}

/* Run ckptctl against d (stderr with stdout); its exit status, output in out. */
static int ctl_run(struct dctx *d, const char *args, char *out, size_t outlen)
{
	return h_ctl(d, args, true, out, outlen);
}

static void test_full_disk(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	d.store_tmpfs = "6M";
	h_start(&d, NULL);
	char msg[512];
	/* 1 MiB fits. */
	assert_int_equal(save_blob(&d, "disk", 1, 1u << 20, msg, sizeof(msg)), 0);
	/* 8 MiB does not: a clear error, nothing half-written. */
	int r = save_blob(&d, "disk", 2, 8u << 20, msg, sizeof(msg));
	assert_int_equal(r, -ENOSPC);
	assert_non_null(strstr(msg, "No space left"));
	assert_non_null(strstr(msg, "step-000000000002"));
	/* The tmpfs lives in the daemon's own mount namespace: ask the
	 * daemon, not our view of the directory. */
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d.sock, NULL, &c), 0);
	ckpt_step_info *steps = NULL;
	size_t n = 0;
	assert_int_equal(ckpt_list(c, "disk", &steps, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(steps[0].step, 1);
	free(steps);
	ckpt_status_info st;
	assert_int_equal(ckpt_status(c, &st), 0);
	/* The failed save gave its chunks back: what is used is the memory
	 * tier's copy of step 1. */
	assert_int_equal(st.pool_used_bytes, st.pool_held_bytes);
	assert_int_equal(st.pool_held_bytes, 1u << 20);
	assert_int_equal(st.saves_failed, 1);
	/* ... and status says why, not only how many. */
	assert_int_equal(st.nfailures, 1);
	assert_string_equal(st.failures[0].job, "disk");
	assert_int_equal(st.failures[0].step, 2);
	assert_int_equal(st.failures[0].rank, 0);
	assert_int_equal(st.failures[0].status, -ENOSPC);
	assert_string_equal(st.failures[0].message, msg);
	int64_t age = (int64_t)time(NULL) - st.failures[0].unix_ns / 1000000000;
	assert_true(age >= -5 && age < 600);
	ckpt_close(c);
	static char out[1 << 16];
	assert_int_equal(ctl_run(&d, "status", out, sizeof(out)), 0);
	char *row = strstr(out, "last failures");
	if (row == NULL || strstr(row, " ago) disk step 2 rank 0: ") == NULL || strstr(row, "No space left") == NULL)
		fail_msg("ckptctl status does not give the failure: %s", out);
	assert_int_equal(ctl_run(&d, "status --json", out, sizeof(out)), 0);
	json_object *o = json_tokener_parse(out), *a, *v;
	assert_non_null(o);
	assert_true(json_object_object_get_ex(o, "last_failures", &a));
	assert_int_equal(json_object_array_length(a), 1);
	json_object *e = json_object_array_get_idx(a, 0);
	assert_true(json_object_object_get_ex(e, "job", &v));
	assert_string_equal(json_object_get_string(v), "disk");
	assert_true(json_object_object_get_ex(e, "step", &v));
	assert_int_equal(json_object_get_int64(v), 2);
	assert_true(json_object_object_get_ex(e, "message", &v));
	assert_string_equal(json_object_get_string(v), msg);
	assert_true(json_object_object_get_ex(e, "error", &v));
	assert_string_equal(json_object_get_string(v), ckpt_strerror(-ENOSPC));
	assert_true(json_object_object_get_ex(e, "failed_unix_ns", &v));
	assert_int_equal(json_object_get_int64(v), st.failures[0].unix_ns);
	json_object_put(o);
	/* Step 1 still restores, and a save that fits still works. */
	uint64_t got = 0;
	assert_int_equal(load_blob(&d, "disk", CKPT_LATEST, 1u << 20, &got), 0);
	assert_int_equal(got, 1);
	assert_int_equal(save_blob(&d, "disk", 3, 1u << 20, msg, sizeof(msg)), 0);
	h_assert_serves(&d);
	assert_int_equal(h_stop(&d), 0);
	h_cleanup(&d);
}

/* ckptctl status keeps the last five failed saves, newest first, each
 * message cut to 200 bytes: here seven saves over the quota of a job
 * whose 128-character name makes the message longer than that. */
static void test_status_keeps_last_failures(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, "[pool]\nquota = 4096\n");
	char job[129];
	memset(job, 'j', 128);
	job[128] = '\0';
	char msg[512];
	for (uint64_t step = 1; step <= 7; step++)
		assert_int_equal(save_blob(&d, job, step, 8192, msg, sizeof(msg)), -E2BIG);
	assert_true(strlen(msg) > 200); /* what the trainer was told, whole */
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d.sock, NULL, &c), 0);
	ckpt_status_info st;
	assert_int_equal(ckpt_status(c, &st), 0);
	ckpt_close(c);
	assert_int_equal(st.saves_failed, 7);
	assert_int_equal(st.nfailures, 5);
	for (uint32_t i = 0; i < 5; i++) {
		const ckpt_failure_info *f = &st.failures[i];
		assert_string_equal(f->job, job);
		assert_int_equal(f->step, 7 - i);
		assert_int_equal(f->status, -E2BIG);
		size_t n = strlen(f->message);
		if (n > 200 || n < 190 || strcmp(f->message + n - 3, "...") != 0 ||
		    strncmp(f->message, msg, n - 3) != 0)
			fail_msg("failure %u: '%s' (%zu bytes), want the first 197 bytes of '%s' and '...'", i,
				 f->message, n, msg);
		if (i > 0)
			assert_true(f->unix_ns >= st.failures[i - 1].unix_ns - 1000000000); /* newest first */
	}
	static char out[1 << 16];
	assert_int_equal(ctl_run(&d, "status", out, sizeof(out)), 0);
	for (uint64_t step = 1; step <= 7; step++) {
		char want[200];
		snprintf(want, sizeof(want), "%s step %" PRIu64 " rank 0: save of 8192 bytes", job, step);
		if ((strstr(out, want) != NULL) != (step >= 3))
			fail_msg("ckptctl status: step %" PRIu64 " %s: %s", step, step >= 3 ? "missing" : "kept", out);
	}
	assert_true(strstr(out, "step 7 rank 0") < strstr(out, "step 3 rank 0"));
	h_assert_serves(&d);
	assert_int_equal(h_stop(&d), 0);
	h_cleanup(&d);
}

static void test_killed_daemon_leaves_storage_consistent(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, NULL);
	const size_t n = 48u << 20;
	char msg[512];
	assert_int_equal(save_blob(&d, "kill", 1, n, msg, sizeof(msg)), 0);

	/* Stage step 2, then SIGKILL the daemon while it uploads. */
	ckpt_hello h = { .job = "kill", .rank = 0, .world_size = 1, .attempt_id = "f" };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, n, &b), 0);
	fill(ckpt_buffer_data(b), n, 2);
	uint64_t shape[1] = { n };
	ckpt_tensor t = { .name = "blob", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = b, .nbytes = n };
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, 2, &t, 1, NULL, 0, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_STAGED, 60000), 0);
	kill(d.pid, SIGKILL);
	waitpid(d.pid, NULL, 0);
	d.pid = -1;
	/* The client learns the connection is gone; durable is never
	 * claimed for a save that did not become durable. */
	int dr = ckpt_future_wait(f, CKPT_DURABLE, 60000);
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);

	h_start(&d, NULL);
	uint64_t got = 0;
	assert_int_equal(load_blob(&d, "kill", CKPT_LATEST, n, &got), 0);
	if (dr == 0)
		assert_int_equal(got, 2);
	assert_true(got == 1 || got == 2);
	/* Whatever the kill interrupted, saving step 2 again either works
	 * (it never completed) or is refused because it did. */
	int r = save_blob(&d, "kill", 2, n, msg, sizeof(msg));
	if (got == 2)
		assert_int_equal(r, -EEXIST);
	else
		assert_int_equal(r, 0);
	assert_int_equal(load_blob(&d, "kill", CKPT_LATEST, n, &got), 0);
	assert_int_equal(got, 2);
	h_assert_serves(&d);
	assert_int_equal(h_stop(&d), 0);
	h_cleanup(&d);
}

/* Pool admission with the block policy: a save that does not fit waits for
 * space and then proceeds; with a tiny admit timeout it fails with
 * ETIMEDOUT and a message, and the save holding the pool is unharmed. */
struct pending_save {
	ckpt_client *c;
	ckpt_buffer *b;
	ckpt_future *f;
	ckpt_tensor t;
	uint64_t shape[1];
	uint64_t step;
};

/* Connect and fill first, so that the save itself goes out at once. */
static void prepare_save(struct dctx *d, const char *job, uint64_t step, size_t n, struct pending_save *p)
{
	ckpt_hello h = { .job = job, .rank = 0, .world_size = 1, .attempt_id = "f" };
	memset(p, 0, sizeof(*p));
	assert_int_equal(ckpt_connect(d->sock, &h, &p->c), 0);
	assert_int_equal(ckpt_buffer_alloc(p->c, n, &p->b), 0);
	fill(ckpt_buffer_data(p->b), n, step);
	p->shape[0] = n;
	p->step = step;
	p->t = (ckpt_tensor){
		.name = "blob", .dtype = CKPT_U8, .ndim = 1, .global_shape = p->shape, .buffer = p->b, .nbytes = n
	};
}

static void start_save(struct pending_save *p)
{
	assert_int_equal(ckpt_save(p->c, p->step, &p->t, 1, NULL, 0, &p->f), 0);
}

static void finish(struct pending_save *p)
{
	ckpt_future_free(p->f);
	ckpt_buffer_free(p->b);
	ckpt_close(p->c);
}

static void test_admission_blocks_then_proceeds(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, NULL); /* 64 MiB pool, admit timeout 5 s */
	const size_t n = 40u << 20;
	struct pending_save a, b;
	prepare_save(&d, "blk", 1, n, &a);
	prepare_save(&d, "blk", 2, n, &b);
	start_save(&a);
	assert_int_equal(ckpt_future_wait(a.f, CKPT_STAGED, 60000), 0);
	/* 40 + 40 MiB > 64 MiB: the second waits for the first's upload. */
	start_save(&b);
	assert_int_equal(ckpt_future_wait(a.f, CKPT_DURABLE, 60000), 0);
	assert_int_equal(ckpt_future_wait(b.f, CKPT_DURABLE, 60000), 0);
	finish(&a);
	finish(&b);
	uint64_t got = 0;
	assert_int_equal(load_blob(&d, "blk", 1, n, &got), 0);
	assert_int_equal(load_blob(&d, "blk", 2, n, &got), 0);
	h_cleanup(&d);
}

static void test_admission_timeout(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, "admit_timeout_ms = 1\n");
	const size_t n = 40u << 20;
	struct pending_save a, b;
	prepare_save(&d, "tmo", 1, n, &a);
	prepare_save(&d, "tmo", 2, n, &b);
	start_save(&a);
	assert_int_equal(ckpt_future_wait(a.f, CKPT_STAGED, 60000), 0);
	/* Writing and fsyncing 40 MiB takes far longer than 1 ms. */
	start_save(&b);
	int r = ckpt_future_wait(b.f, CKPT_STAGED, 60000);
	if (r != -ETIMEDOUT)
		fail_msg("second save: %d (%s); the first was %s", r, ckpt_future_message(b.f),
			 ckpt_future_poll(a.f, CKPT_DURABLE) == 1 ? "already durable" : "not yet durable");
	assert_non_null(strstr(ckpt_future_message(b.f), "no staging space"));
	assert_int_equal(ckpt_future_wait(a.f, CKPT_DURABLE, 60000), 0);
	finish(&a);
	finish(&b);
	uint64_t got = 0;
	assert_int_equal(load_blob(&d, "tmo", CKPT_LATEST, n, &got), 0);
	assert_int_equal(got, 1);
	h_assert_serves(&d);
	h_cleanup(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_full_disk),
		cmocka_unit_test(test_status_keeps_last_failures),
		cmocka_unit_test(test_killed_daemon_leaves_storage_consistent),
		cmocka_unit_test(test_admission_blocks_then_proceeds),
		cmocka_unit_test(test_admission_timeout),
	};
	return cmocka_run_group_tests_name("storage_faults", tests, NULL, NULL);
}
