/* A save as an object: what holds it (tensors, pool spans, the trainer's
 * events) and how it is freed, and its shard bytes as the memory tier and
 * loads read them. Below both the save state machine (save.c) and the
 * memory tier (memtier.c), which hand saves to each other. */
#include "cudadev.h"
#include "daemon.h"
#include "hostbuf.h"
#include "manifest.h"
#include "saveobj.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
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
	free(sv->seal);
	explicit_bzero(sv->key, sizeof(sv->key));
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

/* The view's tensors and the shard directory's name, in one allocation
 * hung from m->tensors. */
struct view_mem {
	char dir[64];
	Ckpt__ManifestTensor *ptrs[];
};

int save_manifest_view(const struct save *sv, Ckpt__Manifest *m, const char *shard_name, uint64_t created_unix_ns)
{
	ckpt__manifest__init(m);
	size_t n = sv->ntensors;
	struct view_mem *vm = malloc(sizeof(*vm) + n * (sizeof(Ckpt__ManifestTensor *) + sizeof(Ckpt__ManifestTensor)));
	if (vm == NULL)
		return -ENOMEM;
	Ckpt__ManifestTensor *mt = (Ckpt__ManifestTensor *)(vm->ptrs + n);
	m->format_version = MANIFEST_FORMAT_VERSION;
	m->job = (char *)sv->job;
	m->step = sv->step;
	m->rank = sv->rank;
	m->world_size = sv->world_size;
	m->attempt_id = (char *)sv->attempt;
	m->created_unix_ns = created_unix_ns;
	m->shard_name = (char *)shard_name;
	if (sv->spread && manifest_spread_dir(vm->dir, sizeof(vm->dir), sv->rank, sv->step) == 0)
		m->shard_dir = vm->dir;
	m->shard_bytes = sv->shard_bytes;
	m->chunk_bytes = sv->d->pool.chunk_bytes;
	m->n_chunk_crc32c = sv->nchunks;
	m->chunk_crc32c = sv->chunk_crc;
	m->extra_state.data = sv->extra;
	m->extra_state.len = sv->extra_len;
	for (size_t i = 0; i < n; i++) {
		const struct save_tensor *t = &sv->tensors[i];
		ckpt__manifest_tensor__init(&mt[i]);
		mt[i].name = t->name;
		mt[i].dtype = t->dtype;
		mt[i].n_global_shape = t->box.ndim;
		mt[i].global_shape = (uint64_t *)t->box.shape;
		mt[i].n_box_offsets = t->box.ndim;
		mt[i].box_offsets = (uint64_t *)t->box.off;
		mt[i].n_box_lengths = t->box.ndim;
		mt[i].box_lengths = (uint64_t *)t->box.len;
		mt[i].shard_offset = t->shard_off;
		mt[i].nbytes = t->nbytes;
		mt[i].crc32c = t->crc;
		vm->ptrs[i] = &mt[i];
	}
	m->n_tensors = n;
	m->tensors = vm->ptrs;
	return 0;
}

void save_held_view(const struct save *sv, Ckpt__HeldCopy *h, const char *job)
{
	ckpt__held_copy__init(h);
	h->job = (char *)job;
	h->rank = sv->rank;
	h->world_size = sv->world_size;
	h->step = sv->step;
	h->bytes = sv->shard_bytes;
	h->attempt_id = (char *)sv->attempt;
	h->tier = (Ckpt__Tier)sv->tier;
	h->durable = sv->durable;
}

void save_step_location(struct daemon *d, const char *job, uint64_t step, char *out, size_t len)
{
	snprintf(out, len, "%s/%s/step-%012" PRIu64, daemon_store_of(d, job)->url, job, step);
}

void save_manifest_view_free(Ckpt__Manifest *m)
{
	if (m->tensors)
		free((char *)m->tensors - offsetof(struct view_mem, ptrs));
	m->tensors = NULL;
	m->n_tensors = 0;
}
