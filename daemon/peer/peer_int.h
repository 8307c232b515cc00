/* Inside peer replication (peer.h): the service's state, shared by its
 * files, each of which does one part of it:
 *   peer.c        start and stop, and the loop bridge (peer_loop_call);
 *   peer_hold.c   what the peer threads do to the daemon's state, on the
 *                 loop: reserve, hold, find, pin and list copies;
 *   peer_copy.c   a save as peers see it: its manifest, sealed or not,
 *                 and its shard on the wire;
 *   peer_serve.c  the server: connection slots, the handshake and hello,
 *                 and the three requests a peer makes (put, get, list);
 *   peer_ring.c   whom to ask: the ring now, where each rank's copies
 *                 are, and links to peers that answer;
 *   peer_send.c   replicating: the sender thread puts saves on peers;
 *   peer_fetch.c  restoring: a load's copies and lists from peers.
 * Not for the rest of the daemon, which sees peer.h and the hooks in
 * struct daemon only; the peer fuzz harness serves frames through it. */
#ifndef CKPTD_PEER_INT_H
#define CKPTD_PEER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <uv.h>

#include "ckpt.pb-c.h"
#include "daemon.h"
#include "link.h"
#include "peer_msg.h"
#include "ring.h"

#define PEER_PROTOCOL_VERSION 1 /* a PeerHello's; 2: it may put sealed replicas (seal.h) */
#define PEER_PROTOCOL_SEALED 2
#define MAX_REPLICAS 16         /* [peers] replicas: SaveReplicated names at most this many peers */
#define LIST_ENTRY_BYTES 384    /* a ReplicaListReply's bytes per copy, at most ([peers] max_list) */
#define JOBS 64                 /* jobs whose copies' holders are remembered (holder_get, sweep) */
#define HOLDER_RANKS (1u << 20) /* ranks remembered per job */
#define NAMES 65536             /* peer names remembered (struct peer.names) */
#define DOWN 64                 /* peers that timed out, remembered (open_link) */
#define DOWN_NS (10ull * 1000 * 1000 * 1000)
#define RING_TTL_NS (5ull * 1000 * 1000 * 1000) /* the ring is built again after this (ring_now) */
#define CLAIMS 4096                             /* ranges a directory remembers who reads (peer_range.c) */
#define RANGE_MAX (64u << 20)                   /* bytes of one range shared across nodes, at most */
#define RANGE_KEY_MAX 1024                      /* bytes of its key */

/* A function run on the loop for a peer thread, which waits for it. */
struct call {
	struct call *next;
	void (*fn)(struct daemon *d, void *arg);
	void *arg;
	bool done;
};

/* One replicated save on its way to its peers. */
struct job {
	struct job *next;
	struct save *sv; /* pinned (readers) until the loop takes the job back */
	struct session *session;
	uint64_t req_id;
	uint32_t want, copies;
	int status;
	char peers[512]; /* who holds a copy, comma-separated */
	char msg[512];   /* why not, when status != 0 */
};

struct peer {
	struct daemon *d;
	struct link_tls tls;
	char self[RING_NAME_MAX];
	int listen_fd;
	uint32_t timeout_ms;
	pthread_t acceptor, sender;
	bool acceptor_started, sender_started;
	uv_async_t async;
	bool direct; /* loop calls run on the caller (peer_loop_call) */

	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stopping;
	struct call *calls, **calls_tail;
	struct job *queue, **queue_tail; /* for the sender */
	struct job *done;                /* for the loop */
	/* Connections served now (shut at stop), under mu: max_handshakes
	 * not yet authenticated plus max_connections peers. A connection
	 * holds its slot until its thread ends (conn_forget). */
	struct slot {
		int fd;            /* -1: free */
		bool authed;       /* past its handshake and PeerHello */
		bool evicted;      /* shut to make room: its thread is ending */
		uint64_t since_ns; /* accepted */
		char host[48];     /* its address */
	} * slots;
	unsigned nslots, nconns;
	uint64_t gate_ns[PEER_LIMIT_N + 1]; /* the last refusal logged, per kind (gate) */
	uint64_t gated[PEER_LIMIT_N + 1];   /* refusals not logged since */
	int sender_fd;                      /* the sender's connection now, or -1 */
	/* Where each rank's copies of a job are (holder_get, holder_set,
	 * sweep), under mu: per job, rank -> 1 + an index in names (0:
	 * unknown), so a job of 4096 ranks costs 16 KiB, whatever its ring. */
	struct holders {
		char job[JOB_BUF];
		int swept;         /* 0: not yet; 1: being swept; 2: swept */
		uint64_t again_ns; /* a sweep that missed a peer: not before */
		uint32_t n;
		uint32_t *at;
	} jobs[JOBS];
	size_t next_job;
	char (*names)[RING_NAME_MAX];
	uint32_t nnames, names_cap;
	/* Peers that did not answer (a connect or handshake that timed out,
	 * or no route): skipped for DOWN_NS, so that a dead node's silence
	 * costs one timeout, not one per request (a load tries its holders in
	 * turn, then storage). Under mu. */
	struct {
		char name[RING_NAME_MAX];
		uint64_t until_ns;
		char why[160];
	} down[DOWN];
	size_t next_down;
	/* The ranges this node is the directory of (peer_range.c), under mu:
	 * who reads each, until when; a range takes its hash's slot. */
	struct claim {
		uint64_t h, off, len;
		uint64_t until_ns;
		char holder[RING_NAME_MAX];
	} claims[CLAIMS]; /* by hash: claims[h % CLAIMS] */
	/* The ring after this node (ring_now), and when it was built. */
	char (*ring)[RING_NAME_MAX];
	size_t nring;
	uint64_t ring_at;
	char ring_why[200];
};

static inline void count(atomic_uint_fast64_t *c, uint64_t n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

/* A refusal by one of the peer port's limits (ckptd_refused_total). */
static inline void refuse(struct peer *p, enum peer_limit_kind kind)
{
	count(&p->d->stats.peer_refused[kind], 1);
}

/* The largest frame a peer may send: a manifest (ReplicaPut, or the
 * ReplicaData of a get) of a save this node's own limits allow. A save
 * request fits [limits] max_frame_bytes (its names and shapes); the
 * manifest adds offsets and CRCs per tensor and per chunk, and the extra
 * state. So a peer's frame is about 9 MiB at the defaults, not the 256
 * MiB a manifest may be in storage, and it is read into a buffer that
 * grows as bytes arrive (link.h). */
static inline size_t frame_max(const struct config *c)
{
	return (size_t)c->max_frame_bytes + c->max_extra_state + (size_t)c->max_tensors * 64 + (64u << 10);
}

/* ---- peer.c ---- */

/* Run fn(d, arg) on the loop and wait for it: 0, or -ESHUTDOWN when the
 * daemon stops first (fn then did not run). With p->direct, at once on
 * the calling thread (the fuzz harness is its own loop). */
int peer_loop_call(struct peer *p, void (*fn)(struct daemon *d, void *arg), void *arg);

/* ---- peer_hold.c: loop calls (peer_loop_call) ---- */

/* Pool space for sv, a replica within the share and its count. */
struct reserve {
	struct save *sv;
	bool replica; /* against the share, and reclaimed first */
	int status;
	char msg[200];
};
void hold_reserve(struct daemon *d, void *arg);
/* arg: the save, its space given back. */
void hold_release(struct daemon *d, void *arg);

/* Hold sv (its bytes in): refused when a newer step of its group is held. */
struct commit {
	struct save *sv;
	bool pin;     /* for a load: pinned before it is held */
	bool durable; /* a copy of a step in storage: held as durable */
	int status;
	char msg[200];
};
void hold_commit(struct daemon *d, void *arg);

/* The copy of (job, step, rank) a peer may read, pinned; sv NULL if none. */
struct find {
	const char *job;
	uint64_t step;
	uint32_t rank, world_size;
	struct save *sv;
};
void hold_find(struct daemon *d, void *arg);
/* arg: a save hold_find pinned. */
void hold_unpin(struct daemon *d, void *arg);

/* The copies of job (of rank, or all ranks) a peer may see, newest first,
 * at most [peers] max_list, copied (free v, jobs, attempts). */
struct listing {
	const char *job;
	uint32_t rank;
	bool all_ranks;
	Ckpt__HeldCopy *v;
	size_t n;
	char (*jobs)[JOB_BUF];
	char (*attempts)[ATTEMPT_BUF];
};
void hold_list(struct daemon *d, void *arg);

/* ---- peer_copy.c ---- */

/* sv's manifest as a peer gets it (public: a sealed replica's, no
 * tensors, no extra state, no CRCs). 0 and *out (malloc'd), or -errno. */
int peer_pack_manifest(const struct save *sv, bool public, uint8_t **out, size_t *len);
/* Seal sv's manifest mb (ml bytes) with sv's job key into z. */
int peer_seal_manifest(const struct save *sv, const uint8_t *mb, size_t ml, struct sealing *z);
/* Where a held sealed replica keeps its sealed manifest in save.seal. */
size_t peer_seal_sm_off(const struct save *sv);
/* A held-copy object for the checked manifest m, no chunks reserved yet;
 * NULL: out of memory. */
struct save *peer_save_from_manifest(struct daemon *d, const Ckpt__Manifest *m, int tier);
/* sv's shard from the pool (corrupt: its first byte flipped on the wire). */
int peer_send_shard(struct link *l, const struct save *sv, bool corrupt);
/* m's shard into sv's chunks, each of the sender's chunks checked
 * against m's CRC32C: 0, -EIO (read to the end, the stream in step), or
 * the link's error; why. */
int peer_recv_shard(struct link *l, struct save *sv, const Ckpt__Manifest *m, char *why, size_t whylen);
/* sv's shard sealed with its key (the sender), or a held sealed replica
 * as it came (the holder). */
int peer_send_sealed(struct link *l, const struct save *sv, const struct sealing *z);
int peer_send_held_sealed(struct link *l, const struct save *sv);
/* A sealed shard into sv: kept sealed (a holder, key NULL), or opened
 * with key and checked against m's CRCs (a restore). */
int peer_recv_sealed(struct link *l, struct save *sv, const Ckpt__Manifest *m, const uint8_t *key,
		     const struct sealing *z, char *why, size_t whylen);
/* The same from a sealed replica held here (pinned), opened with key. */
int peer_open_held(const struct save *held, struct save *sv, const Ckpt__Manifest *m, const uint8_t *key,
		   const struct sealing *z, char *why, size_t whylen);

/* ---- peer_serve.c ---- */

void *peer_acceptor_main(void *arg);
/* Serve the requests of the peer from (authenticated) on l until it
 * ends, a request breaks the stream, or the daemon stops. */
void peer_serve_frames(struct peer *p, struct link *l, const char *from);

/* ---- peer_ring.c ---- */

/* The ring after this node, at most max names in *out (malloc'd), at
 * most RING_TTL_NS old; 0 with why when none. */
size_t peer_ring_now(struct peer *p, size_t max, char (**out)[RING_NAME_MAX], char *why, size_t whylen);
/* Of the ring and this node, the name that scores highest with hash h
 * (rendezvous hashing: every node picks the same one from the same ring),
 * into out (RING_NAME_MAX bytes). */
void peer_ring_pick(struct peer *p, uint64_t h, char *out);
/* Whether name is this node or in the ring now. */
bool peer_ring_has(struct peer *p, const char *name);
void peer_holder_get(struct peer *p, const char *job, uint32_t rank, char *out, size_t len);
void peer_holder_set(struct peer *p, const char *job, uint32_t rank, const char *peer);
/* A sweep of job's holders (peer_fetch.c) begins: its entry, or NULL when
 * job was swept already, or another thread swept it (waited for). */
struct holders *peer_sweep_begin(struct peer *p, const char *job);
/* whole: every peer of the ring answered; else the job may be swept
 * again, DOWN_NS later (a peer cut off during the sweep holds copies no
 * one else names). */
void peer_sweep_end(struct peer *p, struct holders *h, bool whole);
/* A link to peer name, hello said as version; a peer that timed out
 * lately is not tried again (-EHOSTDOWN), unless even_down (a restore
 * that has nowhere else to go: peer_fetch.c), and once it answers such a
 * link, it is asked again by all. */
int peer_open_link(struct peer *p, const char *name, uint32_t version, bool even_down, struct link *l, char *why,
		   size_t whylen);
/* One request on a new link (peer_open_link with PEER_PROTOCOL_VERSION):
 * f sent to name and its answer, at most max bytes, in *in, the link
 * left open for what follows (a shard's bytes). 0, or -errno with why
 * (-EMSGSIZE: the answer is larger than max; -EHOSTDOWN: skipped as
 * down) and the link closed. The caller checks the answer's kind. */
int peer_request(struct peer *p, const char *name, bool even_down, const Ckpt__PeerFrame *f, size_t max, struct link *l,
		 Ckpt__PeerFrame **in, char *why, size_t whylen);
bool peer_is_down(struct peer *p, const char *name);
/* The same, mu held. */
bool peer_down_locked(struct peer *p, const char *name, uint64_t now);

/* ---- peer_send.c ---- */

void *peer_sender_main(void *arg);
void peer_on_replicate(struct daemon *d, struct save *sv);

/* ---- peer_range.c: restores' reads shared across nodes ---- */

/* The hook (struct daemon): range [off, off + len) of key, a shard of job
 * in the main store: 0 with its bytes in buf (from the node that holds
 * it), PEER_RANGE_MINE (this node reads it from storage and keeps it for
 * the others: rangecache.h), or -errno and why (read it alone). */
int peer_range(struct daemon *d, const char *job, const char *key, uint64_t off, uint64_t len, uint8_t *buf, char *why,
	       size_t whylen);
/* A peer's RangeClaim and RangeGet. false: the connection cannot go on. */
bool peer_serve_range_claim(struct peer *p, struct link *l, const Ckpt__RangeClaim *q, const char *from);
bool peer_serve_range_get(struct peer *p, struct link *l, const Ckpt__RangeGet *g);

/* ---- peer_fetch.c: the hooks of struct daemon ---- */

int peer_fetch(struct daemon *d, const struct peer_want *w, struct save **out, char *why, size_t whylen);
int peer_extra(struct daemon *d, const struct peer_want *w, uint8_t **extra, size_t *len, char *why, size_t whylen);
int peer_list(struct daemon *d, const char *job, uint32_t rank, struct peer_copy **out, size_t *nout);

#endif
