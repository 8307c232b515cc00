/* Daemon-wide lifecycle: the clock, and the drain on SIGTERM/SIGINT (stop
 * admitting, let every staged save become durable, then close). */
#include "daemon.h"
#include "log.h"
#include "save.h"
#include "server.h"
#include "session.h"

#include <errno.h>
#include <stdlib.h>
#include <systemd/sd-daemon.h>
#include <time.h>

uint64_t daemon_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void close_all(struct daemon *d)
{
	server_stop(d);
	memtier_clear(d);
	struct session *s;
	while ((s = TAILQ_FIRST(&d->sessions)) != NULL)
		session_close(s, ESHUTDOWN, "ckptd is shutting down");
	uv_close((uv_handle_t *)&d->sigterm, NULL);
	uv_close((uv_handle_t *)&d->sigint, NULL);
	uv_close((uv_handle_t *)&d->admit_timer, NULL);
	uv_close((uv_handle_t *)&d->drain_timer, NULL);
	workq_fini(d->copyq);
	d->copyq = NULL;
}

void daemon_maybe_finish_drain(struct daemon *d)
{
	if (!d->draining || d->nsaves > 0 || d->nloads > 0 || d->copyq == NULL)
		return;
	log_info("drained: every staged save is durable; exiting");
	sd_notify(0, "STATUS=drained");
	close_all(d);
}

static void on_drain_timeout(uv_timer_t *t)
{
	struct daemon *d = t->data;
	log_err("drain deadline of %u ms passed with %u saves not durable; exiting anyway",
		d->cfg.drain_timeout_ms, d->nsaves);
	exit(1);
}

void daemon_on_signal(uv_signal_t *h, int signum)
{
	struct daemon *d = h->data;
	if (d->draining) {
		log_warn("second signal %d: exiting now", signum);
		exit(1);
	}
	log_info("signal %d: draining (%u saves in flight, %u waiting)", signum, d->nsaves, d->nwaiting);
	sd_notify(0, "STOPPING=1");
	d->draining = true;
	server_stop(d);
	save_cancel_waiting(d, ESHUTDOWN, "ckptd is shutting down; this save was not admitted");
	uv_timer_start(&d->drain_timer, on_drain_timeout, d->cfg.drain_timeout_ms, 0);
	daemon_maybe_finish_drain(d);
}

