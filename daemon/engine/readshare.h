/* Restores' storage reads shared within the node: when several loads of
 * this daemon want the same object range at the same time (data-parallel
 * replicas, where every rank of a node loads the whole model; DCP items
 * deduplicated across ranks), one of them reads it and the others use its
 * bytes. Each byte a node's concurrent restores want is then read from
 * storage once, not once per rank.
 *
 * The first loader to ask for a range leads: it reads into its own buffer
 * (a copy thread's read buffer). A loader asking meanwhile for the same
 * range of the same object in the same store, or for a part of it, joins:
 * it waits until the read is done, then applies the bytes straight from
 * the leader's buffer (no copy of its own) and releases them. The leader
 * takes the read out of the table once its own apply is done, and reuses
 * its buffer only after every joiner released it. A loader that comes
 * after that reads for itself: concurrent loads share, later ones do not
 * (nothing is kept; the memory tier is what keeps).
 *
 * No allocation: a read in flight lives on its leader's stack, its bytes
 * in the leader's buffer, so the copy threads' buffers are all that is
 * ever held. No deadlock: a thread is in one readshare_read at a time, and
 * neither fetch nor apply calls it, so a joiner waits only for a fetch and
 * a leader only for applies, neither of which waits in here.
 *
 * A failed read is handed to its joiners and never kept: each then reads
 * the range for itself, once, alone. A failure that was the leader's own
 * (a request that timed out, a connection reset) then costs the others
 * one read each, no more than sharing nothing would, and fails none of
 * them; one that is the object's (gone, shorter than its manifest says)
 * fails each with its own error. */
#ifndef CKPTD_READSHARE_H
#define CKPTD_READSHARE_H

#include <stddef.h>
#include <stdint.h>

struct readshare;

/* Read the range into buf (len bytes): where the bytes came from (0:
 * storage, counted in read_bytes; another READSHARE_* the fetch's own),
 * or -errno. */
typedef int (*readshare_fetch_fn)(void *ctx, uint8_t *buf);
/* Use the range's bytes at src: valid during the call only, never changed;
 * how: the fetch's answer that brought them (to the joiners too). */
typedef void (*readshare_apply_fn)(void *ctx, const uint8_t *src, int how);

#define READSHARE_STORAGE 0

struct readshare_stats {
	uint64_t read_bytes;   /* read from storage (READSHARE_STORAGE), by leaders and by loaders alone */
	uint64_t reads;        /* fetches that succeeded */
	uint64_t shared;       /* reads served by another loader's read */
	uint64_t shared_bytes; /* their bytes */
	uint64_t joined;       /* loaders waiting for or applying a read now */
};

/* NULL when out of memory. */
struct readshare *readshare_new(void);
/* No readshare_read may be running. */
void readshare_free(struct readshare *rs);

/* Bytes [off, off + len) of object key in store (compared as a pointer):
 * joined to a read in flight that covers them, or read by fetch into buf
 * (len bytes, the caller's), which stays the caller's again when this
 * returns. apply runs once on success, with the range's first byte.
 * Returns 0 or fetch's error (apply not run). rs NULL: no sharing. */
int readshare_read(struct readshare *rs, const void *store, const char *key, uint64_t off, uint64_t len, uint8_t *buf,
		   readshare_fetch_fn fetch, readshare_apply_fn apply, void *ctx);

void readshare_stats(struct readshare *rs, struct readshare_stats *out);
/* Tests only: a leader sleeps this long before its fetch, so that
 * concurrent loads meet in flight. */
void readshare_set_fetch_delay_ms(struct readshare *rs, unsigned ms);

#endif
