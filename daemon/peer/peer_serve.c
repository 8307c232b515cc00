/* Serving peers (peer_int.h): the acceptor, connection slots, the
 * handshake and hello, and a peer's requests: put a replica, get a copy,
 * list copies. */
#include "peer_int.h"
#include "clock.h"
#include "log.h"
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

static void reply_status(struct link *l, Ckpt__PeerFrame__BodyCase body, int status, const char *msg)
{
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	Ckpt__ReplicaReady rd = CKPT__REPLICA_READY__INIT;
	Ckpt__ReplicaAck ack = CKPT__REPLICA_ACK__INIT;
	f.body_case = body;
	if (body == CKPT__PEER_FRAME__BODY_READY) {
		rd.status = wire_status(status);
		rd.message = (char *)msg;
		f.ready = &rd;
	} else {
		ack.status = wire_status(status);
		ack.message = (char *)msg;
		f.ack = &ack;
	}
	(void)link_send(l, &f);
}

/* Whether this node holds from's replicas: from is one of its [peers]
 * replicas (K) predecessors in the ring, as from's own peer_ring_now puts it
 * (peer_ring_now lists the others in ring order after this node, so from's
 * successors include this node when from is among the last K). */
static bool holder_for(struct peer *p, const char *from)
{
	char(*ring)[RING_NAME_MAX] = NULL;
	char why[200] = "";
	size_t n = peer_ring_now(p, RING_MAX, &ring, why, sizeof(why));
	size_t k = p->d->cfg.peer_replicas;
	bool ok = false;
	for (size_t i = 0; i < n; i++)
		if (strcmp(ring[i], from) == 0)
			ok = n <= k || i >= n - k;
	free(ring);
	return ok;
}

/* ReplicaPut: check, reserve within the share, receive, hold. Only from
 * a peer whose replicas go here (holder_for). false: the connection
 * cannot go on. */
static bool serve_put(struct peer *p, struct link *l, const Ckpt__ReplicaPut *put, const char *from)
{
	struct daemon *d = p->d;
	Ckpt__Manifest *m = NULL;
	char why[300];
	bool sealed = false;
	struct put_limits lim = { d->cfg.max_tensors, d->cfg.max_extra_state, d->pool.bytes };
	int r = peer_msg_put(put, &lim, &m, &sealed, why, sizeof(why));
	if (r == 0 && !holder_for(p, from)) {
		r = -EPERM;
		snprintf(why, sizeof(why),
			 "%s is not one of the %u peers before this node in its ring ([peers] replicas): its replicas "
			 "go to other nodes",
			 from, d->cfg.peer_replicas);
	}
	struct save *sv = r == 0 ? peer_save_from_manifest(d, m, (int)put->tier) : NULL;
	if (r == 0 && sv == NULL) {
		r = -ENOMEM;
		snprintf(why, sizeof(why), "out of memory");
	}
	if (r == 0 && sealed) {
		sv->seal_len = SEAL_NONCE_BYTES + seal_pieces(m->shard_bytes) * SEAL_TAG_BYTES +
			       put->sealed_manifest.len;
		sv->seal = malloc(sv->seal_len);
		if (sv->seal == NULL) {
			r = -ENOMEM;
			snprintf(why, sizeof(why), "out of memory");
		} else {
			memcpy(sv->seal, put->seal_nonce.data, SEAL_NONCE_BYTES);
			memcpy(sv->seal + peer_seal_sm_off(sv), put->sealed_manifest.data, put->sealed_manifest.len);
			sv->meta_bytes += sv->seal_len;
		}
	}
	struct reserve rs = { .sv = sv, .replica = true };
	if (r == 0) {
		sv->replica = true;
		snprintf(sv->peer, sizeof(sv->peer), "%s", from);
		r = peer_loop_call(p, hold_reserve, &rs);
		if (r == 0 && rs.status < 0) {
			r = rs.status;
			snprintf(why, sizeof(why), "%s", rs.msg);
		}
	}
	if (r < 0) {
		if (sv)
			save_free(sv); /* no chunks */
		if (m)
			ckpt__manifest__free_unpacked(m, NULL);
		log_warn("peers: refused a replica from %s: %s", from, why);
		reply_status(l, CKPT__PEER_FRAME__BODY_READY, r, why);
		return r != -EBADMSG && r != -ESHUTDOWN;
	}
	reply_status(l, CKPT__PEER_FRAME__BODY_READY, 0, "");
	r = sealed ? peer_recv_sealed(l, sv, NULL, NULL, NULL, why, sizeof(why))
		   : peer_recv_shard(l, sv, m, why, sizeof(why));
	struct commit c = { .sv = sv };
	uint64_t bytes = sv->shard_bytes; /* hold_commit frees sv when it refuses it (-ESTALE) */
	if (r == 0 && peer_loop_call(p, hold_commit, &c) == 0) {
		count(&d->stats.peer_bytes_received, bytes);
		log_debug("peers: holding %s step %" PRIu64 " rank %u for %s (%" PRIu64 " bytes)", m->job, m->step,
			  m->rank, from, m->shard_bytes);
		reply_status(l, CKPT__PEER_FRAME__BODY_ACK, c.status, c.msg);
		ckpt__manifest__free_unpacked(m, NULL);
		return true;
	}
	if (r == 0) {
		r = -ESHUTDOWN;
		snprintf(why, sizeof(why), "ckptd is stopping");
	}
	if (peer_loop_call(p, hold_release, sv) < 0)
		log_warn("peers: a replica's pool space stays reserved: ckptd is stopping");
	log_warn("peers: a replica of %s step %" PRIu64 " rank %u from %s failed: %s", m->job, m->step, m->rank, from,
		 why);
	count(&d->stats.peer_link_errors, 1);
	ckpt__manifest__free_unpacked(m, NULL);
	if (r != -EIO)
		return false; /* the stream is broken */
	reply_status(l, CKPT__PEER_FRAME__BODY_ACK, r, why);
	return true;
}

/* ReplicaGet: the copy of (job, step, rank) held here, if any. */
static bool serve_get(struct peer *p, struct link *l, const Ckpt__ReplicaGet *g)
{
	struct find f = { .job = g->job, .step = g->step, .rank = g->rank, .world_size = g->world_size };
	Ckpt__PeerFrame out = CKPT__PEER_FRAME__INIT;
	Ckpt__ReplicaData data = CKPT__REPLICA_DATA__INIT;
	out.body_case = CKPT__PEER_FRAME__BODY_DATA;
	out.data = &data;
	if (peer_loop_call(p, hold_find, &f) < 0)
		return false;
	uint8_t *mb = NULL;
	size_t ml = 0;
	if (f.sv == NULL) {
		data.status = wire_status(-ENOENT);
		data.message = (char *)"no copy of it is held here";
	} else if (peer_pack_manifest(f.sv, f.sv->seal != NULL, &mb, &ml) < 0) {
		data.status = wire_status(-ENOMEM);
		data.message = (char *)"out of memory";
	} else {
		data.manifest.data = mb;
		data.manifest.len = ml;
		if (f.sv->seal) { /* as it was put: its seal, then ciphertext and tags */
			data.seal_nonce.data = f.sv->seal;
			data.seal_nonce.len = SEAL_NONCE_BYTES;
			data.sealed_manifest.data = f.sv->seal + peer_seal_sm_off(f.sv);
			data.sealed_manifest.len = f.sv->seal_len - peer_seal_sm_off(f.sv);
		}
	}
	int r = link_send(l, &out);
	if (r == 0 && f.sv && mb && !g->manifest_only) {
		r = f.sv->seal ? peer_send_held_sealed(l, f.sv) : peer_send_shard(l, f.sv, false);
		if (r == 0)
			count(&p->d->stats.peer_bytes_sent, f.sv->shard_bytes);
	}
	free(mb);
	if (f.sv)
		(void)peer_loop_call(p, hold_unpin, f.sv);
	return r == 0;
}

static bool serve_list(struct peer *p, struct link *l, const Ckpt__ReplicaList *q)
{
	struct listing ls = { .job = q->job, .rank = q->rank, .all_ranks = q->all_ranks };
	if (peer_loop_call(p, hold_list, &ls) < 0)
		return false;
	Ckpt__HeldCopy **ptrs = calloc(ls.n ? ls.n : 1, sizeof(*ptrs));
	for (size_t i = 0; ptrs && i < ls.n; i++)
		ptrs[i] = &ls.v[i];
	Ckpt__ReplicaListReply rep = CKPT__REPLICA_LIST_REPLY__INIT;
	rep.n_held = ptrs ? ls.n : 0;
	rep.held = ptrs;
	Ckpt__PeerFrame out = CKPT__PEER_FRAME__INIT;
	out.body_case = CKPT__PEER_FRAME__BODY_LIST_REPLY;
	out.list_reply = &rep;
	int r = link_send(l, &out);
	free(ptrs);
	free(ls.v);
	free(ls.jobs);
	free(ls.attempts);
	return r == 0;
}

struct conn {
	struct peer *p;
	int fd, slot;
	char addr[64];
};

/* The connection in slot i ends: its slot is free (before its socket is
 * closed, so that no one shuts a number reused meanwhile). */
static void conn_forget(struct peer *p, int i)
{
	pthread_mutex_lock(&p->mu);
	p->slots[i].fd = -1;
	p->nconns--;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

/* Whether to log a refusal of kind now (under mu): one line a second per
 * kind at most, saying how many were not logged since, so that a flood
 * of connections is counted (the metric) without flooding the log. */
static bool gate(struct peer *p, int kind, uint64_t *skipped)
{
	uint64_t now = clock_now_ns();
	if (p->gate_ns[kind] && now - p->gate_ns[kind] < 1000000000ull) {
		p->gated[kind]++;
		return false;
	}
	p->gate_ns[kind] = now;
	*skipped = p->gated[kind];
	p->gated[kind] = 0;
	return true;
}

/* Count the slots of connections not shut to make room: not yet
 * authenticated, authenticated, and from host (under mu). */
static void slot_counts(const struct peer *p, const char *host, unsigned *hand, unsigned *authed, unsigned *from)
{
	*hand = *authed = *from = 0;
	for (unsigned i = 0; i < p->nslots; i++) {
		const struct slot *sl = &p->slots[i];
		if (sl->fd < 0 || sl->evicted)
			continue;
		*hand += !sl->authed;
		*authed += sl->authed;
		*from += host && strcmp(sl->host, host) == 0;
	}
}

/* The slot (its index) for a connection from host just accepted (under
 * mu), or -1 with why. An address with [peers] max_per_address
 * authenticated peers gets no more. Connections still in their handshake
 * make room for a new one: an address at max_per_address gives up its
 * own oldest, else, at max_handshakes, the oldest of all is shut; so
 * connections that never finish a handshake cannot keep a peer out.
 * max_connections is checked once authenticated (conn_authed). */
static int slot_take(struct peer *p, int fd, const char *host, char *why, size_t whylen)
{
	const struct config *c = &p->d->cfg;
	unsigned hand, authed, from, authed_from = 0;
	slot_counts(p, host, &hand, &authed, &from);
	for (unsigned i = 0; i < p->nslots; i++)
		authed_from += p->slots[i].fd >= 0 && p->slots[i].authed && strcmp(p->slots[i].host, host) == 0;
	uint64_t skipped = 0;
	if (authed_from >= c->peer_max_per_address) {
		refuse(p, PEER_LIMIT_PER_ADDRESS);
		if (gate(p, PEER_LIMIT_PER_ADDRESS, &skipped))
			snprintf(why, whylen, "%u peers from it at once already ([peers] max_per_address)%s",
				 authed_from, skipped ? " (and more refused, not logged)" : "");
		return -1;
	}
	/* Room among the handshakes: an address at its cap gives up its own
	 * oldest, else the oldest of all gives way. */
	bool mine = from >= c->peer_max_per_address;
	if (mine || hand >= c->peer_max_handshakes) {
		struct slot *old = NULL;
		for (unsigned i = 0; i < p->nslots; i++) {
			struct slot *sl = &p->slots[i];
			if (sl->fd >= 0 && !sl->authed && !sl->evicted && (!mine || strcmp(sl->host, host) == 0) &&
			    (old == NULL || sl->since_ns < old->since_ns))
				old = sl;
		}
		if (old) {
			refuse(p, mine ? PEER_LIMIT_PER_ADDRESS : PEER_LIMIT_HANDSHAKES);
			if (gate(p, PEER_LIMIT_HANDSHAKES, &skipped))
				log_warn("peers: closed a connection from %s still in its handshake after %" PRIu64
					 " ms, for a new one: %u at once ([peers] %s)%s",
					 old->host, (clock_now_ns() - old->since_ns) / 1000000, mine ? from : hand,
					 mine ? "max_per_address" : "max_handshakes",
					 skipped ? " (more since, not logged)" : "");
			old->evicted = true;
			shutdown(old->fd, SHUT_RDWR);
		}
	}
	for (unsigned i = 0; i < p->nslots; i++)
		if (p->slots[i].fd < 0) {
			struct slot *sl = &p->slots[i];
			memset(sl, 0, sizeof(*sl));
			sl->fd = fd;
			sl->since_ns = clock_now_ns();
			snprintf(sl->host, sizeof(sl->host), "%s", host);
			p->nconns++;
			return (int)i;
		}
	/* Every slot is taken by connections still closing. */
	refuse(p, PEER_LIMIT_HANDSHAKES);
	if (gate(p, PEER_LIMIT_HANDSHAKES, &skipped))
		snprintf(why, whylen, "%u connections at once already", p->nslots);
	return -1;
}

/* The connection on fd authenticated (its certificate, then PeerHello):
 * false when [peers] max_connections peers are served already. */
static bool conn_authed(struct peer *p, int slot, const char *from)
{
	pthread_mutex_lock(&p->mu);
	unsigned hand, authed, n;
	slot_counts(p, NULL, &hand, &authed, &n);
	bool ok = authed < p->d->cfg.peer_max_connections;
	uint64_t skipped = 0;
	if (ok)
		p->slots[slot].authed = true;
	if (!ok) {
		refuse(p, PEER_LIMIT_CONNECTIONS);
		if (gate(p, PEER_LIMIT_CONNECTIONS, &skipped))
			log_warn("peers: closed a connection from %s: %u peers served at once already ([peers] "
				 "max_connections)%s",
				 from, authed, skipped ? " (more since, not logged)" : "");
	}
	pthread_mutex_unlock(&p->mu);
	return ok;
}

void peer_serve_frames(struct peer *p, struct link *l, const char *from)
{
	Ckpt__PeerFrame *f;
	bool go = true;
	int r;
	while (go) {
		f = NULL;
		r = link_recv(l, frame_max(&p->d->cfg), &f);
		if (r == -EMSGSIZE) {
			uint64_t skipped = 0;
			refuse(p, PEER_LIMIT_FRAME_BYTES);
			pthread_mutex_lock(&p->mu);
			bool say = gate(p, PEER_LIMIT_FRAME_BYTES, &skipped);
			pthread_mutex_unlock(&p->mu);
			if (say)
				log_warn("peers: closed the connection of %s: a frame larger than %zu bytes, the "
					 "largest "
					 "manifest this node's [limits] allow%s",
					 from, frame_max(&p->d->cfg), skipped ? " (more since, not logged)" : "");
		}
		if (r < 0) {
			/* The peer's end, or an idle link it left; a frame it began and
			 * did not finish by its deadline is a refusal. */
			if (r != -EPIPE && r != -ETIMEDOUT)
				count(&p->d->stats.peer_link_errors, 1);
			break;
		}
		switch (f->body_case) {
		case CKPT__PEER_FRAME__BODY_PUT: go = serve_put(p, l, f->put, from); break;
		case CKPT__PEER_FRAME__BODY_GET: go = serve_get(p, l, f->get); break;
		case CKPT__PEER_FRAME__BODY_LIST: go = serve_list(p, l, f->list); break;
		case CKPT__PEER_FRAME__BODY_RANGE_CLAIM: go = peer_serve_range_claim(p, l, f->range_claim, from); break;
		case CKPT__PEER_FRAME__BODY_RANGE_GET: go = peer_serve_range_get(p, l, f->range_get); break;
		default:
			log_warn("peers: %s sent an unexpected message (%d); closed", from, (int)f->body_case);
			count(&p->d->stats.peer_link_errors, 1);
			go = false;
		}
		ckpt__peer_frame__free_unpacked(f, NULL);
	}
}

static void *serve_conn(void *arg)
{
	struct conn *cn = arg;
	struct peer *p = cn->p;
	int fd = cn->fd;
	struct link l;
	char err[300];
	uint64_t skipped = 0;
	int r = link_accept(&p->tls, fd, p->timeout_ms, p->d->cfg.peer_min_rate, &l, err, sizeof(err));
	if (r < 0) {
		pthread_mutex_lock(&p->mu);
		bool evicted = p->slots[cn->slot].evicted;
		bool say = !evicted && gate(p, PEER_LIMIT_N, &skipped);
		pthread_mutex_unlock(&p->mu);
		if (r == -ETIMEDOUT)
			refuse(p, PEER_LIMIT_DEADLINE);
		if (say)
			log_warn("peers: refused a connection from %s: %s%s", cn->addr, err,
				 skipped ? " (more since, not logged)" : "");
		if (!evicted)
			count(&p->d->stats.peer_link_errors, 1);
		conn_forget(p, cn->slot);
		close(fd);
		free(cn);
		return NULL;
	}
	Ckpt__PeerFrame *f = NULL;
	char from[RING_NAME_MAX] = "";
	r = link_recv(&l, 4096, &f);
	if (r == 0 && f->body_case == CKPT__PEER_FRAME__BODY_HELLO &&
	    (f->hello->protocol_version == PEER_PROTOCOL_VERSION ||
	     f->hello->protocol_version == PEER_PROTOCOL_SEALED) &&
	    f->hello->node[0] && strlen(f->hello->node) < sizeof(from)) {
		snprintf(from, sizeof(from), "%s", f->hello->node);
	} else {
		log_warn("peers: %s did not open with a PeerHello of version %d%s; closed", cn->addr,
			 PEER_PROTOCOL_VERSION, r == -ETIMEDOUT ? " in time ([peers] timeout_ms)" : "");
		count(&p->d->stats.peer_link_errors, 1);
		if (r == -ETIMEDOUT)
			refuse(p, PEER_LIMIT_DEADLINE);
	}
	if (f)
		ckpt__peer_frame__free_unpacked(f, NULL);
	/* The name it gives is its certificate's ([peers] verify_names): a
	 * peer speaks, and puts replicas, only as itself. */
	if (from[0] && p->tls.verify_names && !link_peer_named(&l, from)) {
		log_warn("peers: %s said it is %s, which its certificate does not name ([peers] verify_names); closed",
			 cn->addr, from);
		count(&p->d->stats.peer_link_errors, 1);
		from[0] = '\0';
	}
	if (from[0] != '\0' && conn_authed(p, cn->slot, from))
		peer_serve_frames(p, &l, from);
	conn_forget(p, cn->slot);
	link_close(&l);
	free(cn);
	return NULL;
}

void *peer_acceptor_main(void *arg)
{
	struct peer *p = arg;
	for (;;) {
		struct sockaddr_storage sa;
		socklen_t sl = sizeof(sa);
		int fd = accept4(p->listen_fd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC);
		pthread_mutex_lock(&p->mu);
		bool stop = p->stopping;
		pthread_mutex_unlock(&p->mu);
		if (stop) {
			if (fd >= 0)
				close(fd);
			return NULL;
		}
		if (fd < 0) {
			if (errno != EINTR && errno != ECONNABORTED)
				usleep(100 * 1000); /* out of fds: back off */
			continue;
		}
		struct conn *cn = calloc(1, sizeof(*cn));
		char host[48] = "?", serv[16] = "", why[200] = "";
		getnameinfo((struct sockaddr *)&sa, sl, host, sizeof(host), serv, sizeof(serv),
			    NI_NUMERICHOST | NI_NUMERICSERV);
		pthread_mutex_lock(&p->mu);
		int slot = cn ? slot_take(p, fd, host, why, sizeof(why)) : -1;
		pthread_mutex_unlock(&p->mu);
		pthread_t t;
		pthread_attr_t at;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		if (slot >= 0) {
			cn->p = p;
			cn->fd = fd;
			cn->slot = slot;
			snprintf(cn->addr, sizeof(cn->addr), "%s:%s", host, serv);
			if (pthread_create(&t, &at, serve_conn, cn) != 0) {
				conn_forget(p, slot);
				snprintf(why, sizeof(why), "cannot start a thread for it");
				slot = -1;
			}
		}
		pthread_attr_destroy(&at);
		if (slot < 0) {
			if (why[0])
				log_warn("peers: refused a connection from %s: %s", host, why);
			close(fd);
			free(cn);
		}
	}
}
