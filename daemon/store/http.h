/* The HTTP engine of the object stores: one libcurl multi handle driven by
 * its own libuv loop (CURLMOPT_SOCKETFUNCTION/TIMERFUNCTION with uv_poll_t
 * and uv_timer_t, as in curl's multi-uv example) on a dedicated I/O
 * thread. Connections are reused across requests, at most max_conns to a
 * host at once. Store operations run on worker threads (store.h is
 * synchronous) and hand batches of requests to the engine with
 * http_run(), which waits for all of them; that also works before the
 * daemon's own loop runs (crash recovery at start). */
#ifndef CKPTD_HTTP_H
#define CKPTD_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct http;

struct http_opts {
	unsigned max_conns; /* per host, in parallel */
	unsigned connect_timeout_ms;
	unsigned low_speed_time_s; /* abort a transfer slower than 1 KiB/s this long */
	const char *ca_bundle;     /* NULL: the system's */
	bool insecure;             /* tests only: no TLS verification */
};

struct http_req {
	/* In. */
	const char *method; /* GET, PUT, POST, DELETE, HEAD */
	const char *url;
	const char *const *headers; /* "Name: value", NULL-terminated */
	const struct iovec *body;   /* PUT/POST body in slices; may be NULL */
	size_t nbody;
	void *dst; /* GET into this buffer (exactly dst_len bytes) */
	size_t dst_len;
	size_t resp_max;     /* else GET into resp, at most this many bytes */
	unsigned timeout_ms; /* whole request; 0: none (the low-speed limit applies) */
	/* Out. */
	long status;   /* HTTP status, 0 if none */
	int curl_code; /* CURLcode, 0 on a completed exchange */
	char curl_err[256];
	char *resp; /* malloc'd body (error bodies too, capped) */
	size_t resp_len;
	size_t got;    /* bytes written into dst */
	bool overflow; /* the body was larger than dst_len/resp_max */
	char etag[160];
	int64_t content_length; /* from the answer's header, -1 if none */
};

int http_init(struct http **out, const struct http_opts *o, char *err, size_t errlen);
void http_free(struct http *h);
/* Run the requests (in parallel, up to max_conns per host) and wait until
 * every one finished. 0, or -ENOMEM if they could not be queued; each
 * request's own outcome is in its status/curl_code. */
int http_run(struct http *h, struct http_req *const *reqs, size_t n);
/* Free what a request received (resp). */
void http_req_reset(struct http_req *r);
/* A transport failure worth retrying (reset, timeout, refused). */
bool http_curl_retryable(int curl_code);

#endif
