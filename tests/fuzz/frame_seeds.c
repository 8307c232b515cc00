/* Writes the seed corpus of fuzz-frame: one file per request a client
 * sends (Hello, RegisterBuffer, Save, Load, the catalogue's requests, a
 * table, the tiers' requests), and one stream of several frames. Built with the harnesses:
 *   B/tests/fuzz/frame-seeds tests/fuzz/corpus/frame */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

static const char *dir;

static void emit(const char *name, Ckpt__Frame **fs, size_t n)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (f == NULL) {
		perror(path);
		exit(1);
	}
	for (size_t i = 0; i < n; i++) {
		size_t total = frame_prepare(fs[i], i + 1);
		uint8_t *buf = malloc(total);
		if (buf == NULL || frame_write(fs[i], total, buf) != 0)
			exit(1);
		fwrite(buf, 1, total, f);
		free(buf);
	}
	fclose(f);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: frame-seeds DIR\n");
		return 2;
	}
	dir = argv[1];
	Ckpt__Hello hello = CKPT__HELLO__INIT;
	hello.protocol_version = WIRE_PROTOCOL_VERSION;
	hello.job = "llama-7b";
	hello.rank = 1;
	hello.world_size = 4;
	hello.attempt_id = "a1";
	Ckpt__Frame fh = CKPT__FRAME__INIT;
	fh.body_case = CKPT__FRAME__BODY_HELLO;
	fh.hello = &hello;

	Ckpt__RegisterBuffer rb = CKPT__REGISTER_BUFFER__INIT;
	rb.buffer_id = 7;
	rb.kind = CKPT__BUFFER_KIND__HOST_FD;
	rb.nbytes = 4096;
	Ckpt__Frame fr = CKPT__FRAME__INIT;
	fr.body_case = CKPT__FRAME__BODY_REGISTER_BUFFER;
	fr.register_buffer = &rb;

	uint64_t shape[2] = { 8, 16 }, off[2] = { 4, 0 }, len[2] = { 4, 16 };
	Ckpt__TensorRef t1 = CKPT__TENSOR_REF__INIT, t2 = CKPT__TENSOR_REF__INIT;
	t1.name = "model.layers.0.weight";
	t1.dtype = CKPT__DTYPE__F32;
	t1.n_global_shape = 2;
	t1.global_shape = shape;
	t1.n_box_offsets = 2;
	t1.box_offsets = off;
	t1.n_box_lengths = 2;
	t1.box_lengths = len;
	t1.buffer_id = 7;
	t1.nbytes = 4 * 16 * 4;
	t2.name = "step";
	t2.dtype = CKPT__DTYPE__I64;
	t2.buffer_id = 7;
	t2.offset = 256;
	t2.nbytes = 8;
	Ckpt__TensorRef *ts[2] = { &t1, &t2 };
	Ckpt__Save save = CKPT__SAVE__INIT;
	save.step = 100;
	save.n_tensors = 2;
	save.tensors = ts;
	save.extra_state.len = 3;
	save.extra_state.data = (uint8_t *)"rng";
	Ckpt__Frame fs = CKPT__FRAME__INIT;
	fs.body_case = CKPT__FRAME__BODY_SAVE;
	fs.save = &save;

	Ckpt__Load load = CKPT__LOAD__INIT;
	load.latest = 1;
	load.n_tensors = 2;
	load.tensors = ts;
	Ckpt__Frame fl = CKPT__FRAME__INIT;
	fl.body_case = CKPT__FRAME__BODY_LOAD;
	fl.load = &load;

	Ckpt__ListRequest lr = CKPT__LIST_REQUEST__INIT;
	lr.job = "llama-7b";
	Ckpt__Frame fls = CKPT__FRAME__INIT;
	fls.body_case = CKPT__FRAME__BODY_LIST;
	fls.list = &lr;

	Ckpt__DeleteRequest dr = CKPT__DELETE_REQUEST__INIT;
	dr.job = "llama-7b";
	dr.step = 100;
	Ckpt__Frame fd = CKPT__FRAME__INIT;
	fd.body_case = CKPT__FRAME__BODY_DELETE;
	fd.delete_ = &dr;

	Ckpt__DType tdt[2] = { CKPT__DTYPE__F32, CKPT__DTYPE__BF16 };
	uint32_t tnd[2] = { 2, 1 };
	uint64_t tdims[] = { 4, 8, 0, 0, 4, 8, 16, 0, 16 };
	uint64_t tbid[2] = { 1, 1 }, toff[2] = { 0, 128 }, tnb[2] = { 128, 32 };
	Ckpt__DeclareTable dt = CKPT__DECLARE_TABLE__INIT;
	dt.table_id = 1;
	dt.names.data = (uint8_t *)"model.w\0model.b";
	dt.names.len = 16;
	dt.n_dtype = 2, dt.dtype = tdt;
	dt.n_ndim = 2, dt.ndim = tnd;
	dt.n_dims = 9, dt.dims = tdims;
	dt.n_buffer_id = 2, dt.buffer_id = tbid;
	dt.n_offset = 2, dt.offset = toff;
	dt.n_nbytes = 2, dt.nbytes = tnb;
	Ckpt__Frame fdt = CKPT__FRAME__INIT;
	fdt.body_case = CKPT__FRAME__BODY_DECLARE_TABLE;
	fdt.declare_table = &dt;
	Ckpt__Save tsave = CKPT__SAVE__INIT;
	tsave.step = 101;
	tsave.table_id = 1;
	Ckpt__Frame fts = CKPT__FRAME__INIT;
	fts.body_case = CKPT__FRAME__BODY_SAVE;
	fts.save = &tsave;

	/* Tiers: a memory save, the copies held, a persist. */
	Ckpt__Save msave = CKPT__SAVE__INIT;
	msave.step = 102;
	msave.table_id = 1;
	msave.tier = CKPT__TIER__TIER_MEMORY;
	Ckpt__Frame fms = CKPT__FRAME__INIT;
	fms.body_case = CKPT__FRAME__BODY_SAVE;
	fms.save = &msave;
	Ckpt__HeldRequest hr = CKPT__HELD_REQUEST__INIT;
	hr.all_ranks = 1;
	Ckpt__Frame fhr = CKPT__FRAME__INIT;
	fhr.body_case = CKPT__FRAME__BODY_HELD;
	fhr.held = &hr;
	Ckpt__PersistRequest pr = CKPT__PERSIST_REQUEST__INIT;
	pr.job = "llama-7b";
	pr.step = 102;
	Ckpt__Frame fpr = CKPT__FRAME__INIT;
	fpr.body_case = CKPT__FRAME__BODY_PERSIST;
	fpr.persist = &pr;

	Ckpt__Frame *one[1];
	one[0] = &fh, emit("hello", one, 1);
	one[0] = &fr, emit("register", one, 1);
	one[0] = &fs, emit("save", one, 1);
	one[0] = &fl, emit("load", one, 1);
	one[0] = &fls, emit("list", one, 1);
	one[0] = &fd, emit("delete", one, 1);
	Ckpt__Frame *table[2] = { &fdt, &fts };
	emit("table", table, 2);
	Ckpt__Frame *tiers[4] = { &fdt, &fms, &fhr, &fpr };
	emit("tiers", tiers, 4);
	Ckpt__Frame *stream[4] = { &fh, &fr, &fs, &fl };
	emit("stream", stream, 4);
	return 0;
}
