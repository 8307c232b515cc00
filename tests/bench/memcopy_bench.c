/* memcopy_bench: the copy routines of daemon/mem/memcopy.c against glibc's
 * memcpy, side by side in one run, on the buffers the daemon copies
 * between: a shared memfd mapping (the trainer's buffer) and an anonymous
 * MADV_HUGEPAGE, pre-faulted buffer (the pool), both faulted in before
 * the first timing.
 *
 *   save:    memfd -> pool, in calls of --save-chunk bytes (save.c's
 *            COPY_BLOCK, 256 KiB)
 *   restore: pool -> memfd, in calls of --restore-chunk bytes (a slab of
 *            loadexec.c, 16 MiB), without a crc, then with the crc of every
 *            byte ([pool] verify_held): two passes per call (the crc of the
 *            call's bytes, then the copy) or fused block by block, a block's
 *            crc and then its copy from cache, or (memcopy_crc's way) its
 *            copy and then its crc from the cache the copy filled, or
 *            the crc in the copy's loop (memcopy.c's lanes, where the CPU
 *            has AVX2 and SSE4.2)
 *
 * on 1 and 2 threads (each its contiguous half). The baseline is glibc's
 * memcpy as ckpt-bench times it: each thread's half in one call. Each repetition runs every
 * variant once, in an order rotated per repetition; the table gives each
 * variant's median over the repetitions and its speed against memcpy's
 * (memcpy's median time over its own, the same direction and threads):
 * ratios, never absolute times alone, on a machine shared with others.
 *
 * usage: memcopy_bench [--mb N] [--reps R] [--threads 1,2] */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "memcopy.h"

#define MAX_VARIANTS 32
#define MAX_REPS 64

enum dir {
	SAVE,
	RESTORE
};
enum how {
	COPY,
	TWO_PASS,
	FUSED,
	FUSED_COPY_FIRST,
	LANES
};

struct variant {
	char name[48];
	enum dir dir;
	enum how how;
	enum memcopy_kind kind;
	size_t block; /* FUSED: the block */
	bool whole;   /* one call per thread (ckpt-bench's baseline) */
};

struct job {
	const struct variant *v;
	uint8_t *dst;
	const uint8_t *src;
	size_t n, chunk;
	uint32_t crc;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *run_job(void *arg)
{
	struct job *j = arg;
	const struct variant *v = j->v;
	uint32_t crc = 0;
	for (size_t off = 0; off < j->n; off += j->chunk) {
		size_t n = j->n - off < j->chunk ? j->n - off : j->chunk;
		uint8_t *d = j->dst + off;
		const uint8_t *s = j->src + off;
		if (v->how == TWO_PASS)
			crc = crc32c_update(crc, s, n);
		if (v->how == COPY || v->how == TWO_PASS) {
			memcopy_with(v->kind, d, s, n);
			continue;
		}
		if (v->how == LANES) {
			memcopy_crc_lanes(d, s, n, &crc);
			continue;
		}
		for (size_t i = 0; i < n; i += v->block) {
			size_t b = n - i < v->block ? n - i : v->block;
			if (v->how == FUSED)
				crc = crc32c_update(crc, s + i, b);
			memcopy_with(v->kind, d + i, s + i, b);
			if (v->how == FUSED_COPY_FIRST)
				crc = crc32c_update(crc, s + i, b);
		}
	}
	j->crc = crc;
	return NULL;
}

static double run_variant(const struct variant *v, uint8_t *memfd, uint8_t *pool, size_t n, unsigned threads,
			  size_t save_chunk, size_t restore_chunk)
{
	uint8_t *dst = v->dir == SAVE ? pool : memfd;
	const uint8_t *src = v->dir == SAVE ? memfd : pool;
	struct job jobs[2];
	pthread_t th[2];
	double t0 = now_s();
	for (unsigned i = 0; i < threads; i++) {
		size_t lo = n / threads * i, hi = i + 1 == threads ? n : n / threads * (i + 1);
		jobs[i] = (struct job){ .v = v,
					.dst = dst + lo,
					.src = src + lo,
					.n = hi - lo,
					.chunk = v->whole         ? hi - lo
						 : v->dir == SAVE ? save_chunk
								  : restore_chunk };
		if (i > 0)
			pthread_create(&th[i], NULL, run_job, &jobs[i]);
	}
	run_job(&jobs[0]);
	for (unsigned i = 1; i < threads; i++)
		pthread_join(th[i], NULL);
	return now_s() - t0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, unsigned n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static size_t add(struct variant *v, size_t nv, enum dir dir, enum how how, enum memcopy_kind k, size_t block)
{
	if (!memcopy_kind_supported(k) || nv == MAX_VARIANTS || (how == LANES && !memcopy_lanes_supported()))
		return nv;
	v[nv] = (struct variant){ .dir = dir, .how = how, .kind = k, .block = block };
	if (how == COPY && block == SIZE_MAX) {
		v[nv].whole = true;
		snprintf(v[nv].name, sizeof(v[nv].name), "memcpy, one call per thread");
	} else if (how == COPY)
		snprintf(v[nv].name, sizeof(v[nv].name), "%s", memcopy_kind_name(k));
	else if (how == LANES)
		snprintf(v[nv].name, sizeof(v[nv].name), "crc in the copy's loop, 3 lanes, avx2-nt");
	else if (how == TWO_PASS)
		snprintf(v[nv].name, sizeof(v[nv].name), "crc, then %s", memcopy_kind_name(k));
	else
		snprintf(v[nv].name, sizeof(v[nv].name), "fused %zu KiB, %s%s", block >> 10,
			 how == FUSED_COPY_FIRST ? "copy, then crc, " : "", memcopy_kind_name(k));
	return nv + 1;
}

static uint8_t *map_pool(size_t n)
{
	uint8_t *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	(void)madvise(p, n, MADV_HUGEPAGE);
	if (madvise(p, n, MADV_POPULATE_WRITE) != 0)
		for (size_t off = 0; off < n; off += 4096)
			p[off] = 0;
	return p;
}

static uint8_t *map_memfd(size_t n)
{
	int fd = memfd_create("memcopy-bench", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)n) != 0)
		return NULL;
	uint8_t *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return NULL;
	for (size_t off = 0; off < n; off += 64)
		p[off] = (uint8_t)(off >> 6);
	return p;
}

int main(int argc, char **argv)
{
	size_t mb = 1024, save_chunk = 256u << 10, restore_chunk = 16u << 20;
	unsigned reps = 9, thr[2] = { 1, 2 }, nthr = 2;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--mb"))
			mb = strtoul(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--reps"))
			reps = (unsigned)strtoul(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--threads"))
			nthr = (unsigned)sscanf(argv[i + 1], "%u,%u", &thr[0], &thr[1]);
		else {
			fprintf(stderr, "usage: memcopy_bench [--mb N] [--reps R] [--threads 1,2]\n");
			return 2;
		}
	}
	if (!mb || !reps || reps > MAX_REPS || nthr < 1 || nthr > 2 || !thr[0] || thr[0] > 2 ||
	    (nthr == 2 && (!thr[1] || thr[1] > 2))) {
		fprintf(stderr, "memcopy_bench: --mb >= 1, --reps 1 to %d, --threads of 1 or 2\n", MAX_REPS);
		return 2;
	}
	size_t n = mb << 20;
	uint8_t *memfd = map_memfd(n), *pool = map_pool(n);
	if (!memfd || !pool) {
		fprintf(stderr, "memcopy_bench: %zu MiB buffers: %s\n", mb, strerror(errno));
		return 1;
	}
	memcpy(pool, memfd, n);

	struct variant v[MAX_VARIANTS];
	size_t nv = 0;
	/* The baseline first: glibc's memcpy as ckpt-bench calls it, each
	 * thread's half in one call (glibc then takes its own non-temporal
	 * path); then every routine in the daemon's calls. */
	for (int d = SAVE; d <= RESTORE; d++) {
		nv = add(v, nv, (enum dir)d, COPY, MEMCOPY_LIBC, SIZE_MAX);
		for (int k = 0; k < MEMCOPY_NKINDS; k++)
			nv = add(v, nv, (enum dir)d, COPY, (enum memcopy_kind)k, 0);
	}
	for (int k = 0; k < MEMCOPY_NKINDS; k++)
		nv = add(v, nv, RESTORE, TWO_PASS, (enum memcopy_kind)k, 0);
	static const size_t blocks[] = { 64u << 10, 128u << 10, 256u << 10, 512u << 10 };
	for (int k = MEMCOPY_SSE2_NT; k < MEMCOPY_NKINDS; k++)
		for (size_t b = 0; b < sizeof(blocks) / sizeof(blocks[0]); b++)
			nv = add(v, nv, RESTORE, FUSED, (enum memcopy_kind)k, blocks[b]);
	for (size_t b = 0; b < sizeof(blocks) / sizeof(blocks[0]); b++)
		nv = add(v, nv, RESTORE, FUSED_COPY_FIRST, MEMCOPY_AVX2_NT, blocks[b]);
	nv = add(v, nv, RESTORE, LANES, MEMCOPY_AVX2_NT, 0);

	printf("memcopy_bench: %zu MiB, %u repetitions, the daemon's routine: %s, fused block %u KiB\n", mb, reps,
	       memcopy_kind_name(memcopy_chosen()), MEMCOPY_CRC_BLOCK >> 10);
	for (unsigned ti = 0; ti < nthr; ti++) {
		static double t[MAX_VARIANTS][MAX_REPS];
		for (unsigned r = 0; r < reps; r++)
			for (size_t i = 0; i < nv; i++) {
				size_t x = (i + r) % nv;
				t[x][r] = run_variant(&v[x], memfd, pool, n, thr[ti], save_chunk, restore_chunk);
			}
		double base[2] = { 0, 0 };
		double med[MAX_VARIANTS];
		for (size_t i = 0; i < nv; i++) {
			med[i] = median(t[i], reps);
			if (v[i].whole)
				base[v[i].dir] = med[i];
		}
		printf("\n%u thread%s: | direction | routine | median ms | vs memcpy (its time / this) |\n", thr[ti],
		       thr[ti] > 1 ? "s" : "");
		printf("|---|---|---|---|\n");
		for (size_t i = 0; i < nv; i++)
			printf("| %s | %s | %.1f | %.0f%% |\n", v[i].dir == SAVE ? "save" : "restore", v[i].name,
			       1e3 * med[i], 100 * base[v[i].dir] / med[i]);
	}
	return 0;
}
