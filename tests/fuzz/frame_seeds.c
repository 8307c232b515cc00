/* Writes the seed corpus of fuzz-frame (and fuzz-peer's, beside it): one file per request a client
 * sends (Hello, RegisterBuffer, Save, Load, the catalogue's requests, a
 * table, the tiers' requests, a wait), and one stream of several frames. Built with the harnesses:
 *   B/tests/fuzz/frame-seeds tests/fuzz/corpus/frame */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* A PeerFrame as fuzz-peer reads it (no length prefix), into DIR/../peer. */
static void emit_peer(const char *name, const Ckpt__PeerFrame *f)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/../peer", dir);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/../peer/%s", dir, name);
	FILE *out = fopen(path, "wb");
	if (out == NULL) {
		perror(path);
		exit(1);
	}
	size_t n = ckpt__peer_frame__get_packed_size(f);
	uint8_t *buf = malloc(n ? n : 1);
	if (buf == NULL)
		exit(1);
	ckpt__peer_frame__pack(f, buf);
	fwrite(buf, 1, n, out);
	free(buf);
	fclose(out);
}

/* Peer seeds: a hello, a put of a one-tensor manifest, and a list answer. */
static void peer_seeds(void)
{
	Ckpt__PeerHello h = CKPT__PEER_HELLO__INIT;
	h.protocol_version = 1;
	h.node = "10.0.0.5:7070";
	Ckpt__PeerFrame fh = CKPT__PEER_FRAME__INIT;
	fh.body_case = CKPT__PEER_FRAME__BODY_HELLO;
	fh.hello = &h;
	emit_peer("hello", &fh);
	uint64_t shape[1] = { 4 };
	uint32_t crc[1] = { 0 };
	Ckpt__ManifestTensor t = CKPT__MANIFEST_TENSOR__INIT;
	Ckpt__ManifestTensor *tp[1] = { &t };
	t.name = "w";
	t.dtype = CKPT__DTYPE__F32;
	t.n_global_shape = 1;
	t.global_shape = shape;
	t.nbytes = 16;
	Ckpt__Manifest m = CKPT__MANIFEST__INIT;
	m.format_version = 1;
	m.job = "llama";
	m.step = 7;
	m.world_size = 1;
	m.attempt_id = "default";
	m.shard_name = "rank-00000-of-00001.default.0000000000000000.shard";
	m.shard_bytes = 16;
	m.chunk_bytes = 1 << 20;
	m.n_chunk_crc32c = 1;
	m.chunk_crc32c = crc;
	m.n_tensors = 1;
	m.tensors = tp;
	size_t n = ckpt__manifest__get_packed_size(&m);
	uint8_t *mb = malloc(n);
	if (mb == NULL)
		exit(1);
	ckpt__manifest__pack(&m, mb);
	Ckpt__ReplicaPut put = CKPT__REPLICA_PUT__INIT;
	put.manifest.data = mb;
	put.manifest.len = n;
	put.tier = CKPT__TIER__TIER_REPLICATED;
	Ckpt__PeerFrame fp = CKPT__PEER_FRAME__INIT;
	fp.body_case = CKPT__PEER_FRAME__BODY_PUT;
	fp.put = &put;
	emit_peer("put", &fp);
	free(mb);
	Ckpt__HeldCopy c[2] = { CKPT__HELD_COPY__INIT, CKPT__HELD_COPY__INIT };
	Ckpt__HeldCopy *cp[2] = { &c[0], &c[1] };
	for (int i = 0; i < 2; i++) {
		c[i].job = "llama";
		c[i].rank = (uint32_t)i;
		c[i].world_size = 2;
		c[i].step = 7;
		c[i].bytes = 16;
		c[i].attempt_id = "default";
	}
	Ckpt__ReplicaListReply rep = CKPT__REPLICA_LIST_REPLY__INIT;
	rep.n_held = 2;
	rep.held = cp;
	Ckpt__PeerFrame fl = CKPT__PEER_FRAME__INIT;
	fl.body_case = CKPT__PEER_FRAME__BODY_LIST_REPLY;
	fl.list_reply = &rep;
	emit_peer("list_reply", &fl);
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
	/* Waiting for a step. */
	Ckpt__WaitRequest wr = CKPT__WAIT_REQUEST__INIT;
	wr.job = "llama-7b";
	wr.step = 102;
	wr.timeout_ms = 0xffffffffu;
	Ckpt__Frame fwr = CKPT__FRAME__INIT;
	fwr.body_case = CKPT__FRAME__BODY_WAIT;
	fwr.wait = &wr;

	Ckpt__Frame *one[1];
	one[0] = &fh, emit("hello", one, 1);
	one[0] = &fr, emit("register", one, 1);
	one[0] = &fs, emit("save", one, 1);
	one[0] = &fl, emit("load", one, 1);
	one[0] = &fls, emit("list", one, 1);
	one[0] = &fd, emit("delete", one, 1);
	one[0] = &fwr, emit("wait", one, 1);
	Ckpt__Frame *table[2] = { &fdt, &fts };
	emit("table", table, 2);
	Ckpt__Frame *tiers[4] = { &fdt, &fms, &fhr, &fpr };
	emit("tiers", tiers, 4);
	Ckpt__Frame *stream[4] = { &fh, &fr, &fs, &fl };
	emit("stream", stream, 4);
	peer_seeds();
	return 0;
}
