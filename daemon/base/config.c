#include "config.h"
#include "wire.h"

#include "log.h"
#include "macro.h"

#include <arpa/inet.h>
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool retention_active(const struct retention *r)
{
	return r->keep_last || r->keep_every || r->max_age_s || r->incomplete_grace_s;
}

static const char *const policy_names[] = {
	[POLICY_BLOCK] = "block",
	[POLICY_SKIP] = "skip",
	[POLICY_COALESCE] = "coalesce",
};

int config_parse_policy(const char *s, enum admit_policy *out)
{
	for (size_t i = 0; i < ELEMENTSOF(policy_names); i++)
		if (strcmp(s, policy_names[i]) == 0) {
			*out = (enum admit_policy)i;
			return 0;
		}
	return -EINVAL;
}

const char *config_policy_name(enum admit_policy p)
{
	return (size_t)p < ELEMENTSOF(policy_names) ? policy_names[p] : "block";
}

static struct job_config *job_section(struct config *c, const char *name)
{
	for (size_t i = 0; i < c->njobs; i++)
		if (strcmp(c->jobs[i].name, name) == 0)
			return &c->jobs[i];
	if (c->njobs == CONFIG_MAX_JOBS || strlen(name) >= sizeof(c->jobs[0].name) || name[0] == '\0')
		return NULL;
	struct job_config *j = &c->jobs[c->njobs++];
	memset(j, 0, sizeof(*j));
	snprintf(j->name, sizeof(j->name), "%s", name);
	return j;
}

static struct tenant_config *tenant_section(struct config *c, const char *name)
{
	for (size_t i = 0; i < c->ntenants; i++)
		if (strcmp(c->tenants[i].name, name) == 0)
			return &c->tenants[i];
	/* A tenant's name is its storage prefix: a job name's rules. */
	if (c->ntenants == CONFIG_MAX_TENANTS || strlen(name) > TENANT_NAME_MAX || name[0] == '\0' ||
	    strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != strlen(name))
		return NULL;
	struct tenant_config *t = &c->tenants[c->ntenants++];
	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "%s", name);
	return t;
}

void config_job_policy(const struct config *c, const char *job, uint64_t pool_bytes, struct job_policy *out)
{
	out->policy = c->policy;
	uint64_t qb = c->quota_bytes;
	uint32_t qp = c->quota_pct;
	out->max_inflight_saves = c->max_inflight_saves;
	out->retention = c->retention;
	out->compress = c->compress;
	out->incremental = c->incremental;
	out->piece_bytes = c->piece_bytes;
	/* A tenant's job TENANT/NAME takes [job.NAME] (every tenant's NAME),
	 * then [job.TENANT/NAME] over it. */
	const char *slash = strchr(job, '/');
	for (size_t n = 0; n < 2 * c->njobs; n++) {
		const struct job_config *j = &c->jobs[n % c->njobs];
		if (n < c->njobs ? !(slash && strcmp(j->name, slash + 1) == 0) : strcmp(j->name, job) != 0)
			continue;
#define SET(k) (j->set & (1u << (k)))
		if (SET(JOB_KEY_POLICY))
			out->policy = j->policy;
		if (SET(JOB_KEY_QUOTA)) {
			qb = j->quota_bytes;
			qp = j->quota_pct;
		}
		if (j->max_inflight_saves)
			out->max_inflight_saves = j->max_inflight_saves;
		if (SET(JOB_KEY_KEEP_LAST))
			out->retention.keep_last = j->retention.keep_last;
		if (SET(JOB_KEY_KEEP_EVERY))
			out->retention.keep_every = j->retention.keep_every;
		if (SET(JOB_KEY_MAX_AGE))
			out->retention.max_age_s = j->retention.max_age_s;
		if (SET(JOB_KEY_INCOMPLETE_GRACE))
			out->retention.incomplete_grace_s = j->retention.incomplete_grace_s;
		if (SET(JOB_KEY_COMPRESS))
			out->compress = j->compress;
		if (SET(JOB_KEY_INCREMENTAL))
			out->incremental = j->incremental;
		if (SET(JOB_KEY_PIECE_BYTES))
			out->piece_bytes = j->piece_bytes;
#undef SET
	}
	if (qp)
		qb = pool_bytes / 100 * qp + pool_bytes % 100 * qp / 100;
	out->quota_bytes = qb && qb < pool_bytes ? qb : pool_bytes;
}

const struct tenant_config *config_tenant_of_job(const struct config *c, const char *job)
{
	const char *slash = strchr(job, '/');
	for (size_t i = 0; slash && i < c->ntenants; i++)
		if (strlen(c->tenants[i].name) == (size_t)(slash - job) &&
		    strncmp(c->tenants[i].name, job, (size_t)(slash - job)) == 0)
			return &c->tenants[i];
	return NULL;
}

bool config_sealed_only(const struct config *c, const char *job)
{
	return config_tenant_of_job(c, job) != NULL;
}

static const char *const level_names[] = {
	[LOG_LVL_ERR] = "error",
	[LOG_LVL_WARN] = "warn",
	[LOG_LVL_INFO] = "info",
	[LOG_LVL_DEBUG] = "debug",
};

static const char *const log_format_names[] = {
	[LOG_FORMAT_TEXT] = "text",
	[LOG_FORMAT_JSON] = "json",
};

static const char *const verify_names_names[] = {
	[VERIFY_NAMES_OFF] = "false",
	[VERIFY_NAMES_ON] = "true",
	[VERIFY_NAMES_AUTO] = "auto",
};

static const char *const layout_names[] = {
	[false] = "step",
	[true] = "spread",
};

/* ---- The keys ----
 *
 * One row per key drives parsing (the file and --set), the defaults,
 * printing (--check-config, in this order), SIGHUP (CFG_RESTART: kept
 * until restart, with a warning; else taken) and tests/unit/test_config.c
 * (every row is in deploy/ckptd.conf.example and every key there is a row).
 * Adding a key: a row here, its field in struct config (config.h), and a
 * line in deploy/ckptd.conf.example (commented if it has no default); its
 * DEFAULT_ in config.h if other code needs the default. .flag makes it a
 * command-line flag too (main.c builds those and --help from the rows).
 * A [job.NAME] key: a row in
 * config_job_keys[], its enum job_key and field in struct job_config
 * (config.h), and what it overrides in config_job_policy(). */

#define SECOND(st, f) .off2 = offsetof(struct st, f), .size2 = sizeof(((struct st *)0)->f)
#define NAMES(a) .names = (a), .nnames = sizeof(a) / sizeof((a)[0])
#define KEY(sec, key, ty, fld, fl, ...) \
	{ \
		.section = sec, .name = key, .type = &ty, .off = offsetof(struct config, fld), \
		.size = sizeof(((struct config *)0)->fld), .flags = fl, __VA_ARGS__ \
	}

const struct config_key config_keys[] = {
	KEY("server", "socket", cfg_str, socket_path, CFG_RESTART, .def_str = DEFAULT_SOCKET_PATH, .flag = "socket",
	    .flag_arg = "PATH", .help = "Unix socket to listen on"),
	KEY("server", "state_dir", cfg_str, state_dir, CFG_RESTART, .def_str = DEFAULT_STATE_DIR, .flag = "state-dir",
	    .flag_arg = "DIR", .help = "daemon state: the journal"),
	KEY("server", "allowed_uids", cfg_ids, allowed_uids, CFG_RESTART, SECOND(config, n_allowed_uids),
	    .help = "uids that may connect (SO_PEERCRED); default: the daemon's own and root"),
	KEY("server", "allowed_gids", cfg_ids, allowed_gids, CFG_RESTART, SECOND(config, n_allowed_gids),
	    .help = "gids that may connect"),
	KEY("server", "admin_gids", cfg_ids, admin_gids, CFG_RESTART, SECOND(config, n_admin_gids),
	    .help = "with root, the gids that see every tenant on the main socket"),
	KEY("server", "drain_timeout_ms", cfg_u32, drain_timeout_ms, 0, .def = DEFAULT_DRAIN_TIMEOUT_MS,
	    .help = "how long a stop waits for saves to become durable"),
	KEY("server", "idle_exit_ms", cfg_u32, idle_exit_ms, CFG_RESTART,
	    .help = "exit once no session, save or load was seen this long (a daemon started on demand); 0: never"),

	KEY("storage", "url", cfg_str, storage_url, CFG_RESTART, .flag = "storage", .flag_arg = "URL",
	    .help = "where checkpoints go: file:///abs/path, s3://bucket/prefix, gs://bucket/prefix"),
	KEY("storage", "layout", cfg_enum, layout_spread, CFG_RESTART, NAMES(layout_names),
	    .help = "step: shards beside their manifests; spread: under 256 key prefixes"),
	KEY("storage", "file_mode", cfg_mode, file_mode, CFG_RESTART, .def = DEFAULT_FILE_MODE,
	    .help = "file://: mode of checkpoint files, octal (directories: x where r); 0640 to share a group"),
	KEY("storage", "probe", cfg_bool, storage_probe, CFG_RESTART, .def = true,
	    .help = "object stores: check at start that create-only writes are refused, byte ranges honoured and "
		    "listings paged (15 requests); a store that fails is refused"),
	KEY("storage", "allow_unconditional", cfg_bool, allow_unconditional, CFG_RESTART,
	    .help = "start on a store that ignores create-only writes, losing 'a complete step is never "
		    "overwritten' and 'all ranks restore one step' (docs/storage.md \"Object storage\")"),
	KEY("storage", "*", cfg_opts, storage_opts, CFG_RESTART,
	    .help = "any other key: an option of the s3:// or gs:// backend (endpoint, region, part_size ...)"),

	KEY("pool", "staging_bytes", cfg_size, staging_bytes, CFG_RESTART, .def = DEFAULT_STAGING_BYTES,
	    .flag = "staging-bytes", .flag_arg = "SIZE", .help = "pinned staging pool"),
	KEY("pool", "chunk_bytes", cfg_size, chunk_bytes, CFG_RESTART, .def = DEFAULT_CHUNK_BYTES,
	    .flag = "chunk-bytes", .flag_arg = "SIZE",
	    .help = "pool chunk and checksum unit (the upload part size is the URL's part_size)"),
	KEY("pool", "copy_threads", cfg_u32, copy_threads, CFG_RESTART, .def = DEFAULT_COPY_THREADS,
	    .help = "threads copying into the pool"),
	KEY("pool", "admit_timeout_ms", cfg_u32, admit_timeout_ms, 0, .def = DEFAULT_ADMIT_TIMEOUT_MS,
	    .help = "how long a save may wait for pool space (block policy)"),
	KEY("pool", "policy", cfg_enum, policy, 0, .def = POLICY_BLOCK, NAMES(policy_names),
	    .help = "a save when the pool is full of data not yet durable: block | skip | coalesce"),
	KEY("pool", "quota", cfg_quota, quota_bytes, 0, SECOND(config, quota_pct),
	    .help = "the most one job may hold not yet durable: bytes or a share (50%)"),
	KEY("pool", "max_parallel_uploads", cfg_u32, max_parallel_uploads, 0, .def = DEFAULT_MAX_PARALLEL_UPLOADS,
	    .help = "uploads at once"),
	KEY("pool", "memory_tier", cfg_bool, memory_tier, 0, .def = true,
	    .help = "keep each (job, rank)'s newest durable step in the pool for restores"),
	KEY("pool", "verify_held", cfg_bool, verify_held, 0, .def = true,
	    .help = "CRC-check restores from the memory tier as from storage"),
	KEY("pool", "compress", cfg_bool, compress, 0, .def = false,
	    .help = "store shards compressed (byte planes and zstd), losslessly, on upload"),
	KEY("pool", "incremental", cfg_bool, incremental, 0, .def = false,
	    .help = "store pieces unchanged since a rank's previous step as references to it"),
	KEY("pool", "piece_bytes", cfg_size, piece_bytes, 0, .def = DEFAULT_PIECE_BYTES,
	    .help = "the pieces compressed and incremental shards are cut into (4K..64M)"),

	KEY("retention", "keep_last", cfg_u32, retention.keep_last, 0, .help = "the newest N complete steps"),
	KEY("retention", "keep_every", cfg_u32, retention.keep_every, 0, .help = "and every step divisible by K"),
	KEY("retention", "max_age", cfg_duration, retention.max_age_s, 0,
	    .help = "complete steps older than this go (s, m, h, d)"),
	KEY("retention", "incomplete_grace", cfg_duration, retention.incomplete_grace_s, 0,
	    .help = "incomplete steps older than this go"),

	KEY("limits", "max_frame_bytes", cfg_u32, max_frame_bytes, CFG_RESTART, .def = DEFAULT_MAX_FRAME_BYTES,
	    .help = "largest request frame"),
	KEY("limits", "max_fds_per_frame", cfg_u32, max_fds_per_frame, CFG_RESTART, .def = DEFAULT_MAX_FDS_PER_FRAME,
	    .help = "fds one frame may carry (1..253)"),
	KEY("limits", "max_sessions", cfg_u32, max_sessions, CFG_RESTART, .def = DEFAULT_MAX_SESSIONS,
	    .help = "client connections at once"),
	KEY("limits", "max_buffers", cfg_u32, max_buffers, CFG_RESTART, .def = DEFAULT_MAX_BUFFERS,
	    .help = "registered buffers per session"),
	KEY("limits", "max_tensors", cfg_u32, max_tensors, CFG_RESTART, .def = DEFAULT_MAX_TENSORS,
	    .help = "tensors in one save"),
	KEY("limits", "max_name_len", cfg_u32, max_name_len, CFG_RESTART, .def = DEFAULT_MAX_NAME_LEN,
	    .help = "longest tensor name"),
	KEY("limits", "max_inflight_saves", cfg_u32, max_inflight_saves, 0, .def = DEFAULT_MAX_INFLIGHT_SAVES,
	    .help = "saves of one rank of a job in flight at once"),
	KEY("limits", "max_inflight_loads", cfg_u32, max_inflight_loads, 0, .def = DEFAULT_MAX_INFLIGHT_LOADS,
	    .help = "loads and lists of one session in flight at once"),
	KEY("limits", "max_sessions_per_uid", cfg_u32, max_sessions_per_uid, 0, .def = DEFAULT_MAX_SESSIONS_PER_UID,
	    .help = "client connections of one uid at once"),
	KEY("limits", "max_registered_bytes", cfg_size, max_registered_bytes, 0, .def = DEFAULT_MAX_REGISTERED_BYTES,
	    .help = "bytes of buffers one session may have registered"),
	KEY("limits", "hello_timeout_ms", cfg_u32, hello_timeout_ms, 0, .def = DEFAULT_HELLO_TIMEOUT_MS,
	    .help = "a connection that sends no Hello within this is closed"),
	KEY("limits", "idle_timeout_ms", cfg_u32, idle_timeout_ms, 0, .def = DEFAULT_IDLE_TIMEOUT_MS,
	    .help = "a control session (ckptctl) silent this long is closed; 0: never"),
	KEY("limits", "max_write_queue", cfg_u32, max_write_queue, CFG_RESTART, .def = DEFAULT_MAX_WRITE_QUEUE,
	    .help = "bytes of replies queued to one session"),
	KEY("limits", "max_extra_state", cfg_u32, max_extra_state, CFG_RESTART, .def = DEFAULT_MAX_EXTRA_STATE,
	    .help = "bytes of extra state in one save"),
	KEY("limits", "manifest_cache_bytes", cfg_size, manifest_cache_bytes, CFG_RESTART,
	    .def = DEFAULT_MANIFEST_CACHE_BYTES, .help = "decoded manifests of pinned steps kept in memory; 0: off"),

	KEY("metrics", "listen", cfg_str, metrics_listen, CFG_RESTART, .flag = "metrics-listen",
	    .flag_arg = "HOST:PORT", .help = "serve Prometheus metrics on http://HOST:PORT/metrics; empty: off"),

	KEY("peers", "listen", cfg_str, peer_listen, CFG_RESTART,
	    .help = "HOST:PORT for peer daemons (TLS with client certificates); empty: replication off"),
	KEY("peers", "advertise", cfg_str, peer_advertise, CFG_RESTART,
	    .help = "this node's HOST:PORT as its peers name it (its place in the ring); default: listen"),
	KEY("peers", "peers", cfg_str, peer_list, CFG_RESTART,
	    .help = "the peers, HOST:PORT,... (this node's own entry may be among them)"),
	KEY("peers", "dns", cfg_str, peer_dns, CFG_RESTART,
	    .help = "NAME:PORT: every address NAME resolves to is a peer (a Kubernetes headless Service)"),
	KEY("peers", "replicas", cfg_u32, peer_replicas, CFG_RESTART, .def = DEFAULT_PEER_REPLICAS,
	    .help = "peers that hold a copy of each replicated save (the next ones in the ring)"),
	KEY("peers", "cert", cfg_str, peer_cert, CFG_RESTART, .help = "this node's certificate (PEM)"),
	KEY("peers", "key", cfg_str, peer_key, CFG_RESTART, .help = "its private key (PEM)"),
	KEY("peers", "ca", cfg_str, peer_ca, CFG_RESTART,
	    .help = "the CA (PEM) that signed every peer's certificate; a peer without one is refused"),
	KEY("peers", "share", cfg_quota, peer_share_bytes, CFG_RESTART, SECOND(config, peer_share_pct),
	    .help = "the most of the pool replicas for peers may hold: bytes or a share (default 25%)"),
	KEY("peers", "timeout_ms", cfg_u32, peer_timeout_ms, CFG_RESTART, .def = DEFAULT_PEER_TIMEOUT_MS,
	    .help = "a connect, a TLS handshake, or a frame (plus its bytes at min_rate), at most"),
	KEY("peers", "min_rate", cfg_size, peer_min_rate, CFG_RESTART, .def = DEFAULT_PEER_MIN_RATE,
	    .help = "bytes a second a peer transfer may not fall below (its deadline: timeout_ms + bytes / rate)"),
	KEY("peers", "max_connections", cfg_u32, peer_max_connections, CFG_RESTART, .def = DEFAULT_PEER_MAX_CONNECTIONS,
	    .help = "authenticated peer connections served at once"),
	KEY("peers", "max_handshakes", cfg_u32, peer_max_handshakes, CFG_RESTART, .def = DEFAULT_PEER_MAX_HANDSHAKES,
	    .help = "connections still in their TLS handshake at once; the oldest gives way to a new one"),
	KEY("peers", "max_per_address", cfg_u32, peer_max_per_address, CFG_RESTART, .def = DEFAULT_PEER_MAX_PER_ADDRESS,
	    .help = "peer connections from one address at once"),
	KEY("peers", "verify_names", cfg_enum, peer_verify_names, CFG_RESTART, .def = VERIFY_NAMES_AUTO,
	    NAMES(verify_names_names),
	    .help = "a peer's certificate must name the HOST it advertises (an IP or DNS subjectAltName), both ways: "
		    "true | false | auto (true when this node's own certificate names its host)"),
	KEY("peers", "serve_own", cfg_bool, peer_serve_own, CFG_RESTART,
	    .help = "peers may read this node's own copies (memory-only steps resharded across nodes), not only the "
		    "replicas it holds for them"),
	KEY("peers", "max_replicas", cfg_u32, peer_max_replicas, CFG_RESTART, .def = DEFAULT_PEER_MAX_REPLICAS,
	    .help = "replicas held for peers at once (their bytes are capped by share)"),
	KEY("peers", "max_list", cfg_u32, peer_max_list, CFG_RESTART, .def = DEFAULT_PEER_MAX_LIST,
	    .help = "copies one list answer names, newest first; a peer's answer with more is not used"),
	KEY("peers", "max_missing_ranks", cfg_u32, peer_max_missing_ranks, CFG_RESTART,
	    .def = DEFAULT_PEER_MAX_MISSING_RANKS,
	    .help = "saved ranks of a memory-only step a load asks the peers for in vain before it stops asking"),
	KEY("peers", "share_reads", cfg_bool, peer_share_reads, CFG_RESTART, .def = true,
	    .help = "restores read each range of a shard from storage once for all the nodes, and pass it over the "
		    "peer links (jobs of the main store without a secret)"),
	KEY("peers", "read_cache", cfg_size, peer_read_cache, CFG_RESTART, .def = DEFAULT_PEER_READ_CACHE,
	    .help = "bytes of ranges this node read for the others kept in memory, at most (share_reads)"),
	KEY("peers", "read_cache_s", cfg_u32, peer_read_cache_s, CFG_RESTART, .def = DEFAULT_PEER_READ_CACHE_S,
	    .help = "seconds a range kept for the others stays after its last use (share_reads)"),

	KEY("log", "level", cfg_enum, log_level, 0, .def = LOG_LVL_INFO, NAMES(level_names), .flag = "log-level",
	    .flag_arg = "LEVEL", .help = "error | warn | info | debug"),
	KEY("log", "core_dumps", cfg_bool, core_dumps, CFG_RESTART,
	    .help = "allow core dumps with object-store credentials in memory (they would be in the dump)"),
	KEY("log", "format", cfg_enum, log_format, 0, .def = LOG_FORMAT_TEXT, NAMES(log_format_names),
	    .flag = "log-format", .flag_arg = "FORMAT",
	    .help = "text (<N> priority prefixes) | json (one object per line); the journal when stderr is one"),

	KEY("debug", "store_delay_ms", cfg_u32, debug_store_delay_ms, CFG_RESTART | CFG_DEBUG,
	    .help = "tests only: pause in the middle of each shard write"),
	KEY("debug", "manifest_delay_ms", cfg_u32, debug_manifest_delay_ms, CFG_RESTART | CFG_DEBUG,
	    .help = "tests only: pause in each manifest fetch of the cache"),
	KEY("debug", "read_delay_ms", cfg_u32, debug_read_delay_ms, CFG_RESTART | CFG_DEBUG,
	    .help = "tests only: pause before each storage read a restore leads (shared with the node's others)"),
	KEY("debug", "wait_delay_ms", cfg_u32, debug_wait_delay_ms, CFG_RESTART | CFG_DEBUG,
	    .help = "tests only: pause after each listing of a step a wait's poll makes"),
	KEY("debug", "gc_delay_ms", cfg_u32, debug_gc_delay_ms, CFG_RESTART | CFG_DEBUG,
	    .help = "tests only: pause at the start of each retention pass after a durable step"),
	KEY("debug", "compress_budget_bytes", cfg_size, debug_compress_budget, CFG_RESTART | CFG_DEBUG,
	    .help = "tests only: the memory for coded pieces waiting for upload (0: half the pool)"),
	KEY("debug", "corrupt_held", cfg_bool, debug_corrupt_held, CFG_RESTART | CFG_DEBUG,
	    .help = "tests only: flip one byte of each copy the memory tier keeps"),
	KEY("debug", "corrupt_replica", cfg_bool, debug_corrupt_replica, CFG_RESTART | CFG_DEBUG,
	    .help = "tests only: flip one byte of each replica sent to a peer, on the wire"),
	KEY("debug", "corrupt_range", cfg_bool, debug_corrupt_range, CFG_RESTART | CFG_DEBUG,
	    .help = "tests only: flip one byte of each range sent to a peer that restores it, on the wire"),
};
const size_t config_nkeys = ELEMENTSOF(config_keys);

#define JOB_KEY(key, ty, fld, ...) \
	{ \
		.name = key, .type = &ty, .off = offsetof(struct job_config, fld), \
		.size = sizeof(((struct job_config *)0)->fld), __VA_ARGS__ \
	}

/* [job.NAME]: each key overrides its namesake of [pool], [limits] or
 * [retention] for that job; config_job_policy() applies them. */
const struct config_key config_job_keys[JOB_KEY_COUNT] = {
	[JOB_KEY_POLICY] = JOB_KEY("policy", cfg_enum, policy, NAMES(policy_names), .help = "block | skip | coalesce"),
	[JOB_KEY_QUOTA] = JOB_KEY("quota", cfg_quota, quota_bytes, SECOND(job_config, quota_pct),
				  .help = "bytes or a share of the pool (50%)"),
	[JOB_KEY_MAX_INFLIGHT_SAVES] = JOB_KEY("max_inflight_saves", cfg_u32, max_inflight_saves,
					       .help = "saves of one rank in flight at once; 0: [limits]"),
	[JOB_KEY_KEEP_LAST] = JOB_KEY("keep_last", cfg_u32, retention.keep_last, .help = "the newest N complete steps"),
	[JOB_KEY_KEEP_EVERY] = JOB_KEY("keep_every", cfg_u32, retention.keep_every,
				       .help = "and every step divisible by K"),
	[JOB_KEY_MAX_AGE] = JOB_KEY("max_age", cfg_duration, retention.max_age_s,
				    .help = "complete steps older than this go"),
	[JOB_KEY_INCOMPLETE_GRACE] = JOB_KEY("incomplete_grace", cfg_duration, retention.incomplete_grace_s,
					     .help = "incomplete steps older than this go"),
	[JOB_KEY_COMPRESS] = JOB_KEY("compress", cfg_bool, compress, .help = "store shards compressed on upload"),
	[JOB_KEY_INCREMENTAL] = JOB_KEY("incremental", cfg_bool, incremental,
					.help = "store unchanged pieces as references to the previous step"),
	[JOB_KEY_PIECE_BYTES] = JOB_KEY("piece_bytes", cfg_size, piece_bytes,
					.help = "the pieces its shards are cut into (4K..64M)"),
};

#define TENANT_KEY(key, ty, fld, ...) \
	{ \
		.name = key, .type = &ty, .off = offsetof(struct tenant_config, fld), \
		.size = sizeof(((struct tenant_config *)0)->fld), .flags = CFG_RESTART, __VA_ARGS__ \
	}

/* [tenant.NAME] (docs/security.md "Tenants"); read at start only. */
const struct config_key config_tenant_keys[TENANT_KEY_COUNT] = {
	[TENANT_KEY_UIDS] = TENANT_KEY("uids", cfg_ids, uids, SECOND(tenant_config, nuids),
				       .help = "uids that are this tenant on the main socket"),
	[TENANT_KEY_GIDS] = TENANT_KEY("gids", cfg_ids, gids, SECOND(tenant_config, ngids),
				       .help = "gids that are this tenant on the main socket"),
	[TENANT_KEY_SOCKET] = TENANT_KEY("socket", cfg_str, socket,
					 .help = "its own socket: whoever connects there is this tenant"),
	[TENANT_KEY_QUOTA] = TENANT_KEY("quota", cfg_size, quota_bytes,
					.help = "pool bytes its saves may hold until durable; 0: no cap"),
	[TENANT_KEY_MAX_INFLIGHT_SAVES] = TENANT_KEY("max_inflight_saves", cfg_u32, max_inflight_saves,
						     .help = "saves of all its jobs in flight at once; 0: no cap"),
	[TENANT_KEY_MAX_REGISTERED_BYTES] = TENANT_KEY(
		"max_registered_bytes", cfg_size, max_registered_bytes,
		.help = "bytes of buffers all its sessions may have registered; 0: no cap"),
	[TENANT_KEY_STORAGE] = TENANT_KEY("storage", cfg_str, storage,
					  .help = "its own storage URL (s3://, gs://, file://); default: [storage]'s"),
	[TENANT_KEY_STORAGE_OPTS] = TENANT_KEY("*", cfg_opts, storage_opts,
					       .help = "any other key: an option of its storage (endpoint, "
						       "credentials_file, profile ...)"),
};

static const struct config_key *find_in(const struct config_key *t, size_t n, const char *section, const char *name)
{
	const struct config_key *any = NULL;
	for (size_t i = 0; i < n; i++) {
		if (section && strcmp(t[i].section, section) != 0)
			continue;
		if (strcmp(t[i].name, name) == 0)
			return &t[i];
		if (strcmp(t[i].name, "*") == 0)
			any = &t[i];
	}
	return any;
}

const struct config_key *config_key_find(const char *section, const char *name)
{
	if (strncmp(section, "job.", 4) == 0)
		return find_in(config_job_keys, JOB_KEY_COUNT, NULL, name);
	if (strncmp(section, "tenant.", 7) == 0)
		return find_in(config_tenant_keys, TENANT_KEY_COUNT, NULL, name);
	return find_in(config_keys, config_nkeys, section, name);
}

void config_defaults(struct config *c)
{
	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < config_nkeys; i++) {
		const struct config_key *k = &config_keys[i];
		if (k->def_str)
			snprintf(FLD(c, k->off), k->size, "%s", k->def_str);
		else if (k->def)
			cfg_set_uint(FLD(c, k->off), k->size, k->def);
	}
	c->allowed_uids[c->n_allowed_uids++] = getuid();
	if (getuid() != 0)
		c->allowed_uids[c->n_allowed_uids++] = 0;
}

/* ---- Parsing, printing, reloading: loops over the rows ---- */

struct ini_ctx {
	struct config *c;
	int err;
	char *msg;
	size_t msglen;
	bool file; /* from the config file: inline comments are stripped */
};

/* value without an inline comment: a '#' or ';' at its start or after
 * white space, and the white space before it (as the example file writes
 * "keep_last = 3   # the newest N"). Other '#' and ';' stay ("a#b", URLs). */
static const char *strip_comment(const char *value, char *buf, size_t len)
{
	size_t n = 0;
	for (const char *p = value; *p && n + 1 < len; p++) {
		if ((*p == '#' || *p == ';') && (p == value || isspace((unsigned char)p[-1])))
			break;
		buf[n++] = *p;
	}
	while (n > 0 && isspace((unsigned char)buf[n - 1]))
		n--;
	buf[n] = '\0';
	return buf;
}

static int on_ini(void *user, const char *section, const char *name, const char *value)
{
	struct ini_ctx *x = user;
	void *base = x->c;
	int r = 0;
	char clean[4096];
	if (x->file && strlen(value) >= sizeof(clean))
		r = -ENAMETOOLONG;
	else if (x->file)
		value = strip_comment(value, clean, sizeof(clean));
	if (r == 0 && strncmp(section, "job.", 4) == 0) {
		base = job_section(x->c, section + 4);
		if (base == NULL)
			r = -E2BIG;
	} else if (r == 0 && strncmp(section, "tenant.", 7) == 0) {
		base = tenant_section(x->c, section + 7);
		if (base == NULL)
			r = -EINVAL; /* a bad name, or too many */
	}
	const struct config_key *k = r ? NULL : config_key_find(section, name);
	if (r == 0 && k == NULL)
		r = -ENOENT;
	if (r == 0)
		r = k->type->parse(k, base, name, value);
	if (r == 0 && base != x->c && strncmp(section, "job.", 4) == 0)
		((struct job_config *)base)->set |= 1u << (k - config_job_keys);
	else if (r == 0 && base != x->c)
		((struct tenant_config *)base)->set |= 1u << (k - config_tenant_keys);
	if (r < 0 && x->err == 0) {
		x->err = r;
		snprintf(x->msg, x->msglen, "[%s] %s = %s: %s", section, name, value,
			 r == -ENOENT ? "unknown key" : strerror(-r));
	}
	return r == 0;
}

int config_load(struct config *c, const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "re");
	if (f == NULL) {
		int e = errno;
		snprintf(err, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	char msg[512] = "";
	struct ini_ctx x = { .c = c, .msg = msg, .msglen = sizeof(msg), .file = true };
	int line = ini_parse_file(f, on_ini, &x);
	fclose(f);
	if (line != 0 || x.err) {
		snprintf(err, errlen, "%s:%d: %s", path, line > 0 ? line : 0, msg[0] ? msg : "syntax error");
		return x.err ? x.err : -EINVAL;
	}
	return 0;
}

int config_set(struct config *c, const char *section_key, const char *value, char *err, size_t errlen)
{
	char sec[160];
	const char *dot = strrchr(section_key, '.');
	if (dot == NULL || dot == section_key || (size_t)(dot - section_key) >= sizeof(sec) || dot[1] == '\0') {
		snprintf(err, errlen, "--set %s: want SECTION.KEY=VALUE", section_key);
		return -EINVAL;
	}
	memcpy(sec, section_key, (size_t)(dot - section_key));
	sec[dot - section_key] = '\0';
	char msg[512] = "";
	struct ini_ctx x = { .c = c, .msg = msg, .msglen = sizeof(msg) };
	on_ini(&x, sec, dot + 1, value);
	if (x.err) {
		snprintf(err, errlen, "--set %s=%s: %s", section_key, value, msg);
		return x.err;
	}
	return 0;
}

/* The rows with (flags & mask) == want, a "[section]" before each new one. */
static void print_rows(const struct config *c, FILE *f, unsigned mask, unsigned want, bool *first)
{
	const char *sec = NULL;
	for (size_t i = 0; i < config_nkeys; i++) {
		const struct config_key *k = &config_keys[i];
		if ((k->flags & mask) != want)
			continue;
		if (sec == NULL || strcmp(sec, k->section) != 0) {
			fprintf(f, "%s[%s]\n", *first ? "" : "\n", k->section);
			*first = false;
			sec = k->section;
		}
		k->type->print(k, c, f);
	}
}

void config_print(const struct config *c, FILE *f)
{
	bool first = true;
	print_rows(c, f, CFG_DEBUG, 0, &first);
	for (size_t i = 0; i < c->njobs; i++) {
		const struct job_config *j = &c->jobs[i];
		fprintf(f, "\n[job.%s]\n", j->name);
		for (size_t k = 0; k < JOB_KEY_COUNT; k++)
			if (j->set & (1u << k))
				config_job_keys[k].type->print(&config_job_keys[k], j, f);
	}
	for (size_t i = 0; i < c->ntenants; i++) {
		const struct tenant_config *t = &c->tenants[i];
		fprintf(f, "\n[tenant.%s]\n", t->name);
		for (size_t k = 0; k < TENANT_KEY_COUNT; k++)
			if (t->set & (1u << k))
				config_tenant_keys[k].type->print(&config_tenant_keys[k], t, f);
	}
	bool debug = false;
	for (size_t i = 0; i < config_nkeys; i++)
		if (config_keys[i].flags & CFG_DEBUG)
			debug |= cfg_key_uint(&config_keys[i], c) != 0;
	if (debug)
		print_rows(c, f, CFG_DEBUG, CFG_DEBUG, &first);
}

int config_reload(struct config *cur, const struct config *next, char *kept, size_t keptlen)
{
	int nkept = 0;
	size_t l = 0;
	if (keptlen)
		kept[0] = '\0';
	for (size_t i = 0; i < config_nkeys; i++) {
		const struct config_key *k = &config_keys[i];
		if (k->type->same(k, cur, next))
			continue;
		if (k->flags & CFG_RESTART) {
			int n = snprintf(kept + l, keptlen - l, "%s[%s] %s", nkept ? ", " : "", k->section,
					 strcmp(k->name, "*") ? k->name : "options");
			if (n > 0 && (size_t)n < keptlen - l)
				l += (size_t)n;
			nkept++;
			continue;
		}
		memcpy(FLD(cur, k->off), CFLD(next, k->off), k->size);
		if (k->size2)
			memcpy(FLD(cur, k->off2), CFLD(next, k->off2), k->size2);
	}
	/* Every [job.NAME] key may change while running. */
	memcpy(cur->jobs, next->jobs, sizeof(next->jobs));
	cur->njobs = next->njobs;
	/* Tenants are read at start only (their sockets, their sessions). */
	if (cur->ntenants != next->ntenants || memcmp(cur->tenants, next->tenants, sizeof(cur->tenants)) != 0) {
		int n = snprintf(kept + l, keptlen - l, "%s[tenant.*]", nkept ? ", " : "");
		if (n > 0 && (size_t)n < keptlen - l)
			l += (size_t)n;
		nkept++;
	}
	return nkept;
}

/* "HOST:PORT" as metrics_listen takes it: a numeric IPv4 address or an
 * [IPv6] one, and a port 0..65535. 0 or -EINVAL. */
static int metrics_addr_check(const char *a)
{
	const char *colon = strrchr(a, ':');
	if (colon == NULL || colon == a || colon[1] == '\0')
		return -EINVAL;
	char *end;
	errno = 0;
	long port = strtol(colon + 1, &end, 10);
	if (*end || errno || port < 0 || port > 65535)
		return -EINVAL;
	char host[64];
	size_t hl = (size_t)(colon - a);
	if (hl >= sizeof(host))
		return -EINVAL;
	memcpy(host, a, hl);
	host[hl] = '\0';
	unsigned char buf[16];
	if (host[0] == '[') {
		if (hl < 3 || host[hl - 1] != ']')
			return -EINVAL;
		host[hl - 1] = '\0';
		return inet_pton(AF_INET6, host + 1, buf) == 1 ? 0 : -EINVAL;
	}
	return inet_pton(AF_INET, host, buf) == 1 ? 0 : -EINVAL;
}

int config_validate(const struct config *c, char *err, size_t errlen)
{
	bool bad_piece = c->piece_bytes < PIECE_BYTES_MIN || c->piece_bytes > PIECE_BYTES_MAX ||
			 c->piece_bytes % PIECE_BYTES_MIN;
	for (size_t i = 0; i < c->njobs; i++)
		if (c->jobs[i].set & (1u << JOB_KEY_PIECE_BYTES))
			bad_piece |= c->jobs[i].piece_bytes < PIECE_BYTES_MIN ||
				     c->jobs[i].piece_bytes > PIECE_BYTES_MAX ||
				     c->jobs[i].piece_bytes % PIECE_BYTES_MIN;
	if (bad_piece) {
		snprintf(err, errlen, "piece_bytes must be a multiple of 4K from 4K to 64M");
		return -EINVAL;
	}
	if (c->chunk_bytes < 4096 || (c->chunk_bytes & 4095)) {
		snprintf(err, errlen, "chunk_bytes %" PRIu64 " must be a multiple of 4096", c->chunk_bytes);
		return -EINVAL;
	}
	if (c->staging_bytes < c->chunk_bytes) {
		snprintf(err, errlen, "staging_bytes %" PRIu64 " is smaller than one chunk (%" PRIu64 ")",
			 c->staging_bytes, c->chunk_bytes);
		return -EINVAL;
	}
	if (c->copy_threads < 1 || c->copy_threads > 64) {
		snprintf(err, errlen, "copy_threads must be 1..64");
		return -EINVAL;
	}
	if (c->max_parallel_uploads < 1 || c->max_parallel_uploads > 64) {
		snprintf(err, errlen, "max_parallel_uploads must be 1..64");
		return -EINVAL;
	}
	if (c->max_frame_bytes < 1024 || c->max_fds_per_frame < 1 || c->max_sessions < 1 || c->max_buffers < 1 ||
	    c->max_tensors < 1 || c->max_name_len < 1 || c->max_inflight_saves < 1 || c->max_inflight_loads < 1 ||
	    c->max_sessions_per_uid < 1 || c->max_registered_bytes < 1 || c->hello_timeout_ms < 100) {
		snprintf(err, errlen, "a limit is too small");
		return -EINVAL;
	}
	if (c->max_fds_per_frame > WIRE_MAX_FDS) {
		snprintf(err, errlen, "max_fds_per_frame must be 1..253 (the kernel's SCM_MAX_FD)");
		return -EINVAL;
	}
	if (c->storage_url[0] == '\0') {
		snprintf(err, errlen, "no storage URL (--storage or [storage] url)");
		return -EINVAL;
	}
	if (c->socket_path[0] != '/' || c->state_dir[0] != '/') {
		snprintf(err, errlen, "%s '%s' must be an absolute path",
			 c->socket_path[0] != '/' ? "socket" : "state_dir",
			 c->socket_path[0] != '/' ? c->socket_path : c->state_dir);
		return -EINVAL;
	}
	if (c->metrics_listen[0] && metrics_addr_check(c->metrics_listen) < 0) {
		snprintf(err, errlen, "[metrics] listen '%s': want HOST:PORT (an IPv4 address or [IPv6], port 0-65535)",
			 c->metrics_listen);
		return -EINVAL;
	}
	for (size_t i = 0; i < c->ntenants; i++) {
		const struct tenant_config *t = &c->tenants[i];
		if (t->storage_opts[0] && t->storage[0] == '\0') {
			snprintf(err, errlen, "[tenant.%s] sets storage options (%s) but no storage", t->name,
				 t->storage_opts);
			return -EINVAL;
		}
		if (t->nuids == 0 && t->ngids == 0 && t->socket[0] == '\0') {
			snprintf(err, errlen, "[tenant.%s] names no uids, gids or socket: nobody could be it", t->name);
			return -EINVAL;
		}
		if (t->socket[0] && (t->socket[0] != '/' || strcmp(t->socket, c->socket_path) == 0)) {
			snprintf(err, errlen,
				 "[tenant.%s] socket '%s' must be an absolute path other than the main socket", t->name,
				 t->socket);
			return -EINVAL;
		}
		for (size_t j = 0; j < i; j++)
			if (t->socket[0] && strcmp(t->socket, c->tenants[j].socket) == 0) {
				snprintf(err, errlen, "[tenant.%s] and [tenant.%s] share the socket %s",
					 c->tenants[j].name, t->name, t->socket);
				return -EINVAL;
			}
	}
	return 0;
}
