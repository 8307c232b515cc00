/* Where a node's replicas go (docs/tiers.md "Tiers"): every peer's name
 * ("HOST:PORT", as [peers] advertise gives it) sorted into a ring; a
 * node's replicas go to the next K names after its own. A replacement
 * node with the same name finds its replicas with the same function.
 * Pure: no I/O. */
#ifndef CKPTD_RING_H
#define CKPTD_RING_H

#include <stddef.h>
#include <stdint.h>

#define RING_MAX 4096 /* peers one ring holds (512 nodes is the design point) */
#define RING_NAME_MAX 128

struct ring {
	char (*names)[RING_NAME_MAX]; /* sorted, unique */
	size_t n;
};

/* The ring of self and every name in list (comma-separated HOST:PORT;
 * blanks ignored, duplicates and self's own entry folded) plus extra
 * (names from DNS; may be NULL). 0, -EINVAL (a name too long or
 * empty), -E2BIG (more than RING_MAX), -ENOMEM. */
int ring_build(struct ring *r, const char *self, const char *list, const char *const *extra, size_t nextra);
void ring_free(struct ring *r);
/* The k names after self in the ring (fewer when the ring is smaller),
 * into out[]; returns how many. self must be in the ring. */
size_t ring_successors(const struct ring *r, const char *self, uint32_t k, const char **out, size_t max);

#endif
