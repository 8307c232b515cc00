#include "metrics.h"
#include "ckpt_version.h"
#include "daemon.h"
#include "log.h"
#include "clock.h"
#include "store.h"
#include "status.h"
#include "grow.h"
#include "macro.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct buf {
	char *p;
	size_t len, cap;
	int err;
};

#ifdef CKPT_HAVE_CUDA
#define CUDA_COMPILED_IN 1
#else
#define CUDA_COMPILED_IN 0
#endif

static void put(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct buf *b, const char *fmt, ...)
{
	if (b->err)
		return;
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->err = -EINVAL;
			return;
		}
		if ((size_t)n < b->cap - b->len) {
			b->len += (size_t)n;
			return;
		}
		if (GROW(b->p, b->cap, b->len + (size_t)n + 1, 8192) < 0) {
			b->err = -ENOMEM;
			return;
		}
	}
}

static void metric(struct buf *b, const char *name, const char *type, const char *help)
{
	put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void hist(struct buf *b, const char *name, const char *help, const struct histogram *h)
{
	metric(b, name, "histogram", help);
	uint64_t cum = 0;
	for (size_t i = 0; i < HIST_BUCKETS; i++) {
		cum += h->counts[i];
		put(b, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, metrics_bounds[i], cum);
	}
	cum += h->counts[HIST_BUCKETS];
	put(b, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cum);
	put(b, "%s_sum %.6f\n%s_count %" PRIu64 "\n", name, h->sum, name, h->count);
}

static const char *type_name(enum status_kind k)
{
	return k == ST_COUNTER ? "counter" : k == ST_GAUGE ? "gauge" : "histogram";
}

/* One line per series of column i; the family header before its first. */
static void column(struct buf *b, const struct status *st, size_t i, const char **family)
{
	const struct status_col *c = &status_cols[i];
	if (!(c->views & SV_METRIC) || c->sum)
		return;
	if (c->kind == ST_HISTOGRAM) {
		hist(b, c->metric, c->help, (const struct histogram *)((const char *)st + c->hist));
		*family = c->metric;
		return;
	}
	if (*family == NULL || strcmp(*family, c->metric) != 0)
		metric(b, c->metric, type_name(c->kind), c->help);
	*family = c->metric;
	if (c->per_message) {
		for (int m = 0; m < STATS_MSG_SLOTS; m++) {
			if (st->request_name[m] != NULL)
				put(b, "%s{msg=\"%s\"} %" PRIu64 "\n", c->metric, st->request_name[m], st->requests[m]);
		}
		return;
	}
	char labels[192] = "";
	if (c->backend || c->label)
		snprintf(labels, sizeof(labels), "{%s%s%s%s%s}", c->backend ? "backend=\"" : "",
			 c->backend ? st->backend : "", c->backend ? "\"" : "", c->backend && c->label ? "," : "",
			 c->label ? c->label : "");
	if (c->unit == ST_UNIT_NS)
		put(b, "%s%s %.3f\n", c->metric, labels, (double)st->v[i] / 1e9);
	else
		put(b, "%s%s %" PRIu64 "\n", c->metric, labels, st->v[i]);
}

int metrics_format(const struct status *st, char **out, size_t *len)
{
	struct buf b = { .cap = 8192 };
	b.p = malloc(b.cap);
	if (b.p == NULL)
		return -ENOMEM;
	const char *family = NULL;
	for (size_t i = 0; i < ST_NCOLS; i++)
		column(&b, st, i, &family);
	/* Per tenant (docs/security.md "Tenants"), when there are any. */
	static const struct {
		const char *name, *help;
		size_t off;
		bool wide;
	} tcols[] = {
		{ "ckptd_tenant_sessions", "Connected clients, by tenant.", offsetof(struct status_tenant, sessions),
		  false },
		{ "ckptd_tenant_saves_inflight", "Saves admitted and not yet durable or failed, by tenant.",
		  offsetof(struct status_tenant, inflight_saves), false },
		{ "ckptd_tenant_pool_bytes", "Pool bytes held by saves not yet durable, by tenant.",
		  offsetof(struct status_tenant, pool_bytes), true },
	};
	for (size_t k = 0; st->ntenants && k < ELEMENTSOF(tcols); k++) {
		metric(&b, tcols[k].name, "gauge", tcols[k].help);
		for (uint32_t i = 0; i < st->ntenants; i++) {
			const char *p = (const char *)&st->tenants[i] + tcols[k].off;
			uint64_t v = tcols[k].wide ? *(const uint64_t *)p : *(const uint32_t *)p;
			put(&b, "%s{tenant=\"%s\"} %" PRIu64 "\n", tcols[k].name, st->tenants[i].name, v);
		}
	}
	/* What is running, as Prometheus exporters say it: a constant 1 whose
	 * labels carry the version, the commit and whether the CUDA driver
	 * API is compiled in (the image check wants it so). */
	metric(&b, "ckptd_build_info", "gauge",
	       "ckptd's version and commit, and whether CUDA is compiled in; always 1.");
	put(&b, "ckptd_build_info{version=\"%s\",commit=\"%s\",cuda=\"%s\"} 1\n", CKPT_VERSION, CKPT_COMMIT,
	    CUDA_COMPILED_IN ? "yes" : "no");
	if (b.err) {
		free(b.p);
		return b.err;
	}
	*out = b.p;
	*len = b.len;
	return 0;
}

int metrics_render(struct daemon *d, char **out, size_t *len)
{
	struct status st;
	int r = status_snapshot(d, &st);
	if (r == 0)
		r = metrics_format(&st, out, len);
	status_release(&st);
	return r;
}

/* ---- a minimal HTTP/1.0 responder: GET /metrics, then close ---- */

#define HTTP_MAX_REQ 8192
#define HTTP_MAX_CONNS 16
#define HTTP_TIMEOUT_MS 5000

struct http_conn {
	uv_tcp_t tcp;
	uv_timer_t timer;
	uv_write_t wr;
	struct daemon *d;
	char req[HTTP_MAX_REQ];
	size_t len;
	char *resp;
	int closing;
};

static void conn_freed(uv_handle_t *h)
{
	struct http_conn *c = h->data;
	if (--c->closing == 0) {
		c->d->metrics_conns--;
		free(c->resp);
		free(c);
	}
}

static void probe_forget(struct http_conn *c);

static void conn_close(struct http_conn *c)
{
	if (c->closing)
		return;
	probe_forget(c);
	c->closing = 2;
	uv_close((uv_handle_t *)&c->timer, conn_freed);
	uv_close((uv_handle_t *)&c->tcp, conn_freed);
}

static void on_written(uv_write_t *w, int status)
{
	(void)status;
	conn_close(w->data);
}

static void respond(struct http_conn *c, int code, const char *ctype, const char *body, size_t blen)
{
	char head[256];
	int hl = snprintf(head, sizeof(head),
			  "HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
			  code,
			  code == 200   ? "OK"
			  : code == 404 ? "Not Found"
			  : code == 503 ? "Service Unavailable"
					: "Bad Request",
			  ctype, blen);
	c->resp = malloc((size_t)hl + blen);
	if (c->resp == NULL) {
		conn_close(c);
		return;
	}
	memcpy(c->resp, head, (size_t)hl);
	memcpy(c->resp + hl, body, blen);
	uv_buf_t b = uv_buf_init(c->resp, (unsigned)((size_t)hl + blen));
	c->wr.data = c;
	uv_read_stop((uv_stream_t *)&c->tcp);
	if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &b, 1, on_written) < 0)
		conn_close(c);
}

/* ---- /healthz and /readyz ----
 * /healthz: the loop answers (alive). /readyz: the pool is mapped, ckptd
 * is not draining, and the last storage probe succeeded. The probe is one
 * GET of a key that never exists, on the threadpool: a reachable store
 * that takes our credentials answers 404 (-ENOENT), so it costs one
 * request per probe and at most one probe per READY_FRESH_MS, however many
 * probes kubelet sends. A request that finds the result older starts a
 * probe and is answered from the last result at once; only when there is
 * none yet (or it is older than READY_STALE_MS) does it wait for the probe.
 * One daemon per process: the probe's state is this module's. */
#define READY_FRESH_MS 2000
#define READY_PROBE_KEY ".ckptd-readyz-probe"

static struct {
	uv_work_t work;
	struct daemon *d;
	bool running;
	int result; /* of the last probe: 0 or -errno; the loop's */
	char msg[256];
	int next_result; /* the running probe's, written on the threadpool */
	char next_msg[256];
	uint64_t done_ns; /* 0: never */
	struct http_conn *waiting[HTTP_MAX_CONNS + 1];
	size_t nwaiting;
} probe;

static void probe_forget(struct http_conn *c)
{
	for (size_t i = 0; i < probe.nwaiting; i++)
		if (probe.waiting[i] == c) {
			probe.waiting[i] = probe.waiting[--probe.nwaiting];
			return;
		}
}

static void ready_answer(struct http_conn *c)
{
	struct daemon *d = c->d;
	char body[400];
	int code = 503;
	if (d->pool.base == NULL)
		snprintf(body, sizeof(body), "not ready: the staging pool is not mapped\n");
	else if (d->draining)
		snprintf(body, sizeof(body), "not ready: draining\n");
	else if (probe.result < 0)
		snprintf(body, sizeof(body), "not ready: storage %s: %s\n", d->store->url, probe.msg);
	else {
		code = 200;
		snprintf(body, sizeof(body), "ready\n");
	}
	respond(c, code, "text/plain", body, strlen(body));
}

static void probe_run(uv_work_t *w)
{
	struct store *st = probe.d->store;
	void *buf = NULL;
	size_t len = 0;
	store_clear_error();
	int r = st->ops->get_all(st, READY_PROBE_KEY, 1, &buf, &len);
	free(buf);
	(void)w;
	if (r == -ENOENT || r == -EFBIG)
		r = 0; /* answered: reachable, and our credentials are taken */
	/* Not result and msg: the loop answers from those while this runs. */
	probe.next_result = r;
	snprintf(probe.next_msg, sizeof(probe.next_msg), "%s", r < 0 ? store_error(r) : "");
}

static void probe_done(uv_work_t *w, int status)
{
	(void)w;
	probe.result = status < 0 ? status : probe.next_result;
	snprintf(probe.msg, sizeof(probe.msg), "%s", status < 0 ? "probe cancelled" : probe.next_msg);
	probe.running = false;
	probe.done_ns = clock_now_ns();
	while (probe.nwaiting > 0)
		ready_answer(probe.waiting[--probe.nwaiting]); /* respond stops reading; close comes later */
}

/* How long a probe's result may still answer while the next one runs
 * (the threadpool may be busy with uploads): kubelet gets an answer at
 * once, never a timeout, unless storage has not been asked for this long. */
#define READY_STALE_MS 300000

static void readyz(struct http_conn *c)
{
	struct daemon *d = c->d;
	uint64_t now = clock_now_ns(), age = probe.done_ns ? now - probe.done_ns : UINT64_MAX;
	if (d->pool.base == NULL || d->draining || age < (uint64_t)READY_FRESH_MS * 1000000ull) {
		ready_answer(c); /* no probe needed for these answers */
		return;
	}
	if (!probe.running) {
		probe.d = d;
		probe.running = true;
		if (uv_queue_work(d->loop, &probe.work, probe_run, probe_done) < 0) {
			probe.running = false;
			probe.result = -EIO;
			snprintf(probe.msg, sizeof(probe.msg), "cannot queue the probe");
			probe.done_ns = now;
		}
	}
	if (!probe.running || age < (uint64_t)READY_STALE_MS * 1000000ull) {
		ready_answer(c); /* the last result, while the next probe runs */
		return;
	}
	probe.waiting[probe.nwaiting++] = c;
}

static bool is_get(const char *req, const char *path)
{
	size_t l = strlen(path);
	return strncmp(req, "GET ", 4) == 0 && strncmp(req + 4, path, l) == 0 &&
	       (req[4 + l] == ' ' || req[4 + l] == '\r' || req[4 + l] == '\n' || req[4 + l] == '?');
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct http_conn *c = h->data;
	(void)suggested;
	*buf = uv_buf_init(c->req + c->len, (unsigned)(sizeof(c->req) - 1 - c->len));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
	struct http_conn *c = s->data;
	(void)buf;
	if (n < 0) {
		conn_close(c);
		return;
	}
	c->len += (size_t)n;
	c->req[c->len] = '\0';
	if (strstr(c->req, "\r\n\r\n") == NULL && strstr(c->req, "\n\n") == NULL) {
		if (c->len >= sizeof(c->req) - 1)
			respond(c, 400, "text/plain", "request too large\n", 18);
		return;
	}
	if (is_get(c->req, "/healthz")) {
		respond(c, 200, "text/plain", "ok\n", 3);
		return;
	}
	if (is_get(c->req, "/readyz")) {
		uv_read_stop((uv_stream_t *)&c->tcp);
		readyz(c);
		return;
	}
	if (!is_get(c->req, "/metrics")) {
		static const char try[] = "try /metrics, /healthz or /readyz\n";
		respond(c, 404, "text/plain", try, sizeof(try) - 1);
		return;
	}
	char *text = NULL;
	size_t len = 0;
	if (metrics_render(c->d, &text, &len) < 0) {
		conn_close(c);
		return;
	}
	respond(c, 200, "text/plain; version=0.0.4", text, len);
	free(text);
}

static void on_timeout(uv_timer_t *t)
{
	conn_close(t->data);
}

static void on_connection(uv_stream_t *server, int status)
{
	struct daemon *d = server->data;
	if (status < 0)
		return;
	struct http_conn *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return;
	c->d = d;
	uv_tcp_init(d->loop, &c->tcp);
	uv_timer_init(d->loop, &c->timer);
	c->tcp.data = c->timer.data = c;
	d->metrics_conns++;
	if (uv_accept(server, (uv_stream_t *)&c->tcp) < 0 || d->metrics_conns > HTTP_MAX_CONNS) {
		conn_close(c);
		return;
	}
	uv_timer_start(&c->timer, on_timeout, HTTP_TIMEOUT_MS, 0);
	uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

int metrics_listen(struct daemon *d, const char *addr, char *err, size_t errlen)
{
	char host[128];
	const char *colon = strrchr(addr, ':');
	if (colon == NULL || colon == addr || (size_t)(colon - addr) >= sizeof(host)) {
		snprintf(err, errlen, "metrics_listen '%s': want HOST:PORT", addr);
		return -EINVAL;
	}
	memcpy(host, addr, (size_t)(colon - addr));
	host[colon - addr] = '\0';
	char *end;
	long port = strtol(colon + 1, &end, 10);
	if (*end || port < 0 || port > 65535) {
		snprintf(err, errlen, "metrics_listen '%s': bad port", addr);
		return -EINVAL;
	}
	struct sockaddr_storage ss;
	int r;
	if (host[0] == '[') {
		size_t hl = strlen(host);
		if (hl < 3 || host[hl - 1] != ']') {
			snprintf(err, errlen, "metrics_listen '%s': bad IPv6 address", addr);
			return -EINVAL;
		}
		host[hl - 1] = '\0';
		r = uv_ip6_addr(host + 1, (int)port, (struct sockaddr_in6 *)&ss);
	} else {
		r = uv_ip4_addr(host, (int)port, (struct sockaddr_in *)&ss);
	}
	if (r == 0)
		r = uv_tcp_init(d->loop, &d->metrics_tcp);
	if (r == 0) {
		d->metrics_tcp.data = d;
		d->metrics_on = true;
		r = uv_tcp_bind(&d->metrics_tcp, (struct sockaddr *)&ss, 0);
		if (r == 0)
			r = uv_listen((uv_stream_t *)&d->metrics_tcp, 16, on_connection);
	}
	if (r < 0) {
		snprintf(err, errlen, "metrics_listen '%s': %s", addr, uv_strerror(r));
		metrics_stop(d);
		return r;
	}
	struct sockaddr_storage bound;
	int blen = sizeof(bound);
	if (uv_tcp_getsockname(&d->metrics_tcp, (struct sockaddr *)&bound, &blen) == 0) {
		d->metrics_port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
								    : ((struct sockaddr_in *)&bound)->sin_port);
	}
	log_info("metrics on http://%s:%d/metrics", host, d->metrics_port);
	return 0;
}

void metrics_stop(struct daemon *d)
{
	if (!d->metrics_on)
		return;
	d->metrics_on = false;
	uv_close((uv_handle_t *)&d->metrics_tcp, NULL);
}
