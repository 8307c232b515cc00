/* Issue "Security", item 4: what a client can make the daemon hold. Each
 * cap refuses with a clear error, counts in ckptd_refused_total{limit=},
 * and leaves the daemon serving everyone else. Also the regressions a
 * hostile local client found: silent connections holding every slot, one
 * file registered many times mapped many times, a job named "a..b", and
 * accept() spinning on EMFILE. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "harness.h"

static struct dctx D;

static int group_setup(void **state)
{
	(void)state;
	h_init(&D);
	h_start(&D, "[limits]\nhello_timeout_ms = 300\nidle_timeout_ms = 1500\nmax_sessions_per_uid = 6\n"
		    "max_registered_bytes = 1G\n");
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	h_cleanup(&D);
	return 0;
}

static uint64_t refused(const char *limit)
{
	char name[128];
	snprintf(name, sizeof(name), "ckptd_refused_total{limit=\"%s\"}", limit);
	return h_metric(&D, name);
}

/* A sparse memfd: registering it faults nothing in. */
static int sparse_memfd(const char *name, size_t n)
{
	int fd = memfd_create(name, MFD_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)n), 0);
	return fd;
}

static int count_lines_with(const char *path, const char *needle)
{
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	char line[4096];
	int n = 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

static int count_fds(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	DIR *d = opendir(path);
	assert_non_null(d);
	int n = 0;
	for (struct dirent *e; (e = readdir(d)) != NULL;)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

static void test_job_name_with_dotdot(void **state)
{
	(void)state;
	int fd = raw_connect(D.sock);
	Ckpt__Hello h = CKPT__HELLO__INIT;
	h.protocol_version = 1;
	h.job = "a..b";
	h.world_size = 1;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_HELLO;
	f.hello = &h;
	assert_int_equal(raw_send(fd, &f, 1, NULL, 0), 0);
	raw_expect_reply(fd, EINVAL, "without '..'", 10000);
	assert_true(raw_wait_eof(fd, 10000));
	close(fd);
}

/* A job name with a slash, on a ckptd without tenants: the refusal says
 * the job name is at fault and what one may be (it said only "invalid
 * job name"), in Hello and in a request naming the job. */
static void test_job_name_with_slash(void **state)
{
	(void)state;
	static const char *const want[] = {
		"job name 'team/llama' must be 1-128 characters of [A-Za-z0-9._-], not starting with '.' and "
		"without '..'",
		"TENANT/NAME only for an admin, of a configured tenant; this ckptd has no tenants",
	};
	ckpt_hello h = { .job = "team/llama", .rank = 0, .world_size = 1 };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(D.sock, &h, &c), -EINVAL);
	for (size_t i = 0; i < 2; i++)
		if (strstr(ckpt_errmsg(), want[i]) == NULL)
			fail_msg("Hello as team/llama: '%s', want '%s'", ckpt_errmsg(), want[i]);
	assert_int_equal(ckpt_connect(D.sock, NULL, &c), 0);
	ckpt_step_info *v = NULL;
	size_t n = 0;
	assert_int_equal(ckpt_list(c, "team/llama", &v, &n), -EINVAL);
	for (size_t i = 0; i < 2; i++)
		if (strstr(ckpt_errmsg(), want[i]) == NULL)
			fail_msg("ls team/llama: '%s', want '%s'", ckpt_errmsg(), want[i]);
	ckpt_close(c);
}

/* Connections that never send Hello used to hold every slot forever. */
static void test_hello_timeout(void **state)
{
	(void)state;
	uint64_t before = refused("hello_timeout");
	int fd = raw_connect(D.sock);
	raw_expect_reply(fd, ETIMEDOUT, "no Hello within 300 ms", 5000);
	assert_true(raw_wait_eof(fd, 5000));
	close(fd);
	assert_true(refused("hello_timeout") > before);
}

/* A control session silent past idle_timeout_ms is closed; a trainer's
 * session is not, however long it waits between saves. */
static void test_idle_timeout_spares_trainers(void **state)
{
	(void)state;
	int ctl = raw_connect(D.sock), trainer = raw_connect(D.sock);
	raw_hello(ctl, "", 0, 0);
	raw_hello(trainer, "idlejob", 0, 1);
	raw_expect_reply(ctl, ETIMEDOUT, "idle for 1500 ms", 6000);
	assert_true(raw_wait_eof(ctl, 5000));
	close(ctl);
	raw_expect_alive(trainer);
	assert_true(refused("idle_timeout") >= 1);
	close(trainer);
}

static void test_sessions_per_uid(void **state)
{
	(void)state;
	int fds[6];
	size_t n = 0;
	uint64_t before = refused("sessions_per_uid");
	/* Up to the cap (less whatever other sessions of ours still close). */
	for (int tries = 0; n < 6 && tries < 100; tries++) {
		int fd = raw_connect(D.sock);
		Ckpt__Hello h = CKPT__HELLO__INIT;
		h.protocol_version = 1;
		Ckpt__Frame f = CKPT__FRAME__INIT;
		f.body_case = CKPT__FRAME__BODY_HELLO;
		f.hello = &h;
		assert_int_equal(raw_send(fd, &f, 1, NULL, 0), 0);
		Ckpt__Frame *rep = raw_recv(fd, 10000, NULL);
		assert_non_null(rep);
		bool ok = rep->body_case == CKPT__FRAME__BODY_HELLO_REPLY;
		if (!ok) {
			assert_int_equal(rep->reply->status, EMFILE);
			assert_non_null(strstr(rep->reply->message, "max_sessions_per_uid"));
			close(fd);
			usleep(100 * 1000);
		} else {
			fds[n++] = fd;
		}
		ckpt__frame__free_unpacked(rep, NULL);
	}
	assert_int_equal(n, 6);
	int extra = raw_connect(D.sock);
	raw_expect_reply(extra, EMFILE, "uid 0 already has 6 sessions (max_sessions_per_uid)", 10000);
	close(extra);
	for (size_t i = 0; i < n; i++)
		close(fds[i]);
	for (int i = 0; i < 100; i++) { /* the closes reach the daemon */
		ckpt_client *c = NULL;
		if (ckpt_connect(D.sock, NULL, &c) == 0) {
			ckpt_close(c);
			break;
		}
		usleep(50 * 1000);
	}
	assert_true(refused("sessions_per_uid") > before);
}

static void test_registered_bytes_cap(void **state)
{
	(void)state;
	int fd = raw_connect(D.sock);
	raw_hello(fd, "capjob", 0, 1);
	int a = sparse_memfd("cap-a", 512u << 20), b = sparse_memfd("cap-b", 512u << 20),
	    c = sparse_memfd("cap-c", 4096);
	assert_int_equal(raw_register_status(fd, 1, a, 512u << 20, NULL), 0);
	assert_int_equal(raw_register_status(fd, 2, b, 512u << 20, NULL), 0);
	uint64_t before = refused("registered_bytes");
	assert_int_equal(raw_register_status(fd, 3, c, 4096, "max_registered_bytes"), ENOBUFS);
	assert_true(refused("registered_bytes") > before);
	/* Unregistering gives the room back. */
	Ckpt__Unregister un = CKPT__UNREGISTER__INIT;
	un.buffer_id = 2;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_UNREGISTER;
	f.unregister = &un;
	assert_int_equal(raw_send(fd, &f, 9, NULL, 0), 0);
	raw_expect_reply(fd, 0, NULL, 10000);
	assert_int_equal(raw_register_status(fd, 3, c, 4096, NULL), 0);
	close(a);
	close(b);
	close(c);
	close(fd);
}

/* One 32 MiB file registered 40 times through dup'd fds, from two
 * sessions: one mapping and one fd in the daemon, not 40. */
static void test_same_file_mapped_once(void **state)
{
	(void)state;
	char maps[64];
	snprintf(maps, sizeof(maps), "/proc/%d/maps", (int)D.pid);
	int fds_before = count_fds(D.pid);
	int s1 = raw_connect(D.sock), s2 = raw_connect(D.sock);
	raw_hello(s1, "mapjob", 0, 2);
	raw_hello(s2, "mapjob", 1, 2);
	int m = make_memfd(32u << 20, 7);
	for (uint64_t i = 0; i < 40; i++) {
		int dupfd = dup(m);
		assert_int_equal(raw_register_status(i % 2 ? s2 : s1, 100 + i, dupfd, 32u << 20, NULL), 0);
		close(dupfd);
	}
	/* Smaller registrations of the same file share it too. */
	assert_int_equal(raw_register_status(s1, 200, m, 4096, NULL), 0);
	assert_int_equal(count_lines_with(maps, "memfd:ckpt-test"), 1);
	assert_true(count_fds(D.pid) <= fds_before + 2 + 1); /* two sockets, one file */
	close(s1);
	close(s2);
	/* Every registration gone: the mapping goes too. */
	for (int i = 0; i < 100 && count_lines_with(maps, "memfd:ckpt-test") > 0; i++)
		usleep(50 * 1000);
	assert_int_equal(count_lines_with(maps, "memfd:ckpt-test"), 0);
	close(m);
}

static double cpu_seconds(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	char buf[1024];
	assert_non_null(fgets(buf, sizeof(buf), f));
	fclose(f);
	const char *p = strrchr(buf, ')');
	unsigned long ut = 0, st = 0;
	/* fields after the command: state ppid ... utime(14) stime(15) */
	assert_int_equal(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st), 2);
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Out of fds, accept() used to fail in a loop that burned a core while new
 * clients hung. Now the client is told, and the loop backs off. */
static void test_fd_exhaustion_backs_off(void **state)
{
	(void)state;
	struct rlimit old, low;
	assert_int_equal(prlimit(D.pid, RLIMIT_NOFILE, NULL, &old), 0);
	low.rlim_cur = (rlim_t)count_fds(D.pid) + 2;
	low.rlim_max = old.rlim_max;
	assert_int_equal(prlimit(D.pid, RLIMIT_NOFILE, &low, NULL), 0);
	int held[16];
	int n = 0;
	/* Fill the daemon's last fds with trainer sessions (never closed for
	 * being idle) until it refuses one: about 2, but an fd an earlier
	 * test's session still held when they were counted may free up since. */
	for (;; n++) {
		if (n == 8)
			fail_msg("ckptd took 8 sessions with %d fds allowed: no refusal", (int)low.rlim_cur);
		held[n] = raw_connect(D.sock);
		Ckpt__Hello h = CKPT__HELLO__INIT;
		h.protocol_version = CKPT_PROTOCOL_VERSION;
		h.job = (char *)"fdjob";
		h.rank = (uint32_t)n;
		h.world_size = 8;
		h.attempt_id = (char *)"raw";
		Ckpt__Frame hf = CKPT__FRAME__INIT;
		hf.body_case = CKPT__FRAME__BODY_HELLO;
		hf.hello = &h;
		(void)raw_send(held[n], &hf, 1, NULL, 0); /* a refused one may be closed already */
		Ckpt__Frame *f = raw_recv(held[n], 10000, NULL);
		assert_non_null(f);
		if (f->body_case == CKPT__FRAME__BODY_HELLO_REPLY) {
			ckpt__frame__free_unpacked(f, NULL);
			continue;
		}
		assert_int_equal(f->body_case, CKPT__FRAME__BODY_REPLY);
		if (f->reply->status != EMFILE || strstr(f->reply->message, "out of file descriptors") == NULL)
			fail_msg("reply %d '%s', want %d and 'out of file descriptors'", f->reply->status,
				 f->reply->message, EMFILE);
		ckpt__frame__free_unpacked(f, NULL);
		close(held[n]);
		break;
	}
	if (n < 2)
		fail_msg("ckptd refused session %d with %d fds allowed (2 free when counted)", n, (int)low.rlim_cur);
	double t0 = cpu_seconds(D.pid);
	for (int i = 0; i < 4; i++) { /* pending connections the loop cannot take */
		held[n++] = raw_connect(D.sock);
	}
	usleep(1000 * 1000);
	double spent = cpu_seconds(D.pid) - t0;
	if (spent > 0.3)
		fail_msg("ckptd used %.2f s of CPU in 1 s while out of fds: it spins", spent);
	for (int i = 0; i < n; i++)
		close(held[i]);
	assert_int_equal(prlimit(D.pid, RLIMIT_NOFILE, &old, NULL), 0);
	/* Served again once fds are back. */
	h_assert_serves(&D);
	assert_true(refused("fd_exhausted") >= 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_job_name_with_dotdot),  cmocka_unit_test(test_job_name_with_slash),
		cmocka_unit_test(test_hello_timeout),         cmocka_unit_test(test_idle_timeout_spares_trainers),
		cmocka_unit_test(test_sessions_per_uid),      cmocka_unit_test(test_registered_bytes_cap),
		cmocka_unit_test(test_same_file_mapped_once), cmocka_unit_test(test_fd_exhaustion_backs_off),
	};
	return cmocka_run_group_tests_name("limits", tests, group_setup, group_teardown);
}
