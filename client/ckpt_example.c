/* ckpt-example: a toy trainer that checkpoints through libckpt, using only
 * the public API.
 *
 * K tensors, each a 2-D float32 global array [rows, 1024], sharded by rows
 * over the world: rank r holds rows [r*rows/W, (r+1)*rows/W). Every element
 * is a function of (job, step, tensor, global element index), so any process
 * at any world size can verify a restore. The value is a 24-bit integer made
 * float, which is exact and never NaN.
 *
 * Saves steps 1..N asynchronously: fill, save, wait for STAGED (the stall the
 * trainer sees), fill the next step while the previous one uploads, and wait
 * for its DURABLE before saving again, so at most one save is not durable.
 * Then loads the latest step into the zeroed buffer and verifies it. With
 * --restore-only it only loads and verifies; --step N loads step N instead
 * of the latest (one rank resolved it, e.g. with `ckptctl resolve`, and
 * handed it to every rank). */
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "ckpt_version.h"

#define COLS 1024u
#define MIB (1024.0 * 1024.0)

struct opts {
	const char *socket, *job, *attempt;
	uint32_t rank, world, local_rank;
	uint64_t steps, size_mb, ntensors;
	uint64_t frozen;    /* the first tensors, which keep step 1's values */
	uint64_t load_step; /* 0: latest */
	int restore_only;
	int shm; /* register a /dev/shm file (pread path) instead of a sealed memfd */
};

struct layout {
	uint64_t rows, lo, hi; /* global rows, this rank's [lo, hi) */
	uint64_t tensor_bytes; /* local bytes per tensor */
	uint64_t total_bytes;
	uint64_t jobh;
	uint64_t frozen; /* opts.frozen */
	char (*names)[48];
	uint64_t shape[2], boff[2], blen[2];
	ckpt_tensor *t;
};

/* Phase times recorded by the completion callback (on the reader thread). */
struct timing {
	_Atomic int64_t staged_ns, durable_ns;
};

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fatal(const char *fmt, ...)
{
	va_list ap;

	fputs("ckpt-example: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void fatal_ckpt(const char *what, int err, const char *msg)
{
	if (msg && *msg)
		fatal("%s: %s (%s)", what, ckpt_strerror(err), msg);
	fatal("%s: %s", what, ckpt_strerror(err));
}

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t hash_str(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
	return mix64(h);
}

/* The base of one (job, step, tensor); element i's value is
 * elem_value(base, i). */
static uint64_t tensor_base(uint64_t jobh, uint64_t step, uint64_t k)
{
	return mix64(jobh ^ mix64(step * 0x9e3779b97f4a7c15ull ^ mix64(k + 0x632be59bd9b4e019ull)));
}

static inline float elem_value(uint64_t base, uint64_t gidx)
{
	return (float)(mix64(base + gidx * 0x9e3779b97f4a7c15ull) & 0xffffff);
}

static void fill(const struct layout *L, float *data, uint64_t step, uint64_t ntensors)
{
	for (uint64_t k = 0; k < ntensors; k++) {
		uint64_t base = tensor_base(L->jobh, k < L->frozen ? 1 : step, k);
		float *p = data + k * (L->tensor_bytes / sizeof(float));

		for (uint64_t r = L->lo; r < L->hi; r++)
			for (uint64_t c = 0; c < COLS; c++)
				*p++ = elem_value(base, r * COLS + c);
	}
}

/* 0 when every element matches step; else reports the first mismatch. */
static int verify(const struct layout *L, const float *data, uint64_t step, uint64_t ntensors)
{
	for (uint64_t k = 0; k < ntensors; k++) {
		uint64_t base = tensor_base(L->jobh, k < L->frozen ? 1 : step, k);
		const float *p = data + k * (L->tensor_bytes / sizeof(float));

		for (uint64_t r = L->lo; r < L->hi; r++)
			for (uint64_t c = 0; c < COLS; c++, p++) {
				float want = elem_value(base, r * COLS + c);

				if (memcmp(p, &want, sizeof(want)) != 0) {
					fprintf(stderr,
						"ckpt-example: step %" PRIu64 " tensor %" PRIu64 " element [%" PRIu64
						", %" PRIu64 "]: got %.1f, want %.1f\n",
						step, k, r, c, (double)*p, (double)want);
					return -1;
				}
			}
	}
	return 0;
}

static void on_phase(ckpt_future *f, ckpt_phase phase, int status, void *user)
{
	struct timing *t = user;

	(void)f;
	if (status)
		return;
	if (phase == CKPT_STAGED)
		atomic_store(&t->staged_ns, now_ns());
	else if (phase == CKPT_DURABLE)
		atomic_store(&t->durable_ns, now_ns());
}

static uint64_t parse_u64(const char *opt, const char *s, uint64_t max)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-' || v > max)
		fatal("bad value for %s: %s", opt, s);
	return v;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: ckpt-example --job NAME [OPTIONS]\n"
		"A trainer rank through libckpt: saves N steps of deterministic data and restores\n"
		"the latest (or --step S), checking every element.\n\n"
		"  -s, --socket PATH     ckptd's socket (default $CKPTD_SOCKET, else %s)\n"
		"      --job NAME        the job (required)\n"
		"      --rank R          this rank (default $RANK, else 0)\n"
		"      --world-size W    ranks in the job (default $WORLD_SIZE, else 1)\n"
		"      --attempt ID      the attempt id sent in Hello (default: the daemon's \"default\")\n"
		"      --steps N         steps to save (default 3)\n"
		"      --size-mb M       MiB of state of the whole job (default 64)\n"
		"      --tensors K       tensors it is split into (default 4)\n"
		"      --frozen F        the first F tensors keep step 1's values, as a frozen base does\n"
		"      --restore-only    save nothing; restore and check\n"
		"      --step S          restore step S instead of the latest\n"
		"      --shm             register a /dev/shm file (staged with pread), not a sealed memfd\n"
		"  -V, --version         print the version and the commit, exit\n"
		"  -h, --help            this text\n",
		CKPT_DEFAULT_SOCKET);
}

static void parse_args(int argc, char **argv, struct opts *o)
{
	const char *e;

	memset(o, 0, sizeof(*o));
	o->socket = getenv("CKPTD_SOCKET");
	o->world = 1;
	o->steps = 3;
	o->size_mb = 64;
	o->ntensors = 4;
	if ((e = getenv("RANK")) && *e)
		o->rank = (uint32_t)parse_u64("$RANK", e, UINT32_MAX);
	if ((e = getenv("WORLD_SIZE")) && *e)
		o->world = (uint32_t)parse_u64("$WORLD_SIZE", e, UINT32_MAX);
	o->local_rank = UINT32_MAX;
	if ((e = getenv("LOCAL_RANK")) && *e)
		o->local_rank = (uint32_t)parse_u64("$LOCAL_RANK", e, UINT32_MAX - 1);

	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "job", required_argument, NULL, 'J' },
		{ "attempt", required_argument, NULL, 'a' },
		{ "rank", required_argument, NULL, 'r' },
		{ "world-size", required_argument, NULL, 'w' },
		{ "steps", required_argument, NULL, 'n' },
		{ "size-mb", required_argument, NULL, 'm' },
		{ "tensors", required_argument, NULL, 'k' },
		{ "frozen", required_argument, NULL, 'F' },
		{ "step", required_argument, NULL, 'S' },
		{ "restore-only", no_argument, NULL, 'R' },
		{ "shm", no_argument, NULL, 'H' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int ch;
	while ((ch = getopt_long(argc, argv, "s:Vh", longopts, NULL)) != -1) {
		switch (ch) {
		case 's': o->socket = optarg; break;
		case 'J': o->job = optarg; break;
		case 'a': o->attempt = optarg; break;
		case 'r': o->rank = (uint32_t)parse_u64("--rank", optarg, UINT32_MAX); break;
		case 'w': o->world = (uint32_t)parse_u64("--world-size", optarg, UINT32_MAX); break;
		case 'n': o->steps = parse_u64("--steps", optarg, 1000000); break;
		case 'm': o->size_mb = parse_u64("--size-mb", optarg, 1u << 20); break;
		case 'k': o->ntensors = parse_u64("--tensors", optarg, 100000); break;
		case 'F': o->frozen = parse_u64("--frozen", optarg, 100000); break;
		case 'S':
			o->load_step = parse_u64("--step", optarg, INT64_MAX);
			if (o->load_step == 0)
				fatal("--step must be at least 1");
			break;
		case 'R': o->restore_only = 1; break;
		case 'H': o->shm = 1; break;
		case 'V': printf("ckpt-example %s (commit %s)\n", CKPT_VERSION, CKPT_COMMIT); exit(0);
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); exit(2);
		}
	}
	if (optind < argc) {
		usage(stderr);
		fatal("unexpected argument %s", argv[optind]);
	}
	if (!o->job || !*o->job) {
		usage(stderr);
		fatal("--job is required");
	}
	if (!o->socket || !*o->socket)
		o->socket = CKPT_DEFAULT_SOCKET;
	if (o->world == 0 || o->rank >= o->world)
		fatal("rank %" PRIu32 " is not below world size %" PRIu32, o->rank, o->world);
	if (o->ntensors == 0)
		fatal("--tensors must be at least 1");

	if (!o->restore_only && o->steps == 0)
		fatal("--steps must be at least 1");
	if (o->local_rank == UINT32_MAX)
		o->local_rank = o->rank;
}

static void make_layout(const struct opts *o, struct layout *L, ckpt_buffer *buf)
{
	L->frozen = o->frozen;
	L->t = calloc(o->ntensors, sizeof(*L->t));
	L->names = calloc(o->ntensors, sizeof(*L->names));
	if (!L->t || !L->names)
		fatal("out of memory");
	L->shape[0] = L->rows;
	L->shape[1] = COLS;
	L->boff[0] = L->lo;
	L->boff[1] = 0;
	L->blen[0] = L->hi - L->lo;
	L->blen[1] = COLS;
	for (uint64_t k = 0; k < o->ntensors; k++) {
		snprintf(L->names[k], sizeof(L->names[k]), "layer%" PRIu64 ".weight", k);
		L->t[k] = (ckpt_tensor){
			.name = L->names[k],
			.dtype = CKPT_F32,
			.ndim = 2,
			.global_shape = L->shape,
			.box_offsets = L->boff,
			.box_lengths = L->blen,
			.buffer = buf,
			.offset = k * L->tensor_bytes,
			.nbytes = L->tensor_bytes,
		};
	}
}

/* Wait for step to be complete on every rank (another rank may still be
 * uploading), so that "latest" means what this run saved. The daemon
 * serves every rank of the node from one poll of storage. Best effort. */
static void wait_complete(ckpt_client *c, const char *job, uint64_t step)
{
	if (ckpt_wait_complete(c, job, step, 120 * 1000, NULL) < 0)
		fprintf(stderr, "ckpt-example: waiting for step %" PRIu64 ": %s\n", step, ckpt_errmsg());
}

static void print_row(uint64_t step, double mib, double stall_ms, double durable_ms)
{
	printf("%8" PRIu64 " %10.1f %10.2f %12.2f\n", step, mib, stall_ms, durable_ms);
	fflush(stdout);
}

/* Wait for the durable of f and print its row. Returns durable_ms. */
static double finish_save(ckpt_future *f, struct timing *tm, int64_t t0, uint64_t step, double mib, double stall_ms)
{
	int64_t td;
	double ms;
	int r = ckpt_future_wait(f, CKPT_DURABLE, -1);
	char what[64];

	if (r < 0) {
		snprintf(what, sizeof(what), "save step %" PRIu64 " durable", step);
		fatal_ckpt(what, r, ckpt_future_message(f));
	}
	td = atomic_load(&tm->durable_ns);
	if (!td) /* the callback has not run yet: the wait's time is close */
		td = now_ns();
	ms = (double)(td - t0) / 1e6;
	print_row(step, mib, stall_ms, ms);
	return ms;
}

static void run_saves(const struct opts *o, ckpt_client *c, const struct layout *L, float *data)
{
	ckpt_future *prev = NULL;
	struct timing tm[2];
	int64_t prev_t0 = 0;
	double prev_stall = 0, sum_stall = 0, sum_durable = 0, max_stall = 0;
	double mib = (double)L->total_bytes / MIB;
	int64_t t_begin = now_ns();
	char what[64];

	printf("%8s %10s %10s %12s\n", "step", "MiB", "stall_ms", "durable_ms");
	for (uint64_t s = 1; s <= o->steps; s++) {
		struct timing *t = &tm[s % 2];
		char extra[64];
		ckpt_future *f;
		int64_t t0;
		double stall;
		int r;

		/* The previous save is staged: its bytes are safe to
		 * overwrite while it uploads. */
		fill(L, data, s, o->ntensors);
		if (prev) {
			sum_durable += finish_save(prev, &tm[(s - 1) % 2], prev_t0, s - 1, mib, prev_stall);
			ckpt_future_free(prev);
			prev = NULL;
		}
		atomic_store(&t->staged_ns, 0);
		atomic_store(&t->durable_ns, 0);
		snprintf(extra, sizeof(extra), "step=%" PRIu64, s);
		t0 = now_ns();
		r = ckpt_save(c, s, L->t, o->ntensors, extra, strlen(extra), &f);
		if (r < 0) {
			snprintf(what, sizeof(what), "save step %" PRIu64, s);
			fatal_ckpt(what, r, ckpt_errmsg());
		}
		r = ckpt_future_set_callback(f, on_phase, t);
		if (r < 0)
			fatal_ckpt("set callback", r, NULL);
		r = ckpt_future_wait(f, CKPT_STAGED, -1);
		if (r < 0) {
			snprintf(what, sizeof(what), "save step %" PRIu64 " staged", s);
			fatal_ckpt(what, r, ckpt_future_message(f));
		}
		stall = (double)(now_ns() - t0) / 1e6;
		sum_stall += stall;
		if (stall > max_stall)
			max_stall = stall;
		prev = f;
		prev_t0 = t0;
		prev_stall = stall;
	}
	sum_durable += finish_save(prev, &tm[o->steps % 2], prev_t0, o->steps, mib, prev_stall);
	ckpt_future_free(prev);
	printf("rank %" PRIu32 "/%" PRIu32 ": saved %" PRIu64
	       " steps of %.1f MiB in %.2f s: stall mean %.2f ms max %.2f ms, "
	       "durable mean %.2f ms\n",
	       o->rank, o->world, o->steps, mib, (double)(now_ns() - t_begin) / 1e9, sum_stall / (double)o->steps,
	       max_stall, sum_durable / (double)o->steps);
	fflush(stdout);
}

static void run_restore(const struct opts *o, ckpt_client *c, const struct layout *L, float *data)
{
	ckpt_future *f;
	const char *extra;
	char want[64];
	size_t elen = 0;
	uint64_t step, bytes;
	int64_t t0;
	double ms;
	int r;

	if (o->load_step)
		snprintf(want, sizeof(want), "load step %" PRIu64, o->load_step);
	else
		snprintf(want, sizeof(want), "load latest");
	memset(data, 0, L->total_bytes);
	t0 = now_ns();
	r = ckpt_load(c, o->load_step ? (int64_t)o->load_step : CKPT_LATEST, L->t, o->ntensors, &f);
	if (r < 0)
		fatal_ckpt(want, r, ckpt_errmsg());
	r = ckpt_future_wait(f, CKPT_LOADED, -1);
	if (r < 0)
		fatal_ckpt(want, r, ckpt_future_message(f));
	if (o->load_step && ckpt_future_step(f) != o->load_step)
		fatal("asked for step %" PRIu64 ", ckptd loaded step %" PRIu64, o->load_step, ckpt_future_step(f));
	ms = (double)(now_ns() - t0) / 1e6;
	step = ckpt_future_step(f);
	bytes = ckpt_future_bytes(f);
	if (!bytes)
		bytes = L->total_bytes;
	extra = ckpt_future_extra(f, &elen);
	snprintf(want, sizeof(want), "step=%" PRIu64, step);
	if (elen != strlen(want) || memcmp(extra, want, elen) != 0)
		fatal("restored step %" PRIu64 ": extra state is \"%.*s\", "
		      "want \"%s\"",
		      step, (int)(elen > 200 ? 200 : elen), extra ? extra : "", want);
	if (verify(L, data, step, o->ntensors) < 0)
		fatal("restored step %" PRIu64 ": data does not verify", step);
	if (!o->restore_only && step != o->steps)
		printf("note: latest complete step is %" PRIu64 ", not %" PRIu64 " (older steps of this job exist)\n",
		       step, o->steps);
	printf("restored step %" PRIu64 ": %.1f MiB in %.2f ms (%.2f GB/s), verified OK\n"
	       "source: %s\n",
	       step, (double)bytes / MIB, ms, (double)bytes / (ms * 1e6), ckpt_future_source(f));
	fflush(stdout);
	ckpt_future_free(f);
}

int main(int argc, char **argv)
{
	struct opts o;
	struct layout L = { 0 };
	ckpt_hello h;
	ckpt_client *c = NULL;
	ckpt_buffer *buf = NULL;
	float *data;
	char what[4200];
	int r;

	parse_args(argc, argv, &o);

	L.rows = o.size_mb * 256 / o.ntensors; /* MiB / (4 B * 1024 cols) */
	if (L.rows < o.world)
		L.rows = o.world;
	L.lo = o.rank * L.rows / o.world;
	L.hi = ((uint64_t)o.rank + 1) * L.rows / o.world;
	L.tensor_bytes = (L.hi - L.lo) * COLS * sizeof(float);
	L.total_bytes = L.tensor_bytes * o.ntensors;
	L.jobh = hash_str(o.job);

	h = (ckpt_hello){
		.job = o.job,
		.rank = o.rank,
		.world_size = o.world,
		.local_rank = o.local_rank,
		.attempt_id = o.attempt,
	};
	r = ckpt_connect(o.socket, &h, &c);
	if (r < 0) {
		snprintf(what, sizeof(what), "connect %s", o.socket);
		fatal_ckpt(what, r, ckpt_errmsg());
	}
	if (o.shm) {
		/* Like torch's share_memory_(): a /dev/shm file, not sealed,
		 * so the daemon stages it with pread. */
		char name[64];
		snprintf(name, sizeof(name), "/ckpt-example-%d", (int)getpid());
		int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0)
			fatal("shm_open %s: %s", name, strerror(errno));
		shm_unlink(name);
		if (ftruncate(fd, (off_t)L.total_bytes) != 0)
			fatal("ftruncate: %s", strerror(errno));
		data = mmap(NULL, L.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
		if (data == MAP_FAILED)
			fatal("mmap: %s", strerror(errno));
		r = ckpt_buffer_register_fd(c, fd, L.total_bytes, &buf);
		close(fd);
		if (r < 0)
			fatal_ckpt("register /dev/shm buffer", r, ckpt_errmsg());
	} else {
		r = ckpt_buffer_alloc(c, L.total_bytes, &buf);
		if (r < 0)
			fatal_ckpt("allocate buffer", r, ckpt_errmsg());
		data = ckpt_buffer_data(buf);
	}
	make_layout(&o, &L, buf);

	if (!o.restore_only) {
		run_saves(&o, c, &L, data);
		if (o.world > 1)
			wait_complete(c, o.job, o.steps);
	}
	run_restore(&o, c, &L, data);

	ckpt_buffer_free(buf);
	ckpt_close(c);
	free(L.t);
	free(L.names);
	return 0;
}
