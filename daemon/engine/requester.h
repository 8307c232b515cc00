/* The client a save or a load came from, as the engine (save.c, load.c)
 * sees it: who asked (Hello's identity, copied in), an opaque session, and
 * the operations that the wire layer registers at start (session.c,
 * session_register_ops), so that replies and events flow up through them
 * and the engine calls no wire function (docs/architecture.md §1). */
#ifndef CKPTD_REQUESTER_H
#define CKPTD_REQUESTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.pb-c.h"

struct session;
struct save;
struct hostbuf;
struct box;
struct save_table;

struct requester {
	struct session *s; /* opaque here */
	uint64_t req_id;
	const char *job, *attempt; /* "" job: a control session */
	uint32_t rank, world_size;
	int policy;             /* enum admit_policy from Hello, or -1 */
	const uint8_t *job_key; /* 32 bytes (daemon.job_key), or NULL: the job's replicas are not sealed */
};

/* Every status here is 0 or -errno (proto/wire.h converts it for the wire). */
struct requester_ops {
	void (*send)(struct session *s, uint64_t req_id, Ckpt__Frame *f);
	void (*reply)(struct session *s, uint64_t req_id, int status, const char *msg);
	/* A load refused before it started (LoadFailed, not a Reply). */
	void (*load_refused)(struct session *s, uint64_t req_id, int status, const char *msg);
	void (*close)(struct session *s, int status, const char *msg);
	/* Keep the session while work runs; release says whether it is
	 * still there (and drops it when not). */
	void (*hold)(struct session *s);
	bool (*release)(struct session *s);
	/* One tensor of the request, against the caps and the session's
	 * buffers: 0 with *box and *buf, or -errno with err. */
	int (*tensor)(struct session *s, const Ckpt__TensorRef *tr, size_t index, struct box *box, struct hostbuf **buf,
		      char *err, size_t errlen);
	/* The session's declared table id (savetab.h), or NULL. */
	const struct save_table *(*table)(struct session *s, uint64_t id);
	/* A save of the session began, or ended (or goes on without it). */
	void (*save_attach)(struct session *s, struct save *sv);
	void (*save_detach)(struct session *s, struct save *sv);
};

#endif
