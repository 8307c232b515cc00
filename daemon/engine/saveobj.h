/* The save object: what one save holds (its tensors, pieces, pool spans,
 * checksums, the trainer's events) and the state it is in, below both the
 * state machine (save.c) and the pieces that work on one save (upload.c,
 * memtier.c, load.c's reads of held copies). Loop thread only, except
 * where a field says otherwise. */
#ifndef CKPTD_SAVEOBJ_H
#define CKPTD_SAVEOBJ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>
#include <uv.h>

#include "ckpt.pb-c.h"
#include "config.h"
#include "tensor.h"
#include "workq.h"

struct session;
struct daemon;
struct hostbuf;
struct cudaev;

enum save_state {
	SAVE_NEW,
	SAVE_ADMITTING, /* waiting for pool chunks */
	SAVE_STAGING,   /* copies running */
	SAVE_HASHING,   /* staged (the trainer goes on); CRC32C of pieces and chunks */
	SAVE_QUEUED,    /* staged; waiting for an upload slot */
	SAVE_UPLOADING, /* shard and manifest being written */
	SAVE_HELD,      /* durable; kept in the pool as the memory tier */
	SAVE_KEPT,      /* a memory or replicated save, checksummed: held in the pool, not in storage */
	SAVE_DONE,      /* durable and released */
	SAVE_FAILED,
};

/* Tensor names shared by a table (savetab.h) and the saves made from it:
 * a save holds the names, not the table (nor its buffers). */
struct save_names {
	unsigned refs;
	char text[]; /* every name, each ended by a NUL */
};
struct save_names *save_names_ref(struct save_names *n);
void save_names_unref(struct save_names *n);

struct save_tensor {
	char *name;
	int dtype;
	struct box box;
	uint64_t shard_off, nbytes;
	struct hostbuf *buf;
	uint64_t buf_off;
	uint32_t crc;
};

/* The part of one tensor that lies in one chunk. */
struct save_piece {
	uint32_t tensor;
	uint64_t tensor_off, len;
	uint32_t crc; /* from the pool, after staged */
};

struct copy_job {
	struct work_item item;
	struct save *sv;
	uint32_t chunk; /* index into sv->chunks */
	uint32_t first_piece, npieces;
	int err;
	bool hash;     /* the second pass: checksums of the staged chunk */
	char why[200]; /* a CUDA failure, in words */
};

/* Tensors start at multiples of this in a shard (and in the pool). */
#define SHARD_ALIGN 64

/* Where a save's copy lives once safe: values of proto's Tier. */
enum save_tier {
	TIER_DURABLE = 0,
	TIER_MEMORY = 1,
	TIER_REPLICATED = 2,
};

struct save {
	TAILQ_ENTRY(save) link;  /* daemon.saves while in flight */
	TAILQ_ENTRY(save) hlink; /* daemon.held while in the memory tier (a persist: in both) */
	TAILQ_ENTRY(save) wlink; /* daemon.waitq or daemon.uploadq */
	TAILQ_ENTRY(save) slink; /* session.saves */
	struct daemon *d;
	struct session *session;
	uint64_t req_id, id;
	enum save_state state;
	bool listed;     /* in daemon.saves */
	bool steplocked; /* holds steplock_save_begin */
	bool in_held;    /* in daemon.held (memtier.c) */
	bool durable;    /* its manifest is in storage (a durable save, or a memory one persisted) */
	bool persisting; /* a kept save uploading on a PersistRequest: QUEUED or UPLOADING, and held */
	enum save_tier tier;
	/* Peers (daemon/peer/): replica, a copy held for the peer named peer
	 * (reclaimed before anything of this node's); from_peer, this node's
	 * own copy brought back from the peer named peer for a restore;
	 * peer_unread, from_peer and read by no load yet: the first load that
	 * reads it says it came from that peer (Loaded.source "peer"), even
	 * when a show brought it back just before (catalog_req.c). Loop
	 * thread, once held. */
	bool replica, from_peer, peer_unread;
	char peer[128];
	char replicated_to[256]; /* a replicated save: the peers that hold it, comma-separated */
	char job[JOB_BUF], attempt[ATTEMPT_BUF];
	uint32_t rank, world_size;
	uint64_t step;
	enum admit_policy policy;
	uint64_t quota_bytes;
	bool spread;                        /* the shard goes to the spread directory ([storage] layout) */
	bool compress;                      /* stored compressed (compress.h) */
	bool incremental;                   /* unchanged pieces stored as references (incbase.h) */
	uint64_t piece_bytes;               /* what its shard is cut into, stored in pieces */
	uint64_t in_flight_s;               /* its job's (catalog_in_flight_s): refs older go (upload.c) */
	bool refs_reused;                   /* its refs' names were there before it (upload.c write_refs) */
	uint64_t stored_bytes, coded_bytes; /* once uploaded: the object's bytes; raw bytes planecodec stored */
	char shard_name[200]; /* as uploaded (a fresh name per save); a held copy serves only its manifest */

	struct save_tensor *tensors;
	size_t ntensors;
	struct save_names *names; /* a table's (savetab.h): the tensors' names point into it */
	struct save_piece *pieces;
	size_t npieces;
	uint64_t shard_bytes;
	uint32_t nchunks;           /* spans of chunks[]: chunk c holds shard bytes [c, c + 1) * chunk_bytes */
	uint32_t whole, tail_slots; /* their shape (pool_shape) */
	uint64_t pool_bytes;        /* what they hold of the pool */
	struct pool_span *chunks;
	uint32_t *chunk_crc;
	bool have_chunks;
	struct copy_job *jobs;
	uint32_t jobs_left;
	uint8_t *extra;
	size_t extra_len;
	uint64_t meta_bytes; /* a copy from a peer: its extra state and tensor table, beside the pool (peer_copy.c) */
	/* Sealed replicas (daemon/peer/seal.h): a save of a job with a key
	 * (its session's) seals its replicas with it; a replica held sealed
	 * keeps its nonce, tags and sealed manifest in seal (meta_bytes
	 * counts it), and the pool holds its ciphertext. */
	bool has_key;
	uint8_t key[32];
	uint8_t *seal;
	size_t seal_len;
	struct cudaev **events; /* the trainer's, one per device; while staging */
	size_t nevents;

	uint64_t t_start, deadline_ns, held_since_ns;
	uv_work_t work;
	unsigned readers;  /* loads reading the held copy on the threadpool */
	bool drop_pending; /* release once readers reach 0 */
	int status;        /* 0 or -errno; SaveFailed carries it as wire_status() */
	char msg[512];
};

/* Release one save's chunks and free it (no events). */
void save_release(struct save *sv);
/* Free it, its pool spans not included. */
void save_free(struct save *sv);
/* Give back the trainer's CUDA events. */
void save_drop_events(struct save *sv);

/* The manifest sv's upload writes, as a view into sv (valid while sv
 * lives and does not change): created and shard_name as given, the
 * shard's directory by its layout. Free with save_manifest_view_free. A
 * memory-only copy has no shard name: "". */
int save_manifest_view(const struct save *sv, Ckpt__Manifest *m, const char *shard_name, uint64_t created_unix_ns);
void save_manifest_view_free(Ckpt__Manifest *m);
/* sv's layout from its Save request m (savelayout.c): its tensors (its
 * TensorRefs, each checked, or a declared table's), their places in the
 * shard, SHARD_ALIGN apart, the pieces and chunks they make, the trainer's
 * CUDA events and the extra state. 0, or -errno with err saying why
 * (-E2BIG: it could never fit the pool). */
int save_layout(struct save *sv, const Ckpt__Save *m, char *err, size_t errlen);
/* sv as a HeldReply lists it (a view into sv), its job named job (the
 * name the requester knows it by: tenancy.h). */
void save_held_view(const struct save *sv, Ckpt__HeldCopy *h, const char *job);
/* Where step of job is in storage, for SaveDurable.location. */
void save_step_location(struct daemon *d, const char *job, uint64_t step, char *out, size_t len);

/* Bytes [off, off+len) of a held save's shard: a pointer into the pool when
 * they lie in one chunk, else copied into tmp. Thread-safe while pinned. */
const uint8_t *save_shard_bytes(const struct save *sv, uint64_t off, uint64_t len, uint8_t *tmp);

#endif
