/* What copy-on-write staging would cost a trainer: write-protect 1 GiB of
 * shared memory with userfaultfd (as a trainer would before a save), lift
 * the protection (as the daemon would after copying), then time the
 * trainer's next write to all of it against a plain write. Not built by
 * meson; the measurement behind the closing note of the Python issue:
 *
 *     cc -O2 -o /tmp/uffd_wp_cost tests/bench/uffd_wp_cost.c && /tmp/uffd_wp_cost
 *
 * Needs Linux >= 5.19 (shmem write-protect) and, unprivileged, >= 5.11
 * (UFFD_USER_MODE_ONLY). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static long minflt(void)
{
	struct rusage r;
	getrusage(RUSAGE_SELF, &r);
	return r.ru_minflt;
}

static void timed_memset(const char *what, char *p, size_t n, int v)
{
	long f0 = minflt();
	double t0 = now_ms();
	memset(p, v, n);
	printf("%-34s %7.1f ms, %ld minor faults\n", what, now_ms() - t0, minflt() - f0);
}

int main(void)
{
	size_t n = 1ul << 30;
	int fd = memfd_create("uffd-wp-cost", 0);
	if (fd < 0 || ftruncate(fd, (off_t)n) != 0)
		return perror("memfd"), 1;
	char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return perror("mmap"), 1;
	memset(p, 1, n);
	timed_memset("write, plain", p, n, 2);
	int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
	struct uffdio_api api = { .api = UFFD_API, .features = UFFD_FEATURE_WP_HUGETLBFS_SHMEM };
	if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api) != 0)
		return perror("userfaultfd"), 1;
	struct uffdio_register reg = { .range = { (unsigned long)p, n }, .mode = UFFDIO_REGISTER_MODE_WP };
	if (ioctl(uffd, UFFDIO_REGISTER, &reg) != 0)
		return perror("UFFDIO_REGISTER"), 1;
	timed_memset("write, registered", p, n, 3);
	struct uffdio_writeprotect wp = { .range = { (unsigned long)p, n }, .mode = UFFDIO_WRITEPROTECT_MODE_WP };
	double t0 = now_ms();
	if (ioctl(uffd, UFFDIO_WRITEPROTECT, &wp) != 0)
		return perror("UFFDIO_WRITEPROTECT"), 1;
	printf("%-34s %7.1f ms\n", "write-protect 1 GiB", now_ms() - t0);
	wp.mode = 0;
	t0 = now_ms();
	if (ioctl(uffd, UFFDIO_WRITEPROTECT, &wp) != 0)
		return perror("UFFDIO_WRITEPROTECT"), 1;
	printf("%-34s %7.1f ms\n", "unprotect 1 GiB", now_ms() - t0);
	timed_memset("write, after protect + unprotect", p, n, 4);
	timed_memset("write, again", p, n, 5);
	return 0;
}
