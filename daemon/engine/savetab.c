#include "savetab.h"
#include "config.h"
#include "hostbuf.h"
#include "saveobj.h"
#include "tensor.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_name(const void *a, const void *b)
{
	const struct save_tensor *x = a, *y = b;
	return strcmp(x->name, y->name);
}

int save_tensors_unique(const struct save_tensor *t, size_t n, char *err, size_t errlen)
{
	struct save_tensor *sorted = malloc((n ? n : 1) * sizeof(*sorted));
	if (sorted == NULL)
		return -ENOMEM;
	memcpy(sorted, t, n * sizeof(*sorted));
	qsort(sorted, n, sizeof(*sorted), cmp_name);
	for (size_t i = 1; i < n; i++)
		if (strcmp(sorted[i - 1].name, sorted[i].name) == 0) {
			snprintf(err, errlen, "tensor name '%s' appears twice", sorted[i].name);
			free(sorted);
			return -EINVAL;
		}
	free(sorted);
	return 0;
}

void save_table_free(struct save_table *t)
{
	if (t == NULL)
		return;
	for (size_t i = 0; t->tensors && i < t->n; i++) {
		t->tensors[i].buf->tables--;
		hostbuf_unref(t->tensors[i].buf);
	}
	free(t->tensors);
	save_names_unref(t->names);
	free(t);
}

/* The arrays agree: one entry per tensor in each, names ended by NULs,
 * and dims holding 3 * ndim values per tensor. */
static int check_shape(const struct config *c, const Ckpt__DeclareTable *m, char *err, size_t errlen)
{
	size_t n = m->n_dtype;
	if (m->table_id == 0) {
		snprintf(err, errlen, "table id 0 is reserved (a save without a table)");
		return -EINVAL;
	}
	if (n > c->max_tensors) {
		snprintf(err, errlen, "%zu tensors, at most %u per save", n, c->max_tensors);
		return -E2BIG;
	}
	if (m->n_ndim != n || m->n_buffer_id != n || m->n_offset != n || m->n_nbytes != n) {
		snprintf(err, errlen,
			 "table %" PRIu64 ": %zu dtypes, %zu ndims, %zu buffer ids, %zu offsets, %zu nbytes: one "
			 "of each per tensor",
			 m->table_id, n, m->n_ndim, m->n_buffer_id, m->n_offset, m->n_nbytes);
		return -EINVAL;
	}
	size_t names = 0;
	for (size_t i = 0; i < m->names.len; i++)
		names += m->names.data[i] == '\0';
	if (names != n || (m->names.len && m->names.data[m->names.len - 1] != '\0')) {
		snprintf(err, errlen, "table %" PRIu64 ": %zu NUL-ended names for %zu tensors", m->table_id, names, n);
		return -EINVAL;
	}
	size_t dims = 0;
	for (size_t i = 0; i < n; i++) {
		if (m->ndim[i] > TENSOR_MAX_DIMS) {
			snprintf(err, errlen, "table %" PRIu64 ": tensor %zu has %u dims, at most %d", m->table_id, i,
				 m->ndim[i], TENSOR_MAX_DIMS);
			return -EINVAL;
		}
		dims += 3 * (size_t)m->ndim[i];
	}
	if (dims != m->n_dims) {
		snprintf(err, errlen, "table %" PRIu64 ": %zu dims given, the ndims add up to %zu", m->table_id,
			 m->n_dims, dims);
		return -EINVAL;
	}
	return 0;
}

int save_table_new(const struct config *c, const Ckpt__DeclareTable *m, savetab_find_fn find, void *ctx,
		   struct save_table **out, char *err, size_t errlen)
{
	*out = NULL;
	int r = check_shape(c, m, err, errlen);
	if (r < 0)
		return r;
	size_t n = m->n_dtype;
	struct save_table *t = calloc(1, sizeof(*t));
	if (t == NULL)
		return -ENOMEM;
	t->id = m->table_id;
	t->tensors = calloc(n ? n : 1, sizeof(*t->tensors));
	t->names = malloc(sizeof(*t->names) + m->names.len + 1);
	if (t->tensors == NULL || t->names == NULL) {
		save_table_free(t);
		return -ENOMEM;
	}
	t->names->refs = 1;
	if (m->names.len)
		memcpy(t->names->text, m->names.data, m->names.len);
	t->names->text[m->names.len] = '\0';
	const char *name = t->names->text;
	/* No dims at all (every tensor a scalar): protobuf-c gives NULL,
	 * which d + 0 must not be. */
	static const uint64_t no_dims[1];
	const uint64_t *d = m->dims ? m->dims : no_dims;
	for (size_t i = 0; i < n; i++) {
		struct save_tensor *st = &t->tensors[i];
		uint32_t k = m->ndim[i];
		r = tensor_check(name, m->dtype[i], k, d, k, d + k, k, d + 2 * k, m->nbytes[i], i, c->max_name_len,
				 &st->box, err, errlen);
		if (r < 0)
			goto fail;
		struct hostbuf *b = find(ctx, m->buffer_id[i]);
		if (b == NULL) {
			snprintf(err, errlen, "tensor '%s': buffer %" PRIu64 " is not registered", name,
				 m->buffer_id[i]);
			r = -ENOENT;
			goto fail;
		}
		if (b->cuda != NULL) {
			snprintf(err, errlen,
				 "tensor '%s': buffer %" PRIu64 " is CUDA memory; a table holds host buffers only "
				 "(save CUDA tensors without one)",
				 name, m->buffer_id[i]);
			r = -ENOTSUP;
			goto fail;
		}
		if (m->offset[i] > b->nbytes || m->nbytes[i] > b->nbytes - m->offset[i]) {
			snprintf(err, errlen,
				 "tensor '%s': bytes [%" PRIu64 ", +%" PRIu64 ") lie outside buffer %" PRIu64
				 " of %" PRIu64 " bytes",
				 name, m->offset[i], m->nbytes[i], m->buffer_id[i], b->nbytes);
			r = -ERANGE;
			goto fail;
		}
		st->name = (char *)name;
		st->dtype = m->dtype[i];
		st->nbytes = m->nbytes[i];
		st->buf = hostbuf_ref(b);
		b->tables++;
		st->buf_off = m->offset[i];
		t->n = i + 1;
		name += strlen(name) + 1;
		d += 3 * (size_t)k;
	}
	r = save_tensors_unique(t->tensors, t->n, err, errlen);
	if (r < 0)
		goto fail;
	*out = t;
	return 0;
fail:
	save_table_free(t);
	return r;
}
