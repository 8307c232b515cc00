/* ckpt_abi_layout: the layout of the structs bindings mirror, from the
 * compiler (ckpt.h says why). */
#include <stddef.h>

#include "client_internal.h" /* ckpt.h, exported */

#define SIZE(T) \
	{ \
#T, NULL, 0, sizeof(T) \
	}
#define FIELD(T, f) \
	{ \
#T, #f, offsetof(T, f), sizeof(((T *)0)->f) \
	}

static const ckpt_abi_field rows[] = {
	SIZE(ckpt_hello),
	FIELD(ckpt_hello, job),
	FIELD(ckpt_hello, rank),
	FIELD(ckpt_hello, world_size),
	FIELD(ckpt_hello, local_rank),
	FIELD(ckpt_hello, attempt_id),
	FIELD(ckpt_hello, policy),
	SIZE(ckpt_tensor),
	FIELD(ckpt_tensor, name),
	FIELD(ckpt_tensor, dtype),
	FIELD(ckpt_tensor, ndim),
	FIELD(ckpt_tensor, global_shape),
	FIELD(ckpt_tensor, box_offsets),
	FIELD(ckpt_tensor, box_lengths),
	FIELD(ckpt_tensor, buffer),
	FIELD(ckpt_tensor, offset),
	FIELD(ckpt_tensor, nbytes),
	SIZE(ckpt_save_opts),
	FIELD(ckpt_save_opts, cuda_stream),
	FIELD(ckpt_save_opts, tier),
	FIELD(ckpt_save_opts, compress),
	FIELD(ckpt_save_opts, incremental),
	SIZE(ckpt_step_info),
	FIELD(ckpt_step_info, job),
	FIELD(ckpt_step_info, step),
	FIELD(ckpt_step_info, complete),
	FIELD(ckpt_step_info, bytes),
	FIELD(ckpt_step_info, ranks_present),
	FIELD(ckpt_step_info, world_size),
	FIELD(ckpt_step_info, attempt_id),
	FIELD(ckpt_step_info, bytes_unlisted),
	FIELD(ckpt_step_info, saved_unix_ns),
	FIELD(ckpt_step_info, tier),
	FIELD(ckpt_step_info, where),
	SIZE(ckpt_held_info),
	FIELD(ckpt_held_info, job),
	FIELD(ckpt_held_info, rank),
	FIELD(ckpt_held_info, world_size),
	FIELD(ckpt_held_info, step),
	FIELD(ckpt_held_info, bytes),
	FIELD(ckpt_held_info, attempt_id),
	FIELD(ckpt_held_info, tier),
	FIELD(ckpt_held_info, durable),
	FIELD(ckpt_held_info, peer),
	SIZE(ckpt_tensor_info),
	FIELD(ckpt_tensor_info, rank),
	FIELD(ckpt_tensor_info, name),
	FIELD(ckpt_tensor_info, dtype),
	FIELD(ckpt_tensor_info, ndim),
	FIELD(ckpt_tensor_info, global_shape),
	FIELD(ckpt_tensor_info, box_offsets),
	FIELD(ckpt_tensor_info, box_lengths),
	FIELD(ckpt_tensor_info, shard_offset),
	FIELD(ckpt_tensor_info, nbytes),
	FIELD(ckpt_tensor_info, crc32c),
	SIZE(ckpt_step_detail),
	FIELD(ckpt_step_detail, info),
	FIELD(ckpt_step_detail, ntensors),
	FIELD(ckpt_step_detail, tensors),
};

const ckpt_abi_field *ckpt_abi_layout(size_t *n)
{
	if (n)
		*n = sizeof(rows) / sizeof(rows[0]);
	return rows;
}
