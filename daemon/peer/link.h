/* One TLS connection between two daemons (docs/tiers.md "Tiers"): mutual
 * certificate authentication against the [peers] CA, PeerFrames framed
 * as on the socket (a 4-byte big-endian length), and raw shard bytes.
 * Every exchange has a deadline: the handshake [peers] timeout_ms; a frame
 * or a write or read of n bytes, timeout_ms plus n at [peers] min_rate,
 * from its start, however the bytes trickle in. Used by the peer threads
 * only (peer_int.h), never by the loop. */
#ifndef CKPTD_LINK_H
#define CKPTD_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.pb-c.h"

#define LINK_MIN_RATE (8u << 20)   /* bytes a second, when min_rate is 0 */
#define LINK_RECV_STEP (64u << 10) /* a frame's buffer grows from this, as bytes arrive */

struct ssl_ctx_st;
struct ssl_st;

struct link_tls {
	struct ssl_ctx_st *server, *client;
	bool verify_names; /* link_connect checks the server's certificate names the HOST it dialled */
};

/* Both contexts from the PEM files: our certificate and key, and the CA
 * every peer's certificate must chain to (TLS 1.2 at least; a peer
 * without a certificate is refused). 0, or -errno with err. */
int link_tls_init(struct link_tls *t, const char *cert, const char *key, const char *ca, char *err, size_t errlen);

void link_tls_fini(struct link_tls *t);

struct link {
	int fd; /* non-blocking */
	struct ssl_st *ssl;
	uint32_t timeout_ms;
	uint64_t min_rate; /* bytes a second; 0: LINK_MIN_RATE */
};

/* Connect to "HOST:PORT" ("[V6]:PORT" too) and handshake, within
 * timeout_ms each; later exchanges by their deadlines (above). 0, or
 * -errno with err saying why (refused, timed out, the peer's
 * certificate). */
int link_connect(const struct link_tls *t, const char *hostport, uint32_t timeout_ms, uint64_t min_rate, struct link *l,
		 char *err, size_t errlen);
/* The server side of an accepted socket (it becomes l's; on failure the
 * caller closes it), the handshake within timeout_ms. */
int link_accept(const struct link_tls *t, int fd, uint32_t timeout_ms, uint64_t min_rate, struct link *l, char *err,
		size_t errlen);
/* A link on the connected socket fd with no TLS at all: only the peer
 * fuzz harness makes one (it serves frames through a socketpair); the
 * daemon's links come from link_connect and link_accept, always TLS. */
void link_plain(struct link *l, int fd, uint32_t timeout_ms);
void link_close(struct link *l);
/* Whether the peer's certificate on l names HOST of hostport ("HOST:PORT"):
 * an IP address or DNS subjectAltName (or, for DNS, the common name when
 * it has none), as TLS clients check a server's. */
bool link_peer_named(const struct link *l, const char *hostport);

/* Whether this node's own certificate (t's) names HOST of hostport. */
bool link_tls_named(const struct link_tls *t, const char *hostport);

int link_send(struct link *l, const Ckpt__PeerFrame *f);
/* The next frame, at most max bytes: 0 and *out (free with
 * ckpt__peer_frame__free_unpacked), -EPIPE at a clean end, -EMSGSIZE,
 * -EBADMSG, -ETIMEDOUT (no frame began within timeout_ms, or it did not
 * end by its deadline), or the read's error. */
int link_recv(struct link *l, size_t max, Ckpt__PeerFrame **out);
int link_write(struct link *l, const void *buf, size_t n);
int link_read(struct link *l, void *buf, size_t n);

/* "HOST:PORT" into its parts; 0 or -EINVAL. */
int link_split(const char *hostport, char *host, size_t hostlen, char *port, size_t portlen);

#endif
