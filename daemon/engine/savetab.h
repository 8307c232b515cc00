/* Tensor tables (DeclareTable, docs/python.md "Python and PyTorch"): a save's
 * tensors checked once (caps, boxes, buffers, unique names) and named by
 * later saves, so that a save of 10,000 unchanged tensors costs the loop
 * a copy of an array, not 10,000 decodes, buffer lookups and a sort of
 * the names. A table holds its host buffers, which cannot be unregistered
 * while it lives (hostbuf.tables: they stay counted against the
 * session's caps); a save made from it holds only the names (a held copy
 * must not keep a dead trainer's memory mapped). Loop thread only. */
#ifndef CKPTD_SAVETAB_H
#define CKPTD_SAVETAB_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.pb-c.h"

struct config;
struct hostbuf;
struct save_tensor;
struct save_names;

struct save_table {
	uint64_t id;
	size_t n;
	struct save_tensor *tensors; /* box, dtype, nbytes, buf (held), buf_off */
	struct save_names *names;    /* tensors[i].name points into it */
};

typedef struct hostbuf *(*savetab_find_fn)(void *ctx, uint64_t buffer_id);

/* Check m entry by entry (find names a buffer id's registration) and
 * build the table. 0, or -errno with err saying which tensor and why. */
int save_table_new(const struct config *c, const Ckpt__DeclareTable *m, savetab_find_fn find, void *ctx,
		   struct save_table **out, char *err, size_t errlen);
void save_table_free(struct save_table *t);

/* Tensor names appear once each (checked on a sorted copy, so the
 * tensors keep their order). 0, -EINVAL naming the twice-seen name, or
 * -ENOMEM. */
int save_tensors_unique(const struct save_tensor *t, size_t n, char *err, size_t errlen);

#endif
