/* powerfs against the rules it stands for (powerfs.c): it is a test oracle,
 * so it is tested before anything is tested on it. Each case mounts a
 * fresh one (root and /dev/fuse needed: else the suite is skipped), does
 * what a program would, cuts the power, mounts the same backing directory
 * again and checks what survived. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

static char top[256], backing[300], mnt[300], ctl_path[300];
static pid_t fs_pid = -1;

static void path(char *out, size_t len, const char *rel)
{
	snprintf(out, len, "%s/%s", mnt, rel);
}

static void mount_fs(void)
{
	struct stat before, now;
	assert_int_equal(stat(mnt, &before), 0);
	fs_pid = fork();
	if (fs_pid == 0) {
		char log[320];
		snprintf(log, sizeof(log), "%s/powerfs.log", top);
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		dup2(fd, 2);
		execl(getenv("POWERFS_BIN"), "powerfs", backing, mnt, ctl_path, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 500; i++) {
		if (stat(mnt, &now) == 0 && now.st_dev != before.st_dev)
			return;
		usleep(10 * 1000);
	}
	fail_msg("powerfs did not mount %s", mnt);
}

static void unmount_fs(void)
{
	if (fs_pid < 0)
		return;
	if (umount2(mnt, 0) != 0)
		umount2(mnt, MNT_DETACH);
	int st;
	for (int i = 0; i < 500 && waitpid(fs_pid, &st, WNOHANG) == 0; i++)
		usleep(10 * 1000);
	kill(fs_pid, SIGKILL);
	waitpid(fs_pid, &st, 0);
	fs_pid = -1;
}

/* One control command; its answer into out; 0 if "ok". */
static int ctl(char *out, size_t len, const char *fmt, ...)
{
	char line[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", ctl_path);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_true(write(fd, line, strlen(line)) > 0);
	char buf[512];
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	buf[n > 0 ? n : 0] = '\0';
	if (out)
		snprintf(out, len, "%s", buf);
	return strncmp(buf, "ok", 2) == 0 ? 0 : -1;
}

/* Cut the power (torn with seed when seed > 0) and mount again. */
static void power_cycle(unsigned long long seed)
{
	if (seed)
		assert_int_equal(ctl(NULL, 0, "cut %llu", seed), 0);
	else
		assert_int_equal(ctl(NULL, 0, "cut"), 0);
	unmount_fs();
	mount_fs();
}

static int setup(void **state)
{
	(void)state;
	snprintf(top, sizeof(top), "/tmp/powerfs-test-XXXXXX");
	assert_non_null(mkdtemp(top));
	snprintf(backing, sizeof(backing), "%s/disk", top);
	snprintf(mnt, sizeof(mnt), "%s/mnt", top);
	snprintf(ctl_path, sizeof(ctl_path), "%s/ctl", top);
	assert_int_equal(mkdir(backing, 0700), 0);
	assert_int_equal(mkdir(mnt, 0700), 0);
	mount_fs();
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	unmount_fs();
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", top);
	return system(cmd) == 0 ? 0 : -1;
}

static void put(const char *rel, const void *data, size_t n, bool sync)
{
	char p[400];
	path(p, sizeof(p), rel);
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, n), (ssize_t)n);
	if (sync)
		assert_int_equal(fsync(fd), 0);
	close(fd);
}

static void sync_dir(const char *rel)
{
	char p[400];
	path(p, sizeof(p), rel);
	int fd = open(p, O_RDONLY | O_DIRECTORY);
	assert_true(fd >= 0);
	assert_int_equal(fsync(fd), 0);
	close(fd);
}

/* The file's bytes (-1 if it does not exist). */
static ssize_t get(const char *rel, void *buf, size_t cap)
{
	char p[400];
	path(p, sizeof(p), rel);
	int fd = open(p, O_RDONLY);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, cap);
	close(fd);
	return n;
}

static bool exists(const char *rel)
{
	char p[400];
	struct stat st;
	path(p, sizeof(p), rel);
	return stat(p, &st) == 0;
}

/* A file's data and size are durable at its fsync; its name at its
 * directory's: a file never fsync'd comes back empty, one whose directory
 * was never fsync'd does not come back. */
static void test_data_at_fsync_names_at_dir_fsync(void **state)
{
	(void)state;
	put("synced", "durable", 7, true);
	put("unsynced", "lost", 4, false);
	sync_dir("");
	put("nameless", "data, no name", 13, true);
	power_cycle(0);
	char buf[64];
	assert_int_equal(get("synced", buf, sizeof(buf)), 7);
	assert_memory_equal(buf, "durable", 7);
	assert_int_equal(get("unsynced", buf, sizeof(buf)), 0);
	assert_false(exists("nameless"));
}

/* Writes after the last fsync are lost, the rest is not; truncate too. */
static void test_overwrite_after_fsync_lost(void **state)
{
	(void)state;
	put("f", "aaaa", 4, true);
	sync_dir("");
	char p[400];
	path(p, sizeof(p), "f");
	int fd = open(p, O_WRONLY);
	assert_int_equal(pwrite(fd, "bb", 2, 0), 2);
	assert_int_equal(ftruncate(fd, 10), 0);
	close(fd);
	char buf[64];
	assert_int_equal(get("f", buf, sizeof(buf)), 10);
	power_cycle(0);
	assert_int_equal(get("f", buf, sizeof(buf)), 4);
	assert_memory_equal(buf, "aaaa", 4);
}

/* A rename is durable at its directories' fsync: before it the old name
 * stands; across directories with only the target's fsync'd, both names
 * (one file, two links) stand; an unlink not fsync'd is undone. */
static void test_rename_and_unlink_need_dir_fsync(void **state)
{
	(void)state;
	char p[400], q[400], buf[64];
	path(p, sizeof(p), "d1");
	assert_int_equal(mkdir(p, 0755), 0);
	path(p, sizeof(p), "d2");
	assert_int_equal(mkdir(p, 0755), 0);
	sync_dir("");
	put("d1/a", "A", 1, true);
	put("d1/gone", "G", 1, true);
	sync_dir("d1");
	path(p, sizeof(p), "d1/a");
	path(q, sizeof(q), "d1/b");
	assert_int_equal(rename(p, q), 0);
	path(p, sizeof(p), "d1/gone");
	assert_int_equal(unlink(p), 0);
	power_cycle(0);
	assert_true(exists("d1/a"));
	assert_false(exists("d1/b"));
	assert_int_equal(get("d1/gone", buf, sizeof(buf)), 1);
	path(p, sizeof(p), "d1/a");
	path(q, sizeof(q), "d2/a");
	assert_int_equal(rename(p, q), 0);
	sync_dir("d2");
	power_cycle(0);
	struct stat s1, s2;
	path(p, sizeof(p), "d1/a");
	path(q, sizeof(q), "d2/a");
	assert_int_equal(stat(p, &s1), 0);
	assert_int_equal(stat(q, &s2), 0);
	assert_int_equal(s1.st_ino, s2.st_ino);
	assert_int_equal(s1.st_nlink, 2);
	assert_int_equal(get("d2/a", buf, sizeof(buf)), 1);
	assert_memory_equal(buf, "A", 1);
}

/* A directory made and never fsync'd in its parent is gone with all in
 * it, however well its own entries were fsync'd. */
static void test_directory_needs_its_parent(void **state)
{
	(void)state;
	char p[400];
	path(p, sizeof(p), "new");
	assert_int_equal(mkdir(p, 0755), 0);
	put("new/f", "F", 1, true);
	sync_dir("new");
	power_cycle(0);
	assert_false(exists("new"));
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "test $(ls '%s/.ino' | wc -l) -eq 0", backing);
	assert_int_equal(system(cmd), 0); /* unreached: removed at mount */
}

/* A torn cut: each 4 KiB page written since the last fsync reaches the
 * disk or not, whole, and the same seed tears the same way. */
static void test_torn_cut_whole_pages_by_seed(void **state)
{
	(void)state;
	enum { PAGES = 16 };
	static uint8_t old[PAGES * 4096], new[PAGES * 4096], got[2][PAGES * 4096];
	memset(old, 'o', sizeof(old));
	memset(new, 'n', sizeof(new));
	for (int round = 0; round < 2; round++) {
		put("t", old, sizeof(old), true);
		sync_dir("");
		char p[400];
		path(p, sizeof(p), "t");
		int fd = open(p, O_WRONLY);
		for (int i = 0; i < PAGES; i++)
			assert_int_equal(pwrite(fd, new + i * 4096, 4096, (off_t)i * 4096), 4096);
		close(fd);
		power_cycle(424242);
		assert_int_equal(get("t", got[round], sizeof(got[round])), (ssize_t)sizeof(old));
		int olds = 0, news = 0;
		for (int i = 0; i < PAGES; i++) {
			const uint8_t *pg = got[round] + i * 4096;
			if (memcmp(pg, old, 4096) == 0)
				olds++;
			else if (memcmp(pg, new, 4096) == 0)
				news++;
			else
				fail_msg("page %d is neither old nor new", i);
		}
		assert_true(olds > 0 && news > 0); /* 16 fair coins: both, but for 2 in 65536 */
	}
	assert_memory_equal(got[0], got[1], sizeof(got[0]));
}

/* A rename over a name, cut torn: the name stands for the old file or
 * the new one, never for none (a journaling file system's rename), over
 * many seeds. */
static void test_torn_rename_over_keeps_the_name(void **state)
{
	(void)state;
	char p[400], q[400], buf[16], prev = 'a';
	put("t", "a", 1, true);
	sync_dir("");
	for (int seed = 1; seed <= 12; seed++) {
		char next = (char)('a' + seed);
		put("t.new", &next, 1, true);
		path(p, sizeof(p), "t.new");
		path(q, sizeof(q), "t");
		assert_int_equal(rename(p, q), 0);
		power_cycle((unsigned long long)seed);
		assert_int_equal(get("t", buf, sizeof(buf)), 1);
		if (buf[0] != prev && buf[0] != next)
			fail_msg("seed %d: t holds '%c', neither '%c' nor '%c'", seed, buf[0], prev, next);
		prev = buf[0];
		assert_int_equal(ctl(NULL, 0, "sync"), 0);
	}
}

/* A failed fsync loses what it was to write, and a retry that succeeds
 * does not bring it back (Linux's behaviour since 4.13). */
static void test_failed_fsync_loses_data(void **state)
{
	(void)state;
	put("f", "old!", 4, true);
	sync_dir("");
	assert_int_equal(ctl(NULL, 0, "fail fsync 1 EIO"), 0);
	char p[400], buf[16];
	path(p, sizeof(p), "f");
	int fd = open(p, O_WRONLY);
	assert_int_equal(pwrite(fd, "new!", 4, 0), 4);
	assert_int_equal(fsync(fd), -1);
	assert_int_equal(errno, EIO);
	assert_int_equal(fsync(fd), 0);
	close(fd);
	assert_int_equal(get("f", buf, sizeof(buf)), 4);
	assert_memory_equal(buf, "new!", 4); /* still read from the cache */
	power_cycle(0);
	assert_int_equal(get("f", buf, sizeof(buf)), 4);
	assert_memory_equal(buf, "old!", 4);
}

/* Full disks: a write past `space` bytes, or the one chosen, fails with
 * ENOSPC and writes nothing. */
static void test_enospc(void **state)
{
	(void)state;
	assert_int_equal(ctl(NULL, 0, "space 8192"), 0);
	char p[400];
	path(p, sizeof(p), "big");
	int fd = open(p, O_WRONLY | O_CREAT, 0644);
	static char block[8192];
	assert_int_equal(write(fd, block, 8192), 8192);
	assert_int_equal(write(fd, block, 1), -1);
	assert_int_equal(errno, ENOSPC);
	close(fd);
	assert_int_equal(ctl(NULL, 0, "space 0"), 0);
	assert_int_equal(ctl(NULL, 0, "fail write 2 ENOSPC"), 0);
	put("a", "1", 1, false);
	fd = open(p, O_WRONLY | O_APPEND);
	assert_int_equal(write(fd, "x", 1), -1);
	assert_int_equal(errno, ENOSPC);
	assert_int_equal(write(fd, "y", 1), 1); /* appended at the end */
	close(fd);
	char buf[8200];
	assert_int_equal(get("big", buf, sizeof(buf)), 8193);
	assert_int_equal(buf[8192], 'y');
}

/* "arm N": the power goes before the Nth mutating operation, which fails
 * with EIO, as does everything after; what was durable then is what the
 * next mount shows. */
static void test_armed_cut(void **state)
{
	(void)state;
	char out[256];
	assert_int_equal(ctl(out, sizeof(out), "arm 4"), 0);
	put("one", "1", 1, true); /* create, write, fsync: 3 operations */
	char p[400];
	path(p, sizeof(p), "");
	int d = open(p, O_RDONLY | O_DIRECTORY);
	assert_int_equal(fsync(d), -1); /* the 4th */
	assert_int_equal(errno, EIO);
	close(d);
	path(p, sizeof(p), "two");
	assert_int_equal(open(p, O_WRONLY | O_CREAT, 0644), -1);
	assert_int_equal(ctl(out, sizeof(out), "status"), 0);
	assert_non_null(strstr(out, " dead"));
	unmount_fs();
	mount_fs();
	assert_false(exists("one")); /* its name never reached the disk */
	assert_false(exists("two"));
}

/* Without a cut, "sync" makes everything durable (a clean shutdown). */
static void test_sync_then_unmount_keeps_all(void **state)
{
	(void)state;
	char p[400], q[400], buf[16];
	path(p, sizeof(p), "x");
	assert_int_equal(mkdir(p, 0700), 0);
	put("x/y", "why", 3, false);
	path(p, sizeof(p), "x/y");
	path(q, sizeof(q), "x/z");
	assert_int_equal(link(p, q), 0);
	assert_int_equal(ctl(NULL, 0, "sync"), 0);
	power_cycle(0);
	assert_int_equal(get("x/z", buf, sizeof(buf)), 3);
	assert_memory_equal(buf, "why", 3);
	struct stat st;
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal(st.st_nlink, 2);
	assert_int_equal(st.st_mode & 07777, 0644);
}

int main(void)
{
	if (getuid() != 0 || access("/dev/fuse", R_OK | W_OK) != 0 || getenv("POWERFS_BIN") == NULL) {
		printf("1..0 # SKIP powerfs needs root, /dev/fuse and POWERFS_BIN\n");
		return 0;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_data_at_fsync_names_at_dir_fsync, setup, teardown),
		cmocka_unit_test_setup_teardown(test_overwrite_after_fsync_lost, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rename_and_unlink_need_dir_fsync, setup, teardown),
		cmocka_unit_test_setup_teardown(test_directory_needs_its_parent, setup, teardown),
		cmocka_unit_test_setup_teardown(test_torn_cut_whole_pages_by_seed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_torn_rename_over_keeps_the_name, setup, teardown),
		cmocka_unit_test_setup_teardown(test_failed_fsync_loses_data, setup, teardown),
		cmocka_unit_test_setup_teardown(test_enospc, setup, teardown),
		cmocka_unit_test_setup_teardown(test_armed_cut, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sync_then_unmount_keeps_all, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
