/* What the first save of a state dict cannot go below (docs/benchmarks.md
 * "The first save of a state dict"): the ways bytes in a trainer's private
 * memory can reach memory the daemon reads, against what a later save
 * does (the daemon copies the trainer's shared-memory file into its
 * pre-faulted pool on two threads), side by side in one run:
 *
 *   later save      pre-faulted source into the pre-faulted pool, 1 and 2 threads
 *   new file        a new memfd, mapped, filled by one memcpy (its page faults)
 *   new file, bulk  the same with fallocate and MAP_POPULATE first
 *   vmsplice        the trainer's pages into a pipe, read into the pool, 1 and 2 pipes
 *   vm_readv        process_vm_readv from another process into the pool, 1 and 2 threads
 *
 *   first_copy_floor [--mb 512] [--reps 3]    (medians; ratios to "later save, 2 threads")
 */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *faulted(size_t n, int v)
{
	char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	memset(p, v, n);
	return p;
}

/* One worker's share [i*per, (i+1)*per) of a transfer. */
struct job {
	char *dst, *src;
	size_t per;
	int i;
	int fd;    /* vmsplice: the pipe's end */
	pid_t pid; /* vm_readv: the trainer */
};

static void *copy_part(void *x)
{
	struct job *j = x;
	memcpy(j->dst + j->i * j->per, j->src + j->i * j->per, j->per);
	return NULL;
}

static void *splice_part(void *x)
{
	struct job *j = x;
	for (size_t off = 0; off < j->per;) {
		struct iovec v = { j->src + j->i * j->per + off, j->per - off };
		ssize_t w = vmsplice(j->fd, &v, 1, 0);
		if (w <= 0) {
			perror("vmsplice");
			exit(1);
		}
		off += (size_t)w;
	}
	return NULL;
}

static void *read_part(void *x)
{
	struct job *j = x;
	for (size_t off = 0; off < j->per;) {
		ssize_t r = read(j->fd, j->dst + j->i * j->per + off, j->per - off);
		if (r <= 0) {
			perror("read");
			exit(1);
		}
		off += (size_t)r;
	}
	return NULL;
}

static void *readv_part(void *x)
{
	struct job *j = x;
	for (size_t off = 0; off < j->per;) {
		size_t n = j->per - off < (64u << 20) ? j->per - off : (64u << 20);
		struct iovec l = { j->dst + j->i * j->per + off, n }, r = { j->src + j->i * j->per + off, n };
		ssize_t g = process_vm_readv(j->pid, &l, 1, &r, 1, 0);
		if (g <= 0) {
			perror("process_vm_readv");
			exit(1);
		}
		off += (size_t)g;
	}
	return NULL;
}

static double run_threads(void *(*fn)(void *), struct job *jobs, int n)
{
	pthread_t th[8];
	double t = now();
	for (int i = 0; i < n; i++)
		pthread_create(&th[i], NULL, fn, &jobs[i]);
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	return now() - t;
}

static double later_save(char *pool, char *src, size_t n, int threads)
{
	struct job j[2];
	for (int i = 0; i < threads; i++)
		j[i] = (struct job){ .dst = pool, .src = src, .per = n / (size_t)threads, .i = i };
	return run_threads(copy_part, j, threads);
}

static double new_file(char *src, size_t n, int bulk)
{
	double t = now();
	int fd = memfd_create("arena", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)n) != 0 || (bulk && fallocate(fd, 0, 0, (off_t)n) != 0)) {
		perror("memfd");
		exit(1);
	}
	char *a = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | (bulk ? MAP_POPULATE : 0), fd, 0);
	if (a == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	memcpy(a, src, n);
	t = now() - t;
	munmap(a, n);
	close(fd);
	return t;
}

/* A file the daemon faulted ahead (a loan): mapped anew by the trainer,
 * whose pages exist, then filled on `threads` threads. */
static double lent_file(int fd, char *src, size_t n, int threads)
{
	double t = now();
	char *a = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (a == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	struct job j[2];
	for (int i = 0; i < threads; i++)
		j[i] = (struct job){ .dst = a, .src = src, .per = n / (size_t)threads, .i = i };
	run_threads(copy_part, j, threads);
	t = now() - t;
	munmap(a, n);
	return t;
}

static double spliced(char *pool, char *src, size_t n, int pipes)
{
	struct job w[2], r[2];
	pthread_t th[4];
	for (int i = 0; i < pipes; i++) {
		int p[2];
		if (pipe(p) != 0) {
			perror("pipe");
			exit(1);
		}
		(void)fcntl(p[0], F_SETPIPE_SZ, 1 << 20);
		w[i] = (struct job){ .src = src, .per = n / (size_t)pipes, .i = i, .fd = p[1] };
		r[i] = (struct job){ .dst = pool, .per = n / (size_t)pipes, .i = i, .fd = p[0] };
	}
	double t = now();
	for (int i = 0; i < pipes; i++) {
		pthread_create(&th[2 * i], NULL, splice_part, &w[i]);
		pthread_create(&th[2 * i + 1], NULL, read_part, &r[i]);
	}
	for (int i = 0; i < 2 * pipes; i++)
		pthread_join(th[i], NULL);
	t = now() - t;
	for (int i = 0; i < pipes; i++) {
		close(w[i].fd);
		close(r[i].fd);
	}
	return t;
}

static double readv_from(pid_t pid, char *pool, char *remote, size_t n, int threads)
{
	struct job j[2];
	for (int i = 0; i < threads; i++)
		j[i] = (struct job){ .dst = pool, .src = remote, .per = n / (size_t)threads, .i = i, .pid = pid };
	return run_threads(readv_part, j, threads);
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

#define ROWS 11

int main(int argc, char **argv)
{
	size_t mb = 512;
	int reps = 3;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--mb") == 0)
			mb = strtoul(argv[i + 1], NULL, 10);
		else if (strcmp(argv[i], "--reps") == 0)
			reps = atoi(argv[i + 1]);
	}
	if (mb < 2 || reps < 1 || reps > 64) {
		fprintf(stderr, "usage: first_copy_floor [--mb N>=2] [--reps 1..64]\n");
		return 2;
	}
	size_t n = mb << 20;
	char *src = faulted(n, 1), *pool = faulted(n, 0);
	/* The trainer of vm_readv: another process, its own private pages at
	 * the same address (mapped before the fork, written after). */
	char *remote = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int ready[2];
	if (remote == MAP_FAILED || pipe(ready) != 0)
		return 1;
	pid_t pid = fork();
	if (pid == 0) {
		memset(remote, 3, n);
		(void)!write(ready[1], "x", 1);
		pause();
		_exit(0);
	}
	char c;
	if (read(ready[0], &c, 1) != 1)
		return 1;
	static const char *names[ROWS] = { "later save, 1 thread",
					   "later save, 2 threads",
					   "new file",
					   "new file, bulk",
					   "vmsplice, 1 pipe",
					   "vmsplice, 2 pipes",
					   "vm_readv, 1 thread",
					   "vm_readv, 2 threads",
					   "lent file, 1 thread",
					   "lent file, 2 threads",
					   "" };
	int lent = memfd_create("lent", MFD_CLOEXEC);
	if (lent < 0 || ftruncate(lent, (off_t)n) != 0 || fallocate(lent, 0, 0, (off_t)n) != 0)
		return 1;
	char *l = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, lent, 0);
	if (l == MAP_FAILED)
		return 1;
	memset(l, 0, n);
	double t[ROWS][64];
	for (int r = 0; r < reps; r++) {
		t[0][r] = later_save(pool, src, n, 1);
		t[1][r] = later_save(pool, src, n, 2);
		t[2][r] = new_file(src, n, 0);
		t[3][r] = new_file(src, n, 1);
		t[4][r] = spliced(pool, src, n, 1);
		t[5][r] = spliced(pool, src, n, 2);
		t[6][r] = readv_from(pid, pool, remote, n, 1);
		t[7][r] = readv_from(pid, pool, remote, n, 2);
		t[8][r] = lent_file(lent, src, n, 1);
		t[9][r] = lent_file(lent, src, n, 2);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	if (pool[n - 1] != 3) {
		fprintf(stderr, "vm_readv read the wrong bytes\n");
		return 1;
	}
	double med[ROWS];
	for (int k = 0; k < ROWS - 1; k++) {
		qsort(t[k], (size_t)reps, sizeof(double), cmp);
		med[k] = t[k][reps / 2];
	}
	printf("%zu MiB, median of %d; ratio to the later save on 2 threads\n", mb, reps);
	for (int k = 0; k < ROWS - 1; k++)
		printf("%-24s %9.1f ms %7.2fx\n", names[k], med[k] * 1e3, med[k] / med[1]);
	return 0;
}
