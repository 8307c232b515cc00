/* ckptd: the node-local checkpoint agent. */
#include "config.h"
#include "ckpt_version.h"
#include "compress.h"
#include "gc.h"
#include "cudadev.h"
#include "daemon.h"
#include "metrics.h"
#include "msgtab.h"
#include "lifecycle.h"
#include "hostbuf.h"
#include "journal.h"
#include "log.h"
#include "mancache.h"
#include "rangecache.h"
#include "readshare.h"
#include "peer.h"
#include "persist.h"
#include "pool.h"
#include "probe.h"
#include "save.h"
#include "server.h"
#include "session.h"
#include "wait_req.h"
#include "backends.h"
#include "store.h"
#include "workq.h"
#include "macro.h"
#include "fsutil.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

static void on_recovered(void *ctx, const char *what)
{
	struct daemon *d = ctx;
	log_warn("recovery: removed %s", what);
	if (d->stats.nrecovered < RECOVERED_LIST)
		snprintf(d->stats.recovered[d->stats.nrecovered++], sizeof(d->stats.recovered[0]), "%s", what);
}

/* A key's default for --help: "1G", "info", "/var/lib/ckptd"; "" if none. */
static const char *default_text(const struct config_key *k, char *buf, size_t len)
{
	static const char units[] = "KMGT";
	uint64_t v = k->def;
	int u = -1;
	if (k->def_str)
		return k->def_str;
	if (k->names)
		return k->def < k->nnames && k->names[k->def] ? k->names[k->def] : "";
	if (v == 0)
		return "";
	while (u < 3 && v % 1024 == 0) {
		v /= 1024;
		u++;
	}
	snprintf(buf, len, "%" PRIu64 "%.*s", v, u >= 0, u >= 0 ? &units[u] : "");
	return buf;
}

#ifdef CKPT_HAVE_CUDA
#define CUDA_COMPILED_IN 1
#else
#define CUDA_COMPILED_IN 0
#endif

static void usage(FILE *f)
{
	fprintf(f, "usage: ckptd [--version] [--config FILE] [--set SECTION.KEY=VALUE]... [--check-config] "
		   "[--probe-storage]");
	int col = 80;
	for (size_t i = 0; i < config_nkeys; i++) {
		const struct config_key *k = &config_keys[i];
		if (k->flag == NULL)
			continue;
		int n = (int)(strlen(k->flag) + strlen(k->flag_arg) + 6);
		if (col + n > 78) {
			fprintf(f, "\n            ");
			col = 12;
		}
		fprintf(f, " [--%s %s]", k->flag, k->flag_arg);
		col += n;
	}
	fprintf(f,
		"\n  --config FILE         ini file (default %s, if it exists)\n"
		"  --set S.K=V           any config key, e.g. --set pool.policy=skip\n"
		"  --check-config        validate (the storage URL too, without connecting), print the effective\n"
		"                        config, exit\n"
		"  --probe-storage       check what each store does (create-only writes refused, byte ranges,\n"
		"                        paged listings) under a prefix of its own, report, exit 0 if all pass\n"
		"  --version             print the version, the commit and whether CUDA is compiled in, exit\n"
		"  --help                this text\n",
		DEFAULT_CONFIG_PATH);
	for (size_t i = 0; i < config_nkeys; i++) {
		const struct config_key *k = &config_keys[i];
		char opt[64], def[32];
		if (k->flag == NULL)
			continue;
		snprintf(opt, sizeof(opt), "--%s %s", k->flag, k->flag_arg);
		const char *dt = default_text(k, def, sizeof(def));
		fprintf(f, "  %-21s%s%s (%s%s%s[%s] %s)\n", opt, strlen(opt) > 21 ? "\n                        " : " ",
			k->help, dt[0] ? "default " : "", dt, dt[0] ? "; " : "", k->section, k->name);
	}
	fprintf(f, "Exit status: 0 after a clean stop (drained, or drain deadline passed with\n"
		   "the rest journaled), 1 on a runtime error, 2 on a usage or config error.\n");
}

/* The flags of main.c, and then a config key's own flag (--socket,
 * --storage ...) from its row's .flag in config_keys[] (config.c): it sets
 * the key as --set would. */
enum {
	OPT_KEY = 0x100
}; /* + the row's index in config_keys[] */
static const struct option base_opts[] = {
	{ "config", required_argument, NULL, 'f' },
	{ "set", required_argument, NULL, 'S' },
	{ "check-config", no_argument, NULL, 'C' },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'v' },
	{ "probe-storage", no_argument, NULL, 'P' },
	{ NULL, 0, NULL, 0 },
};
static struct option opts[32 + ELEMENTSOF(base_opts)];

static void build_opts(void)
{
	size_t n = 0;
	for (size_t i = 0; i < config_nkeys; i++)
		if (config_keys[i].flag) {
			assert(n < 32);
			opts[n++] = (struct option){ config_keys[i].flag, required_argument, NULL, OPT_KEY + (int)i };
		}
	memcpy(&opts[n], base_opts, sizeof(base_opts));
}

static int saved_argc;
static char **saved_argv;

static bool probe_only; /* --probe-storage (main's parse only) */

/* Defaults, then the config file, then flags over it. Used at start and
 * on SIGHUP. 0, 1 for --help, or -errno with err set. */
static int parse_config(struct config *cfg, bool *check_only, char *err, size_t errlen)
{
	const char *config_path = NULL;
	bool explicit = false;
	int c;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(saved_argc, saved_argv, "", opts, NULL)) != -1)
		if (c == 'f') {
			config_path = optarg;
			explicit = true;
		}
	config_defaults(cfg);
	if (!explicit && access(DEFAULT_CONFIG_PATH, R_OK) == 0)
		config_path = DEFAULT_CONFIG_PATH;
	if (config_path) {
		int r = config_load(cfg, config_path, err, errlen);
		if (r < 0)
			return r;
	}
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(saved_argc, saved_argv, "", opts, NULL)) != -1) {
		int r = 0;
		if (c >= OPT_KEY) {
			const struct config_key *k = &config_keys[c - OPT_KEY];
			char key[160];
			snprintf(key, sizeof(key), "%s.%s", k->section, k->name);
			r = config_set(cfg, key, optarg, err, errlen);
		} else
			switch (c) {
			case 'S': {
				char kv[512];
				snprintf(kv, sizeof(kv), "%s", optarg);
				char *eq = strchr(kv, '=');
				if (eq == NULL) {
					snprintf(err, errlen, "--set %s: want SECTION.KEY=VALUE", optarg);
					return -EINVAL;
				}
				*eq = '\0';
				r = config_set(cfg, kv, eq + 1, err, errlen);
				break;
			}
			case 'C':
				if (check_only)
					*check_only = true;
				break;
			case 'P':
				if (check_only)
					probe_only = true;
				break;
			case 'f': break;
			case 'v': break; /* main() answered it */
			case 'h': return 1;
			default: snprintf(err, errlen, "unknown option '%s'", saved_argv[optind - 1]); return -EINVAL;
			}
		if (r < 0)
			return r;
	}
	if (optind < saved_argc) {
		snprintf(err, errlen, "unexpected argument '%s'", saved_argv[optind]);
		return -EINVAL;
	}
	return config_validate(cfg, err, errlen);
}

/* SIGHUP: re-read the config file and flags into a new struct, validate
 * it, and take what can change while running (config_reload: the keys
 * without CFG_RESTART in config_keys[]). */
static void on_sighup(uv_signal_t *h, int signum)
{
	struct daemon *d = h->data;
	(void)signum;
	static struct config nc;
	char err[1024];
	int r = parse_config(&nc, NULL, err, sizeof(err));
	if (r != 0) {
		log_err("SIGHUP: config not reloaded: %s", r > 0 ? "--help" : err);
		return;
	}
	/* What would run: the running restart-only values and the new rest,
	 * validated as a whole before it is taken. */
	static struct config merged;
	merged = d->cfg;
	char kept[512];
	int nkept = config_reload(&merged, &nc, kept, sizeof(kept));
	if (config_validate(&merged, err, sizeof(err)) != 0) {
		log_err("SIGHUP: config not reloaded: with the running values of the keys that change only on "
			"restart: %s",
			err);
		return;
	}
	d->cfg = merged;
	if (nkept > 0)
		log_warn("SIGHUP: %s change only on restart; kept the running values", kept);
	log_set_level((enum log_level)d->cfg.log_level);
	log_set_format((enum log_format)d->cfg.log_format);
	log_info("SIGHUP: configuration reloaded (log level %d, %zu job sections)", nc.log_level, nc.njobs);
}

static int on_temp_begin(void *ctx, const char *key, uint64_t *id)
{
	int r = journal_temp_begin(ctx, key, id);
	if (r < 0)
		log_warn("journal: recording the write of %s: %s", key, strerror(-r));
	return r;
}

static void on_temp_end(void *ctx, uint64_t id)
{
	journal_temp_end(ctx, id);
}

static void on_upload(void *ctx, const char *key, const char *upload_id, int open)
{
	int r = journal_upload(ctx, key, upload_id, open != 0);
	if (r < 0)
		log_warn("journal: recording multipart upload %s of %s: %s", upload_id, key, strerror(-r));
}

/* Start-up, in the order main() runs it. Each step logs its own failure
 * and returns 0 or -1 (exit 1). */

/* The process: logging, limits, signals that must not kill it, state dir. */
static int start_process(struct daemon *d)
{
	log_init();
	log_set_level((enum log_level)d->cfg.log_level);
	log_set_format((enum log_format)d->cfg.log_format);
	/* One fd per registered buffer: lift the soft limit to the hard one. */
	struct rlimit nofile;
	if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
		nofile.rlim_cur = nofile.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &nofile);
	}
	signal(SIGPIPE, SIG_IGN);
	if (hostbuf_init() < 0) {
		log_err("installing the SIGBUS guard: %s", strerror(errno));
		return -1;
	}
	/* A file size limit must fail the write (EFBIG), not kill the daemon. */
	signal(SIGXFSZ, SIG_IGN);
	if (mkdir(d->cfg.state_dir, 0700) == 0) {
		/* Its name durable (the parent's fsync) before the journal in it
		 * counts on it. */
		char parent[1100];
		snprintf(parent, sizeof(parent), "%s", d->cfg.state_dir);
		char *slash = strrchr(parent, '/');
		if (slash)
			*(slash == parent ? slash + 1 : slash) = '\0';
		int r = fsync_dir(slash ? parent : ".");
		if (r < 0) {
			log_err("state dir %s: making it durable: %s", d->cfg.state_dir, strerror(-r));
			return -1;
		}
	} else if (errno != EEXIST) {
		log_err("state dir %s: %s", d->cfg.state_dir, strerror(errno));
		return -1;
	}
	/* One daemon per state dir: a second one's journal recovery would
	 * abort the first's uploads and delete its shards. The lock is held
	 * until the process ends, however it ends. */
	char lock[1100];
	snprintf(lock, sizeof(lock), "%s/lock", d->cfg.state_dir);
	int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
		log_err("state dir %s: %s", d->cfg.state_dir,
			fd >= 0 && errno == EWOULDBLOCK ? "another ckptd is using it (it holds its lock)"
							: strerror(errno));
		return -1;
	}
	return 0;
}

/* The store a journal record's key is in: keys carry the job, and a
 * tenant's job its prefix. */
static struct store *store_of_key(void *ctx, const char *key)
{
	return daemon_store_of(ctx, key);
}

/* Storage: the backend, the manifest cache, the journal and what a crashed
 * run left half-written. */
/* A storage URL with its section's other keys as query options. */
static void url_with_opts(const char *base, const char *opts, char *url, size_t len)
{
	snprintf(url, len, "%s%s%s", base, opts[0] ? (strchr(base, '?') ? "&" : "?") : "", opts);
}

static void storage_url(const struct config *cfg, char *url, size_t len)
{
	url_with_opts(cfg->storage_url, cfg->storage_opts, url, len);
}

static void tenant_url(const struct tenant_config *t, char *url, size_t len)
{
	url_with_opts(t->storage, t->storage_opts, url, len);
}

/* The storage probe (probe.h) of store s (what: how the log names it):
 * 0 to go on, -1 when the store breaks a guarantee it is not allowed to.
 * A store that cannot be asked now (down, wrong credentials) does not stop
 * the start: memory and peer tiers work without it, and its requests fail
 * loudly; its create-only writes stay unchecked until the next start. */
static int probe_store(struct daemon *d, struct store *s, const char *what)
{
	if (!d->cfg.storage_probe || strcmp(s->backend, "file") == 0)
		return 0;
	char report[2048];
	unsigned failed = 0;
	int r = store_probe(s, &failed, report, sizeof(report));
	if (r == 0) {
		log_info("%s: storage probe: %s", what, report);
		return 0;
	}
	if (r != -EPROTO) {
		log_warn("%s: storage probe could not ask the store (%s): its create-only writes, ranges and listings "
			 "are unchecked until the next start",
			 what, report);
		return 0;
	}
	unsigned fatal = failed & ~(d->cfg.allow_unconditional ? PROBE_CREATE_ONLY : 0u);
	if (fatal) {
		log_err("%s: refused by the storage probe: %s", what, report);
		return -1;
	}
	log_warn("%s: [storage] allow_unconditional: starting on a store that ignores create-only writes: a complete "
		 "step can be overwritten, and ranks may restore different steps (%s)",
		 what, report);
	return 0;
}

/* The store of url with opts ([storage] or a tenant's keys): checked,
 * then opened. */
static int open_store(const char *url, const char *opts, struct store **s, char *err, size_t errlen)
{
	if (store_check_options(url, opts, err, errlen) < 0)
		return -1;
	return store_open(url, s, err, errlen) < 0 ? -1 : 0;
}

/* --probe-storage: the storage probe of every store of the config (the
 * daemon's, the tenants' own), file:// too, each reported on stdout; exit
 * 0 when all pass, 1 when one fails or cannot be asked, 2 on a bad URL. */
static int probe_storage(struct daemon *d)
{
	int rc = 0;
	for (size_t i = 0; i <= d->cfg.ntenants; i++) {
		char url[2100], err[1024], report[2048];
		if (i < d->cfg.ntenants) {
			if (!d->cfg.tenants[i].storage[0])
				continue;
			tenant_url(&d->cfg.tenants[i], url, sizeof(url));
		} else {
			storage_url(&d->cfg, url, sizeof(url));
		}
		struct store *s = NULL;
		if (open_store(url, i < d->cfg.ntenants ? d->cfg.tenants[i].storage_opts : d->cfg.storage_opts, &s, err,
			       sizeof(err)) < 0) {
			fprintf(stderr, "ckptd: %s\n", err);
			return 2;
		}
		unsigned failed = 0;
		int r = store_probe(s, &failed, report, sizeof(report));
		printf("%s: %s: %s\n", s->url, r == 0 ? "ok" : r == -EPROTO ? "FAILED" : "could not be asked", report);
		if (r < 0)
			rc = 1;
		store_free(s);
	}
	return fflush(stdout) == 0 ? rc : 1;
}

/* Object-store credentials are about to be read: no core dump (nor a
 * ptrace by our own uid) may carry them off, unless asked for. */
static void guard_credentials(struct daemon *d, const char *url)
{
	bool creds = strncmp(url, "file://", 7) != 0;
	for (size_t i = 0; i < d->cfg.ntenants; i++)
		creds |= d->cfg.tenants[i].storage[0] && strncmp(d->cfg.tenants[i].storage, "file://", 7) != 0;
	if (!creds || d->cfg.core_dumps)
		return;
	if (prctl(PR_SET_DUMPABLE, 0) != 0)
		log_warn("prctl(PR_SET_DUMPABLE, 0): %s; a core dump would hold the storage credentials",
			 strerror(errno));
	else
		log_info("core dumps off: ckptd holds storage credentials ([log] core_dumps = true allows them)");
}

/* The daemon's store and the tenants' own (docs/security.md "Tenants"),
 * each probed. */
static int open_stores(struct daemon *d)
{
	char err[1024];
	char url[2100];
	storage_url(&d->cfg, url, sizeof(url));
	guard_credentials(d, url);
	if (open_store(url, d->cfg.storage_opts, &d->store, err, sizeof(err)) < 0) {
		log_err("%s", err);
		return -1;
	}
	d->store_backend = d->store->backend;
	for (size_t i = 0; i < d->cfg.ntenants; i++) {
		const struct tenant_config *t = &d->cfg.tenants[i];
		tenant_url(t, url, sizeof(url));
		if (t->storage[0] && open_store(url, t->storage_opts, &d->tenant_store[i], err, sizeof(err)) < 0) {
			log_err("[tenant.%s] storage: %s", t->name, err);
			return -1;
		}
		if (t->storage[0])
			log_info("tenant '%s': storage %s", t->name, d->tenant_store[i]->url);
	}
	if (probe_store(d, d->store, d->store->url) < 0)
		return -1;
	for (size_t i = 0; i < d->cfg.ntenants; i++)
		if (d->tenant_store[i] && probe_store(d, d->tenant_store[i], d->tenant_store[i]->url) < 0)
			return -1;
	return 0;
}

/* What reads keep: decoded manifests, reads shared between ranks, and
 * ranges kept for the peers (peer_range.c), only where they are shared. */
static int open_read_caches(struct daemon *d)
{
	if (d->cfg.manifest_cache_bytes) {
		d->mancache = mancache_new(d->cfg.manifest_cache_bytes);
		if (d->mancache == NULL) {
			log_err("manifest cache: out of memory");
			return -1;
		}
		mancache_set_fetch_delay_ms(d->mancache, d->cfg.debug_manifest_delay_ms);
	}
	d->readshare = readshare_new();
	if (d->readshare == NULL) {
		log_err("out of memory");
		return -1;
	}
	readshare_set_fetch_delay_ms(d->readshare, d->cfg.debug_read_delay_ms);
	if (d->cfg.peer_listen[0] && d->cfg.peer_share_reads && d->cfg.peer_read_cache) {
		d->rangecache = rangecache_new(d->cfg.peer_read_cache,
					       (uint64_t)d->cfg.peer_read_cache_s * 1000000000ull);
		if (d->rangecache == NULL) {
			log_err("out of memory");
			return -1;
		}
	}
	return 0;
}

/* The upload journal, hooked into every store (the daemon's and the
 * tenants' own alike), and what a crashed run left half-written removed. */
static int recover_journal(struct daemon *d)
{
	char err[1024];
	if (journal_open(d->cfg.state_dir, &d->journal, err, sizeof(err)) < 0) {
		log_err("%s", err);
		return -1;
	}
	for (size_t i = 0; i <= d->cfg.ntenants; i++) {
		struct store *s = i < d->cfg.ntenants ? d->tenant_store[i] : d->store;
		if (s == NULL)
			continue;
		s->debug_delay_ms = d->cfg.debug_store_delay_ms;
		s->file_mode = d->cfg.file_mode;
		s->on_upload = on_upload;
		s->on_upload_ctx = d->journal;
		s->on_temp_begin = on_temp_begin;
		s->on_temp_end = on_temp_end;
		s->on_temp_ctx = d->journal;
	}
	uint64_t window = catalog_in_flight_s(d->cfg.retention.incomplete_grace_s);
	for (size_t i = 0; i < d->cfg.njobs; i++) {
		struct job_policy jp;
		config_job_policy(&d->cfg, d->cfg.jobs[i].name, d->pool.bytes, &jp);
		uint64_t w = catalog_in_flight_s(jp.retention.incomplete_grace_s);
		window = w > window ? w : window;
	}
	journal_set_in_flight(d->journal, window);
	int r = journal_recover_by(d->journal, store_of_key, d, on_recovered, d);
	if (r < 0) {
		log_err("journal recovery in %s: %s", d->cfg.state_dir, strerror(-r));
		return -1;
	}
	if (r > 0)
		log_warn("recovery: removed %d file(s) a crashed run left half-written", r);
	d->stats.recovered_files = (uint32_t)r;
	return 0;
}

static int start_storage(struct daemon *d)
{
	if (open_stores(d) < 0 || open_read_caches(d) < 0 || recover_journal(d) < 0)
		return -1;
	return 0;
}

/* Memory: the pre-faulted pool, and CUDA if there is a driver. */
static int start_memory(struct daemon *d)
{
	char err[1024];
	uint64_t t0 = clock_now_ns();
	int r = pool_init(&d->pool, d->cfg.staging_bytes, d->cfg.chunk_bytes);
	if (r < 0) {
		log_err("staging pool of %" PRIu64 " bytes: %s", d->cfg.staging_bytes, strerror(-r));
		return -1;
	}
	log_info("pool: %u chunks of %" PRIu64 " MiB pre-faulted in %.0f ms%s", d->pool.nchunks,
		 d->pool.chunk_bytes >> 20, (double)(clock_now_ns() - t0) / 1e6, d->pool.locked ? ", locked" : "");
	/* Coded pieces wait outside the pool for their upload: half of
	 * the pool's size at most, daemon-wide (compress.h). */
	uint64_t budget = d->cfg.staging_bytes / 2 > (64u << 20) ? d->cfg.staging_bytes / 2 : (64u << 20);
	compress_set_budget(d->cfg.debug_compress_budget ? d->cfg.debug_compress_budget : budget);
	d->cuda = cuda_open(d->cfg.copy_threads, d->cuda_why, sizeof(d->cuda_why));
	if (d->cuda == NULL) {
		log_info("CUDA off: %s; host buffers only", d->cuda_why);
		return 0;
	}
	if (cuda_register_pool(d->cuda, d->pool.base, d->pool.bytes, err, sizeof(err)) < 0)
		log_warn("CUDA: %s; staging copies from GPUs will be slower", err);
	cuda_describe(d->cuda, d->cuda_why, sizeof(d->cuda_why));
	log_info("CUDA %s", d->cuda_why);
	return 0;
}

/* The loop: the hooks that carry completions up, the lists and timers,
 * signals, the copy threads, the metrics listener and the socket. */
static int start_loop(struct daemon *d)
{
	char err[1024];
	d->loop = uv_default_loop();
	d->start_ns = clock_now_ns();
	d->on_durable = gc_after_durable;         /* retention, after each durable save */
	d->on_step_durable = wait_step_durable;   /* a step's waiters look again soon */
	d->req_ops = session_requester_ops_get(); /* replies and events of saves and loads */
	session_set_dispatch(msg_dispatch);       /* each decoded frame to its row */
	msgtab_init(d);
	TAILQ_INIT(&d->sessions);
	TAILQ_INIT(&d->saves);
	TAILQ_INIT(&d->waitq);
	TAILQ_INIT(&d->uploadq);
	TAILQ_INIT(&d->held);
	TAILQ_INIT(&d->loads);
	persist_init(d);
	if (wait_init(d) < 0) {
		log_err("out of memory");
		return -1;
	}
	uv_timer_init(d->loop, &d->admit_timer);
	d->admit_timer.data = d;
	uv_timer_init(d->loop, &d->drain_timer);
	d->drain_timer.data = d;
	uv_timer_init(d->loop, &d->finish_timer);
	d->finish_timer.data = d;
	uv_timer_init(d->loop, &d->status_timer);
	d->status_timer.data = d;
	uv_timer_init(d->loop, &d->idle_timer);
	d->idle_timer.data = d;
	uv_signal_init(d->loop, &d->sigterm);
	uv_signal_init(d->loop, &d->sigint);
	uv_signal_init(d->loop, &d->sighup);
	d->sigterm.data = d->sigint.data = d->sighup.data = d;
	uv_signal_start(&d->sigterm, daemon_on_signal, SIGTERM);
	uv_signal_start(&d->sigint, daemon_on_signal, SIGINT);
	uv_signal_start(&d->sighup, on_sighup, SIGHUP);
	int r = workq_init(&d->copyq, d->loop, d->cfg.copy_threads);
	if (r < 0) {
		log_err("copy threads: %s", strerror(-r));
		return -1;
	}
	if (d->cfg.metrics_listen[0] && metrics_listen(d, d->cfg.metrics_listen, err, sizeof(err)) < 0) {
		log_err("%s", err);
		return -1;
	}
	if (peer_start(d, err, sizeof(err)) < 0) {
		log_err("peers: %s", err);
		return -1;
	}
	if (server_start(d, err, sizeof(err)) < 0) {
		log_err("%s", err);
		return -1;
	}
	log_info("ckptd listening on %s, storage %s, pool %" PRIu64 " MiB, %u copy threads", d->cfg.socket_path,
		 d->store->url, d->pool.bytes >> 20, d->cfg.copy_threads);
	return 0;
}

int main(int argc, char **argv)
{
	/* The threadpool runs loads, uploads, catalogue requests and waits'
	 * polls: libuv's 4 threads ran four of a node's eight ranks'
	 * restores at a time (the other four queued, and read again what
	 * the first four had read: readshare.c shares only reads in flight).
	 * 16 unless the environment says otherwise; set before any thread
	 * starts (setenv is not safe beside another thread's getenv), read
	 * by libuv at its first work. */
	setenv("UV_THREADPOOL_SIZE", "16", 0);
	saved_argc = argc;
	saved_argv = argv;
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], "--version") == 0) {
			printf("ckptd %s (commit %s, CUDA driver API %s)\n", CKPT_VERSION, CKPT_COMMIT,
			       CUDA_COMPILED_IN ? "compiled in, loaded at run time" : "not compiled in");
			return 0;
		}
	build_opts();
	static struct daemon dd;
	struct daemon *d = &dd;
	d->nlisteners = 0;
	char err[1024];
	bool check_only = false;
	int r = parse_config(&d->cfg, &check_only, err, sizeof(err));
	if (r == 1) {
		usage(stdout);
		return 0;
	}
	if (r < 0) {
		fprintf(stderr, "ckptd: %s\n", err);
		if (r == -EINVAL && strstr(err, "option"))
			usage(stderr);
		return 2;
	}
	if (probe_only)
		return probe_storage(d);
	if (check_only) {
		/* What a start would refuse of the storage URL, without I/O. */
		char url[2100];
		storage_url(&d->cfg, url, sizeof(url));
		if (store_check(url, d->cfg.storage_opts, err, sizeof(err)) < 0) {
			fprintf(stderr, "ckptd: %s\n", err);
			return 2;
		}
		for (size_t i = 0; i < d->cfg.ntenants; i++) {
			const struct tenant_config *t = &d->cfg.tenants[i];
			tenant_url(t, url, sizeof(url));
			if (t->storage[0] && store_check(url, t->storage_opts, err, sizeof(err)) < 0) {
				fprintf(stderr, "ckptd: [tenant.%s] storage: %s\n", t->name, err);
				return 2;
			}
		}
		config_print(&d->cfg, stdout);
		return fflush(stdout) == 0 ? 0 : 1;
	}
	if (start_process(d) < 0 || start_storage(d) < 0 || start_memory(d) < 0 || start_loop(d) < 0)
		return 1;
	/* READY only now: the socket listens and the pool is faulted in. */
	daemon_notify_start(d);
	uv_run(d->loop, UV_RUN_DEFAULT);
	int rc = uv_loop_close(d->loop);
	if (rc != 0)
		log_warn("loop closed with handles left: %s", uv_strerror(rc));
	cuda_close(d->cuda);
	pool_fini(&d->pool);
	journal_close(d->journal);
	mancache_free(d->mancache);
	readshare_free(d->readshare);
	rangecache_free(d->rangecache);
	for (uint32_t i = 0; i < d->ngc_pending; i++)
		free(d->gc_pending[i]);
	free(d->gc_pending);
	store_free(d->store);
	for (size_t i = 0; i < d->cfg.ntenants; i++)
		store_free(d->tenant_store[i]);
	return 0;
}
