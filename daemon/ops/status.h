/* One status snapshot of the daemon, described by a table of columns, and
 * the views that render it: the StatusReply of ckptctl status
 * (status_reply_fill), the sd_notify STATUS= line (status_line_render) and
 * the Prometheus text (metrics_format in metrics.c). Adding a statistic:
 * one enum entry, one row in status_cols[], one line in status_snapshot();
 * a StatusReply field of the column's name in proto/ckpt.proto if
 * ckptctl status shows it. Loop thread only. */
#ifndef CKPTD_STATUS_H
#define CKPTD_STATUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.pb-c.h"
#include "daemon.h"

enum status_col_id {
	ST_BYTES_STAGED,
	ST_BYTES_DURABLE,
	ST_BYTES_STORED,
	ST_BYTES_RESTORED_MEMORY,
	ST_BYTES_RESTORED_STORAGE,
	ST_BYTES_RESTORED,
	ST_RESTORES_FROM_MEMORY,
	ST_RESTORES_FROM_STORAGE,
	ST_SAVE_STALL,
	ST_SAVE_DURABLE,
	ST_POOL_BYTES,
	ST_POOL_USED_BYTES,
	ST_POOL_HELD_BYTES,
	ST_POOL_MEMORY_ONLY_BYTES,
	ST_INFLIGHT_SAVES,
	ST_WAITING_SAVES,
	ST_SAVES_TOTAL,
	ST_SAVES_SUPERSEDED,
	ST_SAVES_SKIPPED,
	ST_SAVES_FAILED_OTHER,
	ST_SAVES_FAILED,
	ST_STORE_DIRECT_BYTES,
	ST_STORE_RETRIES,
	ST_STORE_FAILURES,
	ST_STORE_READ_BYTES,
	ST_STORE_READS_SHARED,
	ST_STORE_READ_SHARED_BYTES,
	ST_RANGE_BYTES_IN,
	ST_RANGE_BYTES_OUT,
	ST_RANGE_FALLBACKS,
	ST_RANGE_KEPT_BYTES,
	ST_MANIFEST_READS,
	ST_STEP_INDEX_READS,
	ST_STEP_INDEX_WRITES,
	ST_WAIT_POLLS,
	ST_MANIFEST_CACHE_HITS,
	ST_MANIFEST_CACHE_MISSES,
	ST_MANIFEST_CACHE_BYTES,
	ST_MANIFEST_CACHE_ENTRIES,
	ST_SESSIONS,
	ST_RECOVERED_FILES,
	ST_UPTIME_NS,
	ST_CHUNK_BYTES,
	ST_RECLAIMED_BYTES,
	ST_CPU_NS,
	ST_PEAK_RSS_BYTES,
	ST_HELD_COPIES,
	ST_PEER_BYTES_SENT,
	ST_PEER_BYTES_RECEIVED,
	ST_PEER_REPLICAS_HELD,
	ST_PEER_REPLICA_BYTES,
	ST_PEER_RESTORES,
	ST_PEER_LINK_ERRORS,
	ST_HELD_COPIES_FAILED,
	ST_REQUESTS,
	ST_REFUSED_FRAME_BYTES,
	ST_REFUSED_FDS,
	ST_REFUSED_SESSIONS,
	ST_REFUSED_SESSIONS_PER_UID,
	ST_REFUSED_BUFFERS,
	ST_REFUSED_REGISTERED_BYTES,
	ST_REFUSED_INFLIGHT_LOADS,
	ST_REFUSED_HELLO_TIMEOUT,
	ST_REFUSED_IDLE_TIMEOUT,
	ST_REFUSED_FD_EXHAUSTED,
	ST_REFUSED_PEER_HANDSHAKES,
	ST_REFUSED_PEER_CONNECTIONS,
	ST_REFUSED_PEER_PER_ADDRESS,
	ST_REFUSED_PEER_REPLICAS,
	ST_REFUSED_PEER_DEADLINE,
	ST_REFUSED_PEER_FRAME_BYTES,
	ST_REFUSED_PEER_LIST,
	ST_REFUSED_PEER_MISSING,
	ST_NCOLS
};

enum status_kind {
	ST_COUNTER,
	ST_GAUGE,
	ST_HISTOGRAM
};
enum status_unit {
	ST_UNIT_COUNT,
	ST_UNIT_BYTES,
	ST_UNIT_NS,
	ST_UNIT_SECONDS
};

/* The views a column appears in. */
enum status_view {
	SV_REPLY = 1u << 0,  /* the StatusReply field named like the column */
	SV_METRIC = 1u << 1, /* a Prometheus series (or, with sum, a family's total) */
	SV_LINE = 1u << 2,   /* the sd_notify STATUS= line */
};

struct status_col {
	const char *name; /* snake_case; the StatusReply field when SV_REPLY */
	const char *help; /* the first column of a family gives the family's HELP */
	enum status_kind kind;
	enum status_unit unit; /* ST_UNIT_NS: Prometheus shows seconds */
	unsigned views;
	const char *metric; /* the Prometheus family */
	const char *label;  /* this series' fixed label, e.g. source="memory" */
	bool backend;       /* the series carries backend="<store backend>" */
	bool sum;           /* no series of its own: the sum of its family's */
	bool per_message;   /* one series per request message: msg="<row name>" */
	size_t hist;        /* ST_HISTOGRAM: offsetof(struct status, the histogram) */
};

extern const struct status_col status_cols[ST_NCOLS];

struct status_held {
	const char *job, *attempt; /* borrowed from the daemon */
	uint32_t rank, world_size;
	uint64_t step, bytes;
	int tier;     /* enum save_tier: what it was saved as */
	bool durable; /* in storage too */
};

struct status_tenant {
	const char *name; /* borrowed from the config */
	uint32_t sessions, inflight_saves;
	uint64_t pool_bytes;
};

struct status_failure {
	const char *job, *msg; /* borrowed from the daemon's stats */
	uint64_t step;
	uint32_t rank;
	int status; /* 0 or -errno */
	int64_t unix_ns;
};

struct status {
	uint64_t v[ST_NCOLS];
	struct histogram save_stall, save_durable;
	uint64_t requests[STATS_MSG_SLOTS];        /* ST_REQUESTS, by Frame body case */
	const char *request_name[STATS_MSG_SLOTS]; /* NULL: not a request */
	const char *backend;                       /* "file", ... (borrowed) */
	char storage[1400];
	char cuda[512];
	uint32_t nrecovered;
	char *recovered[RECOVERED_LIST]; /* borrowed from the daemon's stats */
	uint32_t nheld;
	struct status_held *held; /* malloc'd */
	uint32_t ntenants;
	struct status_tenant tenants[CONFIG_MAX_TENANTS];
	uint32_t nfailures;
	struct status_failure failures[FAILURE_LIST]; /* the last failed saves, newest first */
};

/* Fill st from the daemon, each value computed once. Strings are borrowed:
 * render before the loop runs again, then status_release (always). 0, or
 * -ENOMEM when the held list could not be copied (the numbers are filled). */
int status_snapshot(const struct daemon *d, struct status *st);
void status_release(struct status *st);

/* The ckptctl status view: every SV_REPLY column into the StatusReply field
 * of its name, the strings and lists. rep borrows from st; 0 or -ENOMEM. */
int status_reply_fill(const struct status *st, Ckpt__StatusReply *rep);
void status_reply_free(Ckpt__StatusReply *rep);

/* The sd_notify view: "STATUS=..." from the SV_LINE columns. */
void status_line_render(const struct status *st, char *buf, size_t len);

#endif
