/* What a store must do for ckptd's guarantees, asked of the store itself
 * (docs/storage.md "Object storage": the storage probe). */
#ifndef CKPTD_PROBE_H
#define CKPTD_PROBE_H

#include "store.h"

#include <stddef.h>

/* Check, under s's own prefix (".ckptd-probe/HOST-PID-RANDOM/"), in a
 * constant number of requests (15 on S3, whatever the job), that:
 *   - a create-only write of an existing object is refused, and leaves
 *     it as it was (else a complete step could be overwritten, and two
 *     writers of a step's commit could both win);
 *   - a ranged read gives those bytes only (restores read their ranges);
 *   - a listing a page at a time gives every name (latest, retention and
 *     gc find every step);
 * and remove what it wrote. 0 when all hold; -EPROTO when the store broke
 * some (*failed: which, PROBE_*; report: what the store did, and which
 * guarantee it would break); another -errno when the store could not be
 * asked (report: the storage error). report always says what was done. */
#define PROBE_CREATE_ONLY 1u
#define PROBE_RANGE 2u
#define PROBE_LISTING 4u
int store_probe(struct store *s, unsigned *failed, char *report, size_t len);

#endif
