/* The memory tier (docs/tiers.md "Tiers"): the copies of saves this
 * node's daemon holds in its pool after they are durable or kept
 * (memory-only), and the replicas it holds for its peers; which stay,
 * which go for room, and which a load may read. Loop thread. */
#ifndef CKPTD_MEMTIER_H
#define CKPTD_MEMTIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct daemon;
struct save;

/* sv became durable, or kept (a memory-only save): hold it. Of its group
 * (its (job, rank), this node's own copies apart from the replicas held
 * for each peer) the newest copy stays, and the newest before it while
 * the newest is in memory only; older ones go (sv itself, when it is
 * one). */
void memtier_hold(struct daemon *d, struct save *sv);
/* A held copy of sv's group with a newer step, or NULL. */
struct save *memtier_newer(struct daemon *d, const struct save *sv);
/* sv's persist ended: apply memtier_hold's rule to its (job, rank) again
 * (it may drop sv, or, now that sv is durable, the copy before it). */
void memtier_settle(struct daemon *d, struct save *sv);
/* Drop sv, held and not persisting, now (or when its readers end). */
void memtier_drop(struct daemon *d, struct save *sv, const char *why);
/* Pool bytes of this node's memory-only copies held (not replicas held
 * for peers), and how many. */
uint64_t memtier_kept_bytes(const struct daemon *d, uint32_t *count);
/* The held copy of (job, step, rank) a peer asks for: the replica held
 * for a peer if any (this node is its holder), else this node's own; or
 * NULL. */
struct save *memtier_find(struct daemon *d, const char *job, uint64_t step, uint32_t rank);
/* Drop held copies nobody reads, oldest first, until a reservation of
 * that shape (pool_shape) fits; none when dropping all of them could not
 * free enough bytes. */
void memtier_reclaim(struct daemon *d, uint32_t whole, uint32_t tail_slots);
/* Pin the held copies of job a load of this node may read: its own, and
 * a replica held for a peer only of a rank this node holds no copy of its
 * own of (a rank of another node, when resharding); unpin releases any
 * that were dropped meanwhile (the caller then admits waiting saves). */
size_t memtier_pin(struct daemon *d, const char *job, struct save ***out);
/* Whether memtier_pin would pin held copy sv (held listings say the same). */
bool memtier_loadable(struct daemon *d, const struct save *sv);
void memtier_unpin(struct save **pinned, size_t n);
/* Release every held copy (shutdown). */
void memtier_clear(struct daemon *d);
/* sv, held and pinned by a load, failed its crc check: drop it (freed when
 * the load unpins it), so that the next restore reads storage. */
void memtier_drop_corrupt(struct daemon *d, struct save *sv);

#endif
