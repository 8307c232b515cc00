#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <errno.h>

#include "wire.h"

/* Packs f into a fresh buffer (header + body); *total gets its length. */
static uint8_t *encode(Ckpt__Frame *f, uint64_t req_id, size_t *total)
{
	*total = frame_prepare(f, req_id);
	uint8_t *buf = malloc(*total);
	assert_non_null(buf);
	frame_write(f, *total, buf);
	return buf;
}

static void test_save_round_trip(void **state)
{
	(void)state;
	uint64_t shape0[] = { 4, 6 }, off0[] = { 2, 0 }, len0[] = { 2, 6 };
	uint64_t shape1[] = { 10 };
	Ckpt__TensorRef t0 = CKPT__TENSOR_REF__INIT, t1 = CKPT__TENSOR_REF__INIT;
	t0.name = "layer.0.weight";
	t0.dtype = CKPT__DTYPE__BF16;
	t0.n_global_shape = 2;
	t0.global_shape = shape0;
	t0.n_box_offsets = 2;
	t0.box_offsets = off0;
	t0.n_box_lengths = 2;
	t0.box_lengths = len0;
	t0.buffer_id = 7;
	t0.offset = 4096;
	t0.nbytes = 2 * 6 * 2;
	t1.name = "step";
	t1.dtype = CKPT__DTYPE__I64;
	t1.n_global_shape = 1;
	t1.global_shape = shape1;
	t1.buffer_id = 8;
	t1.nbytes = 80;
	Ckpt__TensorRef *ts[] = { &t0, &t1 };
	uint8_t extra[300];
	for (size_t i = 0; i < sizeof(extra); i++)
		extra[i] = (uint8_t)(i * 7);
	Ckpt__Save save = CKPT__SAVE__INIT;
	save.step = 123456789012ull;
	save.n_tensors = 2;
	save.tensors = ts;
	save.extra_state.data = extra;
	save.extra_state.len = sizeof(extra);
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_SAVE;
	f.save = &save;

	size_t total;
	uint8_t *buf = encode(&f, 0xABCDEF0123ull, &total);
	assert_int_equal(f.version, WIRE_PROTOCOL_VERSION);
	assert_true(total > FRAME_HDR);
	/* Big-endian length header. */
	uint32_t hdr = (uint32_t)buf[0] << 24 | (uint32_t)buf[1] << 16 | (uint32_t)buf[2] << 8 | buf[3];
	assert_int_equal(hdr, total - FRAME_HDR);

	uint32_t body_len = 0;
	assert_int_equal(frame_next(buf, total, 1u << 20, &body_len), 1);
	assert_int_equal(body_len, total - FRAME_HDR);

	Ckpt__Frame *g = NULL;
	assert_int_equal(frame_decode(buf + FRAME_HDR, body_len, &g), 0);
	assert_non_null(g);
	assert_int_equal(g->version, WIRE_PROTOCOL_VERSION);
	assert_int_equal(g->req_id, 0xABCDEF0123ull);
	assert_int_equal(g->body_case, CKPT__FRAME__BODY_SAVE);
	const Ckpt__Save *s = g->save;
	assert_int_equal(s->step, 123456789012ull);
	assert_int_equal(s->extra_state.len, sizeof(extra));
	assert_memory_equal(s->extra_state.data, extra, sizeof(extra));
	assert_int_equal(s->n_tensors, 2);
	assert_string_equal(s->tensors[0]->name, "layer.0.weight");
	assert_int_equal(s->tensors[0]->dtype, CKPT__DTYPE__BF16);
	assert_int_equal(s->tensors[0]->n_global_shape, 2);
	assert_memory_equal(s->tensors[0]->global_shape, shape0, sizeof(shape0));
	assert_int_equal(s->tensors[0]->n_box_offsets, 2);
	assert_memory_equal(s->tensors[0]->box_offsets, off0, sizeof(off0));
	assert_int_equal(s->tensors[0]->n_box_lengths, 2);
	assert_memory_equal(s->tensors[0]->box_lengths, len0, sizeof(len0));
	assert_int_equal(s->tensors[0]->buffer_id, 7);
	assert_int_equal(s->tensors[0]->offset, 4096);
	assert_int_equal(s->tensors[0]->nbytes, 24);
	assert_string_equal(s->tensors[1]->name, "step");
	assert_int_equal(s->tensors[1]->dtype, CKPT__DTYPE__I64);
	assert_int_equal(s->tensors[1]->n_box_offsets, 0);
	assert_int_equal(s->tensors[1]->n_box_lengths, 0);
	assert_int_equal(s->tensors[1]->global_shape[0], 10);
	assert_int_equal(s->tensors[1]->buffer_id, 8);
	assert_int_equal(s->tensors[1]->nbytes, 80);
	ckpt__frame__free_unpacked(g, NULL);
	free(buf);
}

static void test_next_partial(void **state)
{
	(void)state;
	Ckpt__Reply reply = CKPT__REPLY__INIT;
	reply.status = EINVAL;
	reply.message = "no";
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_REPLY;
	f.reply = &reply;
	size_t total;
	uint8_t *buf = encode(&f, 5, &total);
	uint32_t body_len = 0xdead;
	/* Every proper prefix, header or body, asks for more. */
	for (size_t n = 0; n < total; n++)
		assert_int_equal(frame_next(buf, n, 1u << 20, &body_len), 0);
	assert_int_equal(body_len, 0xdead);
	assert_int_equal(frame_next(buf, total, 1u << 20, &body_len), 1);
	assert_int_equal(body_len, total - FRAME_HDR);

	/* Two frames back to back: the first is reported alone. */
	uint8_t *two = malloc(2 * total);
	assert_non_null(two);
	memcpy(two, buf, total);
	memcpy(two + total, buf, total);
	assert_int_equal(frame_next(two, 2 * total, 1u << 20, &body_len), 1);
	assert_int_equal(body_len, total - FRAME_HDR);
	free(two);
	free(buf);
}

static void test_next_too_big(void **state)
{
	(void)state;
	uint32_t body_len = 0;
	uint8_t hdr[4] = { 0, 0, 0x10, 0x01 }; /* 4097 */
	assert_int_equal(frame_next(hdr, 4, 4096, &body_len), -EMSGSIZE);
	assert_int_equal(frame_next(hdr, 4, 4097, &body_len), 0); /* fits; body missing */
	uint8_t huge[4] = { 0xff, 0xff, 0xff, 0xff };
	assert_int_equal(frame_next(huge, 4, 4u << 20, &body_len), -EMSGSIZE);
	/* The cap applies before the body arrives. */
	uint8_t big[4] = { 0x00, 0x40, 0x00, 0x01 };
	assert_int_equal(frame_next(big, 4, 4u << 20, &body_len), -EMSGSIZE);
	uint8_t empty[4] = { 0, 0, 0, 0 };
	assert_int_equal(frame_next(empty, 4, 4096, &body_len), 1);
	assert_int_equal(body_len, 0);
}

static void test_decode_garbage(void **state)
{
	(void)state;
	Ckpt__Frame *f = NULL;
	/* Field 1 as a length-delimited field claiming 100 bytes. */
	static const uint8_t g1[] = { 0x0a, 0x64, 0x01, 0x02 };
	assert_int_equal(frame_decode(g1, sizeof(g1), &f), -EBADMSG);
	/* A truncated varint. */
	static const uint8_t g2[] = { 0x08, 0xff, 0xff };
	assert_int_equal(frame_decode(g2, sizeof(g2), &f), -EBADMSG);
	/* Wire type 7 does not exist. */
	static const uint8_t g3[] = { 0x0f, 0x00 };
	assert_int_equal(frame_decode(g3, sizeof(g3), &f), -EBADMSG);
	assert_null(f);
}

static void test_decode_version(void **state)
{
	(void)state;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	Ckpt__StatusRequest st = CKPT__STATUS_REQUEST__INIT;
	f.body_case = CKPT__FRAME__BODY_STATUS;
	f.status = &st;
	size_t total;
	uint8_t *buf = encode(&f, 1, &total);
	/* Re-pack the same frame as version 2. */
	f.version = 2;
	size_t blen = ckpt__frame__get_packed_size(&f);
	uint8_t *body = malloc(blen);
	assert_non_null(body);
	ckpt__frame__pack(&f, body);
	Ckpt__Frame *g = NULL;
	assert_int_equal(frame_decode(body, blen, &g), -EPROTONOSUPPORT);
	assert_null(g);
	/* No version at all (0) is refused the same way. */
	static const uint8_t v0[] = { 0x10, 0x01 }; /* req_id = 1 only */
	assert_int_equal(frame_decode(v0, sizeof(v0), &g), -EPROTONOSUPPORT);
	/* The version-1 original decodes. */
	assert_int_equal(frame_decode(buf + FRAME_HDR, total - FRAME_HDR, &g), 0);
	assert_int_equal(g->body_case, CKPT__FRAME__BODY_STATUS);
	ckpt__frame__free_unpacked(g, NULL);
	free(body);
	free(buf);
}

static void test_decode_unknown_field(void **state)
{
	(void)state;
	/* version = 1, req_id = 9, then field 99 (varint) = 5: its tag
	 * 99 << 3 | 0 = 792 is the varint 0x98 0x06. */
	static const uint8_t body[] = { 0x08, WIRE_PROTOCOL_VERSION, 0x10, 0x09,
					0x98, 0x06, 0x05 };
	Ckpt__Frame *g = NULL;
	assert_int_equal(frame_decode(body, sizeof(body), &g), 0);
	assert_non_null(g);
	assert_int_equal(g->version, WIRE_PROTOCOL_VERSION);
	assert_int_equal(g->req_id, 9);
	assert_int_equal(g->body_case, CKPT__FRAME__BODY__NOT_SET);
	ckpt__frame__free_unpacked(g, NULL);
}

/* The exact bytes of one frame, pinned: libckpt and ckptd both write frames
 * with this code, so this is what goes on the wire. */
static void test_golden_bytes(void **state)
{
	(void)state;
	Ckpt__Reply reply = CKPT__REPLY__INIT;
	reply.status = 5;
	reply.message = "no";
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_REPLY;
	f.reply = &reply;
	static const uint8_t want[] = {
		0x00, 0x00, 0x00, 0x0d,       /* body length, big-endian */
		0x08, 0x01,                   /* version = 1 */
		0x10, 0xac, 0x02,             /* req_id = 300 */
		0x72, 0x06,                   /* reply (field 14), 6 bytes */
		0x08, 0x05, 0x12, 0x02, 'n', 'o',
	};
	size_t total;
	uint8_t *buf = encode(&f, 300, &total);
	assert_int_equal(total, sizeof(want));
	assert_memory_equal(buf, want, sizeof(want));
	free(buf);

	/* A body over 16 MiB uses all four header bytes. */
	size_t n = (16u << 20) + 0x30201;
	uint8_t *extra = calloc(1, n);
	assert_non_null(extra);
	Ckpt__Save save = CKPT__SAVE__INIT;
	save.extra_state.data = extra;
	save.extra_state.len = n;
	f.body_case = CKPT__FRAME__BODY_SAVE;
	f.save = &save;
	buf = encode(&f, 1, &total);
	size_t body = total - FRAME_HDR;
	assert_true(body > (16u << 20));
	assert_int_equal(buf[0], (uint8_t)(body >> 24));
	assert_int_equal(buf[1], (uint8_t)(body >> 16));
	assert_int_equal(buf[2], (uint8_t)(body >> 8));
	assert_int_equal(buf[3], (uint8_t)body);
	assert_int_equal(buf[0], 1);
	uint32_t body_len = 0;
	assert_int_equal(frame_next(buf, total, 32u << 20, &body_len), 1);
	assert_int_equal(body_len, body);
	assert_int_equal(frame_next(buf, total, (uint32_t)body - 1, &body_len), -EMSGSIZE);
	free(buf);
	free(extra);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_save_round_trip),
		cmocka_unit_test(test_next_partial),
		cmocka_unit_test(test_next_too_big),
		cmocka_unit_test(test_decode_garbage),
		cmocka_unit_test(test_decode_version),
		cmocka_unit_test(test_decode_unknown_field),
		cmocka_unit_test(test_golden_bytes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
