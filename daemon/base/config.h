/* Daemon configuration: defaults, the ini file (libinih) and command line
 * overrides. Every cap of the wire (docs/architecture.md §4) is here and can be set in [limits].
 * Each key is one row of config_keys[] or config_job_keys[] (config.c):
 * the rows drive parsing, --set and the key flags, the defaults,
 * --check-config's printing and what SIGHUP takes. */
#ifndef CKPTD_CONFIG_H
#define CKPTD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "config_value.h"
#include "names.h"

#define CONFIG_MAX_IDS 32

#define DEFAULT_SOCKET_PATH "/run/ckptd/ckptd.sock"
#define DEFAULT_STATE_DIR "/var/lib/ckptd"
#define DEFAULT_CONFIG_PATH "/etc/ckptd/ckptd.conf"
#define DEFAULT_STAGING_BYTES (1ull << 30)
#define DEFAULT_CHUNK_BYTES (64ull << 20)
#define DEFAULT_COPY_THREADS 2
#define DEFAULT_ADMIT_TIMEOUT_MS 60000
#define DEFAULT_PEER_REPLICAS 1
#define DEFAULT_PEER_SHARE_PCT 25
#define DEFAULT_PEER_TIMEOUT_MS 30000
#define DEFAULT_PEER_MIN_RATE (8u << 20)
#define DEFAULT_PEER_MAX_CONNECTIONS 64
#define DEFAULT_PEER_MAX_HANDSHAKES 16
#define DEFAULT_PEER_MAX_PER_ADDRESS 16
#define DEFAULT_PEER_MAX_REPLICAS 4096
/* [peers] verify_names: false, true, or auto: true when this node's own
 * certificate names its host (a certificate per node), else false. */
#define VERIFY_NAMES_OFF 0
#define VERIFY_NAMES_ON 1
#define VERIFY_NAMES_AUTO 2
#define DEFAULT_PEER_READ_CACHE (1ull << 30)
#define DEFAULT_PEER_READ_CACHE_S 60
#define DEFAULT_PEER_MAX_LIST 768 /* a node holds tens of copies of one job */
#define DEFAULT_PEER_MAX_MISSING_RANKS 8
#define DEFAULT_MAX_FRAME_BYTES (4u << 20)
#define DEFAULT_MAX_FDS_PER_FRAME 253 /* SCM_MAX_FD: a CUDA VMM buffer sends one fd per 20 MiB page */
#define DEFAULT_MAX_SESSIONS 256
#define DEFAULT_MAX_BUFFERS 16384
#define DEFAULT_MAX_TENSORS 65536
#define DEFAULT_MAX_NAME_LEN 1024
#define DEFAULT_MAX_INFLIGHT_SAVES 4 /* per (job, rank) */
#define DEFAULT_MAX_INFLIGHT_LOADS 4
#define DEFAULT_MAX_SESSIONS_PER_UID 128
#define DEFAULT_MAX_REGISTERED_BYTES (1ull << 40)
#define DEFAULT_HELLO_TIMEOUT_MS 10000
#define DEFAULT_IDLE_TIMEOUT_MS 300000
#define DEFAULT_MAX_WRITE_QUEUE (16u << 20)
#define DEFAULT_MAX_EXTRA_STATE (1u << 20)
#define DEFAULT_DRAIN_TIMEOUT_MS 120000
#define DEFAULT_FILE_MODE 0600
#define DEFAULT_MANIFEST_CACHE_BYTES (256ull << 20)

#define DEFAULT_MAX_PARALLEL_UPLOADS 2
/* [pool] piece_bytes: pieces.h's PIECE_BYTES; 4 KiB to 64 MiB, multiples of 4 KiB
 * (PIECE_MIN_BYTES, PIECE_MAX_BYTES). */
#define DEFAULT_PIECE_BYTES (4ull << 20)
#define PIECE_BYTES_MIN (4ull << 10)
#define PIECE_BYTES_MAX (64ull << 20)
#define CONFIG_MAX_JOBS 64
#define CONFIG_MAX_TENANTS 32
#define TENANT_NAME_MAX 32

/* What a save does when the pool (or its job's quota) is full of data that
 * is not yet durable, after memory-tier copies have been reclaimed. */
enum admit_policy {
	POLICY_BLOCK,    /* wait for space, up to admit_timeout_ms */
	POLICY_SKIP,     /* fail at once with EBUSY */
	POLICY_COALESCE, /* supersede older saves of the job and rank not yet uploading */
};

/* Which complete steps to keep; all zero: keep everything. */
struct retention {
	uint32_t keep_last;          /* the newest N complete steps */
	uint32_t keep_every;         /* every step divisible by K */
	uint64_t max_age_s;          /* complete steps older than this go */
	uint64_t incomplete_grace_s; /* incomplete steps older than this go; 0: never */
};

/* The rows of config_job_keys[], in order: bit (1 << JOB_KEY_x) of
 * job_config.set says the section sets that key. */
enum job_key {
	JOB_KEY_POLICY,
	JOB_KEY_QUOTA,
	JOB_KEY_MAX_INFLIGHT_SAVES,
	JOB_KEY_KEEP_LAST,
	JOB_KEY_KEEP_EVERY,
	JOB_KEY_MAX_AGE,
	JOB_KEY_INCOMPLETE_GRACE,
	JOB_KEY_COMPRESS,
	JOB_KEY_INCREMENTAL,
	JOB_KEY_PIECE_BYTES,
	JOB_KEY_COUNT,
};

/* One [job.NAME] section: what it sets overrides [pool], [limits] and
 * [retention] for that job. */
struct job_config {
	char name[JOB_BUF];
	uint32_t set; /* bit per enum job_key */
	struct retention retention;
	enum admit_policy policy;
	uint64_t quota_bytes;
	uint32_t quota_pct;
	uint32_t max_inflight_saves; /* 0: the default */
	bool compress;
	bool incremental;
	uint64_t piece_bytes;
};

/* The rows of config_tenant_keys[], in order. */
enum tenant_key {
	TENANT_KEY_UIDS,
	TENANT_KEY_GIDS,
	TENANT_KEY_SOCKET,
	TENANT_KEY_QUOTA,
	TENANT_KEY_MAX_INFLIGHT_SAVES,
	TENANT_KEY_MAX_REGISTERED_BYTES,
	TENANT_KEY_STORAGE,
	TENANT_KEY_STORAGE_OPTS,
	TENANT_KEY_COUNT,
};

/* One [tenant.NAME] section (docs/security.md "Tenants"): the peer credentials that
 * are this tenant on the main socket, or its own socket (Kubernetes, where
 * pods share a uid); its jobs live under the storage prefix NAME/. */
struct tenant_config {
	char name[TENANT_NAME_MAX + 1];
	uint32_t set; /* bit per enum tenant_key */
	uid_t uids[CONFIG_MAX_IDS];
	size_t nuids;
	gid_t gids[CONFIG_MAX_IDS];
	size_t ngids;
	char socket[108];              /* "": the main socket only */
	uint64_t quota_bytes;          /* of the pool, for its saves not yet durable; 0: no cap */
	uint32_t max_inflight_saves;   /* of all its jobs and ranks; 0: no cap */
	uint64_t max_registered_bytes; /* by all its sessions; 0: no cap */
	char storage[1024];            /* its own storage URL; "": [storage]'s */
	char storage_opts[1024];       /* its other keys, its storage's options (credentials_file ...) as k=v&k=v */
};

/* The effective settings for one job. */
struct job_policy {
	enum admit_policy policy;
	uint64_t quota_bytes; /* of the pool; the whole pool when unlimited */
	uint32_t max_inflight_saves;
	struct retention retention;
	bool compress;        /* uploads stored compressed (upload.c) */
	bool incremental;     /* unchanged pieces stored as references (upload.c) */
	uint64_t piece_bytes; /* the pieces a shard is cut into (pieces.h) */
};

struct config {
	char socket_path[108];
	char storage_url[1024];
	char storage_opts[1024];  /* other [storage] keys as k=v&k=v, for s3:// and gs:// */
	bool layout_spread;       /* [storage] layout = spread (manifest.h, SPREAD_FANOUT) */
	uint32_t file_mode;       /* [storage] file_mode: file:// files' mode, whatever the umask */
	bool storage_probe;       /* [storage] probe: store_probe at start (object stores) */
	bool allow_unconditional; /* [storage] allow_unconditional: start where create-only is ignored */
	char state_dir[1024];
	uint64_t staging_bytes;
	uint64_t chunk_bytes;
	unsigned copy_threads;
	unsigned admit_timeout_ms;
	unsigned drain_timeout_ms;
	unsigned idle_exit_ms; /* [server] idle_exit_ms: exit when idle this long; 0: never (lifecycle.c) */
	uid_t allowed_uids[CONFIG_MAX_IDS];
	size_t n_allowed_uids;
	gid_t allowed_gids[CONFIG_MAX_IDS];
	size_t n_allowed_gids;
	/* caps */
	uint32_t max_frame_bytes;
	uint32_t max_fds_per_frame;
	uint32_t max_sessions;
	uint32_t max_buffers;
	uint32_t max_tensors;
	uint32_t max_name_len;
	uint32_t max_inflight_saves;
	uint32_t max_inflight_loads; /* loads and lists per session */
	uint32_t max_sessions_per_uid;
	uint64_t max_registered_bytes; /* bytes of buffers one session may register */
	uint32_t hello_timeout_ms;     /* a connection that sends no Hello is closed */
	uint32_t idle_timeout_ms;      /* a control session silent this long is closed; 0: never */
	uint32_t max_write_queue;
	uint32_t max_extra_state;
	uint64_t manifest_cache_bytes; /* decoded manifests of pinned steps kept (mancache.h); 0: off */
	int log_level;
	int log_format;  /* enum log_format */
	bool core_dumps; /* [log] core_dumps: allowed while holding object-store credentials */
	/* policies */
	enum admit_policy policy;
	uint64_t quota_bytes;
	uint32_t quota_pct;
	uint32_t max_parallel_uploads;
	bool memory_tier;
	bool verify_held;     /* CRC-check restores from held copies */
	bool compress;        /* [pool] compress: shards stored compressed, unless a job says otherwise */
	bool incremental;     /* [pool] incremental: unchanged pieces stored as references to older steps */
	uint64_t piece_bytes; /* [pool] piece_bytes: what compressed and incremental shards are cut into */
	struct retention retention;
	struct job_config jobs[CONFIG_MAX_JOBS];
	size_t njobs;
	struct tenant_config tenants[CONFIG_MAX_TENANTS];
	size_t ntenants;
	gid_t admin_gids[CONFIG_MAX_IDS]; /* with root, see every tenant on the main socket */
	size_t n_admin_gids;
	char metrics_listen[128]; /* "127.0.0.1:9464"; empty: off */
	/* [peers]: replicas in other nodes' memory (docs/tiers.md "Tiers"). Off
	 * without listen, or without cert, key and ca (never unauthenticated). */
	char peer_listen[128];    /* "HOST:PORT" to listen on for peers */
	char peer_advertise[128]; /* this node as peers name it; default: listen */
	char peer_list[1024];     /* "HOST:PORT,..." (this node's own entry may be in it) */
	char peer_dns[256];       /* "NAME:PORT": every address NAME resolves to is a peer */
	uint32_t peer_replicas;   /* K peers hold each replicated save */
	char peer_cert[256], peer_key[256], peer_ca[256];
	uint64_t peer_share_bytes;       /* of the pool, for replicas held for peers; */
	uint32_t peer_share_pct;         /* or a share of it (neither: DEFAULT_PEER_SHARE_PCT) */
	uint32_t peer_timeout_ms;        /* a connect, a handshake, a frame (plus its bytes at min_rate) */
	uint64_t peer_min_rate;          /* bytes a second a transfer may not fall below */
	uint32_t peer_max_connections;   /* authenticated peer connections served at once */
	uint32_t peer_max_handshakes;    /* connections not yet authenticated at once (the oldest gives way) */
	uint32_t peer_max_per_address;   /* connections from one address at once */
	uint32_t peer_max_replicas;      /* replicas held for peers */
	uint32_t peer_max_list;          /* copies in one list answer, either way */
	uint32_t peer_max_missing_ranks; /* ranks of a memory-only step asked of peers in vain before a load stops */
	int peer_verify_names;           /* VERIFY_NAMES_*: a peer's certificate must name its HOST (both ways) */
	bool peer_serve_own;             /* peers may read this node's own copies, not only its replicas */
	bool peer_share_reads;           /* restores' storage reads shared across nodes (peer_range.c) */
	uint64_t peer_read_cache;        /* bytes of ranges kept for the peers, at most */
	uint32_t peer_read_cache_s;      /* each kept this long after its last use */
	/* testing only: sleep this long in the middle of every shard write */
	uint32_t debug_store_delay_ms;
	/* testing only: sleep this long in every manifest fetch of the cache */
	uint32_t debug_manifest_delay_ms;
	/* testing only: sleep this long before each storage read a restore leads (readshare.h) */
	uint32_t debug_read_delay_ms;
	uint32_t debug_wait_delay_ms;
	/* testing only: sleep this long at the start of every retention pass after a durable step */
	uint32_t debug_gc_delay_ms;
	/* testing only: the memory for coded pieces (compress.h); 0: half the pool */
	uint64_t debug_compress_budget;
	/* testing only: flip one byte of each copy the memory tier keeps */
	bool debug_corrupt_held;
	/* testing only: flip one byte of each replica sent to a peer, on the way */
	bool debug_corrupt_replica;
	/* testing only: flip one byte of each range sent to a peer, on the way */
	bool debug_corrupt_range;
};

extern const struct config_key config_keys[];
extern const size_t config_nkeys;
extern const struct config_key config_job_keys[JOB_KEY_COUNT];
extern const struct config_key config_tenant_keys[TENANT_KEY_COUNT];

/* The row for [section] name: job sections ("job.x") find job rows, a
 * section with a "*" row finds that for other names. NULL if none. */
const struct config_key *config_key_find(const char *section, const char *name);

void config_defaults(struct config *c);
/* Parse an ini file over the current values. 0, or -errno with a message
 * in err naming the file, line and key. */
int config_load(struct config *c, const char *path, char *err, size_t errlen);
/* Is any retention rule set? */
bool retention_active(const struct retention *r);
/* "block" | "skip" | "coalesce"; 0 or -EINVAL. */
int config_parse_policy(const char *s, enum admit_policy *out);
const char *config_policy_name(enum admit_policy p);
/* Settings for job (per-job section over the defaults). */
void config_job_policy(const struct config *c, const char *job, uint64_t pool_bytes, struct job_policy *out);
/* The tenant whose prefix a kept job name carries ("team-a/llama"), or
 * NULL (docs/security.md "Tenants"). */
const struct tenant_config *config_tenant_of_job(const struct config *c, const char *job);
/* Whether job's copies leave this node sealed with its key or not at all
 * (docs/tiers.md "Peers"): a tenant's. The one place this is decided:
 * a save without a key is then not replicated (save.c), and serve_own
 * never serves its own copies (peer_hold.c). */
bool config_sealed_only(const struct config *c, const char *job);
/* Set one key as the ini file would ("section.key", value): the --set
 * flag. 0 or -errno with a message. */
int config_set(struct config *c, const char *section_key, const char *value, char *err, size_t errlen);
/* The effective configuration, as an ini file. */
void config_print(const struct config *c, FILE *f);
/* SIGHUP: take from next every value that may change while running. A
 * restart-only value that changed keeps its running value and is named in
 * kept ("[pool] staging_bytes, ..."). Returns how many were kept. */
int config_reload(struct config *cur, const struct config *next, char *kept, size_t keptlen);
/* Checks the combination of values; 0 or -EINVAL with a message. */
int config_validate(const struct config *c, char *err, size_t errlen);

#endif
