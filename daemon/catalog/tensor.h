/* Tensor boxes and dtypes shared by validation, the save layout and the
 * load planner. */
#ifndef CKPTD_TENSOR_H
#define CKPTD_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TENSOR_MAX_DIMS 8

/* Bytes per element, 0 for an unknown dtype. */
size_t tensor_dtype_size(int dtype);
/* "f32", "bf16", ...; "?" for an unknown dtype. */
const char *tensor_dtype_name(int dtype);

struct box {
	uint32_t ndim;
	uint64_t shape[TENSOR_MAX_DIMS]; /* global shape */
	uint64_t off[TENSOR_MAX_DIMS];
	uint64_t len[TENSOR_MAX_DIMS];
};

/* Fill a box from proto fields (empty offsets/lengths: the whole shape) and
 * check it: dims bounded, box inside shape, no overflow. Sets *nelem. */
int box_from_fields(struct box *b, size_t nshape, const uint64_t *shape, size_t noff, const uint64_t *off, size_t nlen,
		    const uint64_t *len, uint64_t *nelem, char *err, size_t errlen);
/* Intersection of two boxes of the same global shape; false if empty. */
bool box_intersect(const struct box *a, const struct box *b, struct box *out);
bool box_same_shape(const struct box *a, const struct box *b);
/* "[37,5]": the global shape, for messages. */
void box_shape_str(const struct box *b, char *out, size_t len);
bool box_equal(const struct box *a, const struct box *b);
/* Is inner entirely inside outer (same global shape)? */
bool box_contains(const struct box *outer, const struct box *inner);
uint64_t box_volume(const struct box *b);

/* A tensor name: 1..max bytes, no control character. 0 or -EINVAL. */
int tensor_validate_name(const char *name, uint32_t max, char *err, size_t errlen);
/* A tensor as a request names it (proto TensorRef fields): its name, dtype,
 * box, and nbytes that match the box. Fills *box. 0 or -errno, the reason
 * in err naming the tensor (by index when its name is bad). The one check
 * both saves and loads use; the buffer it names is the session's to find. */
int tensor_check(const char *name, int dtype, size_t nshape, const uint64_t *shape, size_t noff, const uint64_t *off,
		 size_t nlen, const uint64_t *len, uint64_t nbytes, size_t index, uint32_t max_name_len,
		 struct box *box, char *err, size_t errlen);

/* Copy the elements of region (inside both src and dst boxes) from a
 * row-major src box to a row-major dst box, as contiguous runs along the
 * last dimension. emit(dst_byte_off, src_byte_off, nbytes) does each run and
 * may fail with -errno, which stops the walk. */
typedef int (*box_run_fn)(void *ctx, uint64_t dst_off, uint64_t src_off, uint64_t n);
int box_copy_runs(const struct box *region, const struct box *src, const struct box *dst, size_t elem, box_run_fn emit,
		  void *ctx);

#endif
