/* A save as an object: what holds it (tensors, pool spans, the trainer's
 * events) and how it is freed, and its shard bytes as the memory tier and
 * loads read them. Below both the save state machine (save.c) and the
 * memory tier (memtier.c), which hand saves to each other. */
#include "cudadev.h"
#include "daemon.h"
#include "hostbuf.h"
#include "saveobj.h"

#include <stdlib.h>
#include <string.h>

struct save_names *save_names_ref(struct save_names *n)
{
	if (n)
		n->refs++;
	return n;
}

void save_names_unref(struct save_names *n)
{
	if (n && --n->refs == 0)
		free(n);
}

void save_drop_events(struct save *sv)
{
	for (size_t i = 0; i < sv->nevents; i++)
		cuda_event_put(sv->events[i]);
	free(sv->events);
	sv->events = NULL;
	sv->nevents = 0;
}

void save_free(struct save *sv)
{
	save_drop_events(sv);
	for (size_t i = 0; i < sv->ntensors; i++) {
		if (sv->names == NULL)
			free(sv->tensors[i].name);
		hostbuf_unref(sv->tensors[i].buf);
	}
	save_names_unref(sv->names);
	free(sv->tensors);
	free(sv->pieces);
	free(sv->chunks);
	free(sv->chunk_crc);
	free(sv->jobs);
	free(sv->extra);
	free(sv);
}

const uint8_t *save_shard_bytes(const struct save *sv, uint64_t off, uint64_t len, uint8_t *tmp)
{
	const struct pool *p = &sv->d->pool;
	uint64_t cb = p->chunk_bytes;
	uint64_t c = off / cb, in = off % cb;
	if (in + len <= cb)
		return pool_span_ptr(p, sv->chunks[c]) + in;
	for (uint64_t done = 0; done < len;) {
		c = (off + done) / cb;
		in = (off + done) % cb;
		uint64_t n = cb - in < len - done ? cb - in : len - done;
		memcpy(tmp + done, pool_span_ptr(p, sv->chunks[c]) + in, n);
		done += n;
	}
	return tmp;
}

void save_release(struct save *sv)
{
	if (sv->have_chunks)
		pool_release(&sv->d->pool, sv->chunks, sv->nchunks);
	sv->have_chunks = false;
	save_free(sv);
}
