/* One trainer (or ckptctl) connection: framing with SCM_RIGHTS, the
 * validation order of docs/architecture.md §4, the outgoing queue, and the session's own
 * requests (Hello, buffers). Dispatch is msgtab.c. */
#ifndef CKPTD_SESSION_H
#define CKPTD_SESSION_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>
#include <uv.h>

#include "ckpt.pb-c.h"
#include "requester.h"
#include "daemon.h"
#include "bufmap.h"
#include "hostbuf.h"
#include "tenancy.h"

struct outmsg {
	STAILQ_ENTRY(outmsg) link;
	size_t len, off;
	uint8_t data[];
};

struct load;
struct save_table;

/* Tensor tables a session may hold at once (DeclareTable): a trainer needs
 * one per distinct state dict it saves. */
#define SESSION_MAX_TABLES 16

struct session {
	TAILQ_ENTRY(session) link;
	struct daemon *d;
	uint64_t id;
	int fd;
	uv_poll_t poll;
	int poll_events;
	bool closing;
	pid_t pid;
	uid_t uid;
	gid_t gid;

	/* docs/security.md "Tenants": the tenant this connection is (its socket, or its
	 * credentials on the main socket), -1 without tenants; admin: root or
	 * an admin gid on the main socket, seeing every tenant. */
	int tenant;
	bool admin;
	bool hello_done;
	char job[JOB_BUF]; /* as ckptd keeps it: TENANT/NAME under a tenant */
	char attempt[ATTEMPT_BUF];
	uint32_t rank, world_size, local_rank;
	int policy; /* enum admit_policy from Hello, or -1 */
	/* The key of the job's replicas, from the secret Hello gave
	 * (daemon.job_key); wiped when the session goes. */
	uint8_t job_key[32];
	bool has_job_key;

	uint8_t *rbuf;
	size_t rlen, rcap;
	int *fdq; /* received fds not yet claimed by a frame */
	uint32_t nfdq;

	struct bufmap bufs;                            /* by id */
	struct save_table *tables[SESSION_MAX_TABLES]; /* declared (savetab.h); NULL: free slot */
	uint64_t registered_bytes;                     /* of bufs, against max_registered_bytes */
	uint64_t started_ns;                           /* hello_timeout_ms counts from here */
	uint64_t last_rx_ns;                           /* idle_timeout_ms counts from here */

	STAILQ_HEAD(, outmsg) outq;
	size_t outq_bytes;

	struct save_list saves; /* linked through save.slink */
	uint32_t inflight_saves;
	uint32_t refs; /* loads/lists on the threadpool hold one */
};

/* Takes ownership of fd (a connected, non-blocking socket), which is
 * tenant (-1: none) or an admin (server.c decided). */
int session_start(struct daemon *d, int fd, pid_t pid, uid_t uid, gid_t gid, int tenant, bool admin);
/* The session's view of jobs (tenancy.h decides what it sees and how it
 * names them). */
struct viewer session_viewer(const struct session *s);
/* The job a request names (tenancy_kept), or the session's own when it
 * names none: true with it in out; false when refused (answered: a
 * control session must name one; what says which request). */
bool session_request_job(struct session *s, uint64_t req_id, const char *name, const char *what, char *out,
			 size_t outlen);
/* The session's tenant's name, or NULL. */
const char *session_tenant_name(const struct session *s);
/* Queue a frame; sets version. Failures close the session. */
void session_send(struct session *s, uint64_t req_id, Ckpt__Frame *f);
/* A Reply: status is 0 or -errno, as everywhere in ckptd; wire_status
 * (proto/wire.h) turns it into the message's positive errno. */
void session_reply(struct session *s, uint64_t req_id, int status, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* Send an error (req_id 0) if status (-errno) != 0, then close. */
void session_close(struct session *s, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
struct hostbuf *session_find_buffer(struct session *s, uint64_t id);
struct box;
/* Check one tensor of a Save or Load against the caps and this session's
 * buffers: name, dtype, box, nbytes, buffer, byte range. 0 with *box and
 * *buf set, or -errno with err naming the tensor. */
int session_check_tensor(struct session *s, const Ckpt__TensorRef *tr, size_t index, struct box *box,
			 struct hostbuf **buf, char *err, size_t errlen);
/* The session's own requests (rows of msgtab.c). */
void session_hello(struct session *s, uint64_t req_id, const Ckpt__Hello *h);
void session_register(struct session *s, uint64_t req_id, const Ckpt__RegisterBuffer *m);
void session_unregister(struct session *s, uint64_t req_id, const Ckpt__Unregister *m);
void session_declare_table(struct session *s, uint64_t req_id, const Ckpt__DeclareTable *m);
void session_drop_table(struct session *s, uint64_t req_id, const Ckpt__DropTable *m);
void session_ref(struct session *s);
/* Returns false if the session has closed meanwhile (and drops it). */
bool session_unref_alive(struct session *s);

/* A load refused before it started: LoadFailed, not a Reply, as the
 * client waits for one of the load's own events. */
void session_send_load_failed(struct session *s, uint64_t req_id, int status, const char *msg);

/* The engine's view of this session (requester.h): main.c sets
 * d->req_ops to these at start; a save or load gets session_requester. */
const struct requester_ops *session_requester_ops_get(void);
struct requester session_requester(struct session *s, uint64_t req_id);

typedef void (*session_dispatch_fn)(struct session *s, const Ckpt__Frame *f);
/* Where every decoded frame goes (main.c: msg_dispatch). */
void session_set_dispatch(session_dispatch_fn fn);

#endif
