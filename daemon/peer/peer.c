/* Peer replication (peer.h, peer_int.h): start and stop, and the loop
 * bridge through which the peer threads reach the daemon's state. */
#include "peer.h"
#include "peer_int.h"
#include "log.h"
#include "requester.h"
#include "save.h"
#include "seal.h"
#include "wire.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void on_async(uv_async_t *a)
{
	struct peer *p = a->data;
	struct daemon *d = p->d;
	pthread_mutex_lock(&p->mu);
	struct call *c = p->calls;
	p->calls = NULL;
	p->calls_tail = &p->calls;
	struct job *done = p->done;
	p->done = NULL;
	pthread_mutex_unlock(&p->mu);
	while (c) {
		struct call *next = c->next;
		c->fn(d, c->arg);
		pthread_mutex_lock(&p->mu);
		c->done = true;
		pthread_cond_broadcast(&p->cv);
		pthread_mutex_unlock(&p->mu);
		c = next;
	}
	while (done) {
		struct job *next = done->next;
		struct save *sv = done->sv;
		snprintf(sv->replicated_to, sizeof(sv->replicated_to), "%s", done->peers); /* before strtok_r */
		if (--sv->readers == 0 && sv->drop_pending) {
			save_release(sv);
			save_admit_waiting(d);
		}
		if (done->session && d->req_ops->release(done->session)) {
			Ckpt__SaveReplicated ev = CKPT__SAVE_REPLICATED__INIT;
			char *names[16];
			size_t n = 0;
			char *save = NULL;
			for (char *t = strtok_r(done->peers, ",", &save); t && n < 16; t = strtok_r(NULL, ",", &save))
				names[n++] = t;
			ev.copies = done->copies;
			ev.n_peers = n;
			ev.peers = names;
			ev.status = wire_status(done->status);
			ev.message = done->msg;
			Ckpt__Frame f = CKPT__FRAME__INIT;
			f.body_case = CKPT__FRAME__BODY_SAVE_REPLICATED;
			f.save_replicated = &ev;
			d->req_ops->send(done->session, done->req_id, &f);
		}
		free(done);
		done = next;
	}
}

int peer_loop_call(struct peer *p, void (*fn)(struct daemon *d, void *arg), void *arg)
{
	if (p->direct) {
		fn(p->d, arg);
		return 0;
	}
	struct call c = { .fn = fn, .arg = arg };
	pthread_mutex_lock(&p->mu);
	if (p->stopping) {
		pthread_mutex_unlock(&p->mu);
		return -ESHUTDOWN;
	}
	*p->calls_tail = &c;
	p->calls_tail = &c.next;
	pthread_mutex_unlock(&p->mu);
	uv_async_send(&p->async);
	pthread_mutex_lock(&p->mu);
	while (!c.done && !p->stopping)
		pthread_cond_wait(&p->cv, &p->mu);
	bool done = c.done;
	pthread_mutex_unlock(&p->mu);
	return done ? 0 : -ESHUTDOWN;
}

/* ---- start and stop ---- */

static int listen_on(const char *hostport, char *err, size_t errlen)
{
	char host[256], port[16];
	if (link_split(hostport, host, sizeof(host), port, sizeof(port)) < 0) {
		snprintf(err, errlen, "[peers] listen '%s' is not HOST:PORT", hostport);
		return -EINVAL;
	}
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *res = NULL;
	int g = getaddrinfo(host, port, &hints, &res);
	if (g != 0) {
		snprintf(err, errlen, "[peers] listen %s: %s", hostport, gai_strerror(g));
		return -EINVAL;
	}
	int fd = -1, e = 0;
	for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0) {
			e = errno;
			continue;
		}
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 64) < 0) {
			e = errno;
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(res);
	if (fd < 0) {
		snprintf(err, errlen, "[peers] listen %s: %s", hostport, strerror(e));
		return -e;
	}
	return fd;
}

/* Whether peer replication is off in this configuration (no listen
 * address, or no certificates: never unauthenticated); d->peer_why says
 * why. */
static bool peers_off(struct daemon *d)
{
	const struct config *c = &d->cfg;
	if (c->peer_listen[0] == '\0') {
		snprintf(d->peer_why, sizeof(d->peer_why), "peer replication is off in this ckptd (no [peers] listen)");
		return true;
	}
	if (!c->peer_cert[0] || !c->peer_key[0] || !c->peer_ca[0]) {
		snprintf(d->peer_why, sizeof(d->peer_why),
			 "peer replication is off in this ckptd: [peers] cert, key and ca are needed (never "
			 "unauthenticated)");
		log_warn("peers: %s", d->peer_why);
		return true;
	}
	return false;
}

/* The [peers] limits in their ranges, or -EINVAL naming them in err. */
static int peer_limits_check(const struct config *c, char *err, size_t errlen)
{
	if (c->peer_replicas < 1 || c->peer_replicas > MAX_REPLICAS) {
		snprintf(err, errlen, "[peers] replicas = %u: want 1 to %d", c->peer_replicas, MAX_REPLICAS);
		return -EINVAL;
	}
	if (c->peer_max_list < 1 || c->peer_max_list > 65536 || c->peer_max_missing_ranks < 1) {
		snprintf(err, errlen, "[peers] max_list (1 to 65536) and max_missing_ranks: want 1 or more");
		return -EINVAL;
	}
	if (c->peer_max_connections < 1 || c->peer_max_handshakes < 1 || c->peer_max_per_address < 1 ||
	    c->peer_max_connections > 65536 || c->peer_max_handshakes > 65536) {
		snprintf(err, errlen,
			 "[peers] max_connections, max_handshakes and max_per_address: want 1 or more (at most 65536)");
		return -EINVAL;
	}
	return 0;
}

/* A peer's state from the configuration, its slots empty and no socket
 * or thread yet; NULL (err says so) when out of memory. */
static struct peer *peer_alloc(struct daemon *d, char *err, size_t errlen)
{
	const struct config *c = &d->cfg;
	struct peer *p = calloc(1, sizeof(*p));
	if (p == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	p->d = d;
	p->listen_fd = -1;
	p->sender_fd = -1;
	p->nslots = c->peer_max_handshakes + c->peer_max_connections;
	p->slots = calloc(p->nslots, sizeof(*p->slots));
	if (p->slots == NULL) {
		free(p);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	for (unsigned i = 0; i < p->nslots; i++)
		p->slots[i].fd = -1;
	p->timeout_ms = c->peer_timeout_ms ? c->peer_timeout_ms : DEFAULT_PEER_TIMEOUT_MS;
	p->calls_tail = &p->calls;
	p->queue_tail = &p->queue;
	snprintf(p->self, sizeof(p->self), "%s", c->peer_advertise[0] ? c->peer_advertise : c->peer_listen);
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	return p;
}

/* TLS from [peers] cert, key and ca, and the listening socket; on failure
 * everything peer_alloc made is freed and the error returned. */
static int peer_tls_listen(struct peer *p, const struct config *c, char *err, size_t errlen)
{
	int r = link_tls_init(&p->tls, c->peer_cert, c->peer_key, c->peer_ca, err, errlen);
	/* auto: names are checked where certificates name their nodes (this
	 * node's does), not where one certificate serves every node. */
	bool own_named = r == 0 && link_tls_named(&p->tls, p->self);
	p->tls.verify_names = c->peer_verify_names == VERIFY_NAMES_ON ||
			      (c->peer_verify_names == VERIFY_NAMES_AUTO && own_named);
	if (r == 0) {
		r = listen_on(c->peer_listen, err, errlen);
		p->listen_fd = r;
	}
	if (r < 0) {
		link_tls_fini(&p->tls);
		pthread_mutex_destroy(&p->mu);
		pthread_cond_destroy(&p->cv);
		free(p->slots);
		free(p);
		return r;
	}
	return 0;
}

static void peer_log_started(const struct peer *p, const struct config *c)
{
	log_info("peers: listening on %s as %s, %u replica(s) per save, TLS with client certificates", c->peer_listen,
		 p->self, c->peer_replicas);
	if (p->tls.verify_names)
		log_info("peers: a peer speaks only under a name its certificate gives ([peers] verify_names = %s)",
			 c->peer_verify_names == VERIFY_NAMES_ON ? "true" : "auto: this node's certificate names it");
	else
		log_warn(
			"peers: names are not checked against certificates ([peers] verify_names = %s): any "
			"certificate the CA signed may speak as any node; give each node a certificate naming its host",
			c->peer_verify_names == VERIFY_NAMES_OFF
				? "false"
				: "auto, and this node's certificate does not name it");
}

int peer_start(struct daemon *d, char *err, size_t errlen)
{
	const struct config *c = &d->cfg;
	if (peers_off(d))
		return 0;
	int r = peer_limits_check(c, err, errlen);
	if (r < 0)
		return r;
	struct peer *p = peer_alloc(d, err, errlen);
	if (p == NULL)
		return -ENOMEM;
	r = peer_tls_listen(p, c, err, errlen);
	if (r < 0)
		return r;
	uv_async_init(d->loop, &p->async, on_async);
	p->async.data = p;
	d->peer = p;
	if (pthread_create(&p->acceptor, NULL, peer_acceptor_main, p) == 0)
		p->acceptor_started = true;
	if (pthread_create(&p->sender, NULL, peer_sender_main, p) == 0)
		p->sender_started = true;
	if (!p->acceptor_started || !p->sender_started) {
		snprintf(err, errlen, "cannot start the peer threads");
		peer_stop(d);
		return -EAGAIN;
	}
	d->on_replicate = peer_on_replicate;
	d->peer_fetch = peer_fetch;
	d->peer_extra = peer_extra;
	d->peer_list = peer_list;
	d->job_key = seal_derive;
	if (c->peer_share_reads && d->rangecache)
		d->peer_range = peer_range;
	peer_log_started(p, c);
	return 0;
}

static void async_closed(uv_handle_t *h)
{
	struct peer *p = h->data;
	link_tls_fini(&p->tls);
	free(p->slots);
	for (size_t i = 0; i < JOBS; i++)
		free(p->jobs[i].at);
	free(p->names);
	free(p->ring);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p);
}

void peer_stop(struct daemon *d)
{
	struct peer *p = d->peer;
	if (p == NULL)
		return;
	d->on_replicate = NULL;
	d->peer_fetch = NULL;
	d->peer_extra = NULL;
	d->peer_list = NULL;
	d->job_key = NULL;
	d->peer_range = NULL;
	pthread_mutex_lock(&p->mu);
	p->stopping = true;
	/* Waiting loop calls give up (-ESHUTDOWN); every socket is shut, so
	 * blocked reads and writes end now. */
	struct call *c = p->calls;
	p->calls = NULL;
	p->calls_tail = &p->calls;
	(void)c;
	for (unsigned i = 0; i < p->nslots; i++)
		if (p->slots[i].fd >= 0)
			shutdown(p->slots[i].fd, SHUT_RDWR);
	if (p->sender_fd >= 0)
		shutdown(p->sender_fd, SHUT_RDWR);
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	if (p->listen_fd >= 0)
		shutdown(p->listen_fd, SHUT_RDWR);
	if (p->acceptor_started)
		pthread_join(p->acceptor, NULL);
	if (p->sender_started)
		pthread_join(p->sender, NULL);
	if (p->listen_fd >= 0)
		close(p->listen_fd);
	/* Connection threads end once their socket is shut (their loop calls
	 * now fail); wait for them, a little. */
	pthread_mutex_lock(&p->mu);
	for (int i = 0; i < 50 && p->nconns > 0; i++) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 100 * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&p->cv, &p->mu, &ts);
	}
	bool left = p->nconns > 0;
	pthread_mutex_unlock(&p->mu);
	/* Jobs the sender did not finish: unpinned by nobody (the copies are
	 * dropped at exit with the memory tier). */
	d->peer = NULL;
	if (left)
		log_warn("peers: %u connection(s) still closing at stop; left to the exit", p->nconns);
	/* Closed either way, or the loop would never end; p is freed once no
	 * thread can hold it (those left see stopping and touch only p). */
	uv_close((uv_handle_t *)&p->async, left ? NULL : async_closed);
}
