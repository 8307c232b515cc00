#include "tensor.h"
#include "ckpt.pb-c.h"
#include "macro.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* One row per dtype of proto/ckpt.proto, indexed by its value. */
static const struct {
	const char *name;
	size_t size;
} dtypes[] = {
	[CKPT__DTYPE__F32] = { "f32", 4 },       [CKPT__DTYPE__F16] = { "f16", 2 },
	[CKPT__DTYPE__BF16] = { "bf16", 2 },     [CKPT__DTYPE__F64] = { "f64", 8 },
	[CKPT__DTYPE__I8] = { "i8", 1 },         [CKPT__DTYPE__U8] = { "u8", 1 },
	[CKPT__DTYPE__I16] = { "i16", 2 },       [CKPT__DTYPE__I32] = { "i32", 4 },
	[CKPT__DTYPE__I64] = { "i64", 8 },       [CKPT__DTYPE__BOOL] = { "bool", 1 },
	[CKPT__DTYPE__F8E4M3] = { "f8e4m3", 1 }, [CKPT__DTYPE__F8E5M2] = { "f8e5m2", 1 },
};

size_t tensor_dtype_size(int dtype)
{
	return dtype > 0 && dtype < (int)ELEMENTSOF(dtypes) ? dtypes[dtype].size : 0;
}

const char *tensor_dtype_name(int dtype)
{
	return tensor_dtype_size(dtype) ? dtypes[dtype].name : "?";
}

void box_shape_str(const struct box *b, char *out, size_t len)
{
	size_t off = 0;
	int w = snprintf(out, len, "[");
	off = w > 0 ? (size_t)w : 0;
	for (uint32_t i = 0; i < b->ndim && off < len; i++) {
		w = snprintf(out + off, len - off, "%s%llu", i ? "," : "", (unsigned long long)b->shape[i]);
		off += w > 0 ? (size_t)w : 0;
	}
	if (off < len)
		snprintf(out + off, len - off, "]");
}

int box_from_fields(struct box *b, size_t nshape, const uint64_t *shape, size_t noff, const uint64_t *off, size_t nlen,
		    const uint64_t *len, uint64_t *nelem, char *err, size_t errlen)
{
	memset(b, 0, sizeof(*b));
	if (nshape > TENSOR_MAX_DIMS) {
		snprintf(err, errlen, "%zu dims, at most %d", nshape, TENSOR_MAX_DIMS);
		return -EINVAL;
	}
	if (!((noff == 0 && nlen == 0) || (noff == nshape && nlen == nshape))) {
		snprintf(err, errlen, "box has %zu offsets and %zu lengths for %zu dims", noff, nlen, nshape);
		return -EINVAL;
	}
	b->ndim = (uint32_t)nshape;
	uint64_t n = 1;
	for (size_t i = 0; i < nshape; i++) {
		b->shape[i] = shape[i];
		b->off[i] = noff ? off[i] : 0;
		b->len[i] = nlen ? len[i] : shape[i];
		if (b->off[i] > b->shape[i] || b->len[i] > b->shape[i] - b->off[i]) {
			snprintf(err, errlen, "box [%llu +%llu) leaves dim %zu of size %llu",
				 (unsigned long long)b->off[i], (unsigned long long)b->len[i], i,
				 (unsigned long long)b->shape[i]);
			return -ERANGE;
		}
		if (b->len[i] != 0 && n > UINT64_MAX / b->len[i]) {
			snprintf(err, errlen, "box volume overflows");
			return -EOVERFLOW;
		}
		n *= b->len[i];
	}
	*nelem = n;
	return 0;
}

bool box_same_shape(const struct box *a, const struct box *b)
{
	if (a->ndim != b->ndim)
		return false;
	for (uint32_t i = 0; i < a->ndim; i++)
		if (a->shape[i] != b->shape[i])
			return false;
	return true;
}

bool box_equal(const struct box *a, const struct box *b)
{
	if (!box_same_shape(a, b))
		return false;
	for (uint32_t i = 0; i < a->ndim; i++)
		if (a->off[i] != b->off[i] || a->len[i] != b->len[i])
			return false;
	return true;
}

bool box_contains(const struct box *outer, const struct box *inner)
{
	if (!box_same_shape(outer, inner))
		return false;
	for (uint32_t i = 0; i < outer->ndim; i++)
		if (inner->off[i] < outer->off[i] || inner->off[i] + inner->len[i] > outer->off[i] + outer->len[i])
			return false;
	return true;
}

uint64_t box_volume(const struct box *b)
{
	uint64_t n = 1;
	for (uint32_t i = 0; i < b->ndim; i++)
		n *= b->len[i];
	return n;
}

bool box_intersect(const struct box *a, const struct box *b, struct box *out)
{
	if (!box_same_shape(a, b))
		return false;
	*out = *a;
	for (uint32_t i = 0; i < a->ndim; i++) {
		uint64_t lo = a->off[i] > b->off[i] ? a->off[i] : b->off[i];
		uint64_t ea = a->off[i] + a->len[i], eb = b->off[i] + b->len[i];
		uint64_t hi = ea < eb ? ea : eb;
		if (hi <= lo)
			return false;
		out->off[i] = lo;
		out->len[i] = hi - lo;
	}
	return true;
}

/* Row-major element index of global coordinate c inside box b. */
static uint64_t linear(const struct box *b, const uint64_t *c)
{
	uint64_t idx = 0;
	for (uint32_t i = 0; i < b->ndim; i++)
		idx = idx * b->len[i] + (c[i] - b->off[i]);
	return idx;
}

int box_copy_runs(const struct box *region, const struct box *src, const struct box *dst, size_t elem, box_run_fn emit,
		  void *ctx)
{
	uint32_t nd = region->ndim;
	if (nd == 0)
		return emit(ctx, 0, 0, elem);
	/* Merge trailing dims that are whole in region, src and dst into
	 * one longer run. */
	uint32_t k = nd - 1;
	uint64_t run = region->len[k];
	while (k > 0 && region->len[k] == src->len[k] && region->len[k] == dst->len[k]) {
		k--;
		run *= region->len[k];
	}
	/* Odometer over dims [0, k), with dim k's start fixed. */
	uint64_t c[TENSOR_MAX_DIMS];
	for (uint32_t i = 0; i < nd; i++)
		c[i] = region->off[i];
	for (;;) {
		int r = emit(ctx, linear(dst, c) * elem, linear(src, c) * elem, run * elem);
		if (r < 0)
			return r;
		int d = (int)k - 1;
		while (d >= 0) {
			if (++c[d] < region->off[d] + region->len[d])
				break;
			c[d] = region->off[d];
			d--;
		}
		if (d < 0)
			return 0;
	}
}

int tensor_validate_name(const char *name, uint32_t max, char *err, size_t errlen)
{
	size_t n = strlen(name);
	if (n == 0 || n > max) {
		snprintf(err, errlen, "tensor name must be 1..%u bytes", max);
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f) {
			snprintf(err, errlen, "tensor name has a control character");
			return -EINVAL;
		}
	return 0;
}

int tensor_check(const char *name, int dtype, size_t nshape, const uint64_t *shape, size_t noff, const uint64_t *off,
		 size_t nlen, const uint64_t *len, uint64_t nbytes, size_t index, uint32_t max_name_len,
		 struct box *box, char *err, size_t errlen)
{
	char why[256];
	int r = tensor_validate_name(name, max_name_len, why, sizeof(why));
	if (r < 0) {
		snprintf(err, errlen, "tensor %zu: %s", index, why);
		return r;
	}
	size_t es = tensor_dtype_size(dtype);
	if (es == 0) {
		snprintf(err, errlen, "tensor '%s': unknown dtype %d", name, dtype);
		return -EINVAL;
	}
	uint64_t nelem;
	r = box_from_fields(box, nshape, shape, noff, off, nlen, len, &nelem, why, sizeof(why));
	if (r < 0) {
		snprintf(err, errlen, "tensor '%s': %s", name, why);
		return r;
	}
	if (nelem > UINT64_MAX / es || nelem * es != nbytes) {
		snprintf(err, errlen,
			 "tensor '%s': nbytes %" PRIu64 " does not match its box (%" PRIu64 " elements of %zu bytes)",
			 name, nbytes, nelem, es);
		return -EINVAL;
	}
	return 0;
}
