/* ckptctl: the operator's command line for ckptd. Uses only the public
 * libckpt API (and json-c for --json). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "ckpt/ckpt.h"
#include "ckpt_version.h"
#include "ckptctl_cmd.h"
#include "ckptctl_util.h"

/* One row per command: its arguments, what it does, and its handler. */
struct command {
	const char *name, *args, *help;
	int min, max; /* positional arguments */
	int (*run)(ckpt_client *c, char **args, int nargs, const struct opts *o);
};
static int run_status(ckpt_client *c, char **a, int n, const struct opts *o);
static int run_ls(ckpt_client *c, char **a, int n, const struct opts *o);
static int run_show(ckpt_client *c, char **a, int n, const struct opts *o);
static int run_verify(ckpt_client *c, char **a, int n, const struct opts *o);
static int run_rm(ckpt_client *c, char **a, int n, const struct opts *o);
static int run_resolve(ckpt_client *c, char **a, int n, const struct opts *o);
static int run_gc(ckpt_client *c, char **a, int n, const struct opts *o);
static int run_metrics(ckpt_client *c, char **a, int n, const struct opts *o);
static int run_persist(ckpt_client *c, char **a, int n, const struct opts *o);
static int run_wait(ckpt_client *c, char **a, int n, const struct opts *o);

static const struct command commands[] = {
	{ "status", "", "sessions, pool, memory tier, in-flight saves, totals", 0, 0, run_status },
	{ "ls", "[JOB]", "steps of JOB (or every job): size, time saved, age; * marks the latest", 0, 1, run_ls },
	{ "show", "JOB STEP", "tensors, dtypes, shapes, boxes, ranks, bytes (STEP: a number, or latest)", 2, 2,
	  run_show },
	{ "verify", "JOB STEP",
	  "re-read every rank's shard from storage and check every crc32c (STEP: a number, or latest)", 2, 2,
	  run_verify },
	{ "rm", "JOB STEP", "remove the step from storage", 2, 2, run_rm },
	{ "persist", "JOB STEP",
	  "upload the copies of STEP that this node's ckptd holds in memory only (memory and replicated saves); "
	  "waits until they are durable (--replicas: also those it holds for peers, a lost node's ranks)",
	  2, 2, run_persist },
	{ "resolve", "JOB [STEP]", "the step a restore loads (default: latest), pinned; hand it to every rank", 1, 2,
	  run_resolve },
	{ "wait", "JOB STEP",
	  "wait until STEP is complete in storage (every rank's manifest), then pin it as resolve does; "
	  "one shared poll per node (--timeout SECONDS: give up after, 0: look once)",
	  2, 2, run_wait },
	{ "gc", "[JOB]", "apply the retention policy now (--dry-run: only say what would go)", 0, 1, run_gc },
	{ "metrics", "", "the Prometheus text exposition", 0, 0, run_metrics },
};
static const size_t ncommands = sizeof(commands) / sizeof(commands[0]);

static void usage(FILE *f)
{
	fprintf(f, "usage: ckptctl [OPTIONS] COMMAND [ARGS]\n\nCommands:\n");
	for (size_t i = 0; i < ncommands; i++) {
		char head[64];
		snprintf(head, sizeof(head), "%s%s%s", commands[i].name, commands[i].args[0] ? " " : "",
			 commands[i].args);
		fprintf(f, "  %-24s %s\n", head, commands[i].help);
	}
	fprintf(f,
		"\nOptions:\n"
		"  -s, --socket PATH        the daemon's socket (default $CKPTD_SOCKET, else %s)\n"
		"      --json               JSON output, for scripts\n"
		"      --dry-run            gc: say what would be removed, remove nothing\n"
		"      --replicas           persist: also the copies held for peers (a lost node's ranks)\n"
		"      --force              rm: also an attempt a save may still be writing (incomplete, young)\n"
		"  -j, --jobs N             verify: ranks checked at once, 1 to 64 (default 4)\n"
		"      --timeout SECONDS    wait: give up after this long (default: no limit; 0: look once)\n"
		"  -V, --version            print the version and the commit, exit\n"
		"  -h, --help               this text\n",
		CKPT_DEFAULT_SOCKET);
}

static int step_cmp(const void *pa, const void *pb)
{
	const ckpt_step_info *a = pa, *b = pb;
	int r = strcmp(a->job, b->job);

	if (r)
		return r;
	return a->step < b->step ? -1 : a->step > b->step;
}

/* Steps sorted by job then step; latest[i]: v[i] is its job's highest
 * complete step, the one a restore of "latest" takes. */
/* In storage: what "latest" can load (a step in memory only is not). */
static bool stored(const ckpt_step_info *v)
{
	return v->tier[0] == '\0' || strcmp(v->tier, "durable") == 0;
}

static void mark_latest(const ckpt_step_info *v, size_t n, bool *latest)
{
	for (size_t i = 0; i < n; i++) {
		latest[i] = false;
		if (!v[i].complete || !stored(&v[i]))
			continue;
		bool later = false;
		for (size_t j = i + 1; j < n && strcmp(v[j].job, v[i].job) == 0 && !later; j++)
			later = v[j].complete && stored(&v[j]);
		latest[i] = !later;
	}
}

/* What ckptctl ls --json's rows are made from. */
struct ls_rows {
	const ckpt_step_info *v;
	const bool *latest;
	int64_t now;
};

/* ckptctl ls --json: a step, marked latest or not, with when it was
 * saved and its age where known. */
static json_object *ls_row(const void *arg, size_t i)
{
	const struct ls_rows *ls = arg;
	const ckpt_step_info *v = &ls->v[i];
	char when[32];
	json_object *o = json_step(v);
	if (v->bytes_unlisted) { /* layout spread: null; show has them */
		json_object_object_del(o, "bytes");
		if (json_object_object_add(o, "bytes", NULL) != 0)
			die_oom();
	}
	json_put(o, "latest", json_object_new_boolean(ls->latest[i]));
	if (v->saved_unix_ns > 0) {
		json_put(o, "saved", json_object_new_string(saved_time(v->saved_unix_ns, when, sizeof(when))));
		json_put(o, "age_s",
			 json_object_new_int64(ls->now > v->saved_unix_ns ? (ls->now - v->saved_unix_ns) / 1000000000
									  : 0));
	}
	return o;
}

/* ckptctl ls: the steps as a table, the job column as wide as the
 * longest name. */
static void ls_text(const ckpt_step_info *v, size_t n, const bool *latest, int64_t now)
{
	size_t jw = 3;
	char sz[32], ranks[32], when[32], age[32];
	for (size_t i = 0; i < n; i++)
		if (strlen(v[i].job) > jw)
			jw = strlen(v[i].job);
	printf("%-*s %13s %-8s %-10s %7s %10s  %-19s %9s  %-10s %s\n", (int)jw, "JOB", "STEP", "COMPLETE", "TIER",
	       "RANKS", "SIZE", "SAVED (UTC)", "AGE", "ATTEMPT", "WHERE");
	for (size_t i = 0; i < n; i++) {
		char step[32];
		snprintf(step, sizeof(step), "%" PRIu64 "%s", v[i].step, latest[i] ? "*" : " ");
		snprintf(ranks, sizeof(ranks), "%" PRIu32 "/%" PRIu32, v[i].ranks_present, v[i].world_size);
		if (v[i].saved_unix_ns > 0)
			human_duration(now > v[i].saved_unix_ns ? (uint64_t)(now - v[i].saved_unix_ns) : 0, age,
				       sizeof(age));
		else
			snprintf(age, sizeof(age), "-");
		printf("%-*s %13s %-8s %-10s %7s %10s  %-19s %9s  %-10s %s\n", (int)jw, v[i].job, step,
		       v[i].complete ? "yes" : "no", v[i].tier[0] ? v[i].tier : "durable", ranks,
		       v[i].bytes_unlisted ? "-" : human_bytes(v[i].bytes, sz, sizeof(sz)),
		       saved_time(v[i].saved_unix_ns, when, sizeof(when)), age, v[i].attempt_id,
		       v[i].where[0] ? v[i].where : "storage");
	}
	if (n > 0)
		printf("* latest complete step of its job in storage (what a restore of \"latest\" loads)\n"
		       "  steps in memory only are this node's daemon's; RANKS counts the ranks it holds\n");
}

static int cmd_ls(ckpt_client *c, const char *job, int json)
{
	ckpt_step_info *v = NULL;
	size_t n = 0;
	char what[300];
	int r = ckpt_list(c, job, &v, &n);
	if (r < 0) {
		snprintf(what, sizeof(what), "ls%s%s", job ? " " : "", job ? job : "");
		die(what, r);
	}
	/* A job with no steps is most often a mistyped name: a header alone
	 * and exit 0 would read as "nothing saved yet". --json still prints
	 * its (empty) array, so that what reads stdout parses. */
	if (job && n == 0) {
		if (json)
			puts("[]");
		fprintf(stderr, "ckptctl: job '%s' has no steps (ckptctl ls lists every job)\n", job);
		free(v);
		return 1;
	}
	if (n > 1)
		qsort(v, n, sizeof(*v), step_cmp);
	bool *latest = calloc(n ? n : 1, sizeof(*latest));
	if (latest == NULL)
		die_oom();
	mark_latest(v, n, latest);
	int64_t now = now_unix_ns();
	if (json) {
		json_object *a = json_rows(n, ls_row, &(struct ls_rows){ .v = v, .latest = latest, .now = now });
		json_print(a);
		json_object_put(a);
	} else {
		ls_text(v, n, latest, now);
	}
	free(latest);
	free(v);
	return 0;
}

static const char *dtype_name(int d)
{
	static const char *const n[] = { "?",   "f32", "f16", "bf16", "f64",    "i8",    "u8",
					 "i16", "i32", "i64", "bool", "f8e4m3", "f8e5m2" };
	return d >= 0 && d < (int)(sizeof(n) / sizeof(n[0])) ? n[d] : "?";
}

static json_object *json_u64_array(const uint64_t *v, uint32_t n)
{
	json_object *a = json_object_new_array();
	if (!a)
		die_oom();
	for (uint32_t i = 0; i < n; i++)
		if (json_object_array_add(a, json_object_new_uint64(v[i])) != 0)
			die_oom();
	return a;
}

static void dims(char *buf, size_t len, const uint64_t *v, uint32_t n)
{
	size_t off = 0;
	off += (size_t)snprintf(buf + off, len - off, "[");
	for (uint32_t i = 0; i < n && off < len; i++)
		off += (size_t)snprintf(buf + off, len - off, "%s%" PRIu64, i ? "," : "", v[i]);
	if (off < len)
		snprintf(buf + off, len - off, "]");
}

/* Steps fit an int64_t (the API's CKPT_LATEST is -1). */
static bool step_number(const char *s, uint64_t *out)
{
	char *end = NULL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (!*s || *end || s[0] == '-' || errno || v > INT64_MAX)
		return false;
	*out = v;
	return true;
}

static uint64_t parse_step(const char *s)
{
	uint64_t v;
	if (!step_number(s, &v)) {
		fprintf(stderr, "ckptctl: '%s' is not a step number\n", s);
		exit(2);
	}
	return v;
}

/* A STEP that may be "latest" (show, verify, resolve): CKPT_LATEST, else
 * the number. rm and persist take numbers only: "latest" moves while a
 * job runs, and removing whatever it is now is no operator's intent. */
static int64_t parse_step_or_latest(const char *s)
{
	uint64_t v;
	if (strcmp(s, "latest") == 0)
		return CKPT_LATEST;
	if (!step_number(s, &v)) {
		fprintf(stderr, "ckptctl: '%s' is not a step number (nor 'latest')\n", s);
		exit(2);
	}
	return (int64_t)v;
}

/* The step show and verify read: a number as given, or for "latest" the
 * one a restore of latest loads, decided as ckptctl resolve decides it
 * (ckpt_resolve: the highest complete step in storage). The choice goes
 * to stderr, so that stdout (--json too) has the form a number gives. */
static uint64_t step_of(ckpt_client *c, const char *cmd, const char *job, const char *arg)
{
	int64_t step = parse_step_or_latest(arg);
	if (step != CKPT_LATEST)
		return (uint64_t)step;
	ckpt_step_info info;
	int r = ckpt_resolve(c, job, CKPT_LATEST, &info);
	if (r < 0) {
		char what[400];
		snprintf(what, sizeof(what), "%s %s latest", cmd, job);
		die(what, r);
	}
	fprintf(stderr, "ckptctl: %s latest: step %" PRIu64 " (the latest complete step in storage)\n", job, info.step);
	return info.step;
}

/* ckptctl show --json: a tensor (of the ckpt_tensor_info array tensors). */
static json_object *tensor_row(const void *tensors, size_t i)
{
	const ckpt_tensor_info *t = &((const ckpt_tensor_info *)tensors)[i];
	json_object *e = json_object_new_object();
	if (!e)
		die_oom();
	json_put(e, "rank", json_object_new_uint64(t->rank));
	json_put(e, "name", json_object_new_string(t->name));
	json_put(e, "dtype", json_object_new_string(dtype_name(t->dtype)));
	json_put(e, "global_shape", json_u64_array(t->global_shape, t->ndim));
	json_put(e, "box_offsets", json_u64_array(t->box_offsets, t->ndim));
	json_put(e, "box_lengths", json_u64_array(t->box_lengths, t->ndim));
	json_put(e, "shard_offset", json_object_new_uint64(t->shard_offset));
	json_put(e, "nbytes", json_object_new_uint64(t->nbytes));
	json_put(e, "crc32c", json_object_new_uint64(t->crc32c));
	return e;
}

static int cmd_show(ckpt_client *c, const char *job, uint64_t step, int json)
{
	ckpt_step_detail *d = NULL;
	char what[400], sz[32];
	int r = ckpt_show(c, job, step, &d);
	if (r < 0) {
		snprintf(what, sizeof(what), "show %s %" PRIu64, job, step);
		die(what, r);
	}
	if (json) {
		json_object *o = json_step(&d->info);
		json_put(o, "tensors", json_rows(d->ntensors, tensor_row, d->tensors));
		json_print(o);
		json_object_put(o);
	} else {
		printf("%s step %" PRIu64 ": %s, %" PRIu32 "/%" PRIu32 " ranks, %s, attempt %s\n", d->info.job,
		       d->info.step, d->info.complete ? "complete" : "INCOMPLETE", d->info.ranks_present,
		       d->info.world_size, human_bytes(d->info.bytes, sz, sizeof(sz)), d->info.attempt_id);
		/* The name last, the other columns as wide as their widest
		 * entry: names run long (Lightning's callback state keys hold
		 * a dict's repr), and a name column as wide as the longest
		 * would pad every row past the terminal's width. */
		char sh[96], of[96], ln[96];
		int sw = (int)strlen("SHAPE"), ow = (int)strlen("OFFSETS"), lw = (int)strlen("LENGTHS");
		for (size_t i = 0; i < d->ntensors; i++) {
			const ckpt_tensor_info *t = &d->tensors[i];
			dims(sh, sizeof(sh), t->global_shape, t->ndim);
			dims(of, sizeof(of), t->box_offsets, t->ndim);
			dims(ln, sizeof(ln), t->box_lengths, t->ndim);
			sw = (int)strlen(sh) > sw ? (int)strlen(sh) : sw;
			ow = (int)strlen(of) > ow ? (int)strlen(of) : ow;
			lw = (int)strlen(ln) > lw ? (int)strlen(ln) : lw;
		}
		printf("%5s  %-6s %-*s %-*s %-*s %10s  %s\n", "RANK", "DTYPE", sw, "SHAPE", ow, "OFFSETS", lw,
		       "LENGTHS", "BYTES", "TENSOR");
		for (size_t i = 0; i < d->ntensors; i++) {
			const ckpt_tensor_info *t = &d->tensors[i];
			dims(sh, sizeof(sh), t->global_shape, t->ndim);
			dims(of, sizeof(of), t->box_offsets, t->ndim);
			dims(ln, sizeof(ln), t->box_lengths, t->ndim);
			printf("%5" PRIu32 "  %-6s %-*s %-*s %-*s %10s  %s\n", t->rank, dtype_name(t->dtype), sw, sh,
			       ow, of, lw, ln, human_bytes(t->nbytes, sz, sizeof(sz)), t->name);
		}
	}
	ckpt_step_detail_free(d);
	return 0;
}

static int cmd_rm(ckpt_client *c, const char *job, uint64_t step, int force, int json)
{
	char what[400];
	int r = ckpt_delete_flags(c, job, step, force ? CKPT_DELETE_FORCE : 0);
	if (r < 0) {
		snprintf(what, sizeof(what), "rm %s %" PRIu64, job, step);
		die(what, r);
	}
	if (json) {
		json_object *o = json_object_new_object();
		if (!o)
			die_oom();
		json_put(o, "job", json_object_new_string(job));
		json_put(o, "step", json_object_new_uint64(step));
		json_put(o, "removed", json_object_new_boolean(1));
		json_print(o);
		json_object_put(o);
	} else {
		printf("removed %s step %" PRIu64 "\n", job, step);
	}
	return 0;
}

static int cmd_persist(ckpt_client *c, const char *job, uint64_t step, int replicas, int json)
{
	char what[400];
	snprintf(what, sizeof(what), "persist %s %" PRIu64, job, step);
	ckpt_future *f = NULL;
	int r = ckpt_persist_ex(c, job, step, replicas ? CKPT_PERSIST_REPLICAS : 0, &f);
	if (r < 0)
		die(what, r);
	r = ckpt_future_wait(f, CKPT_DURABLE, -1);
	if (r < 0) {
		fprintf(stderr, "ckptctl: %s: %s: %s\n", what, ckpt_strerror(r), ckpt_future_message(f));
		ckpt_future_free(f);
		return 1;
	}
	uint64_t bytes = ckpt_future_bytes(f);
	ckpt_future_free(f);
	if (json) {
		json_object *o = json_object_new_object();
		if (!o)
			die_oom();
		json_put(o, "job", json_object_new_string(job));
		json_put(o, "step", json_object_new_uint64(step));
		json_put(o, "durable", json_object_new_boolean(1));
		json_put(o, "bytes", json_object_new_uint64(bytes));
		json_print(o);
		json_object_put(o);
	} else {
		char b[32];
		printf("%s step %" PRIu64 ": durable (%s held here)\n", job, step, human_bytes(bytes, b, sizeof(b)));
	}
	return 0;
}

/* ckpt_resolve: decide the step once and pin it, so that every rank
 * given the printed step loads the same bytes. */
/* A step resolve or wait pinned: its JSON object, or a line ("JOB step N
 * attempt A"; wait's says it is complete, and its ranks). */
static void print_step(const ckpt_step_info *info, int json, bool complete)
{
	if (json) {
		json_object *o = json_step(info);
		json_print(o);
		json_object_put(o);
	} else if (complete) {
		printf("%s step %" PRIu64 " complete: %u ranks, attempt %s\n", info->job, info->step, info->world_size,
		       info->attempt_id);
	} else {
		printf("%s step %" PRIu64 " attempt %s\n", info->job, info->step, info->attempt_id);
	}
}

static int cmd_resolve(ckpt_client *c, const char *job, const char *step_arg, int json)
{
	char what[400];
	ckpt_step_info info;
	int64_t step = step_arg ? parse_step_or_latest(step_arg) : CKPT_LATEST;
	int r = ckpt_resolve(c, job, step, &info);
	if (r < 0) {
		snprintf(what, sizeof(what), "resolve %s %s", job, step_arg ? step_arg : "latest");
		die(what, r);
	}
	print_step(&info, json, false);
	return 0;
}

static int cmd_wait(ckpt_client *c, const char *job, uint64_t step, int64_t timeout_ms, int json)
{
	char what[400];
	ckpt_step_info info;
	int r = ckpt_wait_complete(c, job, step, timeout_ms, &info);
	if (r < 0) {
		snprintf(what, sizeof(what), "wait %s %" PRIu64, job, step);
		die(what, r);
	}
	print_step(&info, json, true);
	return 0;
}

/* ckptctl gc --json: a step removed (of the ckpt_gc_entry array v), and
 * why. */
static json_object *gc_row(const void *v, size_t i)
{
	const ckpt_gc_entry *g = &((const ckpt_gc_entry *)v)[i];
	json_object *e = json_step(&g->info);
	json_put(e, "reason", json_object_new_string(g->reason));
	return e;
}

static int cmd_gc(ckpt_client *c, const char *job, int dry_run, int json)
{
	ckpt_gc_entry *v = NULL;
	size_t n = 0;
	char sz[32];
	int r = ckpt_gc(c, job, dry_run, &v, &n);
	if (r < 0)
		die("gc", r);
	if (json) {
		json_object *o = json_object_new_object();
		if (!o)
			die_oom();
		json_put(o, "dry_run", json_object_new_boolean(dry_run));
		json_put(o, "removed", json_rows(n, gc_row, v));
		json_print(o);
		json_object_put(o);
	} else {
		for (size_t i = 0; i < n; i++)
			printf("%s %s step %" PRIu64 " (%s): %s\n", dry_run ? "would remove" : "removed", v[i].info.job,
			       v[i].info.step, human_bytes(v[i].info.bytes, sz, sizeof(sz)), v[i].reason);
		printf("%zu step(s) %s\n", n, dry_run ? "would be removed" : "removed");
	}
	free(v);
	return 0;
}

static int cmd_metrics(ckpt_client *c)
{
	char *text = NULL;
	int r = ckpt_metrics(c, &text);
	if (r < 0)
		die("metrics", r);
	fputs(text, stdout);
	free(text);
	return 0;
}

static int run_status(ckpt_client *c, char **a, int n, const struct opts *o)
{
	(void)a, (void)n;
	return cmd_status(c, o->json);
}
static int run_ls(ckpt_client *c, char **a, int n, const struct opts *o)
{
	return cmd_ls(c, n ? a[0] : NULL, o->json);
}
static int run_show(ckpt_client *c, char **a, int n, const struct opts *o)
{
	(void)n;
	return cmd_show(c, a[0], step_of(c, "show", a[0], a[1]), o->json);
}
static int run_verify(ckpt_client *c, char **a, int n, const struct opts *o)
{
	(void)n;
	return cmd_verify(c, a[0], step_of(c, "verify", a[0], a[1]), o);
}
static int run_rm(ckpt_client *c, char **a, int n, const struct opts *o)
{
	(void)n;
	return cmd_rm(c, a[0], parse_step(a[1]), o->force, o->json);
}
static int run_persist(ckpt_client *c, char **a, int n, const struct opts *o)
{
	(void)n;
	return cmd_persist(c, a[0], parse_step(a[1]), o->replicas, o->json);
}
static int run_resolve(ckpt_client *c, char **a, int n, const struct opts *o)
{
	return cmd_resolve(c, a[0], n > 1 ? a[1] : NULL, o->json);
}
static int run_wait(ckpt_client *c, char **a, int n, const struct opts *o)
{
	(void)n;
	return cmd_wait(c, a[0], parse_step(a[1]), o->timeout_ms, o->json);
}
static int run_gc(ckpt_client *c, char **a, int n, const struct opts *o)
{
	return cmd_gc(c, n ? a[0] : NULL, o->dry_run, o->json);
}
static int run_metrics(ckpt_client *c, char **a, int n, const struct opts *o)
{
	(void)a, (void)n, (void)o;
	return cmd_metrics(c);
}

/* The options, before or after the command (GNU getopt permutes): -1 to
 * go on, else the exit status (--help, --version, a usage error). */
static int parse_opts(int argc, char **argv, struct opts *o)
{
	/* One option a line. */
	/* clang-format off */
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'J' },
		{ "dry-run", no_argument, NULL, 'n' },
		{ "force", no_argument, NULL, 'F' },
		{ "replicas", no_argument, NULL, 'R' },
		{ "jobs", required_argument, NULL, 'j' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ "timeout", required_argument, NULL, 'T' },
		{ NULL, 0, NULL, 0 },
	};
	/* clang-format on */
	int ch;
	while ((ch = getopt_long(argc, argv, "s:j:Vh", longopts, NULL)) != -1) {
		switch (ch) {
		case 's': o->sock = optarg; break;
		case 'J': o->json = 1; break;
		case 'n': o->dry_run = 1; break;
		case 'F': o->force = 1; break;
		case 'R': o->replicas = 1; break;
		case 'j': {
			char *end;
			long v = strtol(optarg, &end, 10);
			if (*end || v < 1 || v > 64) { /* a session each, within max_sessions */
				fprintf(stderr, "ckptctl: --jobs wants 1 to 64, not '%s'\n", optarg);
				return 2;
			}
			o->jobs = (int)v;
			break;
		}
		case 'T': {
			char *end;
			double v = strtod(optarg, &end);
			if (*end || end == optarg || !(v >= 0 && v <= 4e6)) { /* NaN fails too */
				fprintf(stderr, "ckptctl: --timeout wants seconds from 0 to 4000000, not '%s'\n",
					optarg);
				return 2;
			}
			o->timeout_ms = (int64_t)(v * 1000);
			break;
		}
		case 'V': printf("ckptctl %s (commit %s)\n", CKPT_VERSION, CKPT_COMMIT); return 0;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	return -1;
}

int main(int argc, char **argv)
{
	struct opts o = { .jobs = 4, .timeout_ms = -1, .sock = getenv("CKPTD_SOCKET") };
	if (!o.sock || !*o.sock)
		o.sock = CKPT_DEFAULT_SOCKET;
	int st = parse_opts(argc, argv, &o);
	if (st >= 0)
		return st;
	if (optind >= argc) {
		usage(stderr);
		return 2;
	}
	const char *name = argv[optind];
	const struct command *cmd = NULL;
	for (size_t i = 0; i < ncommands && !cmd; i++)
		if (!strcmp(commands[i].name, name))
			cmd = &commands[i];
	if (!cmd) {
		fprintf(stderr, "ckptctl: unknown command %s\n", name);
		usage(stderr);
		return 2;
	}
	int nargs = argc - optind - 1;
	if (nargs < cmd->min || nargs > cmd->max || (o.dry_run && cmd->run != run_gc) ||
	    (o.timeout_ms >= 0 && cmd->run != run_wait)) {
		fprintf(stderr, "ckptctl: usage: ckptctl %s %s\n", cmd->name, cmd->args);
		return 2;
	}
	ckpt_client *c = NULL;
	int r = ckpt_connect(o.sock, NULL, &c);
	if (r < 0) {
		char what[4200];
		snprintf(what, sizeof(what), "connect %s", o.sock);
		die(what, r);
	}
	r = cmd->run(c, argv + optind + 1, nargs, &o);
	ckpt_close(c);
	if (fflush(stdout) != 0) {
		perror("ckptctl: stdout");
		return 1;
	}
	return r ? 1 : 0;
}
