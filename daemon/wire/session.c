#include "session.h"
#include "requester.h"
#include "wire.h"
#include "log.h"
#include "manifest.h"
#include "save.h"
#include "savetab.h"
#include "tensor.h"
#include "config.h"
#include "cudadev.h"
#include "clock.h"
#include "macro.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* What a decoded frame goes to: msgtab.c's msg_dispatch, set by main.c
 * (the table sits above the session: its handlers call into it). */
static session_dispatch_fn dispatch;

void session_set_dispatch(session_dispatch_fn fn)
{
	dispatch = fn;
}

#define RBUF_INITIAL (64u << 10)
#define READS_PER_WAKEUP 16

static void on_poll(uv_poll_t *h, int status, int events);
static int queue_frame(struct session *s, uint64_t req_id, Ckpt__Frame *f, bool force);

static void session_set_events(struct session *s, int events)
{
	if (s->closing || events == s->poll_events)
		return;
	s->poll_events = events;
	int r = uv_poll_start(&s->poll, events, on_poll);
	if (r < 0)
		log_err("session %" PRIu64 ": uv_poll_start: %s", s->id, uv_strerror(r));
}

static void session_free(struct session *s)
{
	for (uint32_t i = 0; i < s->nfdq; i++)
		close(s->fdq[i]);
	for (size_t i = 0; i < SESSION_MAX_TABLES; i++)
		save_table_free(s->tables[i]);
	bufmap_clear(&s->bufs, hostbuf_unref);
	struct outmsg *m;
	while ((m = STAILQ_FIRST(&s->outq)) != NULL) {
		STAILQ_REMOVE_HEAD(&s->outq, link);
		free(m);
	}
	if (s->fd >= 0)
		close(s->fd);
	free(s->fdq);
	free(s->rbuf);
	explicit_bzero(s->job_key, sizeof(s->job_key));
	free(s);
}

static void on_closed(uv_handle_t *h)
{
	struct session *s = h->data;
	/* The handle is gone; the memory stays while loads still hold it. */
	s->poll.data = NULL;
	if (s->refs == 0)
		session_free(s);
}

void session_ref(struct session *s)
{
	s->refs++;
}

bool session_unref_alive(struct session *s)
{
	s->refs--;
	if (!s->closing)
		return true;
	if (s->refs == 0 && s->poll.data == NULL)
		session_free(s);
	return false;
}

/* Write as much of the queue as the socket takes now. */
static int session_flush(struct session *s)
{
	struct outmsg *m;
	while ((m = STAILQ_FIRST(&s->outq)) != NULL) {
		ssize_t n = send(s->fd, m->data + m->off, m->len - m->off, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 1;
			return -errno;
		}
		m->off += (size_t)n;
		s->outq_bytes -= (size_t)n;
		if (m->off < m->len)
			return 1;
		STAILQ_REMOVE_HEAD(&s->outq, link);
		free(m);
	}
	return 0;
}

void session_close(struct session *s, int status, const char *fmt, ...)
{
	if (s->closing)
		return;
	if (status != 0 && fmt != NULL) {
		char msg[512];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
		log_warn("session %" PRIu64 " (pid %d uid %u): closing: %s", s->id, (int)s->pid, (unsigned)s->uid, msg);
		Ckpt__Reply rep = CKPT__REPLY__INIT;
		rep.status = wire_status(status);
		rep.message = msg;
		Ckpt__Frame f = CKPT__FRAME__INIT;
		f.body_case = CKPT__FRAME__BODY_REPLY;
		f.reply = &rep;
		if (queue_frame(s, 0, &f, true) == 0)
			(void)session_flush(s); /* best effort: the peer may be gone */
	} else {
		log_debug("session %" PRIu64 ": closed", s->id);
	}
	s->closing = true;
	struct save *sv;
	while ((sv = TAILQ_FIRST(&s->saves)) != NULL)
		save_detach_session(sv);
	TAILQ_REMOVE(&s->d->sessions, s, link);
	s->d->nsessions--;
	s->d->last_session_ns = clock_now_ns(); /* idle_exit_ms counts from here (lifecycle.c) */
	if (s->tenant >= 0) {
		s->d->tenant_sessions[s->tenant]--;
		s->d->tenant_registered[s->tenant] -= s->registered_bytes;
	}
	uv_poll_stop(&s->poll);
	uv_close((uv_handle_t *)&s->poll, on_closed);
}

/* Append a packed frame to the out queue; force ignores the queue cap
 * (for the one error frame sent on close). */
static int queue_frame(struct session *s, uint64_t req_id, Ckpt__Frame *f, bool force)
{
	size_t len = frame_prepare(f, req_id);
	if (len - FRAME_HDR > UINT32_MAX || (!force && s->outq_bytes + len > s->d->cfg.max_write_queue))
		return -ENOBUFS;
	struct outmsg *m = malloc(sizeof(*m) + len);
	if (m == NULL)
		return -ENOMEM;
	frame_write(f, len, m->data);
	m->len = len;
	m->off = 0;
	STAILQ_INSERT_TAIL(&s->outq, m, link);
	s->outq_bytes += m->len;
	return 0;
}

void session_send(struct session *s, uint64_t req_id, Ckpt__Frame *f)
{
	assert(s && f);
	if (s->closing)
		return;
	int r = queue_frame(s, req_id, f, false);
	if (r < 0) {
		log_warn("session %" PRIu64 ": cannot queue a reply (%s): the client does not read; closing", s->id,
			 strerror(-r));
		session_close(s, 0, NULL);
		return;
	}
	r = session_flush(s);
	if (r < 0) {
		session_close(s, 0, NULL);
		return;
	}
	session_set_events(s, r > 0 ? (UV_READABLE | UV_WRITABLE) : UV_READABLE);
}

void session_reply(struct session *s, uint64_t req_id, int status, const char *fmt, ...)
{
	char msg[512] = "";
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
	}
	if (status != 0)
		log_info("session %" PRIu64 " req %" PRIu64 ": %s (%s)", s->id, req_id, msg, strerror(-status));
	Ckpt__Reply rep = CKPT__REPLY__INIT;
	rep.status = wire_status(status);
	rep.message = msg;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_REPLY;
	f.reply = &rep;
	session_send(s, req_id, &f);
}

struct hostbuf *session_find_buffer(struct session *s, uint64_t id)
{
	return bufmap_get(&s->bufs, id);
}

int session_check_tensor(struct session *s, const Ckpt__TensorRef *tr, size_t index, struct box *box,
			 struct hostbuf **buf, char *err, size_t errlen)
{
	int r = tensor_check(tr->name, tr->dtype, tr->n_global_shape, tr->global_shape, tr->n_box_offsets,
			     tr->box_offsets, tr->n_box_lengths, tr->box_lengths, tr->nbytes, index,
			     s->d->cfg.max_name_len, box, err, errlen);
	if (r < 0)
		return r;
	struct hostbuf *b = session_find_buffer(s, tr->buffer_id);
	if (b == NULL) {
		snprintf(err, errlen, "tensor '%s': buffer %" PRIu64 " is not registered", tr->name, tr->buffer_id);
		return -ENOENT;
	}
	if (tr->offset > b->nbytes || tr->nbytes > b->nbytes - tr->offset) {
		snprintf(err, errlen,
			 "tensor '%s': bytes [%" PRIu64 ", +%" PRIu64 ") lie outside buffer %" PRIu64 " of %" PRIu64
			 " bytes",
			 tr->name, tr->offset, tr->nbytes, tr->buffer_id, b->nbytes);
		return -ERANGE;
	}
	*buf = b;
	return 0;
}

static int take_fd(struct session *s)
{
	if (s->nfdq == 0)
		return -1;
	int fd = s->fdq[0];
	memmove(s->fdq, s->fdq + 1, (s->nfdq - 1) * sizeof(int));
	s->nfdq--;
	return fd;
}

void session_hello(struct session *s, uint64_t req_id, const Ckpt__Hello *h)
{
	if (s->hello_done) {
		session_reply(s, req_id, -EPROTO, "Hello was already received");
		return;
	}
	if (h->protocol_version != WIRE_PROTOCOL_VERSION) {
		session_close(s, -EPROTONOSUPPORT, "protocol version %u, this ckptd speaks %d", h->protocol_version,
			      WIRE_PROTOCOL_VERSION);
		return;
	}
	char job[sizeof(s->job)], why[512];
	if (h->job[0] != '\0') {
		struct viewer v = session_viewer(s);
		if (tenancy_kept(&v, h->job, job, sizeof(job), why, sizeof(why)) < 0) {
			session_close(s, -EINVAL, "%s", why);
			return;
		}
		if (h->world_size == 0 || h->world_size > MANIFEST_WORLD_MAX || h->rank >= h->world_size) {
			session_close(s, -EINVAL, "rank %u of world size %u is out of range (1..99999)", h->rank,
				      h->world_size);
			return;
		}
		const char *att = h->attempt_id[0] ? h->attempt_id : "default";
		if (!manifest_name_valid(att, ATTEMPT_MAX_LEN)) {
			session_close(s, -EINVAL, "attempt id must be 1-%d characters of [A-Za-z0-9._-] without '..'",
				      ATTEMPT_MAX_LEN);
			return;
		}
		if (h->policy[0]) {
			enum admit_policy pol;
			if (config_parse_policy(h->policy, &pol) < 0) {
				session_close(s, -EINVAL, "policy '%s': want block, skip or coalesce", h->policy);
				return;
			}
			s->policy = (int)pol;
		}
		/* The job's secret seals its replicas; without peers there are
		 * none to seal. */
		if (h->job_key.len > 1024) {
			session_close(s, -EINVAL, "job key (CKPT_JOB_KEY) of %zu bytes: at most 1024", h->job_key.len);
			return;
		}
		if (h->job_key.len && s->d->job_key) {
			int kr = s->d->job_key(h->job_key.data, h->job_key.len, job, s->job_key);
			if (kr < 0) {
				session_close(s, kr, "cannot derive the job's key: %s", strerror(-kr));
				return;
			}
			s->has_job_key = true;
		}
		snprintf(s->job, sizeof(s->job), "%s", job);
		snprintf(s->attempt, sizeof(s->attempt), "%s", att);
		s->rank = h->rank;
		s->world_size = h->world_size;
		s->local_rank = h->local_rank;
	}
	s->hello_done = true;
	log_info("session %" PRIu64 ": pid %d uid %u%s%s%s job '%s' rank %u/%u attempt '%s'%s", s->id, (int)s->pid,
		 (unsigned)s->uid, s->tenant >= 0 ? " tenant '" : "", s->tenant >= 0 ? session_tenant_name(s) : "",
		 s->tenant >= 0 ? "'" : (s->admin ? " admin" : ""), s->job, s->rank, s->world_size, s->attempt,
		 s->has_job_key ? ", replicas sealed with its job key" : "");
	const struct config *c = &s->d->cfg;
	Ckpt__Limits lim = CKPT__LIMITS__INIT;
	lim.max_frame_bytes = c->max_frame_bytes;
	lim.max_fds_per_frame = c->max_fds_per_frame;
	lim.max_buffers = c->max_buffers;
	lim.max_tensors = c->max_tensors;
	lim.max_name_len = c->max_name_len;
	lim.chunk_bytes = s->d->pool.chunk_bytes;
	lim.pool_bytes = s->d->pool.bytes;
	Ckpt__HelloReply rep = CKPT__HELLO_REPLY__INIT;
	rep.protocol_version = WIRE_PROTOCOL_VERSION;
	rep.session_id = s->id;
	rep.capabilities = (s->d->cuda ? WIRE_CAP_CUDA : 0) | WIRE_CAP_TABLES | WIRE_CAP_TIERS;
	rep.limits = &lim;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_HELLO_REPLY;
	f.hello_reply = &rep;
	session_send(s, req_id, &f);
}

static void close_fds(int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

/* A device buffer: checks, then the import (docs/cuda.md "CUDA"). The fds are ours. */
static int register_cuda(struct session *s, const Ckpt__RegisterBuffer *m, int *fds, size_t nfds, struct hostbuf **out,
			 char *err, size_t errlen)
{
	struct daemon *d = s->d;
	struct cudabuf *cb = NULL;
	int r;
	if (d->cuda == NULL) {
		close_fds(fds, nfds);
		snprintf(err, errlen, "CUDA is off in ckptd: %s", d->cuda_why);
		return -ENOTSUP;
	}
	if (m->device_uuid.len != CUDA_UUID_BYTES || m->nbytes == 0) {
		close_fds(fds, nfds);
		snprintf(err, errlen, "a CUDA buffer needs a 16-byte device UUID and nbytes > 0");
		return -EINVAL;
	}
	if (m->kind == CKPT__BUFFER_KIND__CUDA_IPC) {
		close_fds(fds, nfds);
		if (m->ipc_handle.len != CUDA_IPC_BYTES) {
			snprintf(err, errlen, "ipc_handle must be %d bytes", CUDA_IPC_BYTES);
			return -EINVAL;
		}
		if (m->offset > UINT64_MAX - m->nbytes) {
			snprintf(err, errlen, "offset + nbytes overflows");
			return -ERANGE;
		}
		r = cuda_import_ipc(d->cuda, m->device_uuid.data, m->ipc_handle.data, m->alloc_id, m->offset, m->nbytes,
				    &cb, err, errlen);
	} else {
		if (m->n_vmm_sizes == 0 || m->n_vmm_sizes != nfds) {
			close_fds(fds, nfds);
			snprintf(err, errlen, "%zu VMM chunk sizes but %zu file descriptors", m->n_vmm_sizes, nfds);
			return -EBADF;
		}
		r = cuda_import_vmm(d->cuda, m->device_uuid.data, fds, m->vmm_sizes, nfds, m->offset, m->nbytes, &cb,
				    err, errlen);
	}
	if (r < 0)
		return r;
	return hostbuf_from_cuda(cb, m->buffer_id, m->nbytes, out);
}

/* Why the session may not register m (its kind, its fds, its id, the
 * caps of the session and its tenant): -errno with err saying so, or 0. */
static int register_refused(struct session *s, const Ckpt__RegisterBuffer *m, size_t nfds, char *err, size_t errlen)
{
	struct daemon *d = s->d;
	if (m->kind != CKPT__BUFFER_KIND__HOST_FD && m->kind != CKPT__BUFFER_KIND__CUDA_IPC &&
	    m->kind != CKPT__BUFFER_KIND__CUDA_VMM) {
		snprintf(err, errlen, "buffer kind %d is not supported here", m->kind);
		return -EINVAL;
	}
	if (m->kind == CKPT__BUFFER_KIND__HOST_FD && nfds == 0) {
		snprintf(err, errlen, "RegisterBuffer %" PRIu64 " carried no file descriptor", m->buffer_id);
		return -EBADF;
	}
	if (session_find_buffer(s, m->buffer_id)) {
		snprintf(err, errlen, "buffer id %" PRIu64 " is already registered", m->buffer_id);
		return -EEXIST;
	}
	if (s->bufs.n >= d->cfg.max_buffers) {
		d->stats.refused[LIMIT_BUFFERS]++;
		snprintf(err, errlen, "at most %u buffers per session", d->cfg.max_buffers);
		return -ENOBUFS;
	}
	const struct tenant_config *tc = s->tenant >= 0 ? &d->cfg.tenants[s->tenant] : NULL;
	uint64_t tused = tc ? d->tenant_registered[s->tenant] : 0;
	if (tc && tc->max_registered_bytes &&
	    (tused >= tc->max_registered_bytes || m->nbytes > tc->max_registered_bytes - tused)) {
		d->stats.refused[LIMIT_REGISTERED_BYTES]++;
		snprintf(err, errlen,
			 "buffer %" PRIu64 ": %" PRIu64 " more bytes would pass tenant '%s''s cap of %" PRIu64
			 " registered ([tenant.%s] max_registered_bytes)",
			 m->buffer_id, m->nbytes, tc->name, tc->max_registered_bytes, tc->name);
		return -ENOBUFS;
	}
	if (m->nbytes > d->cfg.max_registered_bytes - s->registered_bytes) {
		d->stats.refused[LIMIT_REGISTERED_BYTES]++;
		snprintf(err, errlen,
			 "buffer %" PRIu64 ": %" PRIu64 " more bytes would pass the session's cap of %" PRIu64
			 " registered (max_registered_bytes)",
			 m->buffer_id, m->nbytes, d->cfg.max_registered_bytes);
		return -ENOBUFS;
	}
	return 0;
}

void session_register(struct session *s, uint64_t req_id, const Ckpt__RegisterBuffer *m)
{
	/* The fds this frame carried: one for a host buffer, one per chunk
	 * for VMM, none for a legacy IPC handle. */
	size_t want = m->kind == CKPT__BUFFER_KIND__HOST_FD    ? 1
		      : m->kind == CKPT__BUFFER_KIND__CUDA_VMM ? m->n_vmm_sizes
							       : 0;
	if (want > s->d->cfg.max_fds_per_frame)
		want = s->d->cfg.max_fds_per_frame;
	int fds[256];
	size_t nfds = 0;
	while (nfds < want && nfds < ELEMENTSOF(fds) && (fds[nfds] = take_fd(s)) >= 0)
		nfds++;
	/* More than the kind takes: not for a later frame (a frame's fds
	 * arrive with its first byte), so close them. */
	for (int extra; (extra = take_fd(s)) >= 0;)
		close(extra);
	char err[512];
	int r = register_refused(s, m, nfds, err, sizeof(err));
	if (r < 0) {
		close_fds(fds, nfds);
		session_reply(s, req_id, r, "%s", err);
		return;
	}
	/* From here the fds are the buffer's (closed by the open when it fails). */
	struct hostbuf *b = NULL;
	r = m->kind == CKPT__BUFFER_KIND__HOST_FD ? hostbuf_open(fds[0], m->buffer_id, m->nbytes, &b, err, sizeof(err))
						  : register_cuda(s, m, fds, nfds, &b, err, sizeof(err));
	if (r < 0) {
		if (r == -ENOMEM)
			snprintf(err, sizeof(err), "out of memory");
		log_warn("session %" PRIu64 ": buffer %" PRIu64 " refused: %s", s->id, m->buffer_id, err);
		session_reply(s, req_id, r, "buffer %" PRIu64 ": %s", m->buffer_id, err);
		return;
	}
	if (bufmap_put(&s->bufs, b) < 0) {
		hostbuf_unref(b);
		session_reply(s, req_id, -ENOMEM, "out of memory");
		return;
	}
	s->registered_bytes += b->nbytes;
	if (s->tenant >= 0)
		s->d->tenant_registered[s->tenant] += b->nbytes;
	log_debug("session %" PRIu64 ": buffer %" PRIu64 " registered, %" PRIu64 " bytes, %s", s->id, m->buffer_id,
		  m->nbytes,
		  b->cuda     ? (m->kind == CKPT__BUFFER_KIND__CUDA_IPC ? "CUDA IPC" : "CUDA VMM")
		  : !b->map   ? "pread"
		  : b->sealed ? "sealed"
			      : "unsealed, guarded");
	session_reply(s, req_id, 0, NULL);
}

void session_unregister(struct session *s, uint64_t req_id, const Ckpt__Unregister *m)
{
	struct hostbuf *b = bufmap_get(&s->bufs, m->buffer_id);
	if (b != NULL && b->tables) {
		/* Its bytes count against the session's caps while a table can
		 * still save from it. */
		session_reply(s, req_id, -EBUSY, "buffer %" PRIu64 " is in a tensor table; drop the table first",
			      m->buffer_id);
		return;
	}
	b = bufmap_take(&s->bufs, m->buffer_id);
	if (b != NULL) {
		/* Saves and loads hold their own reference. */
		s->registered_bytes -= b->nbytes;
		if (s->tenant >= 0)
			s->d->tenant_registered[s->tenant] -= b->nbytes;
		hostbuf_unref(b);
		session_reply(s, req_id, 0, NULL);
		return;
	}
	session_reply(s, req_id, -ENOENT, "buffer id %" PRIu64 " is not registered", m->buffer_id);
}

static struct save_table **table_slot(struct session *s, uint64_t id)
{
	for (size_t i = 0; i < SESSION_MAX_TABLES; i++)
		if (s->tables[i] && s->tables[i]->id == id)
			return &s->tables[i];
	return NULL;
}

static struct hostbuf *find_buffer(void *ctx, uint64_t id)
{
	return session_find_buffer(ctx, id);
}

/* Tensors in the session's tables, which hold max_tensors in all. */
static size_t table_entries(const struct session *s)
{
	size_t n = 0;
	for (size_t i = 0; i < SESSION_MAX_TABLES; i++)
		n += s->tables[i] ? s->tables[i]->n : 0;
	return n;
}

void session_declare_table(struct session *s, uint64_t req_id, const Ckpt__DeclareTable *m)
{
	if (table_slot(s, m->table_id)) {
		session_reply(s, req_id, -EEXIST, "table %" PRIu64 " is already declared", m->table_id);
		return;
	}
	struct save_table **slot = NULL;
	for (size_t i = 0; i < SESSION_MAX_TABLES && slot == NULL; i++)
		if (s->tables[i] == NULL)
			slot = &s->tables[i];
	if (slot == NULL) {
		session_reply(s, req_id, -ENOBUFS, "at most %d tables per session; drop one first", SESSION_MAX_TABLES);
		return;
	}
	/* All of a session's tables together hold what one save may: 16
	 * tables of max_tensors each would let one client pin 16 times that
	 * in the daemon's memory. */
	size_t held = table_entries(s);
	if (m->n_dtype <= s->d->cfg.max_tensors && m->n_dtype > s->d->cfg.max_tensors - held) {
		session_reply(s, req_id, -ENOBUFS,
			      "the session's tables would hold %zu tensors, at most %u (max_tensors); drop one first",
			      held + m->n_dtype, s->d->cfg.max_tensors);
		return;
	}
	char err[512];
	int r = save_table_new(&s->d->cfg, m, find_buffer, s, slot, err, sizeof(err));
	if (r < 0) {
		session_reply(s, req_id, r, "%s", r == -ENOMEM ? "out of memory" : err);
		return;
	}
	log_debug("session %" PRIu64 ": table %" PRIu64 " declared, %zu tensors", s->id, m->table_id, (*slot)->n);
	session_reply(s, req_id, 0, NULL);
}

void session_drop_table(struct session *s, uint64_t req_id, const Ckpt__DropTable *m)
{
	struct save_table **slot = table_slot(s, m->table_id);
	if (slot == NULL) {
		session_reply(s, req_id, -ENOENT, "table %" PRIu64 " is not declared", m->table_id);
		return;
	}
	/* Saves made from it hold their own buffers and names. */
	save_table_free(*slot);
	*slot = NULL;
	session_reply(s, req_id, 0, NULL);
}

static const struct save_table *rq_table(struct session *s, uint64_t id)
{
	struct save_table **slot = id ? table_slot(s, id) : NULL;
	return slot ? *slot : NULL;
}

/* Validation order (docs/architecture.md §4): size cap (in receive) -> unpack ->
 * protocol version -> message type and its flags (msgtab.c) -> field ranges
 * (in each handler). */
static void handle_frame(struct session *s, const uint8_t *p, size_t len)
{
	Ckpt__Frame *f = NULL;
	int r = frame_decode(p, len, &f);
	if (r == -EBADMSG) {
		session_close(s, -EBADMSG, "malformed frame (%zu bytes do not parse as a Frame)", len);
		return;
	}
	if (r < 0) {
		session_close(s, -EPROTONOSUPPORT, "unsupported frame version; this ckptd speaks %d",
			      WIRE_PROTOCOL_VERSION);
		return;
	}
	dispatch(s, f);
	ckpt__frame__free_unpacked(f, NULL);
}

/* Returns false when the session was closed. */
static bool receive(struct session *s)
{
	const struct config *c = &s->d->cfg;
	if (s->rcap - s->rlen < 4096 && s->rcap < (size_t)c->max_frame_bytes + 4) {
		size_t ncap = s->rcap * 2;
		if (ncap > (size_t)c->max_frame_bytes + 4)
			ncap = (size_t)c->max_frame_bytes + 4;
		uint8_t *nb = realloc(s->rbuf, ncap);
		if (nb == NULL) {
			session_close(s, -ENOMEM, "out of memory");
			return false;
		}
		s->rbuf = nb;
		s->rcap = ncap;
	}
	/* Room for one fd over the cap, so that an excess shows. */
	size_t cmsg_fds = c->max_fds_per_frame + 1;
	char cbuf[CMSG_SPACE(sizeof(int) * (WIRE_MAX_FDS + 1))];
	size_t cspace = CMSG_SPACE(sizeof(int) * (cmsg_fds > WIRE_MAX_FDS + 1 ? WIRE_MAX_FDS + 1 : cmsg_fds));
	struct iovec iov = { .iov_base = s->rbuf + s->rlen, .iov_len = s->rcap - s->rlen };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = cspace };
	ssize_t n = recvmsg(s->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (n < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
			return true;
		session_close(s, 0, NULL);
		return false;
	}
	uint32_t got = 0;
	bool too_many = (mh.msg_flags & MSG_CTRUNC) != 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		int *fds = (int *)CMSG_DATA(cm);
		for (size_t i = 0; i < k; i++) {
			if (s->nfdq < c->max_fds_per_frame && !too_many) {
				s->fdq[s->nfdq++] = fds[i];
				got++;
			} else {
				close(fds[i]);
				too_many = true;
			}
		}
	}
	if (too_many) {
		s->d->stats.refused[LIMIT_FDS]++;
		session_close(s, -EMFILE, "too many file descriptors in one frame (at most %u)", c->max_fds_per_frame);
		return false;
	}
	if (n == 0) {
		session_close(s, 0, NULL);
		return false;
	}
	s->rlen += (size_t)n;
	s->last_rx_ns = clock_now_ns();
	while (!s->closing) {
		uint32_t flen;
		int r = frame_next(s->rbuf, s->rlen, c->max_frame_bytes, &flen);
		if (r == -EMSGSIZE) {
			s->d->stats.refused[LIMIT_FRAME_BYTES]++;
			session_close(s, -EMSGSIZE, "frame exceeds the cap of %u bytes", c->max_frame_bytes);
			return false;
		}
		if (r == 0)
			break;
		handle_frame(s, s->rbuf + FRAME_HDR, flen);
		if (s->closing)
			return false;
		memmove(s->rbuf, s->rbuf + FRAME_HDR + flen, s->rlen - FRAME_HDR - flen);
		s->rlen -= FRAME_HDR + flen;
	}
	return !s->closing;
}

static void on_poll(uv_poll_t *h, int status, int events)
{
	struct session *s = h->data;
	if (status < 0) {
		session_close(s, 0, NULL);
		return;
	}
	if (events & UV_WRITABLE) {
		int r = session_flush(s);
		if (r < 0) {
			session_close(s, 0, NULL);
			return;
		}
		if (r == 0)
			session_set_events(s, UV_READABLE);
	}
	if (events & (UV_READABLE | UV_DISCONNECT)) {
		for (int i = 0; i < READS_PER_WAKEUP; i++) {
			size_t before = s->rlen;
			if (!receive(s))
				return;
			if (s->rlen == before)
				break;
		}
	}
}

const char *session_tenant_name(const struct session *s)
{
	return s->tenant >= 0 ? s->d->cfg.tenants[s->tenant].name : NULL;
}

struct viewer session_viewer(const struct session *s)
{
	return (struct viewer){ .cfg = &s->d->cfg, .tenant = s->tenant, .admin = s->admin };
}

bool session_request_job(struct session *s, uint64_t req_id, const char *name, const char *what, char *out,
			 size_t outlen)
{
	char why[512];
	if (name[0] == '\0') {
		if (s->job[0] == '\0') {
			session_reply(s, req_id, -EINVAL, "%s needs a job (this session said none in Hello)", what);
			return false;
		}
		snprintf(out, outlen, "%s", s->job); /* kept already */
		return true;
	}
	struct viewer v = session_viewer(s);
	if (tenancy_kept(&v, name, out, outlen, why, sizeof(why)) < 0) {
		session_reply(s, req_id, -EINVAL, "%s", why);
		return false;
	}
	return true;
}

int session_start(struct daemon *d, int fd, pid_t pid, uid_t uid, gid_t gid, int tenant, bool admin)
{
	struct session *s = calloc(1, sizeof(*s));
	if (s == NULL) {
		close(fd);
		return -ENOMEM;
	}
	s->d = d;
	s->fd = fd;
	s->pid = pid;
	s->uid = uid;
	s->gid = gid;
	s->tenant = tenant;
	s->admin = admin;
	s->id = ++d->next_session_id;
	s->started_ns = s->last_rx_ns = clock_now_ns();
	s->policy = -1;
	STAILQ_INIT(&s->outq);
	TAILQ_INIT(&s->saves);
	s->rcap = RBUF_INITIAL;
	s->rbuf = malloc(s->rcap);
	s->fdq = calloc(d->cfg.max_fds_per_frame, sizeof(int));
	int r = (s->rbuf && s->fdq) ? uv_poll_init(d->loop, &s->poll, fd) : -ENOMEM;
	if (r < 0) {
		session_free(s);
		return r;
	}
	s->poll.data = s;
	TAILQ_INSERT_TAIL(&d->sessions, s, link);
	d->nsessions++;
	d->last_session_ns = clock_now_ns();
	if (tenant >= 0)
		d->tenant_sessions[tenant]++;
	session_set_events(s, UV_READABLE);
	return 0;
}

void session_send_load_failed(struct session *s, uint64_t req_id, int status, const char *msg)
{
	Ckpt__LoadFailed bad = CKPT__LOAD_FAILED__INIT;
	bad.status = wire_status(status);
	bad.message = (char *)msg;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_LOAD_FAILED;
	f.load_failed = &bad;
	log_info("session %" PRIu64 ": load refused: %s", s->id, msg);
	session_send(s, req_id, &f);
}

/* ---- what the engine (save.c, load.c) asks of a session: requester.h ---- */

static void rq_reply(struct session *s, uint64_t req_id, int status, const char *msg)
{
	session_reply(s, req_id, status, "%s", msg);
}

static void rq_close(struct session *s, int status, const char *msg)
{
	session_close(s, status, "%s", msg);
}

static void rq_save_attach(struct session *s, struct save *sv)
{
	TAILQ_INSERT_TAIL(&s->saves, sv, slink);
	s->inflight_saves++;
}

static void rq_save_detach(struct session *s, struct save *sv)
{
	TAILQ_REMOVE(&s->saves, sv, slink);
	s->inflight_saves--;
}

static const struct requester_ops session_requester_ops = {
	.send = session_send,
	.reply = rq_reply,
	.load_refused = session_send_load_failed,
	.close = rq_close,
	.hold = session_ref,
	.release = session_unref_alive,
	.tensor = session_check_tensor,
	.table = rq_table,
	.save_attach = rq_save_attach,
	.save_detach = rq_save_detach,
};

const struct requester_ops *session_requester_ops_get(void)
{
	return &session_requester_ops;
}

struct requester session_requester(struct session *s, uint64_t req_id)
{
	return (struct requester){ .s = s,
				   .req_id = req_id,
				   .job = s->job,
				   .attempt = s->attempt,
				   .rank = s->rank,
				   .world_size = s->world_size,
				   .policy = s->policy,
				   .job_key = s->has_job_key ? s->job_key : NULL };
}
