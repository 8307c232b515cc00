/* ckptctl status: sessions, pool, memory tier, in-flight saves, totals. */
#include <errno.h>
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
#include "ckptctl_cmd.h"
#include "ckptctl_util.h"

/* A copy in the memory tier (of s->held), as --json prints it. */
static json_object *held_row(const void *s, size_t i)
{
	const ckpt_held_info *h = &((const ckpt_status_info *)s)->held[i];
	json_object *e = json_object_new_object();
	if (!e)
		die_oom();
	json_put(e, "job", json_object_new_string(h->job));
	json_put(e, "rank", json_object_new_uint64(h->rank));
	json_put(e, "world_size", json_object_new_uint64(h->world_size));
	json_put(e, "step", json_object_new_uint64(h->step));
	json_put(e, "bytes", json_object_new_uint64(h->bytes));
	json_put(e, "attempt_id", json_object_new_string(h->attempt_id));
	json_put(e, "tier", json_object_new_string(tier_name(h->tier)));
	json_put(e, "durable", json_object_new_boolean(h->durable));
	return e;
}

/* The files a crashed run left, removed at start. */
static json_object *json_recovered(const ckpt_status_info *s)
{
	json_object *rec = json_object_new_object();
	json_object *items = json_object_new_array();
	if (!rec || !items)
		die_oom();
	json_put(rec, "files", json_object_new_uint64(s->recovered_files));
	for (uint32_t i = 0; i < s->nrecovered; i++)
		if (json_object_array_add(items, json_object_new_string(s->recovered[i])) != 0)
			die_oom();
	json_put(rec, "removed", items);
	return rec;
}

static json_object *tenant_row(const void *s, size_t i)
{
	const ckpt_tenant_info *t = &((const ckpt_status_info *)s)->tenants[i];
	json_object *e = json_object_new_object();
	if (!e)
		die_oom();
	json_put(e, "name", json_object_new_string(t->name));
	json_put(e, "sessions", json_object_new_uint64(t->sessions));
	json_put(e, "inflight_saves", json_object_new_uint64(t->inflight_saves));
	json_put(e, "pool_bytes", json_object_new_uint64(t->pool_bytes));
	return e;
}

static json_object *failure_row(const void *s, size_t i)
{
	char a[32];
	const ckpt_failure_info *f = &((const ckpt_status_info *)s)->failures[i];
	json_object *e = json_object_new_object();
	if (!e)
		die_oom();
	json_put(e, "job", json_object_new_string(f->job));
	json_put(e, "step", json_object_new_uint64(f->step));
	json_put(e, "rank", json_object_new_uint64(f->rank));
	json_put(e, "error", json_object_new_string(ckpt_strerror(f->status)));
	json_put(e, "message", json_object_new_string(f->message));
	json_put(e, "failed_unix_ns", json_object_new_int64(f->unix_ns));
	json_put(e, "failed", json_object_new_string(saved_time(f->unix_ns, a, sizeof(a))));
	return e;
}

static void status_json(const ckpt_status_info *s)
{
	json_object *o = json_object_new_object();

	if (!o)
		die_oom();
	json_put(o, "sessions", json_object_new_uint64(s->sessions));
	json_put(o, "pool_bytes", json_object_new_uint64(s->pool_bytes));
	json_put(o, "pool_used_bytes", json_object_new_uint64(s->pool_used_bytes));
	json_put(o, "chunk_bytes", json_object_new_uint64(s->chunk_bytes));
	json_put(o, "inflight_saves", json_object_new_uint64(s->inflight_saves));
	json_put(o, "waiting_saves", json_object_new_uint64(s->waiting_saves));
	json_put(o, "saves_total", json_object_new_uint64(s->saves_total));
	json_put(o, "saves_failed", json_object_new_uint64(s->saves_failed));
	json_put(o, "bytes_staged", json_object_new_uint64(s->bytes_staged));
	json_put(o, "bytes_durable", json_object_new_uint64(s->bytes_durable));
	json_put(o, "bytes_restored", json_object_new_uint64(s->bytes_restored));
	json_put(o, "pool_held_bytes", json_object_new_uint64(s->pool_held_bytes));
	json_put(o, "saves_superseded", json_object_new_uint64(s->saves_superseded));
	json_put(o, "saves_skipped", json_object_new_uint64(s->saves_skipped));
	json_put(o, "bytes_restored_memory", json_object_new_uint64(s->bytes_restored_memory));
	json_put(o, "restores_from_memory", json_object_new_uint64(s->restores_from_memory));
	json_put(o, "restores_from_storage", json_object_new_uint64(s->restores_from_storage));
	json_put(o, "reclaimed_bytes", json_object_new_uint64(s->reclaimed_bytes));
	json_put(o, "uptime_ns", json_object_new_uint64(s->uptime_ns));
	json_put(o, "cpu_ns", json_object_new_uint64(s->cpu_ns));
	json_put(o, "peak_rss_bytes", json_object_new_uint64(s->peak_rss_bytes));
	json_put(o, "storage", json_object_new_string(s->storage));
	json_put(o, "cuda", json_object_new_string(s->cuda));
	json_put(o, "memory_tier",
		 json_rows(s->nheld < CKPT_STATUS_MAX_HELD ? s->nheld : CKPT_STATUS_MAX_HELD, held_row, s));
	json_put(o, "recovered", json_recovered(s));
	json_put(o, "tenants", json_rows(s->ntenants, tenant_row, s));
	json_put(o, "last_failures",
		 json_rows(s->nfailures < CKPT_STATUS_MAX_FAILURES ? s->nfailures : CKPT_STATUS_MAX_FAILURES,
			   failure_row, s));
	json_print(o);
	json_object_put(o);
}

static void status_text(const ckpt_status_info *s)
{
	char a[32], b[32], d[32];

	printf("%-16s %" PRIu32 "\n", "sessions", s->sessions);
	printf("%-16s %s used of %s", "pool", human_bytes(s->pool_used_bytes, a, sizeof(a)),
	       human_bytes(s->pool_bytes, b, sizeof(b)));
	if (s->pool_bytes)
		printf(" (%.0f%%)", 100.0 * (double)s->pool_used_bytes / (double)s->pool_bytes);
	printf(", chunks of %s\n", human_bytes(s->chunk_bytes, d, sizeof(d)));
	printf("%-16s %" PRIu32 " in flight, %" PRIu32 " waiting for pool\n", "saves now", s->inflight_saves,
	       s->waiting_saves);
	printf("%-16s %" PRIu64 " total, %" PRIu64 " failed\n", "saves", s->saves_total, s->saves_failed);
	/* Why: the count alone sends the operator to the logs. */
	int64_t now = now_unix_ns();
	for (uint32_t i = 0; i < s->nfailures && i < CKPT_STATUS_MAX_FAILURES; i++) {
		const ckpt_failure_info *f = &s->failures[i];
		human_duration(now > f->unix_ns ? (uint64_t)(now - f->unix_ns) : 0, b, sizeof(b));
		printf("%-16s %s UTC (%s ago) %s step %" PRIu64 " rank %" PRIu32 ": %s\n", i ? "" : "last failures",
		       saved_time(f->unix_ns, a, sizeof(a)), b, f->job, f->step, f->rank,
		       f->message[0] ? f->message : ckpt_strerror(f->status));
	}
	printf("%-16s %s staged, %s durable, %s restored\n", "bytes", human_bytes(s->bytes_staged, a, sizeof(a)),
	       human_bytes(s->bytes_durable, b, sizeof(b)), human_bytes(s->bytes_restored, d, sizeof(d)));
	printf("%-16s %" PRIu64 " superseded, %" PRIu64 " skipped\n", "", s->saves_superseded, s->saves_skipped);
	printf("%-16s %" PRIu64 " from memory (%s), %" PRIu64 " from storage\n", "restores", s->restores_from_memory,
	       human_bytes(s->bytes_restored_memory, a, sizeof(a)), s->restores_from_storage);
	printf("%-16s %s held, %s reclaimed\n", "memory tier", human_bytes(s->pool_held_bytes, a, sizeof(a)),
	       human_bytes(s->reclaimed_bytes, b, sizeof(b)));
	for (uint32_t i = 0; i < s->nheld && i < CKPT_STATUS_MAX_HELD; i++)
		printf("%-16s %s rank %" PRIu32 "/%" PRIu32 " step %" PRIu64 " (%s, %s)\n", "", s->held[i].job,
		       s->held[i].rank, s->held[i].world_size, s->held[i].step,
		       human_bytes(s->held[i].bytes, a, sizeof(a)), held_what(&s->held[i]));
	if (s->recovered_files) {
		printf("%-16s %" PRIu32 " file(s) left by a crashed run removed at start\n", "recovered",
		       s->recovered_files);
		for (uint32_t i = 0; i < s->nrecovered; i++)
			printf("%-16s %s\n", "", s->recovered[i]);
	}
	for (uint32_t i = 0; i < s->ntenants; i++)
		printf("%-16s %s: %" PRIu32 " sessions, %" PRIu32 " saves in flight, %s of the pool\n",
		       i ? "" : "tenants", s->tenants[i].name, s->tenants[i].sessions, s->tenants[i].inflight_saves,
		       human_bytes(s->tenants[i].pool_bytes, a, sizeof(a)));
	printf("%-16s %s\n", "storage", s->storage[0] ? s->storage : "-");
	printf("%-16s %s\n", "cuda", s->cuda[0] ? s->cuda : "-");
	printf("%-16s %s\n", "uptime", human_duration(s->uptime_ns, a, sizeof(a)));
}

int cmd_status(ckpt_client *c, int json)
{
	ckpt_status_info st;
	int r = ckpt_status(c, &st);
	if (r < 0)
		die("status", r);
	if (json)
		status_json(&st);
	else
		status_text(&st);
	return 0;
}
