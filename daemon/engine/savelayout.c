/* A save's layout (saveobj.h save_layout): its tensors from the request
 * (each TensorRef checked against the session's buffers and the caps, or
 * a declared table's), their places in the shard, the pieces they split
 * into at chunk boundaries, the trainer's CUDA events, the extra state.
 * No I/O; loop thread. */
#include "cudadev.h"
#include "daemon.h"
#include "hostbuf.h"
#include "requester.h"
#include "savetab.h"
#include "saveobj.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The trainer's events, one per device its CUDA tensors live on: every
 * such device must have one, or the copy could read half-written data. */
static int open_events(struct save *sv, const Ckpt__Save *m, char *err, size_t errlen)
{
	struct cuda *cu = sv->d->cuda;
	if (m->n_cuda_events > 64) {
		snprintf(err, errlen, "%zu CUDA events, at most 64", m->n_cuda_events);
		return -E2BIG;
	}
	if (m->n_cuda_events > 0 && cu == NULL) {
		snprintf(err, errlen, "the save carries CUDA events but CUDA is off in ckptd");
		return -ENOTSUP;
	}
	if (m->n_cuda_events) {
		sv->events = calloc(m->n_cuda_events, sizeof(*sv->events));
		if (sv->events == NULL)
			return -ENOMEM;
	}
	for (size_t i = 0; i < m->n_cuda_events; i++) {
		const Ckpt__CudaEvent *e = m->cuda_events[i];
		if (e->device_uuid.len != CUDA_UUID_BYTES || e->ipc_handle.len != CUDA_IPC_BYTES) {
			snprintf(err, errlen, "CUDA event %zu: needs a 16-byte device UUID and a 64-byte handle", i);
			return -EINVAL;
		}
		int r = cuda_event_get(cu, e->device_uuid.data, e->ipc_handle.data, &sv->events[i], err, errlen);
		if (r < 0)
			return r;
		sv->nevents = i + 1;
	}
	for (size_t i = 0; i < sv->ntensors; i++) {
		const struct hostbuf *b = sv->tensors[i].buf;
		if (b->cuda == NULL)
			continue;
		size_t k = 0;
		while (k < sv->nevents &&
		       memcmp(cuda_event_uuid(sv->events[k]), cudabuf_uuid(b->cuda), CUDA_UUID_BYTES) != 0)
			k++;
		if (k == sv->nevents) {
			snprintf(err, errlen, "tensor '%s' is on a CUDA device the save has no event for",
				 sv->tensors[i].name);
			return -EINVAL;
		}
	}
	return 0;
}

/* The save's tensors from its TensorRefs, each checked (the session's
 * buffers, the caps), names unique. */
static int tensors_from_refs(struct save *sv, const Ckpt__Save *m, char *err, size_t errlen)
{
	struct session *s = sv->session;
	sv->tensors = calloc(m->n_tensors ? m->n_tensors : 1, sizeof(*sv->tensors));
	if (sv->tensors == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < m->n_tensors; i++) {
		const Ckpt__TensorRef *tr = m->tensors[i];
		struct save_tensor *t = &sv->tensors[i];
		struct hostbuf *b = NULL;
		int r = sv->d->req_ops->tensor(s, tr, i, &t->box, &b, err, errlen);
		if (r < 0)
			return r;
		if ((t->name = strdup(tr->name)) == NULL)
			return -ENOMEM;
		sv->ntensors = i + 1;
		t->dtype = tr->dtype;
		t->nbytes = tr->nbytes;
		t->buf = hostbuf_ref(b);
		t->buf_off = tr->offset;
	}
	return save_tensors_unique(sv->tensors, sv->ntensors, err, errlen);
}

/* The save's tensors from a declared table (savetab.h): checked when it
 * was declared, so only copied, and the names shared. */
static int tensors_from_table(struct save *sv, const Ckpt__Save *m, char *err, size_t errlen)
{
	if (m->n_tensors) {
		snprintf(err, errlen, "a save names a table or carries tensors, not both");
		return -EINVAL;
	}
	const struct save_table *t = sv->d->req_ops->table(sv->session, m->table_id);
	if (t == NULL) {
		snprintf(err, errlen, "table %" PRIu64 " is not declared on this session", m->table_id);
		return -ENOENT;
	}
	sv->tensors = malloc((t->n ? t->n : 1) * sizeof(*sv->tensors));
	if (sv->tensors == NULL)
		return -ENOMEM;
	memcpy(sv->tensors, t->tensors, t->n * sizeof(*sv->tensors));
	for (size_t i = 0; i < t->n; i++)
		hostbuf_ref(sv->tensors[i].buf);
	sv->ntensors = t->n;
	sv->names = save_names_ref(t->names);
	return 0;
}

int save_layout(struct save *sv, const Ckpt__Save *m, char *err, size_t errlen)
{
	const struct config *c = &sv->d->cfg;
	if (m->n_tensors > c->max_tensors) {
		snprintf(err, errlen, "%zu tensors, at most %u per save", m->n_tensors, c->max_tensors);
		return -E2BIG;
	}
	if (m->extra_state.len > c->max_extra_state) {
		snprintf(err, errlen, "extra state of %zu bytes, at most %u", m->extra_state.len, c->max_extra_state);
		return -E2BIG;
	}
	int r = m->table_id ? tensors_from_table(sv, m, err, errlen) : tensors_from_refs(sv, m, err, errlen);
	if (r < 0)
		return r;
	uint64_t off = 0;
	for (size_t i = 0; i < sv->ntensors; i++) {
		struct save_tensor *t = &sv->tensors[i];
		off = (off + SHARD_ALIGN - 1) & ~(uint64_t)(SHARD_ALIGN - 1);
		t->shard_off = off;
		/* off stays below the pool size, so neither line can wrap. */
		if (off > sv->d->pool.bytes || t->nbytes > sv->d->pool.bytes - off) {
			snprintf(err, errlen,
				 "save of more than %" PRIu64 " bytes can never fit the staging pool; "
				 "raise staging_bytes",
				 sv->d->pool.bytes);
			return -E2BIG;
		}
		off += t->nbytes;
	}
	r = open_events(sv, m, err, errlen);
	if (r < 0)
		return r;

	uint64_t cb = sv->d->pool.chunk_bytes;
	sv->shard_bytes = off;
	uint64_t nchunks = off / cb + (off % cb != 0);
	if (nchunks > sv->d->pool.nchunks) {
		snprintf(err, errlen,
			 "save of %" PRIu64 " bytes can never fit the staging pool of %" PRIu64
			 " bytes; raise staging_bytes",
			 off, sv->d->pool.bytes);
		return -E2BIG;
	}
	sv->nchunks = (uint32_t)nchunks;
	pool_shape(&sv->d->pool, off, &sv->whole, &sv->tail_slots);
	sv->pool_bytes = pool_shape_bytes(&sv->d->pool, sv->whole, sv->tail_slots);
	/* Pieces: each tensor split at chunk boundaries. */
	size_t np = 0;
	for (size_t i = 0; i < sv->ntensors; i++) {
		struct save_tensor *t = &sv->tensors[i];
		if (t->nbytes)
			np += (t->shard_off + t->nbytes - 1) / cb - t->shard_off / cb + 1;
	}
	sv->pieces = calloc(np ? np : 1, sizeof(*sv->pieces));
	sv->chunks = calloc(nchunks ? nchunks : 1, sizeof(*sv->chunks));
	sv->chunk_crc = calloc(nchunks ? nchunks : 1, sizeof(uint32_t));
	sv->jobs = calloc(nchunks ? nchunks : 1, sizeof(*sv->jobs));
	if (!sv->pieces || !sv->chunks || !sv->chunk_crc || !sv->jobs)
		return -ENOMEM;
	for (size_t i = 0; i < sv->ntensors; i++) {
		struct save_tensor *t = &sv->tensors[i];
		uint64_t done = 0;
		while (done < t->nbytes) {
			uint64_t at = t->shard_off + done;
			uint64_t room = cb - at % cb;
			uint64_t n = t->nbytes - done < room ? t->nbytes - done : room;
			sv->pieces[sv->npieces++] =
				(struct save_piece){ .tensor = (uint32_t)i, .tensor_off = done, .len = n };
			done += n;
		}
	}
	if (m->extra_state.len) {
		sv->extra = malloc(m->extra_state.len);
		if (sv->extra == NULL)
			return -ENOMEM;
		memcpy(sv->extra, m->extra_state.data, m->extra_state.len);
		sv->extra_len = m->extra_state.len;
	}
	return 0;
}
