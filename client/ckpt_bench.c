/* ckpt-bench: measure ckptd's data path against plain memcpy of the same
 * bytes, side by side in one process and run (so the ratios mean something
 * on a noisy machine):
 *
 *   staging   bytes / (save -> staged), against memcpy with --threads threads
 *   durable   save -> durable, beside the stall
 *   restore   load from the daemon's memory tier, against memcpy with
 *             --restore-threads threads
 *
 * Uses only the public libckpt API. Prints one line per metric and, with
 * --json, one JSON object. */
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "ckpt/ckpt.h"

struct opts {
	const char *socket, *job;
	uint64_t size_mb;
	unsigned threads, restore_threads, steps;
	int json;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, int r, const char *msg)
{
	fprintf(stderr, "ckpt-bench: %s: %s%s%s%s\n", what, ckpt_strerror(r), msg && *msg ? " (" : "",
		msg ? msg : "", msg && *msg ? ")" : "");
	exit(1);
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

/* Seconds for memcpy of n bytes with t threads. */
static double memcpy_time(uint8_t *dst, const uint8_t *src, size_t n, unsigned t)
{
	double best = 1e9;
	for (int rep = 0; rep < 1; rep++) {
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
		double dt = now_s() - t0;
		if (dt < best)
			best = dt;
	}
	return best;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(const double *v, unsigned n)
{
	double tmp[64];
	memcpy(tmp, v, n * sizeof(double));
	qsort(tmp, n, sizeof(double), cmp_double);
	return n % 2 ? tmp[n / 2] : (tmp[n / 2 - 1] + tmp[n / 2]) / 2;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: ckpt-bench --socket PATH [--job NAME] [--size-mb 1024] [--threads 2]\n"
		   "                  [--restore-threads 2] [--steps 5] [--json]\n");
}

int main(int argc, char **argv)
{
	struct opts o = { .socket = NULL, .job = "bench", .size_mb = 1024, .threads = 2,
			  .restore_threads = 2, .steps = 5 };
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--json")) {
			o.json = 1;
			continue;
		}
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			return 0;
		}
		if (!v) {
			usage(stderr);
			return 2;
		}
		i++;
		if (!strcmp(a, "--socket"))
			o.socket = v;
		else if (!strcmp(a, "--job"))
			o.job = v;
		else if (!strcmp(a, "--size-mb"))
			o.size_mb = strtoull(v, NULL, 10);
		else if (!strcmp(a, "--threads"))
			o.threads = (unsigned)strtoul(v, NULL, 10);
		else if (!strcmp(a, "--restore-threads"))
			o.restore_threads = (unsigned)strtoul(v, NULL, 10);
		else if (!strcmp(a, "--steps"))
			o.steps = (unsigned)strtoul(v, NULL, 10);
		else {
			usage(stderr);
			return 2;
		}
	}
	if (!o.size_mb || !o.threads || o.threads > 64 || !o.restore_threads || o.restore_threads > 64 ||
	    !o.steps) {
		usage(stderr);
		return 2;
	}
	size_t n = (size_t)o.size_mb << 20;
	ckpt_hello h = { .job = o.job, .rank = 0, .world_size = 1 };
	ckpt_client *c = NULL;
	int r = ckpt_connect(o.socket, &h, &c);
	if (r < 0)
		die("connect", r, ckpt_errmsg());
	ckpt_buffer *b = NULL;
	r = ckpt_buffer_alloc(c, n, &b);
	if (r < 0)
		die("allocate buffer", r, ckpt_errmsg());
	uint8_t *data = ckpt_buffer_data(b);
	for (size_t i = 0; i < n; i += 4096)
		data[i] = (uint8_t)(i >> 12);
	uint8_t *dst = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (dst == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	/* Several tensors, as a model would have. */
	enum { K = 8 };
	uint64_t shape[K][1];
	char names[K][16];
	ckpt_tensor t[K];
	for (int i = 0; i < K; i++) {
		size_t lo = n / K * (size_t)i, hi = i + 1 == K ? n : n / K * (size_t)(i + 1);
		shape[i][0] = (hi - lo) / 4;
		snprintf(names[i], sizeof(names[i]), "t%d", i);
		t[i] = (ckpt_tensor){ .name = names[i], .dtype = CKPT_F32, .ndim = 1, .global_shape = shape[i],
				      .buffer = b, .offset = lo, .nbytes = hi - lo };
	}

	/* Interleaved rounds: memcpy, save; memcpy, load. Each ratio compares
	 * neighbours in time, and the median of the rounds is reported. */
	enum { MAXR = 64 };
	double cp[MAXR], stall[MAXR], dur[MAXR], cpr[MAXR], load[MAXR];
	unsigned rounds = o.steps > MAXR ? MAXR : o.steps;
	char src[16] = "";
	for (unsigned s = 0; s < rounds; s++) {
		cp[s] = memcpy_time(dst, data, n, o.threads);
		ckpt_future *f = NULL;
		double t0 = now_s();
		r = ckpt_save(c, s + 1, t, K, NULL, 0, &f);
		if (r < 0)
			die("save", r, ckpt_errmsg());
		r = ckpt_future_wait(f, CKPT_STAGED, -1);
		if (r < 0)
			die("staged", r, ckpt_future_message(f));
		stall[s] = now_s() - t0;
		r = ckpt_future_wait(f, CKPT_DURABLE, -1);
		if (r < 0)
			die("durable", r, ckpt_future_message(f));
		dur[s] = now_s() - t0;
		ckpt_future_free(f);
		cpr[s] = memcpy_time(dst, data, n, o.restore_threads);
		t0 = now_s();
		r = ckpt_load(c, CKPT_LATEST, t, K, &f);
		if (r < 0)
			die("load", r, ckpt_errmsg());
		r = ckpt_future_wait(f, CKPT_LOADED, -1);
		if (r < 0)
			die("load", r, ckpt_future_message(f));
		load[s] = now_s() - t0;
		snprintf(src, sizeof(src), "%s", ckpt_future_source(f));
		ckpt_future_free(f);
	}
	double ratio_s[MAXR], ratio_r[MAXR];
	for (unsigned s = 0; s < rounds; s++) {
		ratio_s[s] = cp[s] / stall[s];
		ratio_r[s] = cpr[s] / load[s];
	}
	double stall_med = median(stall, rounds), dur_med = median(dur, rounds);
	double cp_med = median(cp, rounds), cpr_med = median(cpr, rounds), load_med = median(load, rounds);
	double rs = median(ratio_s, rounds), rr = median(ratio_r, rounds);
	const char *source = src;
	double gib = (double)n / (1u << 30);
	double memcpy_gbs = (double)n / cp_med / 1e9, stage_gbs = (double)n / stall_med / 1e9;
	double memcpy_r_gbs = (double)n / cpr_med / 1e9, load_gbs = (double)n / load_med / 1e9;
	if (o.json) {
		json_object *j = json_object_new_object();
		json_object_object_add(j, "bytes", json_object_new_uint64(n));
		json_object_object_add(j, "rounds", json_object_new_int((int)rounds));
		json_object_object_add(j, "threads", json_object_new_int((int)o.threads));
		json_object_object_add(j, "memcpy_gbs", json_object_new_double(memcpy_gbs));
		json_object_object_add(j, "staging_gbs", json_object_new_double(stage_gbs));
		json_object_object_add(j, "staging_vs_memcpy", json_object_new_double(rs));
		json_object_object_add(j, "stall_ms", json_object_new_double(stall_med * 1e3));
		json_object_object_add(j, "durable_ms", json_object_new_double(dur_med * 1e3));
		json_object_object_add(j, "restore_threads", json_object_new_int((int)o.restore_threads));
		json_object_object_add(j, "memcpy_restore_gbs", json_object_new_double(memcpy_r_gbs));
		json_object_object_add(j, "restore_gbs", json_object_new_double(load_gbs));
		json_object_object_add(j, "restore_vs_memcpy", json_object_new_double(rr));
		json_object_object_add(j, "restore_source", json_object_new_string(source));
		puts(json_object_to_json_string_ext(j, JSON_C_TO_STRING_PRETTY));
		json_object_put(j);
	} else {
		printf("state            %.2f GiB in %d tensors, %u rounds, medians\n", gib, K, rounds);
		printf("memcpy           %.2f GB/s (%u threads)\n", memcpy_gbs, o.threads);
		printf("staging          %.2f GB/s (stall %.1f ms) = %.0f%% of memcpy\n", stage_gbs,
		       stall_med * 1e3, 100.0 * rs);
		printf("stall vs durable %.1f ms vs %.1f ms\n", stall_med * 1e3, dur_med * 1e3);
		printf("memcpy           %.2f GB/s (%u threads)\n", memcpy_r_gbs, o.restore_threads);
		printf("restore          %.2f GB/s from %s = %.0f%% of memcpy\n", load_gbs, source, 100.0 * rr);
	}
	munmap(dst, n);
	ckpt_buffer_free(b);
	ckpt_close(c);
	return 0;
}
