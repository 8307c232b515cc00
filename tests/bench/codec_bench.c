/* codec_bench: the plane codec (daemon/base/planecodec.c) on synthetic
 * tensors shaped like a training checkpoint's, on one core:
 *
 *   bf16 w     weights, N(0, 0.02), truncated to bf16
 *   fp32 w     the same in fp32 (master weights)
 *   fp32 m     Adam's first moment, N(0, 1e-4)
 *   fp32 v     Adam's second moment: squares of N(0, 1e-3), tiny, positive
 *   bf16 v     the same, truncated to bf16
 *
 * For each zstd level: the ratio (raw over stored), and compress and
 * decompress MB/s (raw bytes over the median time of --reps passes, one
 * piece of --piece-mb at a time, as upload would call it), then the same
 * for all five together ("all"). One row per level of zstd over the
 * interleaved bytes as they are (no planes) shows what the planes buy.
 * Synthetic data: real weights (heavier tails, per-layer scales) differ.
 *
 * --dir DIR takes the sets from files instead: every DIR/KIND.DTYPE (DTYPE
 * bf16, fp16, fp32 or fp64) as tests/bench/trained_state.py writes a
 * trained model's weights and Adam moments, and adds the row issue 39's
 * target is about, "bf16 w + fp32 m, v" (weights.bf16, adam_m.fp32 and
 * adam_v.fp32 together).
 *
 * usage: codec_bench [--mb N] [--piece-mb P] [--reps R] [--levels -500,-50,-5,1,3] [--dir DIR] */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zstd.h>

#include "planecodec.h"

#define MAX_LEVELS 16
#define NSETS 5
#define MAX_SETS 16
#define MAX_REPS 64

struct set {
	const char *name;
	unsigned elem;
	uint8_t *data;
	size_t n;
	bool target; /* in the "bf16 w + fp32 m, v" row */
};

/* The files of dir as sets (--dir): how many, or -1 with a message. */
static int load_dir(const char *dir, struct set *sets)
{
	DIR *d = opendir(dir);
	if (d == NULL) {
		fprintf(stderr, "codec_bench: %s: %s\n", dir, strerror(errno));
		return -1;
	}
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL && n < MAX_SETS) {
		const char *dot = strrchr(e->d_name, '.');
		unsigned elem = !dot                                             ? 0
				: !strcmp(dot, ".bf16") || !strcmp(dot, ".fp16") ? 2
				: !strcmp(dot, ".fp32")                          ? 4
				: !strcmp(dot, ".fp64")                          ? 8
										 : 0;
		if (elem == 0)
			continue;
		char path[4096];
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		FILE *f = fopen(path, "rb");
		if (f == NULL || fseek(f, 0, SEEK_END) != 0) {
			fprintf(stderr, "codec_bench: %s: %s\n", path, strerror(errno));
			closedir(d);
			return -1;
		}
		long len = ftell(f);
		rewind(f);
		struct set *s = &sets[n];
		s->name = strdup(e->d_name);
		s->elem = elem;
		s->n = len > 0 ? (size_t)len : 0;
		s->data = malloc(s->n ? s->n : 1);
		s->target = !strcmp(e->d_name, "weights.bf16") || !strcmp(e->d_name, "adam_m.fp32") ||
			    !strcmp(e->d_name, "adam_v.fp32");
		if (s->name == NULL || s->data == NULL || fread(s->data, 1, s->n, f) != s->n) {
			fprintf(stderr, "codec_bench: reading %s failed\n", path);
			fclose(f);
			closedir(d);
			return -1;
		}
		fclose(f);
		n++;
	}
	closedir(d);
	if (n == 0)
		fprintf(stderr, "codec_bench: no KIND.bf16/fp16/fp32/fp64 file in %s\n", dir);
	return n ? n : -1;
}

static uint64_t rng = 88172645463325252ull;

static double uniform(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}

static double gauss(void)
{
	return sqrt(-2.0 * log(uniform())) * cos(2.0 * M_PI * uniform());
}

static uint16_t to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return (uint16_t)(u >> 16);
}

static void fill(struct set *s, int which)
{
	size_t count = s->n / s->elem;
	for (size_t i = 0; i < count; i++) {
		double g = gauss();
		float f = which == 0 || which == 1 ? (float)(0.02 * g)
			  : which == 2             ? (float)(1e-4 * g)
						   : (float)((1e-3 * g) * (1e-3 * g));
		if (s->elem == 2) {
			uint16_t b = to_bf16(f);
			memcpy(s->data + 2 * i, &b, 2);
		} else {
			memcpy(s->data + 4 * i, &f, 4);
		}
	}
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int k)
{
	qsort(v, (size_t)k, sizeof(*v), cmp_double);
	return v[k / 2];
}

struct result {
	size_t raw, stored;
	double enc_s, dec_s;
};

/* One set at one level: planes (planar) or zstd over the bytes as they are. */
static int run_set(struct planecodec *c, const struct set *s, size_t piece, int reps, int planar, uint8_t *blob,
		   size_t cap, uint8_t *out, struct result *r)
{
	double te[MAX_REPS], td[MAX_REPS];
	size_t stored = 0;
	for (int rep = 0; rep < reps; rep++) {
		double enc = 0, dec = 0;
		stored = 0;
		for (size_t off = 0; off < s->n; off += piece) {
			size_t len = s->n - off < piece ? s->n - off : piece;
			double t0 = now();
			size_t l;
			if (planar) {
				ssize_t e = planecodec_encode(c, s->data + off, len, s->elem, blob, cap);
				if (e < 0)
					return (int)e;
				l = (size_t)e;
			} else {
				l = ZSTD_compress2(c->cctx, blob, cap, s->data + off, len);
				if (ZSTD_isError(l))
					return -EIO;
			}
			double t1 = now();
			if (planar) {
				if (planecodec_decode(c, blob, l, out, len) != 0)
					return -EBADMSG;
			} else {
				size_t d = ZSTD_decompressDCtx(c->dctx, out, len, blob, l);
				if (ZSTD_isError(d) || d != len)
					return -EBADMSG;
			}
			double t2 = now();
			if (rep == 0 && memcmp(out, s->data + off, len) != 0)
				return -EBADMSG;
			enc += t1 - t0;
			dec += t2 - t1;
			stored += l;
		}
		te[rep] = enc;
		td[rep] = dec;
	}
	r->raw += s->n;
	r->stored += stored;
	r->enc_s += median(te, reps);
	r->dec_s += median(td, reps);
	return 0;
}

static void print_row(const char *what, const char *name, int level, const struct result *r)
{
	printf("%-8s %6d  %-18s %7.3f %10.0f %10.0f\n", what, level, name, (double)r->raw / (double)r->stored,
	       (double)r->raw / r->enc_s / 1e6, (double)r->raw / r->dec_s / 1e6);
}

int main(int argc, char **argv)
{
	size_t mb = 32, piece_mb = 4;
	int reps = 3, levels[MAX_LEVELS] = { -500, -50, -5, 1, 3 }, nlevels = 5;
	static const struct option opts[] = { { "mb", required_argument, NULL, 'm' },
					      { "piece-mb", required_argument, NULL, 'p' },
					      { "reps", required_argument, NULL, 'r' },
					      { "levels", required_argument, NULL, 'l' },
					      { "dir", required_argument, NULL, 'd' },
					      { "help", no_argument, NULL, 'h' },
					      { NULL, 0, NULL, 0 } };
	const char *dir = NULL;
	int o;
	while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (o) {
		case 'm': mb = strtoul(optarg, NULL, 10); break;
		case 'p': piece_mb = strtoul(optarg, NULL, 10); break;
		case 'r': reps = atoi(optarg); break;
		case 'd': dir = optarg; break;
		case 'l': {
			nlevels = 0;
			char *save = NULL;
			for (char *t = strtok_r(optarg, ",", &save); t && nlevels < MAX_LEVELS;
			     t = strtok_r(NULL, ",", &save))
				levels[nlevels++] = atoi(t);
			break;
		}
		default:
			fprintf(stderr,
				"usage: codec_bench [--mb N] [--piece-mb P] [--reps R] [--levels -500,-50,-5,1,3] "
				"[--dir DIR]\n");
			return o == 'h' ? 0 : 2;
		}
	}
	if (mb == 0 || piece_mb == 0 || reps < 1 || reps > MAX_REPS || nlevels == 0) {
		fprintf(stderr, "codec_bench: --mb, --piece-mb, --reps (1-%d) and --levels must be positive\n",
			MAX_REPS);
		return 2;
	}
	struct set sets[MAX_SETS] = { { "bf16 w", 2, NULL, 0, false },
				      { "fp32 w", 4, NULL, 0, false },
				      { "fp32 m", 4, NULL, 0, false },
				      { "fp32 v", 4, NULL, 0, false },
				      { "bf16 v", 2, NULL, 0, false } };
	int nsets = NSETS;
	if (dir != NULL && (nsets = load_dir(dir, sets)) < 0)
		return 1;
	size_t piece = piece_mb << 20, cap = planecodec_bound(piece);
	uint8_t *blob = malloc(cap > ZSTD_compressBound(piece) ? cap : ZSTD_compressBound(piece));
	uint8_t *out = malloc(piece);
	if (blob == NULL || out == NULL)
		return 1;
	cap = cap > ZSTD_compressBound(piece) ? cap : ZSTD_compressBound(piece);
	for (int i = 0; dir == NULL && i < NSETS; i++) {
		sets[i].n = mb << 20;
		sets[i].data = malloc(sets[i].n);
		if (sets[i].data == NULL)
			return 1;
		fill(&sets[i], i == 4 ? 3 : i);
	}
	if (dir)
		printf("# the files of %s, pieces of %zu MiB, median of %d; transposes: %s; one core\n", dir, piece_mb,
		       reps, planecodec_kind_name(planecodec_chosen()));
	else
		printf("# %zu MiB a set, pieces of %zu MiB, median of %d; transposes: %s; one core\n", mb, piece_mb,
		       reps, planecodec_kind_name(planecodec_chosen()));
	printf("%-8s %6s  %-18s %7s %10s %10s\n", "method", "level", "set", "ratio", "comp MB/s", "decomp MB/s");
	for (int planar = 1; planar >= 0; planar--)
		for (int li = 0; li < nlevels; li++) {
			struct planecodec c;
			if (planecodec_init(&c, levels[li]) != 0)
				return 1;
			struct result all = { 0 }, target = { 0 };
			bool any_target = false;
			for (int i = 0; i < nsets; i++) {
				struct result r = { 0 };
				int e = run_set(&c, &sets[i], piece, reps, planar, blob, cap, out, &r);
				if (e < 0) {
					fprintf(stderr, "codec_bench: %s at level %d: %s\n", sets[i].name, levels[li],
						strerror(-e));
					return 1;
				}
				print_row(planar ? "planes" : "zstd", sets[i].name, levels[li], &r);
				all.raw += r.raw;
				all.stored += r.stored;
				all.enc_s += r.enc_s;
				all.dec_s += r.dec_s;
				if (sets[i].target) {
					any_target = true;
					target.raw += r.raw;
					target.stored += r.stored;
					target.enc_s += r.enc_s;
					target.dec_s += r.dec_s;
				}
			}
			print_row(planar ? "planes" : "zstd", "all", levels[li], &all);
			if (any_target)
				print_row(planar ? "planes" : "zstd", "bf16 w + fp32 m, v", levels[li], &target);
			planecodec_free(&c);
		}
	/* planecodec_worth on every piece: what the sample costs. */
	struct planecodec c;
	if (planecodec_init(&c, 0) != 0)
		return 1;
	for (int i = 0; i < nsets; i++) {
		size_t yes = 0, pieces = 0;
		double t0 = now();
		for (size_t off = 0; off < sets[i].n; off += piece, pieces++)
			yes += planecodec_worth(&c, sets[i].data + off,
						sets[i].n - off < piece ? sets[i].n - off : piece, sets[i].elem);
		double t = now() - t0;
		printf("# worth %-18s %zu of %zu pieces, %.1f us a piece\n", sets[i].name, yes, pieces,
		       t / (double)pieces * 1e6);
	}
	planecodec_free(&c);
	for (int i = 0; i < nsets; i++) {
		free(sets[i].data);
		if (dir)
			free((char *)sets[i].name);
	}
	free(blob);
	free(out);
	return 0;
}
