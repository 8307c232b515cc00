/* A session's registered buffers by id: open addressing with linear
 * probing, O(1) per lookup. A save names a buffer per tensor, so a linear
 * search made a save of 10,000 tensors in 10,000 buffers cost 50 million
 * comparisons on the loop thread (tests/bench/py_tensors.py). */
#ifndef CKPTD_BUFMAP_H
#define CKPTD_BUFMAP_H

#include <stdint.h>

struct hostbuf;

struct bufmap {
	struct hostbuf **slot; /* NULL: empty */
	uint32_t cap;          /* a power of two, or 0 */
	uint32_t n;
};

struct hostbuf *bufmap_get(const struct bufmap *m, uint64_t id);
/* Add b (its id must not be in m yet). 0 or -ENOMEM. */
int bufmap_put(struct bufmap *m, struct hostbuf *b);
/* Remove and return the buffer of id, or NULL. */
struct hostbuf *bufmap_take(struct bufmap *m, uint64_t id);
/* Call fn on every buffer (in no particular order), then empty m. */
void bufmap_clear(struct bufmap *m, void (*fn)(struct hostbuf *));

#endif
