#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "hostbuf.h"
#include "testutil.h"

#define NBYTES (1u << 20)

/* A memfd of NBYTES holding a known pattern; *data gets a copy. */
static int make_memfd(int sealable, uint8_t **data)
{
	int fd = memfd_create("ckptd-test", MFD_CLOEXEC | (sealable ? MFD_ALLOW_SEALING : 0));
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, NBYTES), 0);
	uint8_t *d = malloc(NBYTES);
	assert_non_null(d);
	uint64_t seed = 42;
	tu_fill(&seed, d, NBYTES);
	assert_int_equal(pwrite(fd, d, NBYTES, 0), NBYTES);
	*data = d;
	return fd;
}

static int fd_is_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

static void check_reads(const struct hostbuf *b, const uint8_t *data)
{
	static const struct { uint64_t off; size_t len; } r[] = {
		{ 0, 1 }, { 0, NBYTES }, { 4095, 2 }, { 12345, 100000 }, { NBYTES - 1, 1 }, { NBYTES, 0 },
	};
	uint8_t *buf = malloc(NBYTES);
	assert_non_null(buf);
	for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++) {
		memset(buf, 0, NBYTES);
		assert_int_equal(hostbuf_read(b, r[i].off, buf, r[i].len), 0);
		assert_memory_equal(buf, data + r[i].off, r[i].len);
	}
	free(buf);
}

static void test_sealed(void **state)
{
	(void)state;
	uint8_t *data;
	int fd = make_memfd(1, &data);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	int keep = dup(fd);
	struct hostbuf *b = NULL;
	char err[256];
	assert_int_equal(hostbuf_open(fd, 9, NBYTES, &b, err, sizeof(err)), 0);
	assert_non_null(b);
	assert_true(b->sealed);
	assert_non_null(b->map);
	assert_int_equal(b->id, 9);
	assert_int_equal(b->nbytes, NBYTES);
	check_reads(b, data);

	/* Restore writes land in the file and show through the mapping. */
	uint8_t w[300];
	memset(w, 0x5A, sizeof(w));
	assert_int_equal(hostbuf_write(b, 1000, w, sizeof(w)), 0);
	uint8_t back[300];
	assert_int_equal(pread(keep, back, sizeof(back), 1000), sizeof(back));
	assert_memory_equal(back, w, sizeof(w));
	assert_int_equal(hostbuf_read(b, 1000, back, sizeof(back)), 0);
	assert_memory_equal(back, w, sizeof(w));

	/* The seal holds: the client cannot shrink it. */
	assert_int_equal(ftruncate(keep, 4096), -1);
	assert_int_equal(errno, EPERM);
	hostbuf_unref(b);
	close(keep);
	free(data);
}

static void test_unsealed(void **state)
{
	(void)state;
	/* after cmocka, which sets its own SIGBUS handler per test */
	assert_int_equal(hostbuf_init(), 0);
	uint8_t *data;
	int fd = make_memfd(0, &data);
	int keep = dup(fd);
	struct hostbuf *b = NULL;
	char err[256];
	assert_int_equal(hostbuf_open(fd, 1, NBYTES, &b, err, sizeof(err)), 0);
	assert_false(b->sealed);
	assert_non_null(b->map); /* mapped too, copied under the SIGBUS guard */
	check_reads(b, data);

	uint8_t w[64];
	memset(w, 0xC3, sizeof(w));
	assert_int_equal(hostbuf_write(b, NBYTES - 64, w, sizeof(w)), 0);
	uint8_t back[64];
	assert_int_equal(pread(keep, back, sizeof(back), NBYTES - 64), sizeof(back));
	assert_memory_equal(back, w, sizeof(w));

	/* A sealable memfd without F_SEAL_SHRINK is treated as unsealed. */
	int fd2 = memfd_create("ckptd-test2", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_int_equal(ftruncate(fd2, 8192), 0);
	assert_int_equal(fcntl(fd2, F_ADD_SEALS, F_SEAL_GROW), 0);
	struct hostbuf *b2 = NULL;
	assert_int_equal(hostbuf_open(fd2, 2, 8192, &b2, err, sizeof(err)), 0);
	assert_false(b2->sealed);
	hostbuf_unref(b2);

	hostbuf_unref(b);
	close(keep);
	free(data);
}

static void test_truncated_unsealed(void **state)
{
	(void)state;
	/* after cmocka, which sets its own SIGBUS handler per test */
	assert_int_equal(hostbuf_init(), 0);
	uint8_t *data;
	int fd = make_memfd(0, &data);
	int keep = dup(fd);
	struct hostbuf *b = NULL;
	char err[256];
	assert_int_equal(hostbuf_open(fd, 1, NBYTES, &b, err, sizeof(err)), 0);
	assert_false(b->sealed);

	/* The client shrinks its file behind the daemon's back. */
	assert_int_equal(ftruncate(keep, 4096), 0);
	uint8_t buf[8192];
	assert_int_equal(hostbuf_read(b, 0, buf, 4096), 0);
	assert_memory_equal(buf, data, 4096);
	assert_int_equal(hostbuf_read(b, 8192, buf, 100), -EFAULT);
	assert_int_equal(hostbuf_read(b, 4000, buf, 200), -EFAULT);
	assert_int_equal(hostbuf_read(b, NBYTES - 10, buf, 10), -EFAULT);

	/* Writes past the new end fail and never grow the file back. */
	struct stat st;
	assert_int_equal(hostbuf_write(b, 8192, buf, 100), -EFAULT);
	assert_int_equal(hostbuf_write(b, 4000, buf, 200), -EFAULT);
	assert_int_equal(fstat(keep, &st), 0);
	assert_int_equal(st.st_size, 4096);
	memset(buf, 0x11, 100);
	assert_int_equal(hostbuf_write(b, 0, buf, 100), 0);
	assert_int_equal(fstat(keep, &st), 0);
	assert_int_equal(st.st_size, 4096);

	/* Truncated to nothing. */
	assert_int_equal(ftruncate(keep, 0), 0);
	assert_int_equal(hostbuf_read(b, 0, buf, 1), -EFAULT);
	assert_int_equal(hostbuf_write(b, 0, buf, 1), -EFAULT);
	assert_int_equal(fstat(keep, &st), 0);
	assert_int_equal(st.st_size, 0);

	hostbuf_unref(b);
	close(keep);
	free(data);
}

/* The mapped fast path on an unsealed file: a truncation under the copy
 * is caught by the SIGBUS guard and reported, not fatal. */
static void test_guarded_copy_out(void **state)
{
	(void)state;
	/* after cmocka, which sets its own SIGBUS handler per test */
	assert_int_equal(hostbuf_init(), 0);
	const size_t n = 1 << 20;
	int fd = memfd_create("guard", MFD_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)n), 0);
	int keep = dup(fd);
	struct hostbuf *b = NULL;
	char err[256];
	assert_int_equal(hostbuf_open(fd, 1, n, &b, err, sizeof(err)), 0);
	assert_false(b->sealed);
	assert_non_null(b->map);
	uint8_t *dst = malloc(n);
	assert_non_null(dst);
	uint32_t crc = 0;
	assert_int_equal(hostbuf_copy_out(b, 0, dst, n, &crc), 0);
	assert_int_equal(crc, crc32c_update(0, dst, n));
	assert_int_equal(ftruncate(keep, 4096), 0);
	crc = 0;
	assert_int_equal(hostbuf_copy_out(b, 0, dst, n, &crc), -EFAULT);
	/* Writing into the shrunk mapping is refused the same way. */
	assert_int_equal(hostbuf_write(b, 0, dst, n), -EFAULT);
	/* ... while the part still inside the file works. */
	assert_int_equal(hostbuf_copy_out(b, 0, dst, 4096, &crc), 0);
	free(dst);
	hostbuf_unref(b);
	close(keep);
}

/* Restore's fused write: the bytes land in the file, the crc is that of
 * every byte written, on a sealed and an unsealed (guarded) mapping; a
 * truncation under the copy is -EFAULT, as for hostbuf_write. */
static void test_write_crc(void **state)
{
	(void)state;
	assert_int_equal(hostbuf_init(), 0);
	const size_t n = 3 * (256u << 10) + 333;
	uint8_t *src = malloc(n);
	uint8_t *back = malloc(n);
	assert_non_null(src);
	assert_non_null(back);
	uint64_t seed = 5;
	tu_fill(&seed, src, n);
	for (int sealed = 0; sealed < 2; sealed++) {
		uint8_t *data;
		int fd = make_memfd(sealed, &data);
		if (sealed)
			assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
		int keep = dup(fd);
		struct hostbuf *b = NULL;
		char err[256];
		assert_int_equal(hostbuf_open(fd, 3, NBYTES, &b, err, sizeof(err)), 0);
		assert_int_equal(b->sealed, sealed);
		uint32_t crc = 0x55u;
		assert_int_equal(hostbuf_write_crc(b, 7, src + 1, n - 1, &crc), 0);
		assert_int_equal(crc, crc32c_update(0x55u, src + 1, n - 1));
		assert_int_equal(pread(keep, back, n - 1, 7), (ssize_t)(n - 1));
		assert_memory_equal(back, src + 1, n - 1);
		assert_int_equal(hostbuf_write_crc(b, NBYTES - 1, src, 2, &crc), -ERANGE);
		if (!sealed) {
			assert_int_equal(ftruncate(keep, 4096), 0);
			assert_int_equal(hostbuf_write_crc(b, 0, src, n, &crc), -EFAULT);
		}
		hostbuf_unref(b);
		close(keep);
		free(data);
	}
	free(src);
	free(back);
}

static void test_open_rejects(void **state)
{
	(void)state;
	struct hostbuf *b = NULL;
	char err[256];

	int p[2];
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	err[0] = '\0';
	assert_int_equal(hostbuf_open(p[0], 1, 4096, &b, err, sizeof(err)), -EBADF);
	assert_true(err[0] != '\0');
	assert_false(fd_is_open(p[0])); /* ownership taken even on failure */
	close(p[1]);

	int fd = memfd_create("small", MFD_CLOEXEC);
	assert_int_equal(ftruncate(fd, 4096), 0);
	int keep = dup(fd);
	assert_int_equal(hostbuf_open(fd, 1, 4097, &b, err, sizeof(err)), -EINVAL);
	assert_false(fd_is_open(fd));
	fd = dup(keep);
	assert_int_equal(hostbuf_open(fd, 1, 0, &b, err, sizeof(err)), -EINVAL);

	/* Read-only and write-only descriptors of a big enough file. */
	char path[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", keep);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(hostbuf_open(fd, 1, 4096, &b, err, sizeof(err)), -EBADF);
	assert_false(fd_is_open(fd));
	fd = open(path, O_WRONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(hostbuf_open(fd, 1, 4096, &b, err, sizeof(err)), -EBADF);

	/* A regular file on a disk filesystem is refused before any
	 * fstat: only shmem files (memfd, /dev/shm) answer F_GET_SEALS. */
	char tmpl[] = "ckpt-hostbuf-XXXXXX"; /* the build dir: a disk, not tmpfs */
	fd = mkostemp(tmpl, O_CLOEXEC);
	assert_true(fd >= 0);
	unlink(tmpl);
	assert_int_equal(ftruncate(fd, 8192), 0);
	err[0] = '\0';
	assert_int_equal(hostbuf_open(fd, 1, 4096, &b, err, sizeof(err)), -EBADF);
	assert_non_null(strstr(err, "memfd"));
	assert_false(fd_is_open(fd));

	/* A directory is not a buffer either. */
	fd = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(hostbuf_open(fd, 1, 4096, &b, err, sizeof(err)), -EBADF);
	assert_null(b);

	/* The same file read-write is fine, and may be larger than asked. */
	fd = open(path, O_RDWR | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(hostbuf_open(fd, 1, 100, &b, err, sizeof(err)), 0);
	assert_non_null(b);
	hostbuf_unref(b);
	assert_false(fd_is_open(fd)); /* the last unref closes it */
	close(keep);
}

static void test_ranges_and_refs(void **state)
{
	(void)state;
	uint8_t *data;
	int fd = make_memfd(0, &data);
	struct hostbuf *b = NULL;
	char err[256];
	/* Registered smaller than the file: the rest is out of range. */
	assert_int_equal(hostbuf_open(fd, 1, 8192, &b, err, sizeof(err)), 0);
	uint8_t buf[16];
	assert_int_equal(hostbuf_read(b, 8192, buf, 1), -ERANGE);
	assert_int_equal(hostbuf_read(b, 8190, buf, 3), -ERANGE);
	assert_int_equal(hostbuf_read(b, 8193, buf, 0), -ERANGE);
	assert_int_equal(hostbuf_read(b, 1, buf, SIZE_MAX), -ERANGE);
	assert_int_equal(hostbuf_read(b, UINT64_MAX, buf, 2), -ERANGE);
	assert_int_equal(hostbuf_write(b, 8190, buf, 3), -ERANGE);
	assert_int_equal(hostbuf_write(b, UINT64_MAX, buf, 2), -ERANGE);
	assert_int_equal(hostbuf_read(b, 8190, buf, 2), 0);
	assert_memory_equal(buf, data + 8190, 2);

	/* A second reference keeps it alive. */
	assert_ptr_equal(hostbuf_ref(b), b);
	assert_int_equal(b->refs, 2);
	hostbuf_unref(b);
	assert_int_equal(b->refs, 1);
	assert_true(fd_is_open(fd));
	assert_int_equal(hostbuf_read(b, 0, buf, 16), 0);
	assert_memory_equal(buf, data, 16);
	hostbuf_unref(b);
	assert_false(fd_is_open(fd));
	hostbuf_unref(NULL);
	free(data);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sealed),
		cmocka_unit_test(test_unsealed),
		cmocka_unit_test(test_truncated_unsealed),
		cmocka_unit_test(test_guarded_copy_out),
		cmocka_unit_test(test_write_crc),
		cmocka_unit_test(test_open_rejects),
		cmocka_unit_test(test_ranges_and_refs),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
