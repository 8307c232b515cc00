/* libckpt internals, shared by the client's modules only. Nothing here is
 * part of the ABI: the library is built with -fvisibility=hidden and a
 * version script, and only the declarations in ckpt/ckpt.h are exported. */
#ifndef CKPT_CLIENT_INTERNAL_H
#define CKPT_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.pb-c.h"
#include "wire.h"

#pragma GCC visibility push(default)
#include "ckpt/ckpt.h"
#pragma GCC visibility pop

/* The public header repeats what the wire defines (proto/wire.h,
 * proto/ckpt.proto); they must agree. */
_Static_assert(CKPT_PROTOCOL_VERSION == WIRE_PROTOCOL_VERSION,
	       "ckpt.h and proto/wire.h disagree on the protocol version");
_Static_assert(CKPT_CAP_CUDA == WIRE_CAP_CUDA, "ckpt.h and proto/wire.h disagree on CKPT_CAP_CUDA");
_Static_assert(CKPT_CAP_TABLES == WIRE_CAP_TABLES, "ckpt.h and proto/wire.h disagree on CKPT_CAP_TABLES");
_Static_assert(CKPT_CAP_TIERS == WIRE_CAP_TIERS, "ckpt.h and proto/wire.h disagree on CKPT_CAP_TIERS");
#define CLIENT_SAME_DTYPE(x) ((int)CKPT_##x == (int)CKPT__DTYPE__##x)
_Static_assert(CLIENT_SAME_DTYPE(F32) && CLIENT_SAME_DTYPE(F16) && CLIENT_SAME_DTYPE(BF16) && CLIENT_SAME_DTYPE(F64) &&
		       CLIENT_SAME_DTYPE(I8) && CLIENT_SAME_DTYPE(U8) && CLIENT_SAME_DTYPE(I16) &&
		       CLIENT_SAME_DTYPE(I32) && CLIENT_SAME_DTYPE(I64) && CLIENT_SAME_DTYPE(BOOL) &&
		       CLIENT_SAME_DTYPE(F8E4M3) && CLIENT_SAME_DTYPE(F8E5M2),
	       "ckpt_dtype and proto/ckpt.proto's DType disagree");
#undef CLIENT_SAME_DTYPE

#define CLIENT_ERRMSG_LEN 1024

enum pending_kind {
	PENDING_SYNC = 1, /* a caller blocks in client_call() */
	PENDING_SAVE,     /* completes a save future */
	PENDING_LOAD,     /* completes a load future */
};

/* One outstanding request in the client's table, keyed by req_id. */
struct pending {
	struct pending *next, *prev;
	uint64_t req_id;
	enum pending_kind kind;
	/* PENDING_SYNC: filled by the reader, guarded by the client's mu. */
	bool done;
	int status;         /* 0 or -errno */
	char *message;      /* malloc'd, may be NULL */
	Ckpt__Frame *reply; /* the answer frame, owned by the caller */
	/* PENDING_SAVE / PENDING_LOAD */
	ckpt_future *future;
};

struct ckpt_client {
	atomic_int refs; /* the user's + one per live buffer */
	int fd;
	pthread_t reader;
	bool reader_started;

	pthread_mutex_t wmu; /* serializes writes to fd */

	pthread_mutex_t mu;  /* guards everything below */
	pthread_cond_t cv;   /* signals completion of PENDING_SYNC */
	struct pending head; /* circular list of outstanding requests */
	uint64_t next_req_id;
	uint64_t next_buffer_id;
	uint64_t next_table_id;
	int dead;                 /* 0 while usable, else -errno */
	char *dead_msg;           /* why, or NULL */
	bool control;             /* hello without a job */
	uint64_t capabilities;    /* CKPT_CAP_* from the daemon's hello */
	uint32_t max_fds;         /* the daemon's max_fds_per_frame */
	struct client_cuda *cuda; /* per-device events; cuda.c */
	/* Frees cuda; cuda.c sets it with cuda, client_unref() calls it. */
	void (*cuda_free)(ckpt_client *c);
};

struct ckpt_buffer {
	ckpt_client *client; /* holds a ref */
	uint64_t id;
	int fd;    /* our dup / the memfd */
	void *map; /* only for ckpt_buffer_alloc */
	size_t size;
	bool cuda;        /* a device buffer (cuda.c) */
	uint8_t uuid[16]; /* its device */
	int cuda_dev;     /* CUdevice ordinal in this process */
};

struct ckpt_table {
	ckpt_client *client; /* holds a ref */
	uint64_t id;
	size_t n;
};

struct ckpt_future {
	atomic_int refs; /* the user's + the table's while outstanding
				     * + a transient one per dispatcher */
	pthread_mutex_t mu;
	pthread_cond_t cv;      /* CLOCK_MONOTONIC */
	enum pending_kind kind; /* PENDING_SAVE or PENDING_LOAD */
	struct pending node;    /* the table entry while outstanding */

	bool staged, durable, loaded;
	int tier;              /* a save's ckpt_tier */
	bool kept, replicated; /* memory and replicated saves */
	int repl_status;       /* 0, or -errno: why it was not replicated */
	char *repl_message;
	uint32_t replicas;
	int status;    /* 0, or -errno once failed */
	char *message; /* set once on failure */
	uint64_t bytes, step, stall_ns;
	void *extra;
	size_t extra_len;
	char source[8];  /* loads: "memory", "peer", "storage", "mixed" */
	char peer[128];  /* loads from a peer: which */
	size_t ntensors; /* loads: per-tensor sources */
	char **tensor_names, **tensor_sources;

	ckpt_future_cb cb;
	void *cb_user;
	unsigned delivered;   /* bit per phase (1 << phase); bit 0: failure */
	bool dispatching;     /* a thread runs callbacks (cv: when it stops) */
	pthread_t dispatcher; /* ... which one */
};

/* errors.c */
void client_set_errmsg(const char *msg);
void client_set_errmsgf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* conn.c */
void client_ref(ckpt_client *c);
void client_unref(ckpt_client *c);
/* Send req (req_id and version filled in here) and wait for the answer.
 * On success *reply is the daemon's frame (free with
 * ckpt__frame__free_unpacked); a nonzero Reply is turned into its -errno
 * and its message goes to ckpt_errmsg(). fd >= 0 is attached as
 * SCM_RIGHTS. */
int client_call(ckpt_client *c, Ckpt__Frame *req, int fd, Ckpt__Frame **reply);
/* The same with several fds (at most WIRE_MAX_FDS). */
int client_call_fds(ckpt_client *c, Ckpt__Frame *req, const int *fds, size_t nfds, Ckpt__Frame **reply);
/* Send n requests back to back (fds[i] >= 0 rides with request i), then
 * wait for every answer: status[i] is 0 or -errno, msgs[i] its message
 * (malloc'd, may be NULL; the caller frees). Returns 0, or -errno when
 * nothing could be waited for (the statuses then say so too). */
int client_call_batch(ckpt_client *c, Ckpt__Frame **reqs, const int *fds, size_t n, int *status, char **msgs);
/* Register f under a new req_id and send req. On failure the table does not
 * hold f (its ref is dropped) and the error is returned. */
int client_send_future(ckpt_client *c, Ckpt__Frame *req, ckpt_future *f);

/* save_load.c: cheap local checks of tensor i, so that obvious mistakes
 * fail here with a precise message (the daemon checks everything again);
 * fills its global shape, box offsets and box lengths (CKPT_MAX_DIMS
 * each). 0 or -EINVAL with ckpt_errmsg() set. */
int client_tensor_check(ckpt_client *c, size_t i, const ckpt_tensor *t, uint64_t *gs, uint64_t *bo, uint64_t *bl);

/* buffer.c: take a client reference and hand b out (b is registered). */
void buffer_adopt(ckpt_client *c, ckpt_buffer *b, ckpt_buffer **out);
uint64_t buffer_next_id(ckpt_client *c);

/* cuda.c */
/* Record each device's interprocess event on stream (NULL: the legacy
 * default stream) for the CUDA buffers among tensors, and fill s's
 * cuda_events; *evs is malloc'd storage to free after sending. */
int client_cuda_events(ckpt_client *c, const ckpt_tensor *tensors, size_t n, void *stream, Ckpt__Save *s,
		       void **storage);
/* Before a load into CUDA buffers: wait for the work already queued on
 * their devices (cuCtxSynchronize), so it cannot land after the restore. */
int client_cuda_sync(const ckpt_tensor *tensors, size_t n);

/* future.c */
ckpt_future *future_new(enum pending_kind kind, uint64_t step);
void future_ref(ckpt_future *f);
void future_unref(ckpt_future *f);
/* Apply one daemon frame addressed to f. Returns true when f is finished
 * (durable, loaded or failed). Does not run callbacks. */
bool future_apply(ckpt_future *f, const Ckpt__Frame *fr);
void future_fail(ckpt_future *f, int status, const char *msg);
/* Run the callbacks of newly reached phases, outside every lock. The caller
 * holds a ref on f. */
void future_dispatch(ckpt_future *f);

/* A StepInfo from the daemon as the public ckpt_step_info (catalog.c). */
void client_copy_step(ckpt_step_info *o, const Ckpt__StepInfo *s);
void client_copy_held(ckpt_held_info *o, const Ckpt__HeldCopy *h);

#endif
