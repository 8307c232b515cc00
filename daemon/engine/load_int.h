/* What load.c (a restore's requests, pins, peers and replies) and
 * loadexec.c (its copy plan and the threads that run it) share: the load
 * itself. Nothing else includes it. */
#ifndef CKPTD_LOAD_INT_H
#define CKPTD_LOAD_INT_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/queue.h>
#include <uv.h>

#include "names.h"
#include "tensor.h"

struct daemon;
struct hostbuf;
struct save;
struct session;

struct load_req {
	char *name;
	int dtype;
	struct box box;
	struct hostbuf *buf;
	uint64_t buf_off, nbytes;
	uint64_t covered;    /* elements written */
	struct box *applied; /* cuts already written, disjoint */
	size_t napplied, applied_cap;
	unsigned sources; /* SRC_MEMORY | SRC_STORAGE */
};

#define SRC_MEMORY 1u
#define SRC_STORAGE 2u
#define SRC_PEER 4u /* a copy brought back from a peer for this load */

#define PIN_DURABLE 1u /* the copy was in storage when pinned (held_copy) */
/* Brought from a peer by this load (fetch_copy), or by a show just before
 * it and read by no load since (save.peer_unread): read, its bytes are
 * the peer's (SRC_PEER). */
#define PIN_FETCHED 2u
#define PIN_READ_PEER 4u /* a PIN_FETCHED copy this load read (plan_manifest) */

struct load {
	TAILQ_ENTRY(load) link; /* daemon.loads */
	struct daemon *d;
	struct session *session;
	uint64_t req_id;
	char job[JOB_BUF];
	uint32_t rank, world_size;
	bool latest;
	uint64_t step;
	struct load_req *reqs;
	size_t nreqs;
	struct load_req **by_name;
	struct save **pinned; /* memory-tier copies of the job, pinned */
	size_t npinned;
	uint8_t *pin_flags;          /* PIN_*, of pinned[i] */
	bool memory_only;            /* the step is held here in memory only: no storage (load_copies) */
	bool ask_peers;              /* a named step: copies may come from the peers (fetch_copy) */
	bool storage_only;           /* Load.storage_only: neither memory nor peers */
	bool no_copies;              /* a copy failed its crc: planned again from storage alone (load_run) */
	bool no_shared;              /* nor reads shared across nodes (loadexec.c) */
	atomic_bool from_peer_reads; /* bytes of a read shared across nodes came from a peer */
	char peer[128];              /* the peers copies came from, for Loaded.peer */
	bool has_key;                /* the session's job key (requester.h): copies from peers are sealed with it */
	uint8_t key[32];
	char peer_why[200]; /* why the peers gave none */
	uv_work_t work;
	/* results */
	const struct save *bad_held; /* a held copy whose crc did not match */
	int status;                  /* 0 or -errno */
	char msg[512];
	uint64_t loaded_step, bytes, bytes_memory;
	uint8_t *extra;
	size_t extra_len;
};

/* Loaded.peer: add the peer copy sv came from to those this load names. */
void load_note_peer(struct load *ld, const struct save *sv);

static inline int load_fail(struct load *ld, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Record the load's failure (the first one wins only by the callers' checks); returns status. */
static inline int load_fail(struct load *ld, int status, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(ld->msg, sizeof(ld->msg), fmt, ap);
	va_end(ap);
	ld->status = status;
	return status;
}

/* First index in by_name whose name is name, or nreqs. */
static inline size_t load_find_first(const struct load *ld, const char *name)
{
	size_t lo = 0, hi = ld->nreqs;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (strcmp(ld->by_name[mid]->name, name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

#endif
