/* Daemon-wide lifecycle: the drain on SIGTERM/SIGINT (stop
 * admitting, let every staged save become durable, then close), and the
 * same drain once the daemon was idle for [server] idle_exit_ms. */
#include "lifecycle.h"
#include "clock.h"
#include "rangecache.h"
#include "peer.h"
#include "daemon.h"
#include "journal.h"
#include "log.h"
#include "metrics.h"
#include "memtier.h"
#include "save.h"
#include "server.h"
#include "session.h"
#include "status.h"
#include "wait_req.h"

#include <errno.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <systemd/sd-daemon.h>
#include <time.h>

static void close_all(struct daemon *d)
{
	server_stop(d);
	metrics_stop(d);
	peer_stop(d);
	memtier_clear(d);
	struct session *s;
	while ((s = TAILQ_FIRST(&d->sessions)) != NULL)
		session_close(s, -ESHUTDOWN, "ckptd is shutting down");
	uv_close((uv_handle_t *)&d->sigterm, NULL);
	uv_close((uv_handle_t *)&d->sigint, NULL);
	uv_close((uv_handle_t *)&d->sighup, NULL);
	uv_close((uv_handle_t *)&d->status_timer, NULL);
	uv_close((uv_handle_t *)&d->idle_timer, NULL);
	uv_close((uv_handle_t *)&d->admit_timer, NULL);
	uv_close((uv_handle_t *)&d->drain_timer, NULL);
	uv_close((uv_handle_t *)&d->finish_timer, NULL);
	workq_fini(d->copyq);
	d->copyq = NULL;
	wait_fini(d);
}

static bool drained(const struct daemon *d)
{
	return d->draining && d->nsaves == 0 && d->nloads == 0 && d->copyq != NULL;
}

static void on_drained(uv_timer_t *t)
{
	struct daemon *d = t->data;
	if (!drained(d))
		return;
	log_info("drained: every staged save is durable; exiting");
	sd_notify(0, "STATUS=drained");
	close_all(d);
}

/* Work ended while draining: once nothing is left, close everything, from
 * a callback of its own. Not here: this runs inside whatever ended the
 * work (a session closing while a waiter is answered, a save failing as
 * its session goes), and close_all would free what that caller still
 * walks. */
static void maybe_finish_drain(struct daemon *d)
{
	if (drained(d))
		uv_timer_start(&d->finish_timer, on_drained, 0, 0);
}

/* The deadline passed: record what will not become durable, so the next
 * start reports it (uploads already writing are journaled and get cleaned
 * up), then exit cleanly. */
static void on_drain_timeout(uv_timer_t *t)
{
	struct daemon *d = t->data;
	log_err("drain deadline of %u ms passed with %u saves not durable; exiting", d->cfg.drain_timeout_ms,
		d->nsaves);
	struct save *sv;
	TAILQ_FOREACH (sv, &d->saves, link) {
		char what[512];
		snprintf(what, sizeof(what), "%s step %" PRIu64 " rank %u was not durable at shutdown (%s)", sv->job,
			 sv->step, sv->rank, sv->state == SAVE_UPLOADING ? "uploading" : "staged");
		log_warn("%s", what);
		(void)journal_note(d->journal, what);
	}
	sd_notify(0, "STATUS=drain deadline passed");
	fflush(stderr);
	_exit(0);
}

static void status_line(struct daemon *d, char *buf, size_t len)
{
	struct status st;
	(void)status_snapshot(d, &st); /* the line needs no list */
	status_line_render(&st, buf, len);
	status_release(&st);
}

static void on_status_timer(uv_timer_t *t)
{
	struct daemon *d = t->data;
	char line[256];
	status_line(d, line, sizeof(line));
	if (d->rangecache)
		rangecache_sweep(d->rangecache);
	if (d->watchdog_usec)
		sd_notifyf(0, "WATCHDOG=1\n%s", line);
	else
		sd_notify(0, line);
}

static void start_idle_timer(struct daemon *d);

void daemon_notify_start(struct daemon *d)
{
	char line[256];
	status_line(d, line, sizeof(line));
	sd_notifyf(0, "READY=1\n%s", line);
	/* WATCHDOG=1 at half of WatchdogSec; STATUS= every 5 s otherwise. */
	uint64_t usec = 0;
	uint64_t period_ms = 5000;
	if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
		d->watchdog_usec = usec;
		period_ms = usec / 2000;
		if (period_ms == 0)
			period_ms = 1;
		log_info("systemd watchdog: %" PRIu64 " ms, pinging every %" PRIu64 " ms", usec / 1000, period_ms);
	}
	uv_timer_start(&d->status_timer, on_status_timer, period_ms, period_ms);
	start_idle_timer(d);
}

/* Stop admitting, end what waits, and exit once every staged save is
 * durable (or the deadline passed). */
static void start_drain(struct daemon *d)
{
	sd_notify(0, "STOPPING=1");
	d->draining = true;
	d->on_work_ended = maybe_finish_drain;
	uv_timer_stop(&d->idle_timer);
	server_stop(d);
	save_cancel_waiting(d, -ESHUTDOWN, "ckptd is shutting down; this save was not admitted");
	wait_cancel_all(d, -ESHUTDOWN, "ckptd is shutting down; the step's wait ended");
	uv_timer_start(&d->drain_timer, on_drain_timeout, d->cfg.drain_timeout_ms, 0);
	maybe_finish_drain(d);
}

void daemon_on_signal(uv_signal_t *h, int signum)
{
	struct daemon *d = h->data;
	if (d->draining) {
		log_warn("second signal %d: exiting now, %u saves not durable", signum, d->nsaves);
		_exit(1);
	}
	log_info("signal %d: draining (%u saves in flight, %u waiting)", signum, d->nsaves, d->nwaiting);
	start_drain(d);
}

/* Nothing connected and nothing in flight: no session (a trainer's, a
 * ckptctl's), no save (staged, uploading or waiting), no load or
 * catalogue request, no retention run, no persist. Steps held only in
 * memory do not count: they go with the daemon. */
static bool idle(const struct daemon *d)
{
	return d->nsessions == 0 && d->nsaves == 0 && d->nwaiting == 0 && d->nloads == 0 && !d->gc_running &&
	       d->ngc_pending == 0 && TAILQ_EMPTY(&d->persists);
}

static void on_idle_timer(uv_timer_t *t)
{
	struct daemon *d = t->data;
	uint64_t now = clock_now_ns();
	if (d->draining || !idle(d)) {
		d->idle_since_ns = 0;
		return;
	}
	/* A session that came and went between two looks (a probe, a
	 * ckptctl) was activity too. */
	if (d->idle_since_ns == 0 || d->last_session_ns > d->idle_since_ns) {
		d->idle_since_ns = d->idle_since_ns == 0 ? now : d->last_session_ns;
		return;
	}
	if (now - d->idle_since_ns < (uint64_t)d->cfg.idle_exit_ms * 1000000ull)
		return;
	log_info("idle for %u ms (idle_exit_ms): no session and nothing in flight; exiting", d->cfg.idle_exit_ms);
	start_drain(d);
}

/* [server] idle_exit_ms: look four times per period (at most once a
 * second, at least every 50 ms), so the exit comes at most a quarter late. */
static void start_idle_timer(struct daemon *d)
{
	if (d->cfg.idle_exit_ms == 0)
		return;
	/* With peers, replicas held for other nodes and replication in
	 * flight are not this daemon's to drop on a whim. */
	if (d->cfg.peer_listen[0]) {
		log_warn("idle_exit_ms is ignored with [peers] listen set: this daemon holds other nodes' replicas");
		return;
	}
	uint64_t period = d->cfg.idle_exit_ms / 4;
	period = period < 50 ? 50 : period > 1000 ? 1000 : period;
	d->idle_since_ns = clock_now_ns();
	uv_timer_start(&d->idle_timer, on_idle_timer, period, period);
}
