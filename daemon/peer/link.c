/* TLS links between peers (link.h). */
#include "link.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

static void ssl_why(char *err, size_t errlen, const char *what)
{
	unsigned long e = ERR_get_error();
	char buf[256] = "";
	if (e)
		ERR_error_string_n(e, buf, sizeof(buf));
	ERR_clear_error();
	snprintf(err, errlen, "%s%s%s", what, buf[0] ? ": " : "", buf);
}

static SSL_CTX *make_ctx(const SSL_METHOD *m, const char *cert, const char *key, const char *ca, char *err,
			 size_t errlen)
{
	SSL_CTX *c = SSL_CTX_new(m);
	if (c == NULL) {
		ssl_why(err, errlen, "SSL_CTX_new");
		return NULL;
	}
	SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
	SSL_CTX_set_mode(c, SSL_MODE_AUTO_RETRY);
	if (SSL_CTX_use_certificate_chain_file(c, cert) != 1) {
		ssl_why(err, errlen, "the [peers] cert");
	} else if (SSL_CTX_use_PrivateKey_file(c, key, SSL_FILETYPE_PEM) != 1) {
		ssl_why(err, errlen, "the [peers] key");
	} else if (SSL_CTX_check_private_key(c) != 1) {
		ssl_why(err, errlen, "the [peers] key does not match its cert");
	} else if (SSL_CTX_load_verify_locations(c, ca, NULL) != 1) {
		ssl_why(err, errlen, "the [peers] ca");
	} else {
		/* Both ways: a peer without a certificate the CA signed is refused. */
		SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
		return c;
	}
	SSL_CTX_free(c);
	return NULL;
}

int link_tls_init(struct link_tls *t, const char *cert, const char *key, const char *ca, char *err, size_t errlen)
{
	t->server = make_ctx(TLS_server_method(), cert, key, ca, err, errlen);
	t->client = t->server ? make_ctx(TLS_client_method(), cert, key, ca, err, errlen) : NULL;
	if (t->client == NULL) {
		link_tls_fini(t);
		return -EINVAL;
	}
	return 0;
}

void link_tls_fini(struct link_tls *t)
{
	SSL_CTX_free(t->server);
	SSL_CTX_free(t->client);
	t->server = t->client = NULL;
}

int link_split(const char *hostport, char *host, size_t hostlen, char *port, size_t portlen)
{
	const char *colon;
	const char *h = hostport;
	size_t hl;
	if (h[0] == '[') {
		const char *close = strchr(h, ']');
		if (close == NULL || close[1] != ':')
			return -EINVAL;
		h++;
		hl = (size_t)(close - h);
		colon = close + 1;
	} else {
		colon = strrchr(h, ':');
		if (colon == NULL)
			return -EINVAL;
		hl = (size_t)(colon - h);
	}
	if (hl == 0 || hl >= hostlen || strlen(colon + 1) == 0 || strlen(colon + 1) >= portlen)
		return -EINVAL;
	memcpy(host, h, hl);
	host[hl] = '\0';
	snprintf(port, portlen, "%s", colon + 1);
	return 0;
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* When an exchange of n bytes that starts now must be over: the timeout,
 * plus n at the least rate. */
static uint64_t deadline_for(const struct link *l, size_t n)
{
	uint64_t rate = l->min_rate ? l->min_rate : LINK_MIN_RATE;
	return now_ms() + l->timeout_ms + (uint64_t)n * 1000 / rate;
}

/* Non-blocking, so that every wait is a poll with what is left of its
 * deadline (a peer that sends one byte a second cannot stretch it). */
static void set_nonblocking(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Wait until fd is ready for events, or deadline: 0, -ETIMEDOUT, -errno. */
static int wait_fd(int fd, short events, uint64_t deadline)
{
	for (;;) {
		uint64_t now = now_ms();
		if (now >= deadline)
			return -ETIMEDOUT;
		struct pollfd p = { .fd = fd, .events = events };
		uint64_t left = deadline - now;
		int r = poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left);
		if (r > 0)
			return 0; /* ready, or an error or hang-up the next call reports */
		if (r == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return -errno;
	}
}

/* After an SSL call on fd returned ret <= 0: 1 to call it again (it could
 * go on before deadline), or why it cannot (-ETIMEDOUT, -EPIPE at a
 * clean end, -errno, -EPROTO). */
static int ssl_again(SSL *ssl, int fd, int ret, uint64_t deadline)
{
	int e = SSL_get_error(ssl, ret);
	int se = errno;
	if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
		int r = wait_fd(fd, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
		return r == 0 ? 1 : r;
	}
	if (e == SSL_ERROR_ZERO_RETURN) {
		ERR_clear_error();
		return -EPIPE;
	}
	if (e == SSL_ERROR_SYSCALL) {
		ERR_clear_error();
		return ret == 0 || se == 0 ? -EPIPE : -se;
	}
	return -EPROTO; /* the error queue says why (handshake_failed) */
}

/* A non-blocking connect to one address, waited for up to ms. */
static int connect_one(const struct addrinfo *ai, uint32_t ms)
{
	int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
	if (fd < 0)
		return -errno;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
		int e = -errno;
		close(fd);
		return e;
	}
	int r = wait_fd(fd, POLLOUT, now_ms() + ms);
	int soerr = 0;
	socklen_t sl = sizeof(soerr);
	if (r < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr != 0) {
		close(fd);
		return r < 0 ? r : soerr ? -soerr : -ECONNREFUSED;
	}
	return fd;
}

/* The handshake's failure in words: the verify result says more than the
 * error queue when a certificate was refused. */
static int handshake_failed(SSL *ssl, int r, char *err, size_t errlen, const char *what, uint32_t timeout_ms)
{
	if (r == -ETIMEDOUT) {
		snprintf(err, errlen, "%s: timed out after %u ms ([peers] timeout_ms)", what, timeout_ms);
		ERR_clear_error();
		return -ETIMEDOUT;
	}
	long v = SSL_get_verify_result(ssl);
	if (v != X509_V_OK) {
		snprintf(err, errlen, "%s: the peer's certificate: %s", what, X509_verify_cert_error_string(v));
		ERR_clear_error();
		return -EACCES;
	}
	if (r == -EPIPE || r == -ECONNRESET) {
		snprintf(err, errlen, "%s: the connection closed", what);
		ERR_clear_error();
		return -ECONNABORTED;
	}
	ssl_why(err, errlen, what);
	return -ECONNABORTED;
}

/* TLS on the connected socket fd, as its client or its server, all of it
 * within timeout_ms; fd is l's on success; on failure the client closes
 * it, the server leaves it to its caller. */
static int handshake(SSL_CTX *ctx, int fd, const char *name, uint32_t timeout_ms, uint64_t min_rate, struct link *l,
		     const char *what, char *err, size_t errlen)
{
	bool client = name != NULL;
	set_nonblocking(fd);
	SSL *ssl = SSL_new(ctx);
	/* The server's certificate must name the host dialled ([peers]
	 * verify_names): an IP address, or a DNS name. */
	struct in6_addr a6;
	bool ip = name && (inet_pton(AF_INET, name, &a6) == 1 || inet_pton(AF_INET6, name, &a6) == 1);
	if (ssl && name && name[0] &&
	    (ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) != 1 : SSL_set1_host(ssl, name) != 1)) {
		SSL_free(ssl);
		ssl = NULL;
	}
	if (ssl == NULL || SSL_set_fd(ssl, fd) != 1) {
		ssl_why(err, errlen, "SSL_new");
		SSL_free(ssl);
		if (client)
			close(fd);
		return -ENOMEM;
	}
	uint64_t deadline = now_ms() + timeout_ms;
	int r;
	for (;;) {
		int ret = client ? SSL_connect(ssl) : SSL_accept(ssl);
		if (ret == 1) {
			r = 0;
			break;
		}
		r = ssl_again(ssl, fd, ret, deadline);
		if (r < 0)
			break;
	}
	if (r < 0) {
		r = handshake_failed(ssl, r, err, errlen, what, timeout_ms);
		SSL_free(ssl);
		if (client)
			close(fd);
		return r;
	}
	l->fd = fd;
	l->ssl = ssl;
	l->timeout_ms = timeout_ms;
	l->min_rate = min_rate;
	return 0;
}

int link_connect(const struct link_tls *t, const char *hostport, uint32_t timeout_ms, uint64_t min_rate, struct link *l,
		 char *err, size_t errlen)
{
	char host[256], port[16];
	l->fd = -1;
	l->ssl = NULL;
	if (link_split(hostport, host, sizeof(host), port, sizeof(port)) < 0) {
		snprintf(err, errlen, "'%s' is not HOST:PORT", hostport);
		return -EINVAL;
	}
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL;
	int g = getaddrinfo(host, port, &hints, &res);
	if (g != 0) {
		snprintf(err, errlen, "resolving %s: %s", host, gai_strerror(g));
		return -EHOSTUNREACH;
	}
	int fd = -ECONNREFUSED;
	for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next)
		fd = connect_one(ai, timeout_ms);
	freeaddrinfo(res);
	if (fd < 0) {
		snprintf(err, errlen, "connecting to %s: %s", hostport, strerror(-fd));
		return fd;
	}
	char what[300];
	snprintf(what, sizeof(what), "TLS with %s", hostport);
	return handshake(t->client, fd, t->verify_names ? host : "", timeout_ms, min_rate, l, what, err, errlen);
}

int link_accept(const struct link_tls *t, int fd, uint32_t timeout_ms, uint64_t min_rate, struct link *l, char *err,
		size_t errlen)
{
	l->fd = -1;
	l->ssl = NULL;
	return handshake(t->server, fd, NULL, timeout_ms, min_rate, l, "TLS with a peer", err, errlen);
}

/* Whether cert names HOST of hostport, as TLS clients check a server's. */
static bool cert_names(X509 *cert, const char *hostport)
{
	char host[256], port[16];
	if (cert == NULL || link_split(hostport, host, sizeof(host), port, sizeof(port)) < 0)
		return false;
	struct in6_addr a6;
	bool ip = inet_pton(AF_INET, host, &a6) == 1 || inet_pton(AF_INET6, host, &a6) == 1;
	return ip ? X509_check_ip_asc(cert, host, 0) == 1 : X509_check_host(cert, host, 0, 0, NULL) == 1;
}

bool link_peer_named(const struct link *l, const char *hostport)
{
	X509 *cert = l->ssl ? SSL_get1_peer_certificate(l->ssl) : NULL;
	bool ok = cert_names(cert, hostport);
	X509_free(cert);
	return ok;
}

bool link_tls_named(const struct link_tls *t, const char *hostport)
{
	return t->server && cert_names(SSL_CTX_get0_certificate(t->server), hostport);
}

void link_close(struct link *l)
{
	if (l->ssl) {
		SSL_shutdown(l->ssl);
		SSL_free(l->ssl);
	}
	if (l->fd >= 0)
		close(l->fd);
	l->ssl = NULL;
	l->fd = -1;
}

void link_plain(struct link *l, int fd, uint32_t timeout_ms)
{
	set_nonblocking(fd);
	l->fd = fd;
	l->ssl = NULL;
	l->timeout_ms = timeout_ms;
	l->min_rate = 0;
}

/* n bytes on a link without TLS (link_plain) by deadline. */
static int io_plain(struct link *l, uint8_t *p, size_t n, bool write, uint64_t deadline)
{
	while (n > 0) {
		ssize_t got = write ? send(l->fd, p, n, MSG_NOSIGNAL) : read(l->fd, p, n);
		if (got > 0) {
			p += got;
			n -= (size_t)got;
			continue;
		}
		if (got == 0)
			return -EPIPE;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		int r = wait_fd(l->fd, write ? POLLOUT : POLLIN, deadline);
		if (r < 0)
			return r;
	}
	return 0;
}

/* n bytes through SSL_write or SSL_read by deadline. */
static int io(struct link *l, void *buf, size_t n, bool write, uint64_t deadline)
{
	uint8_t *p = buf;
	if (l->ssl == NULL)
		return io_plain(l, p, n, write, deadline);
	while (n > 0) {
		int k = n > (1u << 30) ? (1 << 30) : (int)n;
		int got = write ? SSL_write(l->ssl, p, k) : SSL_read(l->ssl, p, k);
		if (got <= 0) {
			int r = ssl_again(l->ssl, l->fd, got, deadline);
			if (r < 0) {
				ERR_clear_error();
				return r;
			}
			continue;
		}
		p += got;
		n -= (size_t)got;
	}
	return 0;
}

int link_write(struct link *l, const void *buf, size_t n)
{
	return io(l, (void *)buf, n, true, deadline_for(l, n));
}

int link_read(struct link *l, void *buf, size_t n)
{
	return io(l, buf, n, false, deadline_for(l, n));
}

int link_send(struct link *l, const Ckpt__PeerFrame *f)
{
	size_t len = ckpt__peer_frame__get_packed_size(f);
	if (len > UINT32_MAX)
		return -EMSGSIZE;
	uint8_t *buf = malloc(len + 4);
	if (buf == NULL)
		return -ENOMEM;
	buf[0] = (uint8_t)(len >> 24);
	buf[1] = (uint8_t)(len >> 16);
	buf[2] = (uint8_t)(len >> 8);
	buf[3] = (uint8_t)len;
	ckpt__peer_frame__pack(f, buf + 4);
	int r = link_write(l, buf, len + 4);
	free(buf);
	return r;
}

int link_recv(struct link *l, size_t max, Ckpt__PeerFrame **out)
{
	uint8_t hdr[4];
	int r = io(l, hdr, 4, false, deadline_for(l, 0));
	if (r < 0)
		return r;
	size_t len = (size_t)hdr[0] << 24 | (size_t)hdr[1] << 16 | (size_t)hdr[2] << 8 | hdr[3];
	if (len > max)
		return -EMSGSIZE;
	/* The whole frame by one deadline, into a buffer that grows with what
	 * arrives (to twice it at most), not with what the header claims. */
	uint64_t deadline = deadline_for(l, len);
	size_t cap = len < LINK_RECV_STEP ? len : LINK_RECV_STEP, have = 0;
	uint8_t *buf = malloc(cap ? cap : 1);
	if (buf == NULL)
		return -ENOMEM;
	while (r == 0 && have < len) {
		if (have == cap) {
			size_t nc = cap * 2 < len ? cap * 2 : len;
			uint8_t *nb = realloc(buf, nc);
			if (nb == NULL) {
				r = -ENOMEM;
				break;
			}
			buf = nb;
			cap = nc;
		}
		r = io(l, buf + have, cap - have, false, deadline);
		if (r == 0)
			have = cap;
	}
	if (r == 0) {
		*out = ckpt__peer_frame__unpack(NULL, len, buf);
		if (*out == NULL)
			r = -EBADMSG;
	}
	free(buf);
	return r;
}
