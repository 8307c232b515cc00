/* A valid two-tensor Ckpt__Manifest for tests, and its packed bytes. */
#ifndef CKPTD_MANIFEST_UTIL_H
#define CKPTD_MANIFEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.pb-c.h"

#define TM_SHARD_BYTES 8192u
#define TM_CHUNK_BYTES 4096u

/* Self-referencing: initialise in place and do not move. */
struct tm_manifest {
	Ckpt__Manifest m;
	Ckpt__ManifestTensor t[2];
	Ckpt__ManifestTensor *tp[2];
	uint64_t shape0[2], off0[2], len0[2], shape1[1];
	uint32_t crcs[2];
	uint8_t extra[5];
	char job[130], attempt[130], shard[64];
};

static inline void tm_init(struct tm_manifest *x, const char *job, uint64_t step,
			   uint32_t rank, uint32_t world_size, const char *attempt)
{
	memset(x, 0, sizeof(*x));
	ckpt__manifest__init(&x->m);
	snprintf(x->job, sizeof(x->job), "%s", job);
	snprintf(x->attempt, sizeof(x->attempt), "%s", attempt);
	snprintf(x->shard, sizeof(x->shard), "rank-%05u-of-%05u.shard", rank, world_size);
	x->m.format_version = 1;
	x->m.job = x->job;
	x->m.step = step;
	x->m.rank = rank;
	x->m.world_size = world_size;
	x->m.attempt_id = x->attempt;
	x->m.created_unix_ns = 1700000000000000000ull + step * 1000 + rank;
	x->m.shard_name = x->shard;
	x->m.shard_bytes = TM_SHARD_BYTES;
	x->m.chunk_bytes = TM_CHUNK_BYTES;
	x->crcs[0] = 0x11111111u;
	x->crcs[1] = 0x22222222u + rank;
	x->m.n_chunk_crc32c = 2;
	x->m.chunk_crc32c = x->crcs;
	memcpy(x->extra, "rng42", 5);
	x->m.extra_state.data = x->extra;
	x->m.extra_state.len = sizeof(x->extra);

	/* "w": F32 [4, 6], this rank holds rows 2..3. */
	Ckpt__ManifestTensor *t = &x->t[0];
	ckpt__manifest_tensor__init(t);
	t->name = "w";
	t->dtype = CKPT__DTYPE__F32;
	x->shape0[0] = 4;
	x->shape0[1] = 6;
	x->off0[0] = 2;
	x->off0[1] = 0;
	x->len0[0] = 2;
	x->len0[1] = 6;
	t->n_global_shape = 2;
	t->global_shape = x->shape0;
	t->n_box_offsets = 2;
	t->box_offsets = x->off0;
	t->n_box_lengths = 2;
	t->box_lengths = x->len0;
	t->shard_offset = 0;
	t->nbytes = 2 * 6 * 4;
	t->crc32c = 0xAAAA0000u;
	/* "b": BF16 [6], whole, in the second chunk. */
	t = &x->t[1];
	ckpt__manifest_tensor__init(t);
	t->name = "b";
	t->dtype = CKPT__DTYPE__BF16;
	x->shape1[0] = 6;
	t->n_global_shape = 1;
	t->global_shape = x->shape1;
	t->shard_offset = 4096;
	t->nbytes = 12;
	t->crc32c = 0xBBBB0000u;
	x->tp[0] = &x->t[0];
	x->tp[1] = &x->t[1];
	x->m.n_tensors = 2;
	x->m.tensors = x->tp;
}

static inline uint8_t *tm_pack(const Ckpt__Manifest *m, size_t *len)
{
	*len = ckpt__manifest__get_packed_size(m);
	uint8_t *buf = malloc(*len ? *len : 1);
	if (buf)
		ckpt__manifest__pack(m, buf);
	return buf;
}

#endif
