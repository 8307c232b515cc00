/* ckptd: the node-local checkpoint agent. */
#include "config.h"
#include "daemon.h"
#include "journal.h"
#include "log.h"
#include "pool.h"
#include "save.h"
#include "server.h"
#include "session.h"
#include "store.h"
#include "workq.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static void usage(FILE *f)
{
	fprintf(f,
		"usage: ckptd [--socket PATH] [--storage URL] [--staging-bytes SIZE]\n"
		"             [--state-dir DIR] [--config FILE] [--log-level LEVEL]\n"
		"  --socket PATH         Unix socket to listen on (default %s)\n"
		"  --storage URL         where checkpoints go: file:///abs/path\n"
		"  --staging-bytes SIZE  pinned staging pool, e.g. 4G (default 1G)\n"
		"  --chunk-bytes SIZE    pool chunk and upload part size (default 64M)\n"
		"  --state-dir DIR       daemon state (default %s)\n"
		"  --config FILE         ini file (default %s, if it exists)\n"
		"  --log-level LEVEL     error|warn|info|debug\n",
		DEFAULT_SOCKET_PATH, DEFAULT_STATE_DIR, DEFAULT_CONFIG_PATH);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "storage", required_argument, NULL, 'u' },
		{ "staging-bytes", required_argument, NULL, 'b' },
		{ "chunk-bytes", required_argument, NULL, 'c' },
		{ "state-dir", required_argument, NULL, 'd' },
		{ "config", required_argument, NULL, 'f' },
		{ "log-level", required_argument, NULL, 'l' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	/* Command-line values override the config file: find --config first. */
	const char *config_path = NULL;
	bool config_explicit = false;
	int c;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1)
		if (c == 'f') {
			config_path = optarg;
			config_explicit = true;
		}
	static struct daemon dd;
	struct daemon *d = &dd;
	d->listen_fd = -1;
	config_defaults(&d->cfg);
	char err[1024];
	if (!config_explicit && access(DEFAULT_CONFIG_PATH, R_OK) == 0)
		config_path = DEFAULT_CONFIG_PATH;
	if (config_path && config_load(&d->cfg, config_path, err, sizeof(err)) < 0) {
		fprintf(stderr, "ckptd: config: %s\n", err);
		return 2;
	}
	optind = 1;
	opterr = 1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		uint64_t v;
		switch (c) {
		case 's':
			if (strlen(optarg) >= sizeof(d->cfg.socket_path)) {
				fprintf(stderr, "ckptd: --socket: path too long\n");
				return 2;
			}
			snprintf(d->cfg.socket_path, sizeof(d->cfg.socket_path), "%s", optarg);
			break;
		case 'u':
			snprintf(d->cfg.storage_url, sizeof(d->cfg.storage_url), "%s", optarg);
			break;
		case 'b':
		case 'c':
			if (config_parse_size(optarg, &v) < 0) {
				fprintf(stderr, "ckptd: --%s %s: not a size (e.g. 512M, 4G)\n",
					c == 'b' ? "staging-bytes" : "chunk-bytes", optarg);
				return 2;
			}
			if (c == 'b')
				d->cfg.staging_bytes = v;
			else
				d->cfg.chunk_bytes = v;
			break;
		case 'd':
			snprintf(d->cfg.state_dir, sizeof(d->cfg.state_dir), "%s", optarg);
			break;
		case 'f':
			break;
		case 'l': {
			enum log_level lv;
			if (log_parse_level(optarg, &lv) < 0) {
				fprintf(stderr, "ckptd: --log-level %s: want error|warn|info|debug\n", optarg);
				return 2;
			}
			d->cfg.log_level = (int)lv;
			break;
		}
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "ckptd: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	log_set_level((enum log_level)d->cfg.log_level);
	if (config_validate(&d->cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "ckptd: %s\n", err);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	/* A file size limit must fail the write (EFBIG), not kill the daemon. */
	signal(SIGXFSZ, SIG_IGN);
	if (mkdir(d->cfg.state_dir, 0700) != 0 && errno != EEXIST) {
		log_err("state dir %s: %s", d->cfg.state_dir, strerror(errno));
		return 1;
	}
	int r = store_open(d->cfg.storage_url, &d->store, err, sizeof(err));
	if (r < 0) {
		log_err("%s", err);
		return 1;
	}
	d->store->debug_delay_ms = d->cfg.debug_store_delay_ms;
	r = journal_open(d->cfg.state_dir, &d->journal, err, sizeof(err));
	if (r < 0) {
		log_err("%s", err);
		return 1;
	}
	r = journal_recover(d->journal, d->store, on_recovered, d);
	if (r < 0) {
		log_err("journal recovery in %s: %s", d->cfg.state_dir, strerror(-r));
		return 1;
	}
	if (r > 0)
		log_warn("recovery: removed %d file(s) a crashed run left half-written", r);
	d->stats.recovered_files = (uint32_t)r;
	uint64_t t0 = daemon_now_ns();
	r = pool_init(&d->pool, d->cfg.staging_bytes, d->cfg.chunk_bytes);
	if (r < 0) {
		log_err("staging pool of %" PRIu64 " bytes: %s", d->cfg.staging_bytes, strerror(-r));
		return 1;
	}
	log_info("pool: %u chunks of %" PRIu64 " MiB pre-faulted in %.0f ms%s", d->pool.nchunks,
		 d->pool.chunk_bytes >> 20, (double)(daemon_now_ns() - t0) / 1e6,
		 d->pool.locked ? ", locked" : "");

	d->loop = uv_default_loop();
	d->start_ns = daemon_now_ns();
	TAILQ_INIT(&d->sessions);
	TAILQ_INIT(&d->saves);
	TAILQ_INIT(&d->waitq);
	TAILQ_INIT(&d->uploadq);
	TAILQ_INIT(&d->held);
	TAILQ_INIT(&d->loads);
	uv_timer_init(d->loop, &d->admit_timer);
	d->admit_timer.data = d;
	uv_timer_init(d->loop, &d->drain_timer);
	d->drain_timer.data = d;
	uv_signal_init(d->loop, &d->sigterm);
	uv_signal_init(d->loop, &d->sigint);
	d->sigterm.data = d->sigint.data = d;
	uv_signal_start(&d->sigterm, daemon_on_signal, SIGTERM);
	uv_signal_start(&d->sigint, daemon_on_signal, SIGINT);
	r = workq_init(&d->copyq, d->loop, d->cfg.copy_threads);
	if (r < 0) {
		log_err("copy threads: %s", strerror(-r));
		return 1;
	}
	r = server_start(d, err, sizeof(err));
	if (r < 0) {
		log_err("%s", err);
		return 1;
	}
	log_info("ckptd listening on %s, storage %s, pool %" PRIu64 " MiB, %u copy threads", d->cfg.socket_path,
		 d->store->url, d->pool.bytes >> 20, d->cfg.copy_threads);
	sd_notify(0, "READY=1\nSTATUS=serving");
	uv_run(d->loop, UV_RUN_DEFAULT);
	int rc = uv_loop_close(d->loop);
	if (rc != 0)
		log_warn("loop closed with handles left: %s", uv_strerror(rc));
	pool_fini(&d->pool);
	journal_close(d->journal);
	store_free(d->store);
	return 0;
}
