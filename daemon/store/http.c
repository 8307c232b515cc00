#include "http.h"
#include "grow.h"
#include "macro.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <uv.h>

#define ERROR_BODY_MAX (64u << 10)

struct xfer;

struct http {
	uv_loop_t loop;
	uv_async_t wake;
	uv_timer_t timer;
	CURLM *multi;
	pthread_t thread;
	bool started;
	pthread_mutex_t mu; /* guards queue and stop */
	struct xfer *queue;
	bool stop;
	struct http_opts o;
	char ca[1024];
};

struct batch {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	size_t left;
};

struct xfer {
	struct xfer *next;
	struct http *h;
	struct http_req *r;
	struct batch *b;
	CURL *easy;
	struct curl_slist *hdrs;
	size_t bi, boff; /* read position in r->body */
	size_t resp_cap;
	char errbuf[CURL_ERROR_SIZE];
};

struct sock {
	uv_poll_t poll;
	curl_socket_t fd;
	struct http *h;
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc;

static void global_init(void)
{
	global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

bool http_curl_retryable(int c)
{
	switch ((CURLcode)c) {
	case CURLE_COULDNT_CONNECT:
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
	case CURLE_SSL_CONNECT_ERROR:
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
	case CURLE_COULDNT_RESOLVE_HOST: return true;
	default: return false;
	}
}

void http_req_reset(struct http_req *r)
{
	free(r->resp);
	r->resp = NULL;
	r->resp_len = 0;
	r->got = 0;
	r->status = 0;
	r->curl_code = 0;
	r->curl_err[0] = 0;
	r->overflow = false;
	r->etag[0] = 0;
}

static void finish(struct xfer *x, CURLcode cc)
{
	struct http_req *r = x->r;
	r->curl_code = (int)cc;
	curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &r->status);
	curl_off_t cl = -1;
	if (curl_easy_getinfo(x->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl) != CURLE_OK)
		cl = -1;
	r->content_length = cl;
	if (cc != CURLE_OK)
		snprintf(r->curl_err, sizeof(r->curl_err), "%s", x->errbuf[0] ? x->errbuf : curl_easy_strerror(cc));
	curl_multi_remove_handle(x->h->multi, x->easy);
	curl_easy_cleanup(x->easy);
	curl_slist_free_all(x->hdrs);
	struct batch *b = x->b;
	free(x);
	pthread_mutex_lock(&b->mu);
	if (--b->left == 0)
		pthread_cond_signal(&b->cv);
	pthread_mutex_unlock(&b->mu);
}

static void check_done(struct http *h)
{
	CURLMsg *m;
	int left;
	while ((m = curl_multi_info_read(h->multi, &left)) != NULL) {
		if (m->msg != CURLMSG_DONE)
			continue;
		struct xfer *x = NULL;
		curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
		finish(x, m->data.result);
	}
}

static void on_poll(uv_poll_t *p, int status, int events)
{
	struct sock *s = p->data;
	int flags = 0;
	/* libuv reports POLLERR as status UV_EBADF, with no events. Tell curl
	 * the socket is readable and writable too, as its own poll does
	 * (Curl_socket_check counts POLLERR as both): it then reads or writes
	 * and reports the socket's error ("Recv failure: Connection reset by
	 * peer"). CURL_CSELECT_ERR alone fails the transfer as "select/poll
	 * returned error", which names no cause. */
	if (status < 0)
		flags = CURL_CSELECT_ERR | CURL_CSELECT_IN | CURL_CSELECT_OUT;
	if (events & UV_READABLE)
		flags |= CURL_CSELECT_IN;
	if (events & UV_WRITABLE)
		flags |= CURL_CSELECT_OUT;
	int running;
	curl_multi_socket_action(s->h->multi, s->fd, flags, &running);
	check_done(s->h);
}

static void on_sock_closed(uv_handle_t *hd)
{
	free(hd->data);
}

static int sock_cb(CURL *e, curl_socket_t fd, int what, void *userp, void *sockp)
{
	(void)e;
	struct http *h = userp;
	struct sock *s = sockp;
	if (what == CURL_POLL_REMOVE) {
		if (s) {
			uv_poll_stop(&s->poll);
			uv_close((uv_handle_t *)&s->poll, on_sock_closed);
			curl_multi_assign(h->multi, fd, NULL);
		}
		return 0;
	}
	if (s == NULL) {
		s = calloc(1, sizeof(*s));
		if (s == NULL)
			return -1;
		s->fd = fd;
		s->h = h;
		if (uv_poll_init_socket(&h->loop, &s->poll, fd) < 0) {
			free(s);
			return -1;
		}
		s->poll.data = s;
		curl_multi_assign(h->multi, fd, s);
	}
	int ev = 0;
	if (what == CURL_POLL_IN || what == CURL_POLL_INOUT)
		ev |= UV_READABLE;
	if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT)
		ev |= UV_WRITABLE;
	return uv_poll_start(&s->poll, ev, on_poll) < 0 ? -1 : 0;
}

static void on_timeout(uv_timer_t *t)
{
	struct http *h = t->data;
	int running;
	curl_multi_socket_action(h->multi, CURL_SOCKET_TIMEOUT, 0, &running);
	check_done(h);
}

static int timer_cb(CURLM *m, long ms, void *userp)
{
	(void)m;
	struct http *h = userp;
	if (ms < 0)
		uv_timer_stop(&h->timer);
	else
		uv_timer_start(&h->timer, on_timeout, (uint64_t)ms, 0);
	return 0;
}

static size_t on_read(char *buf, size_t size, size_t nitems, void *ud)
{
	struct xfer *x = ud;
	const struct http_req *r = x->r;
	size_t want = size * nitems, done = 0;
	while (done < want && x->bi < r->nbody) {
		const struct iovec *v = &r->body[x->bi];
		size_t n = v->iov_len - x->boff;
		if (n > want - done)
			n = want - done;
		memcpy(buf + done, (const char *)v->iov_base + x->boff, n);
		done += n;
		x->boff += n;
		if (x->boff == v->iov_len) {
			x->bi++;
			x->boff = 0;
		}
	}
	return done;
}

static int on_seek(void *ud, curl_off_t off, int origin)
{
	struct xfer *x = ud;
	if (origin != SEEK_SET || off < 0)
		return CURL_SEEKFUNC_CANTSEEK;
	x->bi = 0;
	x->boff = 0;
	uint64_t left = (uint64_t)off;
	while (x->bi < x->r->nbody && left >= x->r->body[x->bi].iov_len) {
		left -= x->r->body[x->bi].iov_len;
		x->bi++;
	}
	if (x->bi == x->r->nbody && left > 0)
		return CURL_SEEKFUNC_FAIL;
	x->boff = (size_t)left;
	return CURL_SEEKFUNC_OK;
}

static size_t on_write(char *p, size_t size, size_t nmemb, void *ud)
{
	struct xfer *x = ud;
	struct http_req *r = x->r;
	size_t n = size * nmemb;
	long st = 0;
	curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &st);
	if (r->dst && st >= 200 && st < 300) {
		if (n > r->dst_len - r->got) {
			r->overflow = true;
			return 0;
		}
		memcpy((char *)r->dst + r->got, p, n);
		r->got += n;
		return n;
	}
	size_t max = (r->dst || st >= 300) ? ERROR_BODY_MAX : r->resp_max;
	if (st >= 300 && n > max - r->resp_len) {
		/* An error page (a proxy's 503 HTML): its start says enough;
		 * the status decides, so drop the rest and keep the exchange. */
		n = max - r->resp_len;
		if (n == 0)
			return size * nmemb;
	} else if (n > max - r->resp_len) {
		r->overflow = true;
		return 0;
	}
	if (GROW(r->resp, x->resp_cap, r->resp_len + n + 1, 4096) < 0)
		return 0;
	memcpy(r->resp + r->resp_len, p, n);
	r->resp_len += n;
	r->resp[r->resp_len] = 0;
	return size * nmemb;
}

static size_t on_header(char *p, size_t size, size_t nmemb, void *ud)
{
	struct xfer *x = ud;
	size_t n = size * nmemb;
	if (n > 5 && strncasecmp(p, "etag:", 5) == 0) {
		const char *v = p + 5;
		size_t len = n - 5;
		while (len && (*v == ' ' || *v == '\t'))
			v++, len--;
		while (len && (v[len - 1] == '\r' || v[len - 1] == '\n' || v[len - 1] == ' '))
			len--;
		if (len < sizeof(x->r->etag)) {
			memcpy(x->r->etag, v, len);
			x->r->etag[len] = 0;
		}
	}
	return n;
}

static int setup(struct xfer *x)
{
	struct http *h = x->h;
	struct http_req *r = x->r;
	CURL *e = x->easy = curl_easy_init();
	if (e == NULL)
		return -ENOMEM;
	for (const char *const *hd = r->headers; hd && *hd; hd++) {
		struct curl_slist *n = curl_slist_append(x->hdrs, *hd);
		if (n == NULL)
			return -ENOMEM;
		x->hdrs = n;
	}
	/* No "Expect: 100-continue" round trip before each part. */
	struct curl_slist *n = curl_slist_append(x->hdrs, "Expect:");
	if (n == NULL)
		return -ENOMEM;
	x->hdrs = n;
	uint64_t blen = 0;
	for (size_t i = 0; i < r->nbody; i++)
		blen += r->body[i].iov_len;
	CURLcode c = CURLE_OK;
#define SET(opt, val) \
	if (c == CURLE_OK) \
	c = curl_easy_setopt(e, opt, val)
	SET(CURLOPT_URL, r->url);
	SET(CURLOPT_PRIVATE, (char *)x);
	SET(CURLOPT_ERRORBUFFER, x->errbuf);
	SET(CURLOPT_NOSIGNAL, 1L);
	SET(CURLOPT_HTTPHEADER, x->hdrs);
	SET(CURLOPT_CONNECTTIMEOUT_MS, (long)h->o.connect_timeout_ms);
	if (r->timeout_ms)
		SET(CURLOPT_TIMEOUT_MS, (long)r->timeout_ms);
	SET(CURLOPT_LOW_SPEED_LIMIT, 1024L);
	SET(CURLOPT_LOW_SPEED_TIME, (long)h->o.low_speed_time_s);
	SET(CURLOPT_SSL_VERIFYPEER, h->o.insecure ? 0L : 1L);
	SET(CURLOPT_SSL_VERIFYHOST, h->o.insecure ? 0L : 2L);
	if (h->ca[0])
		SET(CURLOPT_CAINFO, h->ca);
	SET(CURLOPT_WRITEFUNCTION, on_write);
	SET(CURLOPT_WRITEDATA, x);
	SET(CURLOPT_HEADERFUNCTION, on_header);
	SET(CURLOPT_HEADERDATA, x);
	SET(CURLOPT_TCP_KEEPALIVE, 1L);
	/* Keys are signed as they are: no /./ or /../ folding. */
	SET(CURLOPT_PATH_AS_IS, 1L);
	/* HTTP/1.1: parallelism is connections (max_conns), not h2 streams
	 * multiplexed onto one. */
	SET(CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
	if (strcmp(r->method, "PUT") == 0) {
		SET(CURLOPT_UPLOAD, 1L);
		SET(CURLOPT_INFILESIZE_LARGE, (curl_off_t)blen);
	} else if (strcmp(r->method, "POST") == 0) {
		SET(CURLOPT_POST, 1L);
		SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)blen);
	} else if (strcmp(r->method, "HEAD") == 0) {
		SET(CURLOPT_NOBODY, 1L);
	} else if (strcmp(r->method, "GET") != 0) {
		SET(CURLOPT_CUSTOMREQUEST, r->method);
	}
	if (r->nbody || strcmp(r->method, "PUT") == 0 || strcmp(r->method, "POST") == 0) {
		SET(CURLOPT_READFUNCTION, on_read);
		SET(CURLOPT_READDATA, x);
		SET(CURLOPT_SEEKFUNCTION, on_seek);
		SET(CURLOPT_SEEKDATA, x);
	}
#undef SET
	return c == CURLE_OK ? 0 : -EINVAL;
}

static void on_wake(uv_async_t *a)
{
	struct http *h = a->data;
	pthread_mutex_lock(&h->mu);
	struct xfer *q = h->queue;
	h->queue = NULL;
	bool stop = h->stop;
	pthread_mutex_unlock(&h->mu);
	while (q) {
		struct xfer *next = q->next;
		CURLMcode mc = curl_multi_add_handle(h->multi, q->easy);
		if (mc != CURLM_OK) {
			snprintf(q->errbuf, sizeof(q->errbuf), "curl_multi_add_handle: %s", curl_multi_strerror(mc));
			q->r->curl_code = CURLE_FAILED_INIT;
			finish(q, CURLE_FAILED_INIT);
		}
		q = next;
	}
	if (stop) {
		/* Closes the cached connections: their poll handles close too,
		 * and the loop runs out. */
		curl_multi_cleanup(h->multi);
		h->multi = NULL;
		uv_timer_stop(&h->timer);
		uv_close((uv_handle_t *)&h->timer, NULL);
		uv_close((uv_handle_t *)&h->wake, NULL);
	}
}

static void *engine_main(void *arg)
{
	struct http *h = arg;
	uv_run(&h->loop, UV_RUN_DEFAULT);
	return NULL;
}

/* The CA bundle when the URL names none: $SSL_CERT_FILE or
 * $CURL_CA_BUNDLE, else libcurl's own when it is there, else the first of
 * the distributions' usual places (a ckptd from the wheel carries Debian's
 * libcurl, whose path RHEL and SUSE do not have). Empty: libcurl's
 * default. */
static void system_ca(char *out, size_t cap)
{
	static const char *const env[] = { "SSL_CERT_FILE", "CURL_CA_BUNDLE" };
	static const char *const known[] = {
		"/etc/ssl/certs/ca-certificates.crt",                /* Debian, Ubuntu, Arch */
		"/etc/pki/tls/certs/ca-bundle.crt",                  /* RHEL, Fedora, Amazon Linux */
		"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", /* RHEL 9 */
		"/etc/ssl/ca-bundle.pem",                            /* SUSE */
		"/etc/ssl/cert.pem",                                 /* Alpine */
	};
	out[0] = '\0';
	for (size_t i = 0; i < ELEMENTSOF(env); i++) {
		const char *v = getenv(env[i]);
		if (v && v[0] && access(v, R_OK) == 0) {
			snprintf(out, cap, "%s", v);
			return;
		}
	}
	const curl_version_info_data *vi = curl_version_info(CURLVERSION_NOW);
	if (vi && vi->cainfo && access(vi->cainfo, R_OK) == 0)
		return;
	for (size_t i = 0; i < ELEMENTSOF(known); i++)
		if (access(known[i], R_OK) == 0) {
			snprintf(out, cap, "%s", known[i]);
			return;
		}
}

int http_init(struct http **out, const struct http_opts *o, char *err, size_t errlen)
{
	pthread_once(&global_once, global_init);
	if (global_rc != CURLE_OK) {
		snprintf(err, errlen, "curl_global_init: %s", curl_easy_strerror(global_rc));
		return -EIO;
	}
	struct http *h = calloc(1, sizeof(*h));
	if (h == NULL)
		return -ENOMEM;
	h->o = *o;
	if (o->ca_bundle)
		snprintf(h->ca, sizeof(h->ca), "%s", o->ca_bundle);
	else
		system_ca(h->ca, sizeof(h->ca));
	pthread_mutex_init(&h->mu, NULL);
	int r = uv_loop_init(&h->loop);
	if (r < 0) {
		snprintf(err, errlen, "uv_loop_init: %s", uv_strerror(r));
		free(h);
		return r;
	}
	uv_async_init(&h->loop, &h->wake, on_wake);
	h->wake.data = h;
	uv_timer_init(&h->loop, &h->timer);
	h->timer.data = h;
	h->multi = curl_multi_init();
	if (h->multi == NULL) {
		snprintf(err, errlen, "curl_multi_init failed");
		http_free(h);
		return -ENOMEM;
	}
	curl_multi_setopt(h->multi, CURLMOPT_SOCKETFUNCTION, sock_cb);
	curl_multi_setopt(h->multi, CURLMOPT_SOCKETDATA, h);
	curl_multi_setopt(h->multi, CURLMOPT_TIMERFUNCTION, timer_cb);
	curl_multi_setopt(h->multi, CURLMOPT_TIMERDATA, h);
	curl_multi_setopt(h->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)o->max_conns);
	curl_multi_setopt(h->multi, CURLMOPT_MAXCONNECTS, (long)o->max_conns * 2);
	r = pthread_create(&h->thread, NULL, engine_main, h);
	if (r != 0) {
		snprintf(err, errlen, "starting the HTTP thread: %s", strerror(r));
		http_free(h);
		return -r;
	}
	h->started = true;
	*out = h;
	return 0;
}

void http_free(struct http *h)
{
	if (h == NULL)
		return;
	if (h->started) {
		pthread_mutex_lock(&h->mu);
		h->stop = true;
		pthread_mutex_unlock(&h->mu);
		uv_async_send(&h->wake);
		pthread_join(h->thread, NULL);
	} else {
		uv_close((uv_handle_t *)&h->timer, NULL);
		uv_close((uv_handle_t *)&h->wake, NULL);
		uv_run(&h->loop, UV_RUN_DEFAULT);
	}
	if (h->multi)
		curl_multi_cleanup(h->multi);
	uv_loop_close(&h->loop);
	pthread_mutex_destroy(&h->mu);
	free(h);
}

int http_run(struct http *h, struct http_req *const *reqs, size_t n)
{
	if (n == 0)
		return 0;
	struct batch b;
	pthread_mutex_init(&b.mu, NULL);
	pthread_cond_init(&b.cv, NULL);
	b.left = 0;
	struct xfer *head = NULL, *tail = NULL;
	int ret = 0;
	for (size_t i = 0; i < n; i++) {
		http_req_reset(reqs[i]);
		struct xfer *x = calloc(1, sizeof(*x));
		if (x == NULL) {
			ret = -ENOMEM;
			break;
		}
		x->h = h;
		x->r = reqs[i];
		x->b = &b;
		if (setup(x) < 0) {
			curl_easy_cleanup(x->easy);
			curl_slist_free_all(x->hdrs);
			free(x);
			ret = -ENOMEM;
			break;
		}
		if (tail)
			tail->next = x;
		else
			head = x;
		tail = x;
		b.left++;
	}
	if (ret < 0) {
		while (head) {
			struct xfer *nx = head->next;
			curl_easy_cleanup(head->easy);
			curl_slist_free_all(head->hdrs);
			free(head);
			head = nx;
		}
		pthread_mutex_destroy(&b.mu);
		pthread_cond_destroy(&b.cv);
		return ret;
	}
	pthread_mutex_lock(&h->mu);
	tail->next = h->queue;
	h->queue = head;
	pthread_mutex_unlock(&h->mu);
	uv_async_send(&h->wake);
	pthread_mutex_lock(&b.mu);
	while (b.left > 0)
		pthread_cond_wait(&b.cv, &b.mu);
	pthread_mutex_unlock(&b.mu);
	pthread_mutex_destroy(&b.mu);
	pthread_cond_destroy(&b.cv);
	return 0;
}
