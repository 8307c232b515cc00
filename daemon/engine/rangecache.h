/* Ranges of shards this node read from storage for a restore after the
 * range's directory named it their reader (docs/architecture.md "Reads
 * shared across nodes"): kept a while, so that the other nodes that
 * restore the same bytes get them from this node's memory rather than
 * from storage, and so do this node's own later loads.
 *
 * An entry is made when the read begins (rangecache_begin), so a peer
 * that asks while it is in flight waits for it rather than missing it,
 * and gets its bytes when it ends (rangecache_end). It lives ttl after
 * its last use. The cache holds at most max_bytes: a new entry first
 * pushes out the ones that expired, then the least lately used that no
 * one reads now; when that is not enough it is not made (the read is then
 * this node's alone, and the others read the range for themselves).
 *
 * Thread-safe: the copy threads of loads, and the peer threads that serve
 * ranges, use it at once. */
#ifndef CKPTD_RANGECACHE_H
#define CKPTD_RANGECACHE_H

#include <stdint.h>

struct rangecache;
struct rc_entry;

struct rangecache_stats {
	uint64_t bytes;   /* held now, reads in flight included */
	uint64_t entries; /* held now */
	uint64_t hits;    /* gets answered */
	uint64_t misses;  /* gets that found nothing (or a read that failed) */
	uint64_t refused; /* begins that did not fit (not those of a range kept already) */
};

/* NULL when out of memory. max_bytes 0: nothing is ever kept. */
struct rangecache *rangecache_new(uint64_t max_bytes, uint64_t ttl_ns);
/* No entry may be in use. */
void rangecache_free(struct rangecache *rc);

/* Bytes [off, off + len) of object key in store (compared as a pointer)
 * are being read: an entry for them, or NULL (no room, out of memory, or
 * one for the same range is there already). */
struct rc_entry *rangecache_begin(struct rangecache *rc, const void *store, const char *key, uint64_t off,
				  uint64_t len);
/* e's read ended: its bytes (len of them at src) kept, or src NULL (it
 * failed): dropped. Those waiting for it go on. */
void rangecache_end(struct rangecache *rc, struct rc_entry *e, const uint8_t *src);

/* The bytes [off, off + len) of key in store from an entry that covers
 * them, waiting up to wait_ms for one being read: 0 and *at (valid until
 * rangecache_release(*held)), -ENOENT (none, or its read failed), or
 * -ETIMEDOUT (still being read). */
int rangecache_hold(struct rangecache *rc, const void *store, const char *key, uint64_t off, uint64_t len,
		    uint32_t wait_ms, const uint8_t **at, struct rc_entry **held);
void rangecache_release(struct rangecache *rc, struct rc_entry *e);

/* Let go of what expired (the daemon's status timer: an idle node keeps
 * nothing past its ttl). */
void rangecache_sweep(struct rangecache *rc);

void rangecache_stats(struct rangecache *rc, struct rangecache_stats *out);

#endif
