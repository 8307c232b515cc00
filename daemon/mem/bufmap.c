#include "bufmap.h"
#include "hostbuf.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

static uint32_t home(const struct bufmap *m, uint64_t id)
{
	/* Fibonacci hashing: client ids are often sequential. */
	return (uint32_t)((id * 0x9e3779b97f4a7c15ull) >> 32) & (m->cap - 1);
}

struct hostbuf *bufmap_get(const struct bufmap *m, uint64_t id)
{
	if (m->cap == 0)
		return NULL;
	for (uint32_t i = home(m, id);; i = (i + 1) & (m->cap - 1)) {
		struct hostbuf *b = m->slot[i];
		if (b == NULL || b->id == id)
			return b;
	}
}

static void place(struct bufmap *m, struct hostbuf *b)
{
	uint32_t i = home(m, b->id);
	while (m->slot[i] != NULL)
		i = (i + 1) & (m->cap - 1);
	m->slot[i] = b;
}

int bufmap_put(struct bufmap *m, struct hostbuf *b)
{
	/* At most half full, so probes stay short and one slot is always
	 * empty (every search ends). */
	if ((uint64_t)(m->n + 1) * 2 > m->cap) {
		uint32_t cap = m->cap ? m->cap * 2 : 16;
		if (cap == 0 || cap > (1u << 30))
			return -ENOMEM;
		struct hostbuf **old = m->slot;
		uint32_t ocap = m->cap;
		m->slot = calloc(cap, sizeof(*m->slot));
		if (m->slot == NULL) {
			m->slot = old;
			return -ENOMEM;
		}
		m->cap = cap;
		for (uint32_t i = 0; i < ocap; i++)
			if (old[i])
				place(m, old[i]);
		free(old);
	}
	place(m, b);
	m->n++;
	return 0;
}

struct hostbuf *bufmap_take(struct bufmap *m, uint64_t id)
{
	if (m->cap == 0)
		return NULL;
	uint32_t mask = m->cap - 1, i = home(m, id);
	while (m->slot[i] != NULL && m->slot[i]->id != id)
		i = (i + 1) & mask;
	struct hostbuf *b = m->slot[i];
	if (b == NULL)
		return NULL;
	/* Backward shift (Knuth's algorithm R): move up every later entry of
	 * the run whose home does not lie cyclically in (i, j]. */
	m->slot[i] = NULL;
	for (uint32_t j = (i + 1) & mask; m->slot[j] != NULL; j = (j + 1) & mask) {
		uint32_t h = home(m, m->slot[j]->id);
		bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
		if (!stays) {
			m->slot[i] = m->slot[j];
			m->slot[j] = NULL;
			i = j;
		}
	}
	m->n--;
	return b;
}

void bufmap_clear(struct bufmap *m, void (*fn)(struct hostbuf *))
{
	for (uint32_t i = 0; i < m->cap; i++)
		if (m->slot[i] && fn)
			fn(m->slot[i]);
	free(m->slot);
	*m = (struct bufmap){ 0 };
}
