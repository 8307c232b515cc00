#include "metrics.h"
#include "catalog.h"
#include "daemon.h"
#include "log.h"
#include "mancache.h"
#include "pool.h"
#include "save.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double metrics_bounds[HIST_BUCKETS] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
					      0.25, 0.5, 1, 2.5, 5, 10, 30 };

void hist_observe(struct histogram *h, double s)
{
	size_t i = 0;
	while (i < HIST_BUCKETS && s > metrics_bounds[i])
		i++;
	h->counts[i]++;
	h->count++;
	h->sum += s;
}

struct buf {
	char *p;
	size_t len, cap;
	int err;
};

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
		size_t nc = b->cap * 2 + (size_t)n;
		char *np = realloc(b->p, nc);
		if (np == NULL) {
			b->err = -ENOMEM;
			return;
		}
		b->p = np;
		b->cap = nc;
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

int metrics_render(struct daemon *d, char **out, size_t *len)
{
	struct buf b = { .cap = 8192 };
	b.p = malloc(b.cap);
	if (b.p == NULL)
		return -ENOMEM;
	const struct stats *s = &d->stats;
	const char *be = d->store_backend;
	uint64_t held = 0;
	struct save *sv;
	TAILQ_FOREACH(sv, &d->held, link)
		held += sv->pool_bytes;

	metric(&b, "ckptd_bytes_staged_total", "counter", "Bytes copied into the staging pool.");
	put(&b, "ckptd_bytes_staged_total %" PRIu64 "\n", s->bytes_staged);
	metric(&b, "ckptd_bytes_uploaded_total", "counter", "Bytes made durable in storage.");
	put(&b, "ckptd_bytes_uploaded_total{backend=\"%s\"} %" PRIu64 "\n", be, s->bytes_durable);
	metric(&b, "ckptd_bytes_restored_total", "counter", "Bytes restored into trainer buffers.");
	put(&b, "ckptd_bytes_restored_total{source=\"memory\"} %" PRIu64 "\n", s->bytes_restored_memory);
	put(&b, "ckptd_bytes_restored_total{source=\"storage\"} %" PRIu64 "\n",
	    s->bytes_restored - s->bytes_restored_memory);
	metric(&b, "ckptd_restores_total", "counter", "Loads served, by where all their bytes came from.");
	put(&b, "ckptd_restores_total{source=\"memory\"} %" PRIu64 "\n", s->restores_from_memory);
	put(&b, "ckptd_restores_total{source=\"storage\"} %" PRIu64 "\n", s->restores_from_storage);
	hist(&b, "ckptd_save_stall_seconds", "Time from a save request to staged (the trainer's stall).",
	     &s->stall_hist);
	hist(&b, "ckptd_save_durable_seconds", "Time from a save request to durable.", &s->durable_hist);
	metric(&b, "ckptd_pool_bytes", "gauge", "Size of the staging pool.");
	put(&b, "ckptd_pool_bytes %" PRIu64 "\n", d->pool.bytes);
	metric(&b, "ckptd_pool_used_bytes", "gauge", "Pool bytes in use, memory tier included.");
	put(&b, "ckptd_pool_used_bytes %" PRIu64 "\n", pool_used_bytes(&d->pool));
	metric(&b, "ckptd_pool_held_bytes", "gauge", "Pool bytes held as the memory tier.");
	put(&b, "ckptd_pool_held_bytes %" PRIu64 "\n", held);
	metric(&b, "ckptd_saves_inflight", "gauge", "Saves admitted and not yet durable or failed.");
	put(&b, "ckptd_saves_inflight %" PRIu32 "\n", d->nsaves - d->nwaiting);
	metric(&b, "ckptd_saves_waiting", "gauge", "Saves waiting for pool space.");
	put(&b, "ckptd_saves_waiting %" PRIu32 "\n", d->nwaiting);
	metric(&b, "ckptd_saves_total", "counter", "Save requests received.");
	put(&b, "ckptd_saves_total %" PRIu64 "\n", s->saves_total);
	metric(&b, "ckptd_saves_failed_total", "counter", "Saves that failed, by reason.");
	put(&b, "ckptd_saves_failed_total{reason=\"superseded\"} %" PRIu64 "\n", s->saves_superseded);
	put(&b, "ckptd_saves_failed_total{reason=\"skipped\"} %" PRIu64 "\n", s->saves_skipped);
	put(&b, "ckptd_saves_failed_total{reason=\"other\"} %" PRIu64 "\n",
	    s->saves_failed - s->saves_superseded - s->saves_skipped);
	metric(&b, "ckptd_store_direct_bytes_total", "counter",
	       "Bytes written to file:// storage with O_DIRECT (bypassing the page cache).");
	put(&b, "ckptd_store_direct_bytes_total{backend=\"%s\"} %llu\n", be, (unsigned long long)d->store->direct_bytes);
	metric(&b, "ckptd_store_retries_total", "counter", "Storage requests retried.");
	put(&b, "ckptd_store_retries_total{backend=\"%s\"} %" PRIu64 "\n", be, s->store_retries + (uint64_t)d->store->retries);
	metric(&b, "ckptd_store_failures_total", "counter", "Uploads that failed in storage.");
	put(&b, "ckptd_store_failures_total{backend=\"%s\"} %" PRIu64 "\n", be, s->store_failures);
	struct mancache_stats mc = { 0 };
	if (d->mancache)
		mancache_stats(d->mancache, &mc);
	metric(&b, "ckptd_manifest_reads_total", "counter", "Manifests read from storage (GETs), by any path.");
	put(&b, "ckptd_manifest_reads_total{backend=\"%s\"} %" PRIu64 "\n", be, catalog_manifest_gets());
	metric(&b, "ckptd_manifest_cache_hits_total", "counter",
	       "Manifest reads of pinned steps served by the cache (kept, or shared with a read in flight).");
	put(&b, "ckptd_manifest_cache_hits_total %" PRIu64 "\n", mc.hits);
	metric(&b, "ckptd_manifest_cache_misses_total", "counter", "Manifest reads of pinned steps the cache fetched.");
	put(&b, "ckptd_manifest_cache_misses_total %" PRIu64 "\n", mc.misses);
	metric(&b, "ckptd_manifest_cache_bytes", "gauge", "Decoded manifests kept by the cache (estimated bytes).");
	put(&b, "ckptd_manifest_cache_bytes %" PRIu64 "\n", mc.bytes);
	metric(&b, "ckptd_manifest_cache_entries", "gauge", "Manifests in the cache, fetches in flight included.");
	put(&b, "ckptd_manifest_cache_entries %" PRIu64 "\n", mc.entries);
	metric(&b, "ckptd_sessions", "gauge", "Connected clients.");
	put(&b, "ckptd_sessions %" PRIu32 "\n", d->nsessions);
	metric(&b, "ckptd_recovered_files", "gauge", "Files a crashed run left, removed at start.");
	put(&b, "ckptd_recovered_files %" PRIu32 "\n", s->recovered_files);
	metric(&b, "ckptd_uptime_seconds", "gauge", "Seconds since start.");
	put(&b, "ckptd_uptime_seconds %.3f\n", (double)(clock_now_ns() - d->start_ns) / 1e9);
	if (b.err) {
		free(b.p);
		return b.err;
	}
	*out = b.p;
	*len = b.len;
	return 0;
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

static void conn_close(struct http_conn *c)
{
	if (c->closing)
		return;
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
			  code, code == 200 ? "OK" : code == 404 ? "Not Found" : "Bad Request", ctype, blen);
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
	if (strncmp(c->req, "GET /metrics ", 13) != 0 && strncmp(c->req, "GET /metrics\r", 13) != 0) {
		respond(c, 404, "text/plain", "try /metrics\n", 13);
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
