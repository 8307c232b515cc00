/* The daemon's shared state. Everything here belongs to the loop thread. */
#ifndef CKPTD_DAEMON_H
#define CKPTD_DAEMON_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <uv.h>

#include "clock.h"
#include "config.h"
#include "hist.h"
#include "pool.h"
#include "store.h"
#include "workq.h"

struct session;
struct save;
struct journal;
struct load;
struct cuda;
struct readshare;
struct rangecache;

TAILQ_HEAD(session_list, session);
TAILQ_HEAD(save_list, save);
TAILQ_HEAD(load_list, load);
struct persist;
TAILQ_HEAD(persist_list, persist);
struct peer;
struct waits;
struct Ckpt__Manifest;
/* The copy a peer_fetch asks for: (job, step, rank) of world_size; with
 * expect (the manifest of a step in storage), only that save's copy (the
 * same attempt, size and tensors, every CRC32C), held here as durable
 * under its shard's name in storage; no_sweep: only the peers likeliest
 * to hold it, never the whole ring. */
#define PEER_RANGE_MINE 1 /* peer_range: this node reads the range */

struct peer_want {
	const char *job;
	uint64_t step;
	uint32_t rank, world_size;
	const struct Ckpt__Manifest *expect;
	bool no_sweep;
	/* The asking rank's job key (32 bytes, from its trainer's secret:
	 * seal.h), or NULL: a sealed copy is opened with it, and with it an
	 * unsealed copy is refused. */
	const uint8_t *key;
};
/* A copy a peer holds (peer_list). */
struct peer_copy {
	char peer[128];
	char job[JOB_BUF], attempt[ATTEMPT_BUF];
	uint32_t rank, world_size;
	uint64_t step, bytes;
	int tier;
	bool durable;
};

#define RECOVERED_LIST 8
#define FAILURE_LIST 5      /* failed saves kept for ckptctl status */
#define FAILURE_MSG_MAX 200 /* bytes of each one's message kept */

/* A failed save (save.c, enter_failed): what its trainer was told. */
struct save_failure {
	char job[JOB_BUF];
	uint64_t step;
	uint32_t rank;
	int status;      /* 0 or -errno */
	int64_t unix_ns; /* when */
	char msg[FAILURE_MSG_MAX + 1];
};

#define STATS_MSG_SLOTS 64 /* Frame body cases; msgtab.c checks its rows fit */

/* The caps on what a client can make the daemon hold (docs/security.md "Limits"),
 * each counted when it refuses something: ckptd_refused_total{limit=}. */
enum limit_kind {
	LIMIT_FRAME_BYTES,      /* max_frame_bytes */
	LIMIT_FDS,              /* max_fds_per_frame */
	LIMIT_SESSIONS,         /* max_sessions */
	LIMIT_SESSIONS_PER_UID, /* max_sessions_per_uid */
	LIMIT_BUFFERS,          /* max_buffers */
	LIMIT_REGISTERED_BYTES, /* max_registered_bytes */
	LIMIT_INFLIGHT_LOADS,   /* max_inflight_loads */
	LIMIT_HELLO_TIMEOUT,    /* hello_timeout_ms */
	LIMIT_IDLE_TIMEOUT,     /* idle_timeout_ms */
	LIMIT_FD_EXHAUSTED,     /* the process's RLIMIT_NOFILE, at accept */
	LIMIT_N
};

/* The caps on what peers can make the daemon hold (docs/tiers.md "Peers"),
 * counted on the peer threads: ckptd_refused_total{limit="peer_..."}. */
enum peer_limit_kind {
	PEER_LIMIT_HANDSHAKES,  /* [peers] max_handshakes: the oldest handshake closed for a new one */
	PEER_LIMIT_CONNECTIONS, /* [peers] max_connections */
	PEER_LIMIT_PER_ADDRESS, /* [peers] max_per_address */
	PEER_LIMIT_REPLICAS,    /* [peers] max_replicas */
	PEER_LIMIT_DEADLINE,    /* [peers] timeout_ms and min_rate: a handshake or frame not done in time */
	PEER_LIMIT_FRAME_BYTES, /* a peer's frame larger than a manifest this node's [limits] allow */
	PEER_LIMIT_LIST,        /* [peers] max_list: a peer's list answer over it, or with copies not asked for */
	PEER_LIMIT_MISSING,     /* [peers] max_missing_ranks: a load stopped asking peers for a step's ranks */
	PEER_LIMIT_N
};

struct stats {
	uint64_t refused[LIMIT_N];
	atomic_uint_fast64_t peer_refused[PEER_LIMIT_N];
	uint64_t saves_total, saves_failed, saves_superseded, saves_skipped;
	uint64_t bytes_staged, bytes_durable, bytes_restored, bytes_restored_memory;
	uint64_t bytes_stored; /* of the shards' objects: bytes_durable after compression */
	uint64_t restores_from_memory, restores_from_storage;
	uint64_t reclaimed_bytes;
	/* peers (daemon/peer/): counted on its threads */
	atomic_uint_fast64_t peer_bytes_sent, peer_bytes_received, peer_link_errors, peer_restores;
	atomic_uint_fast64_t held_copies_failed; /* a load's copy in memory failed its crc (load.c) */
	/* restores' reads shared across nodes (peer_range.c, loadexec.c):
	 * bytes got from and sent to the peers that hold ranges, and ranges
	 * read from storage alone because the peers could not give them */
	atomic_uint_fast64_t range_bytes_in, range_bytes_out, range_fallbacks;
	uint64_t store_failures;
	uint64_t wait_polls; /* step listings for WaitRequests (wire/wait_req.c) */
	struct histogram stall_hist, durable_hist;
	uint64_t requests[STATS_MSG_SLOTS];        /* received, by Frame body case (msgtab.c) */
	const char *request_name[STATS_MSG_SLOTS]; /* of the request messages; set by msgtab_init */
	uint32_t recovered_files;                  /* removed at start after a crash */
	uint32_t nrecovered;
	char recovered[RECOVERED_LIST][1024]; /* what, for ckptctl status */
	/* The last FAILURE_LIST failed saves, a ring: the newest is
	 * failures[(nfailures - 1) % FAILURE_LIST]. Written by enter_failed
	 * and read by status_snapshot, both on the loop thread (a save's state
	 * changes only there: the copy and upload threads hand back through
	 * their done callbacks), so no lock. */
	struct save_failure failures[FAILURE_LIST];
	uint64_t nfailures; /* recorded since start */
};

struct requester_ops;

struct daemon {
	uv_loop_t *loop;
	struct config cfg;
	struct pool pool;
	struct store *store;
	/* A tenant's own storage ([tenant.X] storage), by index; NULL: store. */
	struct store *tenant_store[CONFIG_MAX_TENANTS];
	struct mancache *mancache;     /* NULL: off; shared by the threadpool (thread-safe) */
	struct readshare *readshare;   /* restores' storage reads in flight (thread-safe) */
	struct rangecache *rangecache; /* ranges kept for the peers (peer_range.c); NULL: not shared */
	struct workq *copyq;
	struct stats stats;
	struct cuda *cuda; /* NULL: CUDA is off, cuda_why says why */
	char cuda_why[256];

	/* The main socket (listeners[0]) and one per tenant with a socket
	 * (server.c). */
	struct listener {
		struct daemon *d;
		int fd;
		uv_poll_t poll;
		int tenant; /* whose socket: an index in cfg.tenants; -1: the main one */
		bool owned; /* we bound it, so we unlink it */
		char path[108];
	} listeners[1 + CONFIG_MAX_TENANTS];
	uint32_t nlisteners;
	bool listening;
	uint32_t tenant_sessions[CONFIG_MAX_TENANTS];   /* by index in cfg.tenants (session.c) */
	uint64_t tenant_registered[CONFIG_MAX_TENANTS]; /* bytes of buffers its sessions registered */
	int spare_fd;                                   /* closed to accept and refuse when out of fds (server.c) */
	uv_timer_t accept_timer;                        /* resumes accepting after fd exhaustion */
	unsigned accept_backoff_ms;
	uv_timer_t sweep_timer; /* hello and idle timeouts */
	struct session_list sessions;
	uint32_t nsessions;
	uint64_t next_session_id;

	struct save_list saves; /* every save not yet finished */
	uint32_t nsaves;
	struct save_list waitq; /* admitting, FIFO per job */
	uint32_t nwaiting;
	struct save_list uploadq; /* staged, waiting for an upload slot */
	uint32_t nuploading;
	struct save_list held; /* the memory tier, oldest first */
	uint32_t nheld;
	/* Of them, replicas held for peers, and their pool bytes with their
	 * extra state and tensor tables (memtier_hold, drop): the share is
	 * checked per replica without a walk of the list. */
	uint32_t nreplicas;
	uint64_t replica_bytes;
	struct journal *journal;
	uv_timer_t admit_timer;
	uint64_t next_save_id;

	uint32_t nloads; /* loads and catalogue requests on the threadpool */
	struct load_list loads;
	bool gc_running;
	char **gc_pending; /* jobs whose retention should run next (malloc'd names) */
	uint32_t ngc_pending, gc_pending_cap;
	uv_signal_t sigterm, sigint, sighup;
	uv_timer_t drain_timer;
	uv_timer_t finish_timer; /* closes everything once drained (lifecycle.c) */
	bool draining;
	uint64_t start_ns;
	const char *store_backend; /* "file", ... for metric labels */
	uv_tcp_t metrics_tcp;
	bool metrics_on;
	int metrics_port;
	uint32_t metrics_conns;
	uv_timer_t status_timer;  /* sd_notify STATUS= and WATCHDOG=1 */
	uv_timer_t idle_timer;    /* [server] idle_exit_ms (lifecycle.c) */
	uint64_t idle_since_ns;   /* when the daemon was last seen busy; 0: busy now */
	uint64_t last_session_ns; /* a session last opened or closed (session.c): one between two looks counts */
	uint64_t watchdog_usec;
	/* Hooks set at start by the modules above the engine, so that
	 * completions flow up without calls into them. */
	void (*on_work_ended)(struct daemon *d);               /* lifecycle.c, while draining */
	void (*on_durable)(struct daemon *d, const char *job); /* retention (gc.c) */
	/* Every rank's save of (job, step) that became durable here: the
	 * waiters of the step look again soon (wire/wait_req.c). */
	void (*on_step_durable)(struct daemon *d, const char *job, uint64_t step);
	/* WaitRequests: one shared poll per (job, step), and the steps lately
	 * seen complete (wire/wait_req.c owns it; NULL: not started). */
	struct waits *waits;
	/* A persist's upload of sv ended: status 0 (durable) or -errno (and
	 * why); sv stays held. persist.c. */
	void (*on_persist_end)(struct daemon *d, struct save *sv, int status, const char *why);
	struct persist_list persists;        /* PersistRequests waiting (persist.c) */
	const struct requester_ops *req_ops; /* the wire layer's (session.c) */
	/* Peer replication (daemon/peer/, set by peer_start); NULL: off, and
	 * peer_why says why. Loop thread: on_replicate takes a kept
	 * replicated save (and its SaveReplicated event). Threadpool:
	 * peer_fetch brings (job, step, rank)'s copy back from the peers that
	 * hold this node's replicas into the pool, held and pinned for the
	 * caller (0 and *out, or -errno and why); peer_list says which copies
	 * of (job, rank) they hold (*out malloc'd, each with its peer). */
	struct peer *peer;
	char peer_why[160];
	void (*on_replicate)(struct daemon *d, struct save *sv);
	int (*peer_fetch)(struct daemon *d, const struct peer_want *w, struct save **out, char *why, size_t whylen);
	int (*peer_list)(struct daemon *d, const char *job, uint32_t rank, struct peer_copy **out, size_t *n);
	/* Threadpool (a load's copy threads): range [off, off + len) of key,
	 * a shard of job in the main store, from the node that reads it for
	 * the job's nodes (daemon/peer/peer_range.c): 0 with its bytes in buf;
	 * PEER_RANGE_MINE: this node reads it (and keeps it in rangecache);
	 * -errno and why: read it alone. NULL: reads are not shared. */
	int (*peer_range)(struct daemon *d, const char *job, const char *key, uint64_t off, uint64_t len, uint8_t *buf,
			  char *why, size_t whylen);
	/* Threadpool: the extra state of (job, step, rank)'s copy a peer
	 * holds, without its shard (*extra malloc'd). */
	int (*peer_extra)(struct daemon *d, const struct peer_want *w, uint8_t **extra, size_t *len, char *why,
			  size_t whylen);
	/* Loop (a session's Hello): the key of job's replicas from the secret
	 * its trainer gave (CKPT_JOB_KEY; daemon/peer/seal.h). 0 or -errno. */
	int (*job_key)(const void *secret, size_t len, const char *job, uint8_t key[32]);
};

/* Work that a drain waits for (a save, a load, a catalogue request) ended.
 * Modules below lifecycle.c call this, not lifecycle.c: the hook is set when a
 * drain starts, and completes it when nothing is left. */
static inline void daemon_work_ended(struct daemon *d)
{
	if (d->on_work_ended)
		d->on_work_ended(d);
}

/* The storage a kept job name lives in: its tenant's own, or the main
 * one (docs/security.md "Tenants"). */
static inline struct store *daemon_store_of(const struct daemon *d, const char *job)
{
	const struct tenant_config *t = config_tenant_of_job(&d->cfg, job);
	struct store *s = t ? d->tenant_store[t - d->cfg.tenants] : NULL;
	return s ? s : d->store;
}

#endif
