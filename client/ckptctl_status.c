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

int cmd_status(ckpt_client *c, int json)
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
			json_put(e, "tier", json_object_new_string(tier_name(h->tier)));
			json_put(e, "durable", json_object_new_boolean(h->durable));
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
		json_object *ten = json_object_new_array();
		if (!ten)
			die_oom();
		for (uint32_t i = 0; i < st.ntenants; i++) {
			json_object *e = json_object_new_object();
			if (!e)
				die_oom();
			json_put(e, "name", json_object_new_string(st.tenants[i].name));
			json_put(e, "sessions", json_object_new_uint64(st.tenants[i].sessions));
			json_put(e, "inflight_saves", json_object_new_uint64(st.tenants[i].inflight_saves));
			json_put(e, "pool_bytes", json_object_new_uint64(st.tenants[i].pool_bytes));
			if (json_object_array_add(ten, e) != 0)
				die_oom();
		}
		json_put(o, "tenants", ten);
		json_object *fails = json_object_new_array();
		if (!fails)
			die_oom();
		for (uint32_t i = 0; i < st.nfailures && i < CKPT_STATUS_MAX_FAILURES; i++) {
			const ckpt_failure_info *f = &st.failures[i];
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
			if (json_object_array_add(fails, e) != 0)
				die_oom();
		}
		json_put(o, "last_failures", fails);
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
	/* Why: the count alone sends the operator to the logs. */
	int64_t now = now_unix_ns();
	for (uint32_t i = 0; i < st.nfailures && i < CKPT_STATUS_MAX_FAILURES; i++) {
		const ckpt_failure_info *f = &st.failures[i];
		human_duration(now > f->unix_ns ? (uint64_t)(now - f->unix_ns) : 0, b, sizeof(b));
		printf("%-16s %s UTC (%s ago) %s step %" PRIu64 " rank %" PRIu32 ": %s\n", i ? "" : "last failures",
		       saved_time(f->unix_ns, a, sizeof(a)), b, f->job, f->step, f->rank,
		       f->message[0] ? f->message : ckpt_strerror(f->status));
	}
	printf("%-16s %s staged, %s durable, %s restored\n", "bytes", human_bytes(st.bytes_staged, a, sizeof(a)),
	       human_bytes(st.bytes_durable, b, sizeof(b)), human_bytes(st.bytes_restored, d, sizeof(d)));
	printf("%-16s %" PRIu64 " superseded, %" PRIu64 " skipped\n", "", st.saves_superseded, st.saves_skipped);
	printf("%-16s %" PRIu64 " from memory (%s), %" PRIu64 " from storage\n", "restores", st.restores_from_memory,
	       human_bytes(st.bytes_restored_memory, a, sizeof(a)), st.restores_from_storage);
	printf("%-16s %s held, %s reclaimed\n", "memory tier", human_bytes(st.pool_held_bytes, a, sizeof(a)),
	       human_bytes(st.reclaimed_bytes, b, sizeof(b)));
	for (uint32_t i = 0; i < st.nheld && i < CKPT_STATUS_MAX_HELD; i++)
		printf("%-16s %s rank %" PRIu32 "/%" PRIu32 " step %" PRIu64 " (%s, %s)\n", "", st.held[i].job,
		       st.held[i].rank, st.held[i].world_size, st.held[i].step,
		       human_bytes(st.held[i].bytes, a, sizeof(a)), held_what(&st.held[i]));
	if (st.recovered_files) {
		printf("%-16s %" PRIu32 " file(s) left by a crashed run removed at start\n", "recovered",
		       st.recovered_files);
		for (uint32_t i = 0; i < st.nrecovered; i++)
			printf("%-16s %s\n", "", st.recovered[i]);
	}
	for (uint32_t i = 0; i < st.ntenants; i++)
		printf("%-16s %s: %" PRIu32 " sessions, %" PRIu32 " saves in flight, %s of the pool\n",
		       i ? "" : "tenants", st.tenants[i].name, st.tenants[i].sessions, st.tenants[i].inflight_saves,
		       human_bytes(st.tenants[i].pool_bytes, a, sizeof(a)));
	printf("%-16s %s\n", "storage", st.storage[0] ? st.storage : "-");
	printf("%-16s %s\n", "cuda", st.cuda[0] ? st.cuda : "-");
	printf("%-16s %s\n", "uptime", human_duration(st.uptime_ns, a, sizeof(a)));
	return 0;
}
