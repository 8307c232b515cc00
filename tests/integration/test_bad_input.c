/* Bad input: for each case the daemon answers with a clear error or closes
 * only the offending session, and goes on serving other clients. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "harness.h"

static struct dctx D;

static int group_setup(void **state)
{
	(void)state;
	h_init(&D);
	/* Small caps so the tests can break them cheaply. */
	h_start(&D, "[limits]\nmax_frame_bytes = 65536\nmax_fds_per_frame = 4\n");
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	h_cleanup(&D);
	return 0;
}

/* Expect a Reply with status, then (if closes) EOF. */
static void expect_reply(int fd, int status, const char *needle, bool closes)
{
	raw_expect_reply(fd, status, needle, 10000);
	if (closes)
		assert_true(raw_wait_eof(fd, 10000));
}

static void test_frame_over_cap(void **state)
{
	(void)state;
	int fd = raw_connect(D.sock);
	assert_true(fd >= 0);
	raw_hello(fd, "bad", 0, 1);
	uint8_t hdr[4] = { 0x00, 0x10, 0x00, 0x00 }; /* 1 MiB > 64 KiB cap */
	assert_int_equal(raw_send_bytes(fd, hdr, 4), 0);
	expect_reply(fd, EMSGSIZE, "cap", true);
	close(fd);
	h_assert_serves(&D);
}

static void test_garbage_bytes(void **state)
{
	(void)state;
	int fd = raw_connect(D.sock);
	assert_true(fd >= 0);
	uint8_t junk[4 + 32];
	junk[0] = 0;
	junk[1] = 0;
	junk[2] = 0;
	junk[3] = 32;
	memset(junk + 4, 0xFF, 32);
	assert_int_equal(raw_send_bytes(fd, junk, sizeof(junk)), 0);
	expect_reply(fd, EBADMSG, "malformed", true);
	close(fd);
	h_assert_serves(&D);
}

static void test_first_frame_not_hello(void **state)
{
	(void)state;
	int fd = raw_connect(D.sock);
	Ckpt__StatusRequest sr = CKPT__STATUS_REQUEST__INIT;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_STATUS;
	f.status = &sr;
	assert_int_equal(raw_send(fd, &f, 1, NULL, 0), 0);
	expect_reply(fd, EPROTO, "Hello", true);
	close(fd);
	h_assert_serves(&D);
}

static void test_wrong_version(void **state)
{
	(void)state;
	int fd = raw_connect(D.sock);
	Ckpt__Hello h = CKPT__HELLO__INIT;
	h.protocol_version = 99;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_HELLO;
	f.hello = &h;
	assert_int_equal(raw_send(fd, &f, 1, NULL, 0), 0);
	expect_reply(fd, EPROTONOSUPPORT, "protocol version", true);
	close(fd);
	h_assert_serves(&D);
}

static void test_unknown_message_type(void **state)
{
	(void)state;
	int fd = raw_connect(D.sock);
	raw_hello(fd, "bad", 0, 1);
	/* version=1, req_id=7, then field 99 (varint 5): a body this daemon
	 * does not know. */
	uint8_t body[] = { 0x08, 0x01, 0x10, 0x07, 0x98, 0x06, 0x05 };
	uint8_t buf[4 + sizeof(body)] = { 0, 0, 0, sizeof(body) };
	memcpy(buf + 4, body, sizeof(body));
	assert_int_equal(raw_send_bytes(fd, buf, sizeof(buf)), 0);
	expect_reply(fd, EBADMSG, "unknown", false);
	/* A daemon-to-client message sent by a client is refused the same way. */
	Ckpt__SaveStaged ev = CKPT__SAVE_STAGED__INIT;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_SAVE_STAGED;
	f.save_staged = &ev;
	assert_int_equal(raw_send(fd, &f, 8, NULL, 0), 0);
	expect_reply(fd, EBADMSG, "unexpected", false);
	raw_expect_alive(fd);
	close(fd);
	h_assert_serves(&D);
}

static void test_out_of_range_offset(void **state)
{
	(void)state;
	int fd = raw_connect(D.sock);
	raw_hello(fd, "bad", 0, 1);
	int mfd = make_memfd(4096, 1);
	raw_register(fd, 1, mfd, 4096);
	close(mfd);
	uint64_t shape[1] = { 100 };
	Ckpt__TensorRef t = CKPT__TENSOR_REF__INIT;
	t.name = "w";
	t.dtype = CKPT__DTYPE__F32;
	t.n_global_shape = 1;
	t.global_shape = shape;
	t.buffer_id = 1;
	t.offset = 4000; /* 4000 + 400 > 4096 */
	t.nbytes = 400;
	Ckpt__TensorRef *tp = &t;
	Ckpt__Save sv = CKPT__SAVE__INIT;
	sv.step = 1;
	sv.n_tensors = 1;
	sv.tensors = &tp;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_SAVE;
	f.save = &sv;
	assert_int_equal(raw_send(fd, &f, 3, NULL, 0), 0);
	Ckpt__Frame *rep = raw_recv(fd, 10000, NULL);
	assert_non_null(rep);
	assert_int_equal(rep->body_case, CKPT__FRAME__BODY_SAVE_FAILED);
	assert_int_equal(rep->req_id, 3);
	assert_int_equal(rep->save_failed->status, ERANGE);
	assert_non_null(strstr(rep->save_failed->message, "outside buffer"));
	ckpt__frame__free_unpacked(rep, NULL);
	/* Offset overflow near 2^64 is caught too, not wrapped. */
	t.offset = UINT64_MAX - 10;
	assert_int_equal(raw_send(fd, &f, 4, NULL, 0), 0);
	rep = raw_recv(fd, 10000, NULL);
	assert_non_null(rep);
	assert_int_equal(rep->body_case, CKPT__FRAME__BODY_SAVE_FAILED);
	assert_int_equal(rep->save_failed->status, ERANGE);
	ckpt__frame__free_unpacked(rep, NULL);
	/* nbytes that does not match the box. */
	t.offset = 0;
	t.nbytes = 399;
	assert_int_equal(raw_send(fd, &f, 5, NULL, 0), 0);
	rep = raw_recv(fd, 10000, NULL);
	assert_non_null(rep);
	assert_int_equal(rep->save_failed->status, EINVAL);
	ckpt__frame__free_unpacked(rep, NULL);
	/* A buffer that was never registered. */
	t.nbytes = 400;
	t.buffer_id = 77;
	assert_int_equal(raw_send(fd, &f, 6, NULL, 0), 0);
	rep = raw_recv(fd, 10000, NULL);
	assert_non_null(rep);
	assert_int_equal(rep->save_failed->status, ENOENT);
	ckpt__frame__free_unpacked(rep, NULL);
	raw_expect_alive(fd);
	close(fd);
	h_assert_serves(&D);
}

static void test_register_without_fd(void **state)
{
	(void)state;
	int fd = raw_connect(D.sock);
	raw_hello(fd, "bad", 0, 1);
	Ckpt__RegisterBuffer rb = CKPT__REGISTER_BUFFER__INIT;
	rb.buffer_id = 1;
	rb.kind = CKPT__BUFFER_KIND__HOST_FD;
	rb.nbytes = 4096;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_REGISTER_BUFFER;
	f.register_buffer = &rb;
	assert_int_equal(raw_send(fd, &f, 2, NULL, 0), 0);
	expect_reply(fd, EBADF, "no file descriptor", false);
	/* A file smaller than it claims. */
	int mfd = make_memfd(1024, 0);
	assert_int_equal(raw_send(fd, &f, 3, &mfd, 1), 0);
	close(mfd);
	expect_reply(fd, EINVAL, "1024", false);
	raw_expect_alive(fd);
	close(fd);
}

static void test_too_many_fds(void **state)
{
	(void)state;
	int fd = raw_connect(D.sock);
	raw_hello(fd, "bad", 0, 1);
	int fds[8];
	for (int i = 0; i < 8; i++)
		fds[i] = make_memfd(4096, 0);
	Ckpt__RegisterBuffer rb = CKPT__REGISTER_BUFFER__INIT;
	rb.buffer_id = 1;
	rb.kind = CKPT__BUFFER_KIND__HOST_FD;
	rb.nbytes = 4096;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_REGISTER_BUFFER;
	f.register_buffer = &rb;
	assert_int_equal(raw_send(fd, &f, 2, fds, 8), 0);
	expect_reply(fd, EMFILE, "file descriptors", true);
	for (int i = 0; i < 8; i++)
		close(fds[i]);
	close(fd);
	h_assert_serves(&D);
}

/* Poll the catalogue until job/step is complete. */
static bool wait_complete(const char *job, uint64_t step, int timeout_ms)
{
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(D.sock, NULL, &c), 0);
	bool ok = false;
	for (int waited = 0; waited < timeout_ms && !ok; waited += 50) {
		ckpt_step_info *steps = NULL;
		size_t n = 0;
		assert_int_equal(ckpt_list(c, job, &steps, &n), 0);
		for (size_t i = 0; i < n; i++)
			if (steps[i].step == step && steps[i].complete)
				ok = true;
		free(steps);
		if (!ok)
			usleep(50 * 1000);
	}
	ckpt_close(c);
	return ok;
}

static void test_disconnect_mid_save(void **state)
{
	(void)state;
	const size_t n = 24u << 20;
	ckpt_hello h = { .job = "mid", .rank = 0, .world_size = 1, .attempt_id = "m" };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, n, &b), 0);
	uint8_t *p = ckpt_buffer_data(b);
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 31 + 7);
	uint64_t shape[1] = { n };
	ckpt_tensor t = { .name = "blob", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape,
			  .buffer = b, .offset = 0, .nbytes = n };
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, 10, &t, 1, NULL, 0, &f), 0);
	/* The trainer dies right after asking: no wait for staged. */
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);
	/* The daemon still finishes the save: nothing is lost. */
	assert_true(wait_complete("mid", 10, 30000));
	assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
	assert_int_equal(ckpt_buffer_alloc(c, n, &b), 0);
	t.buffer = b;
	assert_int_equal(ckpt_load(c, 10, &t, 1, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_LOADED, 30000), 0);
	p = ckpt_buffer_data(b);
	for (size_t i = 0; i < n; i++)
		if (p[i] != (uint8_t)(i * 31 + 7))
			fail_msg("byte %zu differs after restore", i);
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);
	h_assert_serves(&D);
}

static void truncate_case(int fd_to_register, const char *what)
{
	const size_t n = 8u << 20;
	ckpt_hello h = { .job = "trunc", .rank = 0, .world_size = 1 };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_register_fd(c, fd_to_register, n, &b), 0);
	/* The client shrinks its file behind the daemon's back. */
	assert_int_equal(ftruncate(fd_to_register, 4096), 0);
	uint64_t shape[1] = { n };
	ckpt_tensor t = { .name = "w", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape,
			  .buffer = b, .offset = 0, .nbytes = n };
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, 1, &t, 1, NULL, 0, &f), 0);
	int r = ckpt_future_wait(f, CKPT_STAGED, 30000);
	if (r != -EFAULT)
		fail_msg("%s: staged returned %d (%s)", what, r, ckpt_future_message(f));
	assert_non_null(strstr(ckpt_future_message(f), "truncated"));
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);
	h_assert_serves(&D);
}

static void test_truncated_memfd(void **state)
{
	(void)state;
	int fd = make_memfd(8u << 20, 3);
	truncate_case(fd, "memfd");
	close(fd);
}

static void test_truncated_shm_file(void **state)
{
	(void)state;
	char name[64];
	snprintf(name, sizeof(name), "/ckpt-test-%d", (int)getpid());
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	shm_unlink(name);
	assert_int_equal(ftruncate(fd, 8 << 20), 0);
	truncate_case(fd, "/dev/shm file");
	close(fd);
}

static void test_sealed_memfd_is_staged(void **state)
{
	(void)state;
	/* A memfd sealed against shrinking cannot be truncated at all, and
	 * the daemon stages it through its read-only mapping. */
	const size_t n = 4u << 20;
	int fd = memfd_create("sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)n), 0);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	assert_int_equal(ftruncate(fd, 4096), -1);
	assert_int_equal(errno, EPERM);
	uint8_t *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i ^ (i >> 9));
	ckpt_hello h = { .job = "sealed", .rank = 0, .world_size = 1 };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_register_fd(c, fd, n, &b), 0);
	uint64_t shape[1] = { n };
	ckpt_tensor t = { .name = "w", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape,
			  .buffer = b, .offset = 0, .nbytes = n };
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, 1, &t, 1, NULL, 0, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(f);
	memset(p, 0, n);
	assert_int_equal(ckpt_load(c, 1, &t, 1, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_LOADED, 30000), 0);
	for (size_t i = 0; i < n; i++)
		if (p[i] != (uint8_t)(i ^ (i >> 9)))
			fail_msg("byte %zu differs after restore", i);
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);
	munmap(p, n);
	close(fd);
}

static void test_control_session_cannot_save(void **state)
{
	(void)state;
	int fd = raw_connect(D.sock);
	raw_hello(fd, "", 0, 0);
	Ckpt__Save sv = CKPT__SAVE__INIT;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_SAVE;
	f.save = &sv;
	Ckpt__Frame *rep = raw_call(fd, &f, 2, CKPT__FRAME__BODY_SAVE_FAILED);
	assert_int_equal(rep->save_failed->status, EPERM);
	ckpt__frame__free_unpacked(rep, NULL);
	raw_expect_alive(fd);
	close(fd);
}

static void test_save_larger_than_pool(void **state)
{
	(void)state;
	/* 80 MiB can never fit the 64 MiB pool: fail fast, do not wait. */
	const size_t n = 80u << 20;
	int fd = memfd_create("big", MFD_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)n), 0);
	ckpt_hello h = { .job = "big", .rank = 0, .world_size = 1 };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_register_fd(c, fd, n, &b), 0);
	uint64_t shape[1] = { n };
	ckpt_tensor t = { .name = "w", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape,
			  .buffer = b, .offset = 0, .nbytes = n };
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, 1, &t, 1, NULL, 0, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_STAGED, 30000), -E2BIG);
	assert_non_null(strstr(ckpt_future_message(f), "staging pool"));
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);
	close(fd);
	h_assert_serves(&D);
}

static void test_uid_not_allowed(void **state)
{
	(void)state;
	/* A daemon that admits only uid 4242 refuses us with EACCES. */
	struct dctx other;
	h_init(&other);
	h_start(&other, "[server]\nallowed_uids = 4242\nallowed_gids =\n");
	/* h_start's readiness probe connected, so the socket works. */
	ckpt_client *c = NULL;
	int r = ckpt_connect(other.sock, NULL, &c);
	assert_int_equal(r, -EACCES);
	assert_non_null(strstr(ckpt_errmsg(), "not allowed"));
	h_cleanup(&other);

	/* Another uid refused by the default ids: test_other_uid.c (needs root). */
	h_assert_serves(&D);
}


static void test_duplicate_save_in_flight(void **state)
{
	(void)state;
	/* The same (job, step, rank) twice at once: the second is refused,
	 * the first completes. */
	const size_t n = 16u << 20;
	ckpt_hello h = { .job = "dup", .rank = 0, .world_size = 1 };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(D.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, n, &b), 0);
	memset(ckpt_buffer_data(b), 7, n);
	uint64_t shape[1] = { n };
	ckpt_tensor t = { .name = "w", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape,
			  .buffer = b, .nbytes = n };
	ckpt_future *f1 = NULL, *f2 = NULL;
	assert_int_equal(ckpt_save(c, 1, &t, 1, NULL, 0, &f1), 0);
	assert_int_equal(ckpt_save(c, 1, &t, 1, NULL, 0, &f2), 0);
	assert_int_equal(ckpt_future_wait(f2, CKPT_STAGED, 30000), -EBUSY);
	assert_non_null(strstr(ckpt_future_message(f2), "already being saved"));
	assert_int_equal(ckpt_future_wait(f1, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(f1);
	ckpt_future_free(f2);
	ckpt_buffer_free(b);
	ckpt_close(c);
}

static void test_non_shm_fd_refused(void **state)
{
	(void)state;
	/* A file on a disk filesystem (which could be FUSE or NFS and block
	 * the daemon) is not accepted as a buffer. */
	int fd = raw_connect(D.sock);
	raw_hello(fd, "bad", 0, 1);
	char path[400];
	snprintf(path, sizeof(path), "%s/plain.bin", D.dir);
	int ffd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	assert_true(ffd >= 0);
	assert_int_equal(ftruncate(ffd, 4096), 0);
	Ckpt__RegisterBuffer rb = CKPT__REGISTER_BUFFER__INIT;
	rb.buffer_id = 1;
	rb.kind = CKPT__BUFFER_KIND__HOST_FD;
	rb.nbytes = 4096;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_REGISTER_BUFFER;
	f.register_buffer = &rb;
	assert_int_equal(raw_send(fd, &f, 2, &ffd, 1), 0);
	close(ffd);
	expect_reply(fd, EBADF, "memfd", false);
	raw_expect_alive(fd);
	close(fd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_frame_over_cap),
		cmocka_unit_test(test_garbage_bytes),
		cmocka_unit_test(test_first_frame_not_hello),
		cmocka_unit_test(test_wrong_version),
		cmocka_unit_test(test_unknown_message_type),
		cmocka_unit_test(test_out_of_range_offset),
		cmocka_unit_test(test_register_without_fd),
		cmocka_unit_test(test_too_many_fds),
		cmocka_unit_test(test_disconnect_mid_save),
		cmocka_unit_test(test_truncated_memfd),
		cmocka_unit_test(test_truncated_shm_file),
		cmocka_unit_test(test_sealed_memfd_is_staged),
		cmocka_unit_test(test_control_session_cannot_save),
		cmocka_unit_test(test_save_larger_than_pool),
		cmocka_unit_test(test_uid_not_allowed),
		cmocka_unit_test(test_duplicate_save_in_flight),
		cmocka_unit_test(test_non_shm_fd_refused),
	};
	return cmocka_run_group_tests_name("bad_input", tests, group_setup, group_teardown);
}
