/* ckptctl: the operator's command line for ckptd. Uses only the public
 * libckpt API (and json-c for --json). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "ckpt/ckpt.h"
#include "ckpt_version.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: ckptctl [--version] [--socket PATH] [--json] COMMAND\n"
		"  status              sessions, pool, memory tier, in-flight saves, totals\n"
		"  ls [JOB]            checkpoint steps, of JOB or of every job\n"
		"  show JOB STEP       tensors, dtypes, shapes, boxes, ranks, bytes\n"
		"  verify JOB STEP     re-read the step and check every crc32c\n"
		"  rm JOB STEP         remove the step from storage\n"
		"  resolve JOB [STEP]  the step a restore loads (default: latest), pinned;\n"
		"                      hand it to every rank (ckpt-example --step)\n"
		"  gc [--dry-run] [JOB]  apply the retention policy now\n"
		"  metrics             Prometheus text exposition\n"
		"\n"
		"The socket defaults to $CKPTD_SOCKET, else %s.\n",
		CKPT_DEFAULT_SOCKET);
}

static void die(const char *what, int err)
{
	const char *m = ckpt_errmsg();

	if (m && *m)
		fprintf(stderr, "ckptctl: %s: %s (%s)\n", what, ckpt_strerror(err), m);
	else
		fprintf(stderr, "ckptctl: %s: %s\n", what, ckpt_strerror(err));
	exit(1);
}

static void die_oom(void)
{
	fprintf(stderr, "ckptctl: out of memory\n");
	exit(1);
}

/* "1.5 GiB" and friends. */
static const char *human_bytes(uint64_t n, char *buf, size_t len)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double v = (double)n;
	size_t u = 0;

	while (v >= 1024.0 && u + 1 < sizeof(unit) / sizeof(unit[0])) {
		v /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%" PRIu64 " B", n);
	else
		snprintf(buf, len, "%.1f %s", v, unit[u]);
	return buf;
}

static const char *human_duration(uint64_t ns, char *buf, size_t len)
{
	uint64_t s = ns / 1000000000u;

	if (s >= 86400)
		snprintf(buf, len, "%" PRIu64 "d%02" PRIu64 "h%02" PRIu64 "m", s / 86400, s / 3600 % 24, s / 60 % 60);
	else if (s >= 3600)
		snprintf(buf, len, "%" PRIu64 "h%02" PRIu64 "m%02" PRIu64 "s", s / 3600, s / 60 % 60, s % 60);
	else if (s >= 60)
		snprintf(buf, len, "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
	else
		snprintf(buf, len, "%" PRIu64 "s", s);
	return buf;
}

static void json_put(json_object *o, const char *key, json_object *v)
{
	if (!v || json_object_object_add(o, key, v) != 0)
		die_oom();
}

static void json_print(json_object *o)
{
	const char *s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);

	if (!s)
		die_oom();
	puts(s);
}

static int cmd_status(ckpt_client *c, int json)
{
	ckpt_status_info st;
	char a[32], b[32], d[32];
	int r;

	r = ckpt_status(c, &st);
	if (r < 0)
		die("status", r);
	if (json) {
		json_object *o = json_object_new_object();

		if (!o)
			die_oom();
		json_put(o, "sessions", json_object_new_uint64(st.sessions));
		json_put(o, "pool_bytes", json_object_new_uint64(st.pool_bytes));
		json_put(o, "pool_used_bytes", json_object_new_uint64(st.pool_used_bytes));
		json_put(o, "chunk_bytes", json_object_new_uint64(st.chunk_bytes));
		json_put(o, "inflight_saves", json_object_new_uint64(st.inflight_saves));
		json_put(o, "waiting_saves", json_object_new_uint64(st.waiting_saves));
		json_put(o, "saves_total", json_object_new_uint64(st.saves_total));
		json_put(o, "saves_failed", json_object_new_uint64(st.saves_failed));
		json_put(o, "bytes_staged", json_object_new_uint64(st.bytes_staged));
		json_put(o, "bytes_durable", json_object_new_uint64(st.bytes_durable));
		json_put(o, "bytes_restored", json_object_new_uint64(st.bytes_restored));
		json_put(o, "pool_held_bytes", json_object_new_uint64(st.pool_held_bytes));
		json_put(o, "saves_superseded", json_object_new_uint64(st.saves_superseded));
		json_put(o, "saves_skipped", json_object_new_uint64(st.saves_skipped));
		json_put(o, "bytes_restored_memory", json_object_new_uint64(st.bytes_restored_memory));
		json_put(o, "restores_from_memory", json_object_new_uint64(st.restores_from_memory));
		json_put(o, "restores_from_storage", json_object_new_uint64(st.restores_from_storage));
		json_put(o, "reclaimed_bytes", json_object_new_uint64(st.reclaimed_bytes));
		json_put(o, "uptime_ns", json_object_new_uint64(st.uptime_ns));
		json_put(o, "cpu_ns", json_object_new_uint64(st.cpu_ns));
		json_put(o, "peak_rss_bytes", json_object_new_uint64(st.peak_rss_bytes));
		json_put(o, "storage", json_object_new_string(st.storage));
		json_put(o, "cuda", json_object_new_string(st.cuda));
		json_object *held = json_object_new_array();
		if (!held)
			die_oom();
		for (uint32_t i = 0; i < st.nheld && i < CKPT_STATUS_MAX_HELD; i++) {
			const ckpt_held_info *h = &st.held[i];
			json_object *e = json_object_new_object();
			if (!e)
				die_oom();
			json_put(e, "job", json_object_new_string(h->job));
			json_put(e, "rank", json_object_new_uint64(h->rank));
			json_put(e, "world_size", json_object_new_uint64(h->world_size));
			json_put(e, "step", json_object_new_uint64(h->step));
			json_put(e, "bytes", json_object_new_uint64(h->bytes));
			json_put(e, "attempt_id", json_object_new_string(h->attempt_id));
			if (json_object_array_add(held, e) != 0)
				die_oom();
		}
		json_put(o, "memory_tier", held);
		json_object *rec = json_object_new_object();
		json_object *items = json_object_new_array();
		if (!rec || !items)
			die_oom();
		json_put(rec, "files", json_object_new_uint64(st.recovered_files));
		for (uint32_t i = 0; i < st.nrecovered; i++)
			if (json_object_array_add(items, json_object_new_string(st.recovered[i])) != 0)
				die_oom();
		json_put(rec, "removed", items);
		json_put(o, "recovered", rec);
		json_print(o);
		json_object_put(o);
		return 0;
	}
	printf("%-16s %" PRIu32 "\n", "sessions", st.sessions);
	printf("%-16s %s used of %s", "pool", human_bytes(st.pool_used_bytes, a, sizeof(a)),
	       human_bytes(st.pool_bytes, b, sizeof(b)));
	if (st.pool_bytes)
		printf(" (%.0f%%)", 100.0 * (double)st.pool_used_bytes / (double)st.pool_bytes);
	printf(", chunks of %s\n", human_bytes(st.chunk_bytes, d, sizeof(d)));
	printf("%-16s %" PRIu32 " in flight, %" PRIu32 " waiting for pool\n", "saves now", st.inflight_saves,
	       st.waiting_saves);
	printf("%-16s %" PRIu64 " total, %" PRIu64 " failed\n", "saves", st.saves_total, st.saves_failed);
	printf("%-16s %s staged, %s durable, %s restored\n", "bytes", human_bytes(st.bytes_staged, a, sizeof(a)),
	       human_bytes(st.bytes_durable, b, sizeof(b)), human_bytes(st.bytes_restored, d, sizeof(d)));
	printf("%-16s %" PRIu64 " superseded, %" PRIu64 " skipped\n", "", st.saves_superseded, st.saves_skipped);
	printf("%-16s %" PRIu64 " from memory (%s), %" PRIu64 " from storage\n", "restores", st.restores_from_memory,
	       human_bytes(st.bytes_restored_memory, a, sizeof(a)), st.restores_from_storage);
	printf("%-16s %s held, %s reclaimed\n", "memory tier", human_bytes(st.pool_held_bytes, a, sizeof(a)),
	       human_bytes(st.reclaimed_bytes, b, sizeof(b)));
	for (uint32_t i = 0; i < st.nheld && i < CKPT_STATUS_MAX_HELD; i++)
		printf("%-16s %s rank %" PRIu32 "/%" PRIu32 " step %" PRIu64 " (%s)\n", "", st.held[i].job,
		       st.held[i].rank, st.held[i].world_size, st.held[i].step,
		       human_bytes(st.held[i].bytes, a, sizeof(a)));
	if (st.recovered_files) {
		printf("%-16s %" PRIu32 " file(s) left by a crashed run removed at start\n", "recovered",
		       st.recovered_files);
		for (uint32_t i = 0; i < st.nrecovered; i++)
			printf("%-16s %s\n", "", st.recovered[i]);
	}
	printf("%-16s %s\n", "storage", st.storage[0] ? st.storage : "-");
	printf("%-16s %s\n", "cuda", st.cuda[0] ? st.cuda : "-");
	printf("%-16s %s\n", "uptime", human_duration(st.uptime_ns, a, sizeof(a)));
	return 0;
}

static int step_cmp(const void *pa, const void *pb)
{
	const ckpt_step_info *a = pa, *b = pb;
	int r = strcmp(a->job, b->job);

	if (r)
		return r;
	return a->step < b->step ? -1 : a->step > b->step;
}

static int cmd_ls(ckpt_client *c, const char *job, int json)
{
	ckpt_step_info *v = NULL;
	size_t n = 0, jw = 3;
	char what[300], sz[32], ranks[32];
	int r;

	r = ckpt_list(c, job, &v, &n);
	if (r < 0) {
		snprintf(what, sizeof(what), "ls%s%s", job ? " " : "", job ? job : "");
		die(what, r);
	}
	if (n > 1)
		qsort(v, n, sizeof(*v), step_cmp);
	if (json) {
		json_object *a = json_object_new_array();

		if (!a)
			die_oom();
		for (size_t i = 0; i < n; i++) {
			json_object *o = json_object_new_object();

			if (!o)
				die_oom();
			json_put(o, "job", json_object_new_string(v[i].job));
			json_put(o, "step", json_object_new_uint64(v[i].step));
			json_put(o, "complete", json_object_new_boolean(v[i].complete));
			if (v[i].bytes_unlisted) { /* layout spread: null; show has them */
				if (json_object_object_add(o, "bytes", NULL) != 0)
					die_oom();
			} else {
				json_put(o, "bytes", json_object_new_uint64(v[i].bytes));
			}
			json_put(o, "ranks_present", json_object_new_uint64(v[i].ranks_present));
			json_put(o, "world_size", json_object_new_uint64(v[i].world_size));
			json_put(o, "attempt_id", json_object_new_string(v[i].attempt_id));
			if (json_object_array_add(a, o) != 0)
				die_oom();
		}
		json_print(a);
		json_object_put(a);
		free(v);
		return 0;
	}
	for (size_t i = 0; i < n; i++)
		if (strlen(v[i].job) > jw)
			jw = strlen(v[i].job);
	printf("%-*s %12s %-8s %7s %10s  %s\n", (int)jw, "JOB", "STEP", "COMPLETE", "RANKS", "SIZE", "ATTEMPT");
	for (size_t i = 0; i < n; i++) {
		snprintf(ranks, sizeof(ranks), "%" PRIu32 "/%" PRIu32, v[i].ranks_present, v[i].world_size);
		printf("%-*s %12" PRIu64 " %-8s %7s %10s  %s\n", (int)jw, v[i].job, v[i].step,
		       v[i].complete ? "yes" : "no", ranks,
		       v[i].bytes_unlisted ? "-" : human_bytes(v[i].bytes, sz, sizeof(sz)), v[i].attempt_id);
	}
	free(v);
	return 0;
}

static const char *dtype_name(int d)
{
	static const char *const n[] = { "?",   "f32", "f16", "bf16", "f64",    "i8",    "u8",
					 "i16", "i32", "i64", "bool", "f8e4m3", "f8e5m2" };
	return d >= 0 && d < (int)(sizeof(n) / sizeof(n[0])) ? n[d] : "?";
}

static json_object *json_step(const ckpt_step_info *v)
{
	json_object *o = json_object_new_object();
	if (!o)
		die_oom();
	json_put(o, "job", json_object_new_string(v->job));
	json_put(o, "step", json_object_new_uint64(v->step));
	json_put(o, "complete", json_object_new_boolean(v->complete));
	json_put(o, "bytes", json_object_new_uint64(v->bytes));
	json_put(o, "ranks_present", json_object_new_uint64(v->ranks_present));
	json_put(o, "world_size", json_object_new_uint64(v->world_size));
	json_put(o, "attempt_id", json_object_new_string(v->attempt_id));
	return o;
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

static uint64_t parse_step(const char *s)
{
	char *end = NULL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	/* Steps fit an int64_t (the API's CKPT_LATEST is -1). */
	if (!*s || *end || s[0] == '-' || errno || v > INT64_MAX) {
		fprintf(stderr, "ckptctl: '%s' is not a step number\n", s);
		exit(2);
	}
	return v;
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
		json_object *o = json_step(&d->info), *a = json_object_new_array();
		if (!a)
			die_oom();
		for (size_t i = 0; i < d->ntensors; i++) {
			const ckpt_tensor_info *t = &d->tensors[i];
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
			if (json_object_array_add(a, e) != 0)
				die_oom();
		}
		json_put(o, "tensors", a);
		json_print(o);
		json_object_put(o);
	} else {
		printf("%s step %" PRIu64 ": %s, %" PRIu32 "/%" PRIu32 " ranks, %s, attempt %s\n", d->info.job,
		       d->info.step, d->info.complete ? "complete" : "INCOMPLETE", d->info.ranks_present,
		       d->info.world_size, human_bytes(d->info.bytes, sz, sizeof(sz)), d->info.attempt_id);
		printf("%5s  %-32s %-6s %-16s %-16s %-16s %10s\n", "RANK", "TENSOR", "DTYPE", "SHAPE", "OFFSETS",
		       "LENGTHS", "BYTES");
		for (size_t i = 0; i < d->ntensors; i++) {
			const ckpt_tensor_info *t = &d->tensors[i];
			char sh[96], of[96], ln[96];
			dims(sh, sizeof(sh), t->global_shape, t->ndim);
			dims(of, sizeof(of), t->box_offsets, t->ndim);
			dims(ln, sizeof(ln), t->box_lengths, t->ndim);
			printf("%5" PRIu32 "  %-32s %-6s %-16s %-16s %-16s %10s\n", t->rank, t->name,
			       dtype_name(t->dtype), sh, of, ln, human_bytes(t->nbytes, sz, sizeof(sz)));
		}
	}
	ckpt_step_detail_free(d);
	return 0;
}

static int cmd_verify(ckpt_client *c, const char *job, uint64_t step, int json)
{
	ckpt_verify_result *v = NULL;
	char what[400], sz[32];
	int r = ckpt_verify(c, job, step, &v);
	if (r < 0) {
		snprintf(what, sizeof(what), "verify %s %" PRIu64, job, step);
		die(what, r);
	}
	int ok = v->ok;
	if (json) {
		json_object *o = json_step(&v->info), *a = json_object_new_array();
		if (!a)
			die_oom();
		json_put(o, "ok", json_object_new_boolean(v->ok));
		json_put(o, "bytes_checked", json_object_new_uint64(v->bytes_checked));
		for (size_t i = 0; i < v->nproblems; i++)
			if (json_object_array_add(a, json_object_new_string(v->problems[i])) != 0)
				die_oom();
		json_put(o, "problems", a);
		json_print(o);
		json_object_put(o);
	} else {
		for (size_t i = 0; i < v->nproblems; i++)
			printf("%s\n", v->problems[i]);
		printf("%s step %" PRIu64 ": %s (%s checked)\n", job, step, ok ? "OK" : "FAILED",
		       human_bytes(v->bytes_checked, sz, sizeof(sz)));
	}
	ckpt_verify_result_free(v);
	return ok ? 0 : 1;
}

static int cmd_rm(ckpt_client *c, const char *job, uint64_t step, int json)
{
	char what[400];
	int r = ckpt_delete(c, job, step);
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

/* ckpt_resolve: decide the step once and pin it, so that every rank
 * given the printed step loads the same bytes. */
static int cmd_resolve(ckpt_client *c, const char *job, const char *step_arg, int json)
{
	char what[400];
	ckpt_step_info info;
	int64_t step = step_arg ? (int64_t)parse_step(step_arg) : CKPT_LATEST;
	int r = ckpt_resolve(c, job, step, &info);
	if (r < 0) {
		snprintf(what, sizeof(what), "resolve %s %s", job, step_arg ? step_arg : "latest");
		die(what, r);
	}
	if (json) {
		json_object *o = json_step(&info);
		json_print(o);
		json_object_put(o);
	} else {
		printf("%s step %" PRIu64 " attempt %s\n", info.job, info.step, info.attempt_id);
	}
	return 0;
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
		json_object *o = json_object_new_object(), *a = json_object_new_array();
		if (!o || !a)
			die_oom();
		json_put(o, "dry_run", json_object_new_boolean(dry_run));
		for (size_t i = 0; i < n; i++) {
			json_object *e = json_step(&v[i].info);
			json_put(e, "reason", json_object_new_string(v[i].reason));
			if (json_object_array_add(a, e) != 0)
				die_oom();
		}
		json_put(o, "removed", a);
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

int main(int argc, char **argv)
{
	const char *sock = getenv("CKPTD_SOCKET");
	const char *cmd = NULL, *args[2] = { NULL, NULL };
	int nargs = 0, dry_run = 0;
	char what[4200];
	ckpt_client *c = NULL;
	int json = 0, r;

	if (!sock || !*sock)
		sock = CKPT_DEFAULT_SOCKET;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (!strcmp(a, "--version")) {
			printf("ckptctl %s (commit %s)\n", CKPT_VERSION, CKPT_COMMIT);
			return 0;
		}
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(a, "--socket") || !strcmp(a, "-s")) {
			if (++i >= argc) {
				fprintf(stderr, "ckptctl: %s needs a path\n", a);
				return 2;
			}
			sock = argv[i];
		} else if (!strncmp(a, "--socket=", 9)) {
			sock = a + 9;
		} else if (!strcmp(a, "--json")) {
			json = 1;
		} else if (!strcmp(a, "--dry-run")) {
			dry_run = 1;
		} else if (a[0] == '-' && a[1]) {
			fprintf(stderr, "ckptctl: unknown option %s\n", a);
			usage(stderr);
			return 2;
		} else if (!cmd) {
			cmd = a;
		} else if (nargs < 2) {
			args[nargs++] = a;
		} else {
			fprintf(stderr, "ckptctl: unexpected argument %s\n", a);
			usage(stderr);
			return 2;
		}
	}
	if (!cmd) {
		usage(stderr);
		return 2;
	}
	int want_min, want_max;
	if (!strcmp(cmd, "status") || !strcmp(cmd, "metrics"))
		want_min = 0, want_max = 0;
	else if (!strcmp(cmd, "ls") || !strcmp(cmd, "gc"))
		want_min = 0, want_max = 1;
	else if (!strcmp(cmd, "show") || !strcmp(cmd, "verify") || !strcmp(cmd, "rm"))
		want_min = 2, want_max = 2;
	else if (!strcmp(cmd, "resolve"))
		want_min = 1, want_max = 2;
	else {
		fprintf(stderr, "ckptctl: unknown command %s\n", cmd);
		usage(stderr);
		return 2;
	}
	if (nargs < want_min || nargs > want_max || (dry_run && strcmp(cmd, "gc"))) {
		fprintf(stderr, "ckptctl: wrong arguments for %s\n", cmd);
		usage(stderr);
		return 2;
	}

	r = ckpt_connect(sock, NULL, &c);
	if (r < 0) {
		snprintf(what, sizeof(what), "connect %s", sock);
		die(what, r);
	}
	if (!strcmp(cmd, "status"))
		r = cmd_status(c, json);
	else if (!strcmp(cmd, "ls"))
		r = cmd_ls(c, nargs ? args[0] : NULL, json);
	else if (!strcmp(cmd, "gc"))
		r = cmd_gc(c, nargs ? args[0] : NULL, dry_run, json);
	else if (!strcmp(cmd, "metrics"))
		r = cmd_metrics(c);
	else if (!strcmp(cmd, "show"))
		r = cmd_show(c, args[0], parse_step(args[1]), json);
	else if (!strcmp(cmd, "verify"))
		r = cmd_verify(c, args[0], parse_step(args[1]), json);
	else if (!strcmp(cmd, "resolve"))
		r = cmd_resolve(c, args[0], nargs > 1 ? args[1] : NULL, json);
	else
		r = cmd_rm(c, args[0], parse_step(args[1]), json);
	ckpt_close(c);
	if (fflush(stdout) != 0) {
		perror("ckptctl: stdout");
		return 1;
	}
	return r ? 1 : 0;
}
