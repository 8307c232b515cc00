/* The wire's framing, decoding and request validation, as a session meets
 * bytes from a client: frame_next over a stream of frames, frame_decode of
 * each body, then the checks every tensor of a Save or Load goes through
 * (tensor_check: name, dtype, shape, box, bytes) and box arithmetic on
 * what passes, and a DeclareTable's checks (savetab.c) against one
 * registered buffer. */
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "hostbuf.h"
#include "savetab.h"
#include "tensor.h"
#include "wire.h"

/* Buffer 1 is a registered 1 MiB host buffer; no other id is. Its
 * references never reach 0 (it is not freed). */
static struct hostbuf fake = { .refs = 1u << 30, .id = 1, .fd = -1, .nbytes = 1u << 20 };

static struct hostbuf *find_fake(void *ctx, uint64_t id)
{
	(void)ctx;
	return id == 1 ? &fake : NULL;
}

static void check_tensors(Ckpt__TensorRef **ts, size_t n)
{
	struct box prev;
	bool have_prev = false;
	for (size_t i = 0; i < n; i++) {
		const Ckpt__TensorRef *tr = ts[i];
		struct box b, part;
		char err[256];
		if (tensor_check(tr->name, tr->dtype, tr->n_global_shape, tr->global_shape, tr->n_box_offsets,
				 tr->box_offsets, tr->n_box_lengths, tr->box_lengths, tr->nbytes, i, 1024, &b, err,
				 sizeof(err)) != 0)
			continue;
		char shape[256];
		box_shape_str(&b, shape, sizeof(shape));
		if (have_prev && box_same_shape(&prev, &b))
			(void)box_intersect(&prev, &b, &part);
		prev = b;
		have_prev = true;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t off = 0;
	while (off < size) {
		uint32_t body = 0;
		int r = frame_next(data + off, size - off, 1u << 20, &body);
		if (r <= 0)
			break; /* incomplete, or refused (too large) */
		Ckpt__Frame *f = NULL;
		if (frame_decode(data + off + FRAME_HDR, body, &f) == 0) {
			if (f->body_case == CKPT__FRAME__BODY_SAVE && f->save)
				check_tensors(f->save->tensors, f->save->n_tensors);
			else if (f->body_case == CKPT__FRAME__BODY_LOAD && f->load)
				check_tensors(f->load->tensors, f->load->n_tensors);
			else if (f->body_case == CKPT__FRAME__BODY_DECLARE_TABLE && f->declare_table) {
				struct config c = { .max_tensors = 65536, .max_name_len = 1024 };
				struct save_table *t = NULL;
				char err[256];
				if (save_table_new(&c, f->declare_table, find_fake, NULL, &t, err, sizeof(err)) == 0)
					save_table_free(t);
			}
			ckpt__frame__free_unpacked(f, NULL);
		}
		off += FRAME_HDR + (size_t)body;
	}
	return 0;
}
