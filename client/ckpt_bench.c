/* ckpt-bench: checkpoint benchmark. Trainer ranks are processes holding
 * model-sized state; each save, load from the daemon's memory and load from
 * storage is timed. --mode agent goes through ckptd; --mode direct has each
 * rank write the same bytes to storage itself, synchronously, as torch.save
 * would: the baseline the agent must beat.
 *
 * State: --size-mb M of parameters, or --layers L of a GPT-like model
 * (hidden 224, vocabulary 50257, float32): 45 MB of embedding plus
 * 2.41 MB per layer, which gives the dataflux-pytorch table's sizes
 * (10 layers 69 MB, 100 286 MB, 1000 2.4 GB, 10000 24 GB). --optimizer sgd
 * adds 1x (momentum), adam 2x (two moments). Layers are dealt round-robin
 * to ranks.
 *
 * --mode tiers (docs/tiers.md "Tiers") times, side by side in each round, a
 * durable, a memory and a replicated save of the same state (the stall
 * and the time to durable, kept and replicated), then loads of the step
 * from the daemon's memory, from storage, and, through a second daemon
 * (--restore-socket: another node, which holds nothing of the job), from
 * the memory of the peer holding the replica.
 *
 * Output: a markdown table on stdout and, with --json FILE, {config,
 * results}: save_stall_s, save_durable_s, load_memory_s, load_storage_s
 * (each median and p90 over rounds; a round's time is its slowest rank's),
 * throughput_mb_s, memcpy_mb_s and memcpy_load_mb_s (the baselines beside
 * the saves and the loads from memory: memcpy_time), memcpy_save_s and
 * memcpy_load_s, staging_vs_memcpy and load_memory_vs_memcpy (median over
 * median), daemon_cpu_s, daemon_peak_rss_mb. Only the
 * public libckpt API is used.
 *
 * Checkpoints are never overwritten, so each run saves as a job of its
 * own, bench-<unix time>-<pid>, and runs again against the same daemon and
 * storage. A --job the user names is checked first: if it holds any step
 * this run would save, ckpt-bench says so and what to do, saving nothing. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "ckpt_version.h"

#define MAX_RANKS 64
#define MAX_ROUNDS 64
#define HIDDEN 224ull
#define VOCAB 50257ull

struct opts {
	const char *socket, *job, *storage, *json, *mode, *optimizer, *restore_socket;
	uint64_t size_mb, layers;
	unsigned ranks, saves, loads, threads;
};

/* Results every rank writes into shared memory. */
struct shared {
	pthread_barrier_t bar;
	double stall[MAX_RANKS][MAX_ROUNDS], durable[MAX_RANKS][MAX_ROUNDS];
	double loadmem[MAX_RANKS][MAX_ROUNDS], loadsto[MAX_RANKS][MAX_ROUNDS];
	/* --mode tiers: the memory and replicated saves' stall and time to
	 * kept or replicated; loads from a peer's memory */
	double stall_mem[MAX_RANKS][MAX_ROUNDS], kept[MAX_RANKS][MAX_ROUNDS];
	double stall_rep[MAX_RANKS][MAX_ROUNDS], replicated[MAX_RANKS][MAX_ROUNDS];
	double loadpeer[MAX_RANKS][MAX_ROUNDS];
	/* the memcpy baseline, taken just before each save round (the
	 * trainer's buffer into a pool-like buffer) and each load round from
	 * memory (back) */
	double mc_save[MAX_RANKS][MAX_ROUNDS], mc_load[MAX_RANKS][MAX_ROUNDS];
	uint64_t bytes[MAX_RANKS];
	int failed;
	char msg[512];
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void fail(struct shared *sh, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct shared *sh, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (!sh->failed) {
		vsnprintf(sh->msg, sizeof(sh->msg), fmt, ap);
		sh->failed = 1;
	}
	va_end(ap);
	_exit(1);
}

/* The tensor sizes (bytes) rank r holds, before optimizer state. */
static size_t rank_tensors(const struct opts *o, unsigned r, uint64_t *sizes, size_t cap)
{
	size_t n = 0;
	if (o->layers) {
		if (r == 0 && n < cap)
			sizes[n++] = VOCAB * HIDDEN * 4; /* embedding */
		for (uint64_t l = r; l < o->layers; l += o->ranks) {
			static const uint64_t per[4] = { 3 * HIDDEN * HIDDEN, HIDDEN * HIDDEN, 4 * HIDDEN * HIDDEN,
							 4 * HIDDEN * HIDDEN };
			for (int k = 0; k < 4 && n < cap; k++)
				sizes[n++] = per[k] * 4;
		}
	} else {
		uint64_t total = o->size_mb << 20;
		uint64_t mine = total / o->ranks + (r < total % o->ranks ? 1 : 0);
		mine &= ~(uint64_t)3;
		/* tensors of at most 64 MiB, as a model's would be */
		while (mine && n < cap) {
			uint64_t t = mine > (64u << 20) ? (64u << 20) : mine;
			sizes[n++] = t;
			mine -= t;
		}
	}
	return n;
}

static unsigned opt_mult(const struct opts *o)
{
	return !strcmp(o->optimizer, "adam") ? 3 : !strcmp(o->optimizer, "sgd") ? 2 : 1;
}

static double memcpy_time(uint8_t *dst, const uint8_t *src, size_t n, unsigned threads);
static uint8_t *pool_like(struct shared *sh, unsigned r, uint64_t total);
static void rank_tiers(const struct opts *o, struct shared *sh, unsigned r, ckpt_tensor *t, size_t k, ckpt_client *c,
		       uint8_t *data, uint8_t *pool, uint64_t total);

/* Rank r's tensors, each with its optimizer state (m1, m2) beside it:
 * their names and shapes (float32 elements) into names and shapes; how
 * many, the bytes of them all in *total. */
static size_t agent_tensors(const struct opts *o, unsigned r, char (*names)[32], uint64_t *shapes, size_t cap,
			    uint64_t *total)
{
	static uint64_t sizes[1 << 16];
	size_t nt = rank_tensors(o, r, sizes, cap / 3);
	unsigned mult = opt_mult(o);
	size_t k = 0;
	*total = 0;
	for (size_t i = 0; i < nt; i++)
		for (unsigned m = 0; m < mult; m++, k++) {
			snprintf(names[k], sizeof(names[k]), "t%zu.%s", i, m == 0 ? "w" : m == 1 ? "m1" : "m2");
			shapes[k] = sizes[i] / 4;
			*total += sizes[i];
		}
	return k;
}

/* --mode agent's saves, timed: the stall and the time to durable. */
static void agent_saves(const struct opts *o, struct shared *sh, unsigned r, ckpt_client *c, ckpt_tensor *t, size_t k,
			uint8_t *data, uint8_t *pool, uint64_t total)
{
	for (unsigned s = 0; s < o->saves; s++) {
		pthread_barrier_wait(&sh->bar);
		sh->mc_save[r][s] = memcpy_time(pool, data, total, o->threads);
		pthread_barrier_wait(&sh->bar);
		ckpt_future *f = NULL;
		double t0 = now_s();
		int e = ckpt_save(c, s + 1, t, k, NULL, 0, &f);
		if (e < 0)
			fail(sh, "rank %u: save: %s (%s)", r, ckpt_strerror(e), ckpt_errmsg());
		e = ckpt_future_wait(f, CKPT_STAGED, -1);
		sh->stall[r][s] = now_s() - t0;
		if (e == 0)
			e = ckpt_future_wait(f, CKPT_DURABLE, -1);
		sh->durable[r][s] = now_s() - t0;
		if (e < 0)
			fail(sh, "rank %u: save %u: %s (%s)", r, s + 1, ckpt_strerror(e), ckpt_future_message(f));
		ckpt_future_free(f);
		data[s % (total ? total : 1)] ^= 1; /* the trainer moves on */
	}
}

/* --mode agent's loads of the latest step, timed: from the daemon's
 * memory (which must be where it came from), then from storage. */
static void agent_loads(const struct opts *o, struct shared *sh, unsigned r, ckpt_client *c, ckpt_tensor *t, size_t k,
			uint8_t *data, uint8_t *pool, uint64_t total)
{
	for (unsigned l = 0; l < o->loads; l++) {
		for (int storage = 0; storage < 2; storage++) {
			pthread_barrier_wait(&sh->bar);
			if (!storage) {
				/* pool holds the bytes data had before the
				 * last save, which the load brings back */
				sh->mc_load[r][l] = memcpy_time(data, pool, total, o->threads);
				pthread_barrier_wait(&sh->bar);
			}
			ckpt_future *f = NULL;
			double t0 = now_s();
			int e = ckpt_load_ex(c, CKPT_LATEST, t, k, storage ? CKPT_LOAD_STORAGE_ONLY : 0, &f);
			if (e == 0)
				e = ckpt_future_wait(f, CKPT_LOADED, -1);
			(storage ? sh->loadsto : sh->loadmem)[r][l] = now_s() - t0;
			if (e < 0)
				fail(sh, "rank %u: load: %s (%s)", r, ckpt_strerror(e),
				     f ? ckpt_future_message(f) : "");
			if (!storage && strcmp(ckpt_future_source(f), "memory") != 0)
				fail(sh, "rank %u: load came from %s, not memory", r, ckpt_future_source(f));
			ckpt_future_free(f);
		}
	}
}

static void rank_agent(const struct opts *o, struct shared *sh, unsigned r)
{
	enum {
		CAP = 1 << 16
	};
	static uint64_t shapes[CAP];
	static char names[CAP][32];
	static ckpt_tensor t[CAP];
	uint64_t total = 0;
	size_t k = agent_tensors(o, r, names, shapes, CAP, &total);
	ckpt_hello h = { .job = o->job, .rank = r, .world_size = o->ranks };
	ckpt_client *c = NULL;
	int e = ckpt_connect(o->socket, &h, &c);
	if (e < 0)
		fail(sh, "rank %u: connect %s: %s (%s)", r, o->socket, ckpt_strerror(e), ckpt_errmsg());
	ckpt_buffer *b = NULL;
	e = ckpt_buffer_alloc(c, total ? total : 4096, &b);
	if (e < 0)
		fail(sh, "rank %u: buffer of %" PRIu64 " bytes: %s (%s)", r, total, ckpt_strerror(e), ckpt_errmsg());
	uint8_t *data = ckpt_buffer_data(b);
	for (uint64_t i = 0; i < total; i += 4096)
		data[i] = (uint8_t)(i >> 12 ^ r);
	uint64_t off = 0;
	for (size_t i = 0; i < k; i++) {
		t[i] = (ckpt_tensor){ .name = names[i],
				      .dtype = CKPT_F32,
				      .ndim = 1,
				      .global_shape = &shapes[i],
				      .buffer = b,
				      .offset = off,
				      .nbytes = shapes[i] * 4 };
		off += shapes[i] * 4;
	}
	sh->bytes[r] = total;
	uint8_t *pool = pool_like(sh, r, total);
	if (o->restore_socket) {
		rank_tiers(o, sh, r, t, k, c, data, pool, total);
	} else {
		agent_saves(o, sh, r, c, t, k, data, pool, total);
		agent_loads(o, sh, r, c, t, k, data, pool, total);
	}
	munmap(pool, total ? total : 4096);
	ckpt_buffer_free(b);
	ckpt_close(c);
}

/* One save of step at tier, timed: the stall (to staged) into *stall,
 * the time to its last phase (durable, kept, replicated) into *done. */
static void timed_save(struct shared *sh, unsigned r, ckpt_client *c, uint64_t step, ckpt_tensor *t, size_t k, int tier,
		       double *stall, double *done)
{
	ckpt_save_opts so = { .tier = tier };
	ckpt_future *f = NULL;
	double t0 = now_s();
	int e = ckpt_save_ex(c, step, t, k, NULL, 0, &so, &f);
	if (e < 0)
		fail(sh, "rank %u: save: %s (%s)", r, ckpt_strerror(e), ckpt_errmsg());
	e = ckpt_future_wait(f, CKPT_STAGED, -1);
	*stall = now_s() - t0;
	if (e == 0)
		e = ckpt_future_wait(f,
				     tier == CKPT_TIER_DURABLE  ? CKPT_DURABLE
				     : tier == CKPT_TIER_MEMORY ? CKPT_KEPT
								: CKPT_REPLICATED,
				     -1);
	*done = now_s() - t0;
	if (e < 0)
		fail(sh, "rank %u: save %" PRIu64 ": %s (%s)", r, step, ckpt_strerror(e), ckpt_future_message(f));
	ckpt_future_free(f);
}

/* A load of step into t, timed; its source must be want. */
static double timed_load(struct shared *sh, unsigned r, ckpt_client *c, uint64_t step, ckpt_tensor *t, size_t k,
			 unsigned flags, const char *want)
{
	ckpt_future *f = NULL;
	double t0 = now_s();
	int e = ckpt_load_ex(c, (int64_t)step, t, k, flags, &f);
	if (e == 0)
		e = ckpt_future_wait(f, CKPT_LOADED, -1);
	double dt = now_s() - t0;
	if (e < 0)
		fail(sh, "rank %u: load of step %" PRIu64 ": %s (%s)", r, step, ckpt_strerror(e),
		     f ? ckpt_future_message(f) : "");
	if (strcmp(ckpt_future_source(f), want) != 0)
		fail(sh, "rank %u: load of step %" PRIu64 " came from %s, not %s", r, step, ckpt_future_source(f),
		     want);
	ckpt_future_free(f);
	return dt;
}

/* --mode tiers: each round a durable, a memory and a replicated save,
 * then the replicated step from this daemon's memory, the durable one
 * from storage, and the replicated one through the restore daemon, which
 * brings it from the peer that holds it. */
static void rank_tiers(const struct opts *o, struct shared *sh, unsigned r, ckpt_tensor *t, size_t k, ckpt_client *c,
		       uint8_t *data, uint8_t *pool, uint64_t total)
{
	ckpt_hello h = { .job = o->job, .rank = r, .world_size = o->ranks };
	ckpt_client *rc = NULL;
	int e = ckpt_connect(o->restore_socket, &h, &rc);
	if (e < 0)
		fail(sh, "rank %u: connect %s: %s (%s)", r, o->restore_socket, ckpt_strerror(e), ckpt_errmsg());
	ckpt_buffer *rb = NULL;
	e = ckpt_buffer_alloc(rc, total ? total : 4096, &rb);
	if (e < 0)
		fail(sh, "rank %u: restore buffer: %s (%s)", r, ckpt_strerror(e), ckpt_errmsg());
	static ckpt_tensor rt[1 << 16];
	for (size_t i = 0; i < k; i++) {
		rt[i] = t[i];
		rt[i].buffer = rb;
	}
	for (unsigned s = 0; s < o->saves; s++) {
		uint64_t base = 3 * (uint64_t)s;
		pthread_barrier_wait(&sh->bar);
		sh->mc_save[r][s] = memcpy_time(pool, data, total, o->threads);
		pthread_barrier_wait(&sh->bar);
		timed_save(sh, r, c, base + 1, t, k, CKPT_TIER_DURABLE, &sh->stall[r][s], &sh->durable[r][s]);
		data[s % (total ? total : 1)] ^= 1;
		pthread_barrier_wait(&sh->bar);
		timed_save(sh, r, c, base + 2, t, k, CKPT_TIER_MEMORY, &sh->stall_mem[r][s], &sh->kept[r][s]);
		data[s % (total ? total : 1)] ^= 1;
		pthread_barrier_wait(&sh->bar);
		timed_save(sh, r, c, base + 3, t, k, CKPT_TIER_REPLICATED, &sh->stall_rep[r][s], &sh->replicated[r][s]);
		pthread_barrier_wait(&sh->bar);
		sh->mc_load[r][s] = memcpy_time(data, pool, total, o->threads);
		pthread_barrier_wait(&sh->bar);
		sh->loadmem[r][s] = timed_load(sh, r, c, base + 3, t, k, 0, "memory");
		pthread_barrier_wait(&sh->bar);
		sh->loadsto[r][s] = timed_load(sh, r, c, base + 1, t, k, CKPT_LOAD_STORAGE_ONLY, "storage");
		/* Another node: what it can restore (its peers, asked once), then
		 * the load, which brings the copy from the peer that holds it. */
		ckpt_held_info *held = NULL;
		size_t nh = 0;
		e = ckpt_held(rc, NULL, 0, &held, &nh);
		bool found = false;
		for (size_t i = 0; e == 0 && i < nh; i++)
			found |= held[i].step == base + 3 && held[i].peer[0];
		free(held);
		if (!found)
			fail(sh, "rank %u: the restore daemon finds no peer holding step %" PRIu64, r, base + 3);
		pthread_barrier_wait(&sh->bar);
		sh->loadpeer[r][s] = timed_load(sh, r, rc, base + 3, rt, k, 0, "peer");
		if (memcmp(ckpt_buffer_data(rb), data, total) != 0)
			fail(sh, "rank %u: the copy from the peer differs from what was saved", r);
	}
	ckpt_buffer_free(rb);
	ckpt_close(rc);
}

static void rank_direct(const struct opts *o, struct shared *sh, unsigned r)
{
	static uint64_t sizes[1 << 16];
	size_t nt = rank_tensors(o, r, sizes, 1 << 16);
	uint64_t total = 0;
	for (size_t i = 0; i < nt; i++)
		total += sizes[i] * opt_mult(o);
	sh->bytes[r] = total;
	if (strncmp(o->storage, "file://", 7) != 0)
		fail(sh, "--mode direct needs --storage file:///path");
	char dir[1024], path[1200];
	snprintf(dir, sizeof(dir), "%s/direct-%s", o->storage + 7, o->job);
	mkdir(o->storage + 7, 0755);
	mkdir(dir, 0755);
	snprintf(path, sizeof(path), "%s/rank-%05u.bin", dir, r);
	uint8_t *data = mmap(NULL, total ? total : 4096, PROT_READ | PROT_WRITE,
			     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (data == MAP_FAILED)
		fail(sh, "rank %u: mmap: %s", r, strerror(errno));
	for (uint64_t i = 0; i < total; i += 4096)
		data[i] = (uint8_t)(i >> 12 ^ r);
	for (unsigned s = 0; s < o->saves; s++) {
		pthread_barrier_wait(&sh->bar);
		double t0 = now_s();
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd < 0)
			fail(sh, "rank %u: %s: %s", r, path, strerror(errno));
		for (uint64_t done = 0; done < total;) {
			ssize_t w = write(fd, data + done, total - done > (1u << 30) ? (1u << 30) : total - done);
			if (w <= 0)
				fail(sh, "rank %u: write %s: %s", r, path, strerror(errno));
			done += (uint64_t)w;
		}
		if (fsync(fd) != 0)
			fail(sh, "rank %u: fsync: %s", r, strerror(errno));
		(void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		close(fd);
		sh->stall[r][s] = sh->durable[r][s] = now_s() - t0;
	}
	for (unsigned l = 0; l < o->loads; l++) {
		for (int storage = 0; storage < 2; storage++) {
			pthread_barrier_wait(&sh->bar);
			double t0 = now_s();
			if (storage) {
				int fd = open(path, O_RDONLY | O_CLOEXEC);
				if (fd < 0)
					fail(sh, "rank %u: %s: %s", r, path, strerror(errno));
				for (uint64_t done = 0; done < total;) {
					ssize_t g = pread(fd, data + done,
							  total - done > (1u << 30) ? (1u << 30) : total - done,
							  (off_t)done);
					if (g <= 0)
						fail(sh, "rank %u: read %s: %s", r, path, strerror(errno));
					done += (uint64_t)g;
				}
				(void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
				close(fd);
			}
			/* direct mode has no memory tier: that time stays 0 */
			(storage ? sh->loadsto : sh->loadmem)[r][l] = storage ? now_s() - t0 : 0;
		}
	}
	munmap(data, total ? total : 4096);
}

struct slice {
	uint8_t *dst;
	const uint8_t *src;
	size_t n;
};

static void *copy_slice(void *arg)
{
	struct slice *s = arg;
	memcpy(s->dst, s->src, s->n);
	return NULL;
}

/* The memcpy baseline is taken the way the copy it is compared with runs,
 * so that the ratio measures the daemon and not a difference of set-up:
 * --threads threads (the daemon's [pool] copy_threads, 2 by default),
 * between the trainer's buffer (a shared memfd mapping, the one the
 * daemon copies from on save and into on restore) and a buffer made like
 * the pool (anonymous, MADV_HUGEPAGE, pre-faulted writable: pool_like), once
 * per round right before the round it stands beside, and summarized like
 * it (median and p90 over the same rounds). A best-of-3 taken once before
 * the run, as this was, compared a minimum against a median and moved
 * with whatever else the machine was doing at that moment. */
static double memcpy_time(uint8_t *dst, const uint8_t *src, size_t n, unsigned t)
{
	pthread_t th[64];
	struct slice sl[64];
	double t0 = now_s();
	for (unsigned i = 0; i < t; i++) {
		size_t lo = n / t * i, hi = i + 1 == t ? n : n / t * (i + 1);
		sl[i] = (struct slice){ dst + lo, src + lo, hi - lo };
		pthread_create(&th[i], NULL, copy_slice, &sl[i]);
	}
	for (unsigned i = 0; i < t; i++)
		pthread_join(th[i], NULL);
	return now_s() - t0;
}

/* Rank r's baseline buffer, made as daemon/mem/pool.c makes the pool. */
static uint8_t *pool_like(struct shared *sh, unsigned r, uint64_t total)
{
	size_t n = total ? total : 4096;
	uint8_t *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		fail(sh, "rank %u: mmap: %s", r, strerror(errno));
	(void)madvise(p, n, MADV_HUGEPAGE);
	if (madvise(p, n, MADV_POPULATE_WRITE) != 0)
		for (size_t off = 0; off < n; off += 4096)
			((volatile uint8_t *)p)[off] = 0;
	return p;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Per round the slowest rank; then median and p90 over rounds. */
static void stats(double v[MAX_RANKS][MAX_ROUNDS], unsigned ranks, unsigned rounds, double *med, double *p90)
{
	double per[MAX_ROUNDS];
	for (unsigned s = 0; s < rounds; s++) {
		per[s] = 0;
		for (unsigned r = 0; r < ranks; r++)
			if (v[r][s] > per[s])
				per[s] = v[r][s];
	}
	qsort(per, rounds, sizeof(double), cmp_double);
	*med = rounds ? (rounds % 2 ? per[rounds / 2] : (per[rounds / 2 - 1] + per[rounds / 2]) / 2) : 0;
	*p90 = rounds ? per[(rounds * 9 + 9) / 10 - 1] : 0;
}

static json_object *stat_obj(double med, double p90)
{
	json_object *o = json_object_new_object();
	json_object_object_add(o, "median", json_object_new_double(med));
	json_object_object_add(o, "p90", json_object_new_double(p90));
	return o;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: ckpt-bench [OPTIONS]\n"
		"Times saves, loads from the daemon's memory and loads from storage of R trainer\n"
		"ranks, through ckptd (--mode agent) or written by each rank itself (--mode direct).\n\n"
		"  -s, --socket PATH        ckptd's socket (default $CKPTD_SOCKET, else %s)\n"
		"      --job NAME           the job the ranks save as (default bench-<unix time>-<pid>, a\n"
		"                           fresh job each run); it must hold none of the steps this run\n"
		"                           saves (1 to S; tiers: 1 to 3S): checkpoints are never overwritten\n"
		"      --size-mb M          M MB of float32 parameters per job (default 256)\n"
		"      --layers L           instead: a GPT-like model of L layers (hidden 224, vocabulary\n"
		"                           50257): 45 MB of embedding plus 2.41 MB per layer\n"
		"      --optimizer KIND     none (default), sgd (adds 1x, momentum) or adam (adds 2x)\n"
		"      --ranks R            trainer processes, 1 to %d (default 1)\n"
		"      --saves S            save rounds, 1 to %d (default 3)\n"
		"      --loads N            load rounds from memory and from storage, 0 to %d (default 2)\n"
		"      --threads T          memcpy threads for the copy baseline: the daemon's [pool] copy_threads,\n"
		"                           1 to 64 (default 2, as the daemon's)\n"
		"      --mode agent|direct|tiers  through ckptd, or each rank writes its state itself (default\n"
		"                           agent); tiers: durable, memory and replicated saves, and loads from\n"
		"                           memory, storage and a peer, side by side (docs/tiers.md \"Tiers\")\n"
		"      --restore-socket PATH  tiers: a second ckptd, on another node of the same [peers]\n"
		"                           ring, that restores from the peer holding the replica\n"
		"      --storage URL        file:///path: where direct mode writes (needed there)\n"
		"      --json FILE          also write {config, results} as JSON to FILE\n"
		"  -V, --version            print the version and the commit, exit\n"
		"  -h, --help               this text\n",
		CKPT_DEFAULT_SOCKET, MAX_RANKS, MAX_ROUNDS, MAX_ROUNDS);
}

/* A whole number in [lo, hi] or exit 2 naming the option. */
static uint64_t number(const char *opt, const char *v, uint64_t lo, uint64_t hi)
{
	char *end = NULL;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (!*v || *end || v[0] == '-' || errno || x < lo || x > hi) {
		fprintf(stderr, "ckpt-bench: --%s wants a number from %" PRIu64 " to %" PRIu64 ", not '%s'\n", opt, lo,
			hi, v);
		exit(2);
	}
	return x;
}

static const struct option longopts[] = {
	{ "socket", required_argument, NULL, 's' },
	{ "job", required_argument, NULL, 'J' },
	{ "size-mb", required_argument, NULL, 'm' },
	{ "layers", required_argument, NULL, 'L' },
	{ "ranks", required_argument, NULL, 'r' },
	{ "saves", required_argument, NULL, 'S' },
	{ "loads", required_argument, NULL, 'l' },
	{ "threads", required_argument, NULL, 't' },
	{ "optimizer", required_argument, NULL, 'o' },
	{ "mode", required_argument, NULL, 'M' },
	{ "storage", required_argument, NULL, 'u' },
	{ "restore-socket", required_argument, NULL, 'R' },
	{ "json", required_argument, NULL, 'j' },
	{ "version", no_argument, NULL, 'V' },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

/* The options as given, checked together and settled: --mode tiers as
 * an agent run with a restore socket, a fresh job where none is named.
 * -1 to go on, else the exit status. */
static int settle_opts(struct opts *o)
{
	bool tiers = !strcmp(o->mode, "tiers");
	if (tiers && !o->restore_socket) {
		fprintf(stderr, "ckpt-bench: --mode tiers needs --restore-socket\n");
		return 2;
	}
	if (tiers) {
		o->mode = "agent"; /* through ckptd; rank_agent goes to rank_tiers */
		o->loads = o->saves;
	} else {
		o->restore_socket = NULL;
	}
	bool agent = !strcmp(o->mode, "agent");
	if ((!agent && strcmp(o->mode, "direct")) || !o->ranks || o->ranks > MAX_RANKS || !o->saves ||
	    o->saves > MAX_ROUNDS || o->loads > MAX_ROUNDS || !o->threads || o->threads > 64 ||
	    (strcmp(o->optimizer, "none") && strcmp(o->optimizer, "sgd") && strcmp(o->optimizer, "adam")) ||
	    (!agent && !o->storage) || (!o->size_mb && !o->layers)) {
		usage(stderr);
		return 2;
	}
	if (!o->job) {
		/* a fresh job each run: a second run against the same storage
		 * would otherwise find its steps saved already */
		static char fresh[64];
		snprintf(fresh, sizeof(fresh), "bench-%lld-%ld", (long long)time(NULL), (long)getpid());
		o->job = fresh;
	}
	return -1;
}

/* The options into *out: -1 to go on, else the exit status. */
static int parse_opts(int argc, char **argv, struct opts *out)
{
	struct opts o = { .job = NULL,
			  .mode = "agent",
			  .optimizer = "none",
			  .size_mb = 256,
			  .ranks = 1,
			  .saves = 3,
			  .loads = 2,
			  .threads = 2 };
	o.socket = getenv("CKPTD_SOCKET");
	int ch;
	while ((ch = getopt_long(argc, argv, "s:Vh", longopts, NULL)) != -1) {
		switch (ch) {
		case 's': o.socket = optarg; break;
		case 'J': o.job = optarg; break;
		case 'm': o.size_mb = number("size-mb", optarg, 0, 1u << 24); break;
		case 'L': o.layers = number("layers", optarg, 0, 1u << 20); break;
		case 'r': o.ranks = (unsigned)number("ranks", optarg, 1, MAX_RANKS); break;
		case 'S': o.saves = (unsigned)number("saves", optarg, 1, MAX_ROUNDS); break;
		case 'l': o.loads = (unsigned)number("loads", optarg, 0, MAX_ROUNDS); break;
		case 't': o.threads = (unsigned)number("threads", optarg, 1, 64); break;
		case 'o': o.optimizer = optarg; break;
		case 'M': o.mode = optarg; break;
		case 'u': o.storage = optarg; break;
		case 'R': o.restore_socket = optarg; break;
		case 'j': o.json = optarg; break;
		case 'V': printf("ckpt-bench %s (commit %s)\n", CKPT_VERSION, CKPT_COMMIT); return 0;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "ckpt-bench: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	int rc = settle_opts(&o);
	if (rc >= 0)
		return rc;
	*out = o;
	return -1;
}

/* An agent run saves steps 1 to last of o->job: 1, after saying which and
 * what to do, when the job holds any of them already (in storage, or in
 * daemons' memory), else 0. A listing that fails is only warned about: the
 * saves then say what is wrong. */
static int job_taken(ckpt_client *ctl, const struct opts *o, uint64_t last)
{
	ckpt_step_info *v = NULL;
	size_t n = 0;
	int e = ckpt_list(ctl, o->job, &v, &n);
	if (e < 0) {
		fprintf(stderr, "ckpt-bench: warning: listing job '%s': %s (%s)\n", o->job, ckpt_strerror(e),
			ckpt_errmsg());
		return 0;
	}
	uint64_t taken = 0;
	size_t ntaken = 0;
	for (size_t i = 0; i < n; i++)
		if (v[i].step >= 1 && v[i].step <= last) {
			if (!ntaken || v[i].step < taken)
				taken = v[i].step;
			ntaken++;
		}
	free(v);
	if (!ntaken)
		return 0;
	fprintf(stderr,
		"ckpt-bench: job '%s' already has step %" PRIu64 " (%zu of the steps 1 to %" PRIu64
		" this run saves), and checkpoints are never overwritten. Leave out --job (each run then saves as a"
		" fresh job, bench-<unix time>-<pid>), name a job not used yet, or remove those steps first:"
		" 'ckptctl ls %s' lists them, 'ckptctl rm %s STEP' removes one.\n",
		o->job, taken, ntaken, last, o->job, o->job);
	return 1;
}

/* The ranks' shared results and the barrier they meet at; NULL (said on
 * stderr) if it cannot be mapped. */
static struct shared *shared_new(unsigned ranks)
{
	struct shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		perror("mmap");
		return NULL;
	}
	memset(sh, 0, sizeof(*sh));
	pthread_barrierattr_t ba;
	pthread_barrierattr_init(&ba);
	pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
	pthread_barrier_init(&sh->bar, &ba, ranks);
	return sh;
}

/* A process per rank, waited for: 1 if any died or failed to exit 0. */
static int run_ranks(const struct opts *o, struct shared *sh, bool agent)
{
	pid_t pids[MAX_RANKS];
	for (unsigned r = 0; r < o->ranks; r++) {
		pids[r] = fork();
		if (pids[r] == 0) {
			if (agent)
				rank_agent(o, sh, r);
			else
				rank_direct(o, sh, r);
			_exit(0);
		}
	}
	int bad = 0;
	for (unsigned r = 0; r < o->ranks; r++) {
		int st;
		waitpid(pids[r], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			bad = 1;
	}
	return bad;
}

/* What a run measured, over its ranks and rounds. */
struct summary {
	double mb; /* the state of every rank, MiB */
	/* the memcpy baselines beside the saves and the loads from memory:
	 * median and p90, s */
	double mcs, mcsp, mcl, mclp;
	/* stall, to durable, load from memory, load from storage: median
	 * and p90, s */
	double sm, sp, dm, dp, lmm, lmp, lsm, lsp;
	double cpu, rss; /* the daemon's CPU time (s) and peak RSS (MiB) */
};

static void summarize(const struct opts *o, struct shared *sh, bool agent, const ckpt_status_info *before,
		      const ckpt_status_info *after, struct summary *m)
{
	uint64_t bytes = 0;
	for (unsigned r = 0; r < o->ranks; r++)
		bytes += sh->bytes[r];
	stats(sh->mc_save, o->ranks, o->saves, &m->mcs, &m->mcsp);
	stats(sh->mc_load, o->ranks, o->loads, &m->mcl, &m->mclp);
	stats(sh->stall, o->ranks, o->saves, &m->sm, &m->sp);
	stats(sh->durable, o->ranks, o->saves, &m->dm, &m->dp);
	stats(sh->loadmem, o->ranks, o->loads, &m->lmm, &m->lmp);
	stats(sh->loadsto, o->ranks, o->loads, &m->lsm, &m->lsp);
	m->mb = (double)bytes / (1 << 20);
	m->cpu = agent ? (double)(after->cpu_ns - before->cpu_ns) / 1e9 : 0;
	m->rss = agent ? (double)after->peak_rss_bytes / (1 << 20) : 0;
}

/* --mode tiers: the tiers' saves and the restores' sources side by side. */
static void print_tiers(const struct opts *o, struct shared *sh, const struct summary *m)
{
	double a[2], b[2], c2[2], d2[2], e2[2];
	stats(sh->stall_mem, o->ranks, o->saves, &a[0], &a[1]);
	stats(sh->kept, o->ranks, o->saves, &b[0], &b[1]);
	stats(sh->stall_rep, o->ranks, o->saves, &c2[0], &c2[1]);
	stats(sh->replicated, o->ranks, o->saves, &d2[0], &d2[1]);
	stats(sh->loadpeer, o->ranks, o->saves, &e2[0], &e2[1]);
	printf("\n| tier | stall (med/p90) | to durable / kept / replicated (med/p90) |\n|---|---|---|\n");
	printf("| durable | %.3f / %.3f s | %.3f / %.3f s |\n", m->sm, m->sp, m->dm, m->dp);
	printf("| memory | %.3f / %.3f s | %.3f / %.3f s |\n", a[0], a[1], b[0], b[1]);
	printf("| replicated | %.3f / %.3f s | %.3f / %.3f s |\n", c2[0], c2[1], d2[0], d2[1]);
	printf("\n| restore from | median | p90 | MiB/s |\n|---|---|---|---|\n");
	printf("| local memory | %.3f s | %.3f s | %.0f |\n", m->lmm, m->lmp, m->lmm > 0 ? m->mb / m->lmm : 0);
	printf("| a peer's memory (another node) | %.3f s | %.3f s | %.0f |\n", e2[0], e2[1],
	       e2[0] > 0 ? m->mb / e2[0] : 0);
	printf("| storage | %.3f s | %.3f s | %.0f |\n", m->lsm, m->lsp, m->lsm > 0 ? m->mb / m->lsm : 0);
}

/* The markdown table on stdout (and the tiers' with --mode tiers), and
 * for an agent run, the job saved and the figures against memcpy. */
static void print_tables(const struct opts *o, struct shared *sh, const struct summary *m, bool agent)
{
	char lm[32];
	snprintf(lm, sizeof(lm), agent ? "%.3f s" : "-", m->lmm);
	printf("| mode | state | ranks | stall (med/p90) | durable (med/p90) | load memory | load storage | MB/s "
	       "durable |\n");
	printf("|---|---|---|---|---|---|---|---|\n");
	printf("| %s | %.0f MiB%s | %u | %.3f / %.3f s | %.3f / %.3f s | %s | %.3f s | %.0f |\n", o->mode, m->mb,
	       strcmp(o->optimizer, "none") ? (strcmp(o->optimizer, "adam") ? " (sgd)" : " (adam)") : "", o->ranks,
	       m->sm, m->sp, m->dm, m->dp, lm, m->lsm, m->dm > 0 ? m->mb / m->dm : 0);
	if (o->restore_socket)
		print_tiers(o, sh, m);
	if (agent) {
		printf("saved as job '%s', steps 1 to %u (ckptctl ls %s lists them)\n", o->job,
		       o->restore_socket ? 3 * o->saves : o->saves, o->job);
		printf("staging %.0f%% and load from memory %.0f%% of memcpy (%u threads, beside each round; "
		       "medians %.3f / %.3f s, p90 %.3f / %.3f s per rank); "
		       "daemon cpu %.2f s, peak rss %.0f MiB\n",
		       100 * m->mcs / m->sm, m->lmm > 0 ? 100 * m->mcl / m->lmm : 0, o->threads, m->mcs, m->mcl,
		       m->mcsp, m->mclp, m->cpu, m->rss);
	}
}

/* --json FILE: {config, results}; 1 (said on stderr) if it cannot be
 * written. storage: the daemon's, for an agent run. */
static int write_json(const struct opts *o, struct shared *sh, const struct summary *m, bool agent, const char *storage)
{
	json_object *root = json_object_new_object(), *cfg = json_object_new_object(), *res = json_object_new_object();
	json_object_object_add(cfg, "mode", json_object_new_string(o->mode));
	json_object_object_add(cfg, "job", json_object_new_string(o->job));
	json_object_object_add(cfg, "size_mb", json_object_new_double(m->mb));
	json_object_object_add(cfg, "layers", json_object_new_uint64(o->layers));
	json_object_object_add(cfg, "ranks", json_object_new_int((int)o->ranks));
	json_object_object_add(cfg, "saves", json_object_new_int((int)o->saves));
	json_object_object_add(cfg, "loads", json_object_new_int((int)o->loads));
	json_object_object_add(cfg, "optimizer", json_object_new_string(o->optimizer));
	json_object_object_add(cfg, "storage", json_object_new_string(agent ? storage : o->storage));
	json_object_object_add(res, "save_stall_s", stat_obj(m->sm, m->sp));
	json_object_object_add(res, "save_durable_s", stat_obj(m->dm, m->dp));
	json_object_object_add(res, "load_memory_s", agent ? stat_obj(m->lmm, m->lmp) : NULL);
	json_object_object_add(res, "load_storage_s", stat_obj(m->lsm, m->lsp));
	json_object_object_add(res, "throughput_mb_s", json_object_new_double(m->dm > 0 ? m->mb / m->dm : 0));
	json_object_object_add(res, "memcpy_mb_s",
			       json_object_new_double(m->mcs > 0 ? (m->mb / o->ranks) / m->mcs : 0));
	json_object_object_add(res, "memcpy_load_mb_s",
			       json_object_new_double(m->mcl > 0 ? (m->mb / o->ranks) / m->mcl : 0));
	if (agent) {
		json_object_object_add(res, "memcpy_save_s", stat_obj(m->mcs, m->mcsp));
		json_object_object_add(res, "memcpy_load_s", stat_obj(m->mcl, m->mclp));
		json_object_object_add(res, "staging_vs_memcpy", json_object_new_double(m->mcs / m->sm));
		json_object_object_add(res, "load_memory_vs_memcpy",
				       json_object_new_double(m->lmm > 0 ? m->mcl / m->lmm : 0));
	}
	if (o->restore_socket) {
		double m2, p2;
		stats(sh->stall_mem, o->ranks, o->saves, &m2, &p2);
		json_object_object_add(res, "memory_stall_s", stat_obj(m2, p2));
		stats(sh->kept, o->ranks, o->saves, &m2, &p2);
		json_object_object_add(res, "memory_kept_s", stat_obj(m2, p2));
		stats(sh->stall_rep, o->ranks, o->saves, &m2, &p2);
		json_object_object_add(res, "replicated_stall_s", stat_obj(m2, p2));
		stats(sh->replicated, o->ranks, o->saves, &m2, &p2);
		json_object_object_add(res, "replicated_s", stat_obj(m2, p2));
		stats(sh->loadpeer, o->ranks, o->saves, &m2, &p2);
		json_object_object_add(res, "load_peer_s", stat_obj(m2, p2));
	}
	json_object_object_add(res, "daemon_cpu_s", json_object_new_double(m->cpu));
	json_object_object_add(res, "daemon_peak_rss_mb", json_object_new_double(m->rss));
	json_object_object_add(root, "config", cfg);
	json_object_object_add(root, "results", res);
	if (json_object_to_file_ext(o->json, root, JSON_C_TO_STRING_PRETTY) != 0) {
		fprintf(stderr, "ckpt-bench: writing %s failed\n", o->json);
		return 1;
	}
	json_object_put(root);
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	int rc = parse_opts(argc, argv, &o);
	if (rc >= 0)
		return rc;
	bool agent = !strcmp(o.mode, "agent");
	if (!o.socket)
		o.socket = CKPT_DEFAULT_SOCKET;
	struct shared *sh = shared_new(o.ranks);
	if (sh == NULL)
		return 1;

	ckpt_client *ctl = NULL;
	ckpt_status_info before = { 0 }, after = { 0 };
	if (agent) {
		int e = ckpt_connect(o.socket, NULL, &ctl);
		if (e < 0) {
			fprintf(stderr, "ckpt-bench: connect %s: %s (%s)\n", o.socket, ckpt_strerror(e), ckpt_errmsg());
			return 1;
		}
		if (job_taken(ctl, &o, o.restore_socket ? 3 * (uint64_t)o.saves : o.saves)) {
			ckpt_close(ctl);
			return 1;
		}
		ckpt_status(ctl, &before);
	}
	if (run_ranks(&o, sh, agent) || sh->failed) {
		fprintf(stderr, "ckpt-bench: %s\n", sh->failed ? sh->msg : "a rank died");
		return 1;
	}
	if (agent)
		ckpt_status(ctl, &after);
	struct summary m;
	summarize(&o, sh, agent, &before, &after, &m);
	print_tables(&o, sh, &m, agent);
	if (o.json && write_json(&o, sh, &m, agent, before.storage) != 0)
		return 1;
	if (ctl)
		ckpt_close(ctl);
	return 0;
}
