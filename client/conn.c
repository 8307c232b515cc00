/* The connection: connect and hello, framing, the reader thread and the
 * table of outstanding requests.
 *
 * Frame: 4-byte big-endian length, then a packed Ckpt__Frame (proto/wire.h,
 * shared with the daemon). Every frame we send carries
 * version = WIRE_PROTOCOL_VERSION and a nonzero req_id unique on
 * the connection; the daemon's replies and pushed events echo it. Writes are
 * serialized by wmu so frames never interleave. One reader thread per client
 * receives everything and completes requests; callbacks run on it, outside
 * every internal lock. */
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "client_internal.h"
#include "wire.h"

/* ---- refcount and teardown ---------------------------------------------- */

void client_ref(ckpt_client *c)
{
	atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
}

void client_unref(ckpt_client *c)
{
	if (!c)
		return;
	if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1)
		return;
	if (c->cuda_free)
		c->cuda_free(c);
	if (c->fd >= 0)
		close(c->fd);
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
	pthread_mutex_destroy(&c->wmu);
	free(c->dead_msg);
	free(c);
}

/* ---- the request table (c->mu held) -------------------------------------- */

static void table_insert(ckpt_client *c, struct pending *p)
{
	p->next = &c->head;
	p->prev = c->head.prev;
	c->head.prev->next = p;
	c->head.prev = p;
}

static void table_remove(struct pending *p)
{
	p->prev->next = p->next;
	p->next->prev = p->prev;
	p->next = p->prev = NULL;
}

static struct pending *table_find(ckpt_client *c, uint64_t req_id)
{
	for (struct pending *p = c->head.next; p != &c->head; p = p->next)
		if (p->req_id == req_id)
			return p;
	return NULL;
}

/* Mark the connection unusable (first reason wins). c->mu held. */
static void mark_dead_locked(ckpt_client *c, int status, const char *msg)
{
	if (c->dead)
		return;
	c->dead = status;
	c->dead_msg = strdup(msg ? msg : "");
}

/* Fail every outstanding request with status. Takes c->mu itself; runs
 * future callbacks after dropping it. */
static void fail_all(ckpt_client *c, int status, const char *msg)
{
	struct pending *list = NULL, *p;

	pthread_mutex_lock(&c->mu);
	while (c->head.next != &c->head) {
		p = c->head.next;
		table_remove(p);
		if (p->kind == PENDING_SYNC) {
			p->status = status;
			p->message = strdup(msg ? msg : "");
			p->done = true;
		} else {
			/* reuse next to chain the detached futures */
			p->next = list;
			list = p;
		}
	}
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);

	while (list) {
		ckpt_future *f;

		p = list;
		list = p->next;
		p->next = NULL;
		f = p->future;
		future_fail(f, status, msg);
		future_dispatch(f);
		future_unref(f); /* the table's reference */
	}
}

/* ---- writing ------------------------------------------------------------- */

/* Pack fr behind its length (proto/wire.h) into a new buffer. */
static int frame_pack(const Ckpt__Frame *fr, uint8_t **out, size_t *outlen)
{
	size_t total = frame_size(fr);
	uint8_t *buf;

	if (total - FRAME_HDR > WIRE_CLIENT_MAX_FRAME_BYTES)
		return -EMSGSIZE;
	buf = malloc(total);
	if (!buf)
		return -ENOMEM;
	if (frame_write(fr, total, buf) < 0) {
		free(buf);
		return -EPROTO;
	}
	*out = buf;
	*outlen = total;
	return 0;
}

/* Write all of buf; with fd >= 0, attach it to the first byte. Returns 0 or
 * -errno; *sent says how much went out (a partial frame breaks the
 * stream). c->wmu held. */
static int write_all(int sock, const uint8_t *buf, size_t len, const int *fds, size_t nfds, size_t *sent)
{
	size_t off = 0;
	ssize_t n;

	*sent = 0;
	if (nfds > WIRE_MAX_FDS)
		return -E2BIG;
	if (nfds > 0) {
		union {
			struct cmsghdr hdr;
			char buf[CMSG_SPACE(sizeof(int) * WIRE_MAX_FDS)];
		} ctl;
		struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
		struct msghdr mh = {
			.msg_iov = &iov,
			.msg_iovlen = 1,
			.msg_control = ctl.buf,
			.msg_controllen = CMSG_SPACE(sizeof(int) * nfds),
		};
		struct cmsghdr *cm;

		memset(&ctl, 0, sizeof(ctl));
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
		/* The whole frame in one sendmsg; a short write (a signal)
		 * is finished below, the fd already went with byte 0. */
		do
			n = sendmsg(sock, &mh, MSG_NOSIGNAL);
		while (n < 0 && errno == EINTR);
		if (n < 0)
			return -errno;
		off = (size_t)n;
	}
	while (off < len) {
		n = send(sock, buf + off, len - off, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			*sent = off;
			return -errno;
		}
		off += (size_t)n;
	}
	*sent = off;
	return 0;
}

static int send_frame(ckpt_client *c, const Ckpt__Frame *fr, const int *fds, size_t nfds)
{
	uint8_t *buf;
	size_t len, sent;
	int r;

	r = frame_pack(fr, &buf, &len);
	if (r < 0)
		return r;
	pthread_mutex_lock(&c->wmu);
	r = write_all(c->fd, buf, len, fds, nfds, &sent);
	pthread_mutex_unlock(&c->wmu);
	free(buf);
	if (r < 0 && (sent > 0 || r == -ENOTCONN)) {
		/* Half a frame is out: nothing more can be sent, so end the
		 * session. (On EPIPE the peer hung up; the reader sees EOF
		 * after any last word the daemon sent, and reports that.) */
		pthread_mutex_lock(&c->mu);
		mark_dead_locked(c, -ECONNRESET, "connection to ckptd lost");
		pthread_mutex_unlock(&c->mu);
		shutdown(c->fd, SHUT_RDWR);
	}
	return r;
}

/* ---- requests ------------------------------------------------------------ */

/* Register p and stamp req with its id. Returns c->dead if unusable. */
static int begin_request(ckpt_client *c, struct pending *p, Ckpt__Frame *req)
{
	pthread_mutex_lock(&c->mu);
	if (c->dead) {
		int r = c->dead;

		client_set_errmsg(c->dead_msg);
		pthread_mutex_unlock(&c->mu);
		return r;
	}
	p->req_id = c->next_req_id++;
	table_insert(c, p);
	pthread_mutex_unlock(&c->mu);
	req->version = WIRE_PROTOCOL_VERSION;
	req->req_id = p->req_id;
	return 0;
}

int client_call(ckpt_client *c, Ckpt__Frame *req, int fd, Ckpt__Frame **reply)
{
	return client_call_fds(c, req, &fd, fd >= 0 ? 1 : 0, reply);
}

int client_call_fds(ckpt_client *c, Ckpt__Frame *req, const int *fds, size_t nfds, Ckpt__Frame **reply)
{
	struct pending p = { .kind = PENDING_SYNC };
	int r;

	*reply = NULL;
	/* On the reader thread (a callback) nobody would read the answer. */
	if (c->reader_started && pthread_equal(pthread_self(), c->reader)) {
		client_set_errmsg("blocking call from a completion callback");
		return -EDEADLK;
	}
	r = begin_request(c, &p, req);
	if (r < 0)
		return r;
	r = send_frame(c, req, fds, nfds);
	pthread_mutex_lock(&c->mu);
	/* A peer that hung up may have said why first (say, a refused uid):
	 * the reader fails this request with that reason at EOF. */
	if ((r == -EPIPE || r == -ECONNRESET) && c->reader_started)
		r = 0;
	if (r < 0) {
		/* Unless the reader failed it meanwhile, it is still ours. */
		if (!p.done)
			table_remove(&p);
		pthread_mutex_unlock(&c->mu);
		free(p.message);
		if (p.reply)
			ckpt__frame__free_unpacked(p.reply, NULL);
		client_set_errmsg("");
		return r;
	}
	while (!p.done)
		pthread_cond_wait(&c->cv, &c->mu);
	pthread_mutex_unlock(&c->mu);

	if (p.status) {
		client_set_errmsg(p.message);
		free(p.message);
		if (p.reply)
			ckpt__frame__free_unpacked(p.reply, NULL);
		return p.status;
	}
	free(p.message);
	*reply = p.reply;
	return 0;
}

int client_call_batch(ckpt_client *c, Ckpt__Frame **reqs, const int *fds, size_t n, int *status, char **msgs)
{
	struct pending *p = calloc(n ? n : 1, sizeof(*p));
	size_t sent = 0;
	int r = 0;

	if (!p) {
		client_set_errmsg("");
		return -ENOMEM;
	}
	if (c->reader_started && pthread_equal(pthread_self(), c->reader)) {
		free(p);
		client_set_errmsg("blocking call from a completion callback");
		return -EDEADLK;
	}
	/* Back to back: the daemon answers in order while later ones are
	 * still on their way, so n requests cost one round trip, not n. */
	for (; sent < n; sent++) {
		p[sent].kind = PENDING_SYNC;
		r = begin_request(c, &p[sent], reqs[sent]);
		if (r < 0)
			break;
		r = send_frame(c, reqs[sent], fds[sent] >= 0 ? &fds[sent] : NULL, fds[sent] >= 0 ? 1 : 0);
		if (r < 0) {
			pthread_mutex_lock(&c->mu);
			if ((r == -EPIPE || r == -ECONNRESET) && c->reader_started) {
				r = 0; /* the reader fails it with the daemon's last word */
			} else if (!p[sent].done) {
				table_remove(&p[sent]);
				p[sent].done = true;
				p[sent].status = r;
			}
			pthread_mutex_unlock(&c->mu);
			sent++;
			break;
		}
	}
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < sent; i++)
		while (!p[i].done)
			pthread_cond_wait(&c->cv, &c->mu);
	pthread_mutex_unlock(&c->mu);
	for (size_t i = 0; i < n; i++) {
		status[i] = i < sent ? p[i].status : (r < 0 ? r : -ECANCELED);
		msgs[i] = i < sent ? p[i].message : NULL;
		if (p[i].reply)
			ckpt__frame__free_unpacked(p[i].reply, NULL);
	}
	free(p);
	return 0;
}

int client_send_future(ckpt_client *c, Ckpt__Frame *req, ckpt_future *f)
{
	bool ours = false;
	int r;

	future_ref(f); /* the table's */
	r = begin_request(c, &f->node, req);
	if (r < 0) {
		future_unref(f);
		return r;
	}
	r = send_frame(c, req, NULL, 0);
	if (r < 0) {
		pthread_mutex_lock(&c->mu);
		if (f->node.next) {
			table_remove(&f->node);
			ours = true;
		}
		pthread_mutex_unlock(&c->mu);
		/* Else fail_all() took the table's reference already. */
		if (ours)
			future_unref(f);
		client_set_errmsg("");
	}
	return r;
}

/* ---- the reader thread --------------------------------------------------- */

/* Read exactly n bytes: 0, -ECONNRESET on EOF, or -errno. */
static int read_full(int fd, void *buf, size_t n)
{
	size_t off = 0;

	while (off < n) {
		ssize_t r = recv(fd, (uint8_t *)buf + off, n - off, 0);

		if (r == 0)
			return -ECONNRESET;
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		off += (size_t)r;
	}
	return 0;
}

/* Handle one frame from the daemon; takes ownership of fr. */
static void handle_frame(ckpt_client *c, Ckpt__Frame *fr)
{
	struct pending *p;
	ckpt_future *f;
	bool done, drop = false;

	if (fr->req_id == 0) {
		/* A session-level error: everything outstanding fails. */
		if (fr->body_case == CKPT__FRAME__BODY_REPLY && fr->reply->status != 0) {
			int st = wire_errno(fr->reply->status);

			pthread_mutex_lock(&c->mu);
			mark_dead_locked(c, st, fr->reply->message);
			pthread_mutex_unlock(&c->mu);
			fail_all(c, st, fr->reply->message);
			shutdown(c->fd, SHUT_RDWR);
		}
		ckpt__frame__free_unpacked(fr, NULL);
		return;
	}

	pthread_mutex_lock(&c->mu);
	p = table_find(c, fr->req_id);
	if (!p) {
		/* late event for something already finished */
		pthread_mutex_unlock(&c->mu);
		ckpt__frame__free_unpacked(fr, NULL);
		return;
	}
	if (p->kind == PENDING_SYNC) {
		table_remove(p);
		if (fr->body_case == CKPT__FRAME__BODY_REPLY && fr->reply->status != 0) {
			p->status = wire_errno(fr->reply->status);
			p->message = strdup(fr->reply->message ? fr->reply->message : "");
		}
		p->reply = fr; /* the caller frees it */
		p->done = true;
		pthread_cond_broadcast(&c->cv);
		pthread_mutex_unlock(&c->mu);
		return;
	}
	f = p->future;
	future_ref(f);
	pthread_mutex_unlock(&c->mu);

	done = future_apply(f, fr);
	ckpt__frame__free_unpacked(fr, NULL);
	if (done) {
		pthread_mutex_lock(&c->mu);
		if (f->node.next) {
			table_remove(&f->node);
			drop = true;
		}
		pthread_mutex_unlock(&c->mu);
		if (drop)
			future_unref(f); /* the table's */
	}
	future_dispatch(f);
	future_unref(f);
}

static void *reader_main(void *arg)
{
	ckpt_client *c = arg;
	char msg[128];
	int status = -ECONNRESET;

	snprintf(msg, sizeof(msg), "connection to ckptd lost");
	for (;;) {
		uint8_t hdr[FRAME_HDR], *buf;
		uint32_t len;
		Ckpt__Frame *fr;
		int r;

		r = read_full(c->fd, hdr, sizeof(hdr));
		if (r < 0)
			break;
		len = frame_len(hdr);
		if (len > WIRE_CLIENT_MAX_FRAME_BYTES) {
			status = -EPROTO;
			snprintf(msg, sizeof(msg), "ckptd sent a frame of %u bytes (limit %u)", len,
				 WIRE_CLIENT_MAX_FRAME_BYTES);
			break;
		}
		buf = malloc(len ? len : 1);
		if (!buf) {
			status = -ENOMEM;
			snprintf(msg, sizeof(msg), "out of memory for a %u-byte frame", len);
			break;
		}
		r = read_full(c->fd, buf, len);
		if (r < 0) {
			free(buf);
			break;
		}
		fr = frame_unpack(buf, len);
		free(buf);
		if (!fr) {
			status = -EPROTO;
			snprintf(msg, sizeof(msg), "ckptd sent a malformed frame");
			break;
		}
		handle_frame(c, fr);
	}

	pthread_mutex_lock(&c->mu);
	mark_dead_locked(c, status, msg);
	status = c->dead;
	snprintf(msg, sizeof(msg), "%s", c->dead_msg ? c->dead_msg : "");
	pthread_mutex_unlock(&c->mu);
	/* Stop the peer too: no request can be answered any more. */
	shutdown(c->fd, SHUT_RDWR);
	fail_all(c, status, msg);
	client_unref(c); /* taken in ckpt_connect */
	return NULL;
}

/* ---- connect / close ----------------------------------------------------- */

static char *default_attempt_id(void)
{
	const char *run = getenv("TORCHELASTIC_RUN_ID");
	const char *restart = getenv("TORCHELASTIC_RESTART_COUNT");
	char *s = NULL;

	/* Slurm: the job, and its requeues. Each launch its own attempt, so
	 * that a step saved again after a rollback never reuses the names of
	 * the save a removal may be taking (docs/architecture.md "What a
	 * removal leaves"). */
	const char *job = getenv("SLURM_JOB_ID");
	if ((!run || !*run) && job && *job) {
		const char *again = getenv("SLURM_RESTART_COUNT");
		if (asprintf(&s, "slurm-%s-%s", job, again && *again ? again : "0") < 0)
			return NULL;
		bool ok = true;
		for (const char *c = s; *c && ok; c++)
			ok = isalnum((unsigned char)*c) || *c == '-' || *c == '_';
		if (ok)
			return s;
		free(s);
		s = NULL;
	}
	if (!run || !*run)
		return strdup("default");
	if (!restart || !*restart)
		restart = "0";
	if (asprintf(&s, "%s-%s", run, restart) < 0)
		return NULL;
	return s;
}

static int fail_connect(ckpt_client *c, int r)
{
	ckpt_close(c);
	return r;
}

/* A client with its locks and lists, not connected. */
static ckpt_client *client_new(const ckpt_hello *hello)
{
	ckpt_client *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	pthread_condattr_t ca;
	atomic_init(&c->refs, 1);
	c->fd = -1;
	c->head.next = c->head.prev = &c->head;
	c->next_req_id = 1;
	c->next_buffer_id = 1;
	c->next_table_id = 1;
	pthread_mutex_init(&c->wmu, NULL);
	pthread_mutex_init(&c->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cv, &ca);
	pthread_condattr_destroy(&ca);
	c->control = !hello || !hello->job || !*hello->job;
	return c;
}

/* Connect c's socket to sa and start its reader thread: 0 or -errno. */
static int client_open(ckpt_client *c, const struct sockaddr_un *sa)
{
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0)
		return -errno;
	for (;;) {
		if (connect(c->fd, (const struct sockaddr *)sa, sizeof(*sa)) == 0 || errno == EISCONN)
			break;
		if (errno != EINTR)
			return -errno;
	}
	/* The reader must not take the application's signals. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	client_ref(c); /* the reader's, so ckpt_close() from a callback is safe */
	int r = -pthread_create(&c->reader, NULL, reader_main, c);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r < 0) {
		client_unref(c);
		return r;
	}
	c->reader_started = true;
	return 0;
}

/* Say Hello (hello NULL: a control session) and take the daemon's
 * answer: its protocol version, capabilities and limits. */
static int client_hello(ckpt_client *c, const ckpt_hello *hello)
{
	Ckpt__Frame req = CKPT__FRAME__INIT, *rep = NULL;
	Ckpt__Hello h = CKPT__HELLO__INIT;
	char *attempt = hello && hello->attempt_id ? strdup(hello->attempt_id) : default_attempt_id();
	if (!attempt) {
		client_set_errmsg("");
		return -ENOMEM;
	}
	h.protocol_version = WIRE_PROTOCOL_VERSION;
	h.job = (char *)(hello && hello->job ? hello->job : "");
	h.rank = hello ? hello->rank : 0;
	h.world_size = hello ? hello->world_size : 0;
	h.local_rank = hello ? hello->local_rank : 0;
	h.attempt_id = attempt;
	h.policy = (char *)(hello && hello->policy ? hello->policy : "");
	/* The job's secret, from the environment (docs/tiers.md "Peers"):
	 * its replicas are sealed with it. */
	const char *key = h.job[0] ? getenv("CKPT_JOB_KEY") : NULL;
	if (key && key[0]) {
		h.job_key.data = (uint8_t *)key;
		h.job_key.len = strlen(key);
	}
	req.body_case = CKPT__FRAME__BODY_HELLO;
	req.hello = &h;
	int r = client_call(c, &req, -1, &rep);
	free(attempt);
	if (r < 0)
		return r;
	if (rep->body_case != CKPT__FRAME__BODY_HELLO_REPLY) {
		ckpt__frame__free_unpacked(rep, NULL);
		client_set_errmsg("ckptd answered hello with something else");
		return -EPROTO;
	}
	if (rep->hello_reply->protocol_version && rep->hello_reply->protocol_version != WIRE_PROTOCOL_VERSION) {
		client_set_errmsgf("ckptd speaks protocol version %u, we %u", rep->hello_reply->protocol_version,
				   WIRE_PROTOCOL_VERSION);
		ckpt__frame__free_unpacked(rep, NULL);
		return -EPROTONOSUPPORT;
	}
	c->capabilities = rep->hello_reply->capabilities;
	if (rep->hello_reply->limits)
		c->max_fds = rep->hello_reply->limits->max_fds_per_frame;
	ckpt__frame__free_unpacked(rep, NULL);
	return 0;
}

int ckpt_connect(const char *socket_path, const ckpt_hello *hello, ckpt_client **out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (!out) {
		client_set_errmsg("");
		return -EINVAL;
	}
	*out = NULL;
	if (!socket_path || !*socket_path)
		socket_path = CKPT_DEFAULT_SOCKET;
	if (strlen(socket_path) >= sizeof(sa.sun_path)) {
		client_set_errmsg("socket path too long");
		return -ENAMETOOLONG;
	}
	memcpy(sa.sun_path, socket_path, strlen(socket_path) + 1);
	if (hello && hello->job && *hello->job && (hello->world_size == 0 || hello->rank >= hello->world_size)) {
		client_set_errmsg("rank must be below world_size");
		return -EINVAL;
	}
	ckpt_client *c = client_new(hello);
	if (!c) {
		client_set_errmsg("");
		return -ENOMEM;
	}
	int r = client_open(c, &sa);
	if (r < 0) {
		client_set_errmsg("");
		return fail_connect(c, r);
	}
	if ((r = client_hello(c, hello)) < 0)
		return fail_connect(c, r);
	*out = c;
	return 0;
}

uint64_t ckpt_capabilities(const ckpt_client *c)
{
	return c ? c->capabilities : 0;
}

void ckpt_close(ckpt_client *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->mu);
	mark_dead_locked(c, -ECONNRESET, "connection closed");
	pthread_mutex_unlock(&c->mu);
	if (c->fd >= 0)
		shutdown(c->fd, SHUT_RDWR);
	if (c->reader_started && pthread_equal(pthread_self(), c->reader)) {
		/* Closed from a completion callback: the reader sees EOF
		 * when it returns, fails the rest, drops its reference and
		 * the last reference closes the fd. */
		pthread_detach(c->reader);
		client_unref(c);
		return;
	}
	if (c->reader_started) {
		pthread_join(c->reader, NULL);
		c->reader_started = false;
	}
	/* The reader already failed everything; this covers a client whose
	 * reader never started. */
	fail_all(c, c->dead, c->dead_msg);
	if (c->fd >= 0) {
		close(c->fd);
		c->fd = -1;
	}
	/* Buffers still registered keep the struct alive until freed. */
	client_unref(c);
}
