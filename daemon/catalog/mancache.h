/* Decoded manifests of pinned steps, shared by every load and show of this
 * daemon: with N -> M resharding, or ckpt.dcp's read_metadata on every
 * rank, the ranks of one node read each manifest once between them.
 *
 * Safe to share: a format 2 manifest is created create-only, never
 * overwritten, and the catalogue asks only for the attempt a step's
 * commit pins. An entry is keyed by the manifest's storage key (job,
 * step, rank, world size and attempt are all in it) and remembers the
 * time and size the step's listing gave for the object; a lookup with
 * another time or size (the step was deleted and saved again, on any
 * node) is a miss, and the old entry goes. rm and GC of a step on this
 * daemon drop its entries.
 *
 * Single flight: the first caller for a key fetches it, callers that come
 * meanwhile wait for that fetch and share its result, success or failure.
 * A failure is never kept: the next caller fetches again. Bounded: ready
 * entries over max_bytes (an estimate of their decoded size) go, least
 * recently used first; an entry still held by a load is freed when it is
 * released. Thread-safe; one mutex, never held across a fetch.
 *
 * A step's index (StepIndex, also create-only) is kept the same way,
 * under its own key: the ranks of a node GET it once between them. It
 * counts in bytes and entries, not in hits and misses (manifests only). */
#ifndef CKPTD_MANCACHE_H
#define CKPTD_MANCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.pb-c.h"

struct mancache;
struct mancache_entry;

/* Read and decode the manifest: 0 and *out (the cache owns it then), or
 * -errno with err set. Runs on the caller's thread, no lock held. */
typedef int (*mancache_fetch_fn)(void *ctx, Ckpt__Manifest **out, char *err, size_t errlen);

typedef int (*mancache_fetch_index_fn)(void *ctx, Ckpt__StepIndex **out, char *err, size_t errlen);

struct mancache_stats {
	uint64_t hits;   /* served with no fetch of their own (kept, or shared in flight) */
	uint64_t misses; /* fetched */
	uint64_t bytes;  /* of the entries kept */
	uint64_t entries;
};

/* max_bytes > 0. NULL when out of memory. */
struct mancache *mancache_new(uint64_t max_bytes);
/* Every entry must have been released. */
void mancache_free(struct mancache *c);
/* The manifest at key, listed with (mtime_ns, size). 0 with *out and *ref
 * set (release ref with mancache_release; *out stays valid until then and
 * must not be changed), or the fetch's error with err set. */
int mancache_get(struct mancache *c, const char *key, int64_t mtime_ns, uint64_t size, mancache_fetch_fn fetch,
		 void *ctx, const Ckpt__Manifest **out, struct mancache_entry **ref, char *err, size_t errlen);
/* mancache_get for a step index (catalog.c checks it in its fetch). */
int mancache_get_index(struct mancache *c, const char *key, int64_t mtime_ns, uint64_t size,
		       mancache_fetch_index_fn fetch, void *ctx, const Ckpt__StepIndex **out,
		       struct mancache_entry **ref, char *err, size_t errlen);
void mancache_release(struct mancache *c, struct mancache_entry *e);
/* Forget every key that starts with prefix ("job/step-000000000042/"),
 * fetches in flight included: they are handed to their waiters, not kept. */
void mancache_drop_prefix(struct mancache *c, const char *prefix);
void mancache_stats(struct mancache *c, struct mancache_stats *out);
/* Tests only: sleep this long in every fetch, so that concurrent callers
 * meet in flight. */
void mancache_set_fetch_delay_ms(struct mancache *c, unsigned ms);

#endif
