#include "wire.h"

#include <assert.h>
#include <errno.h>

uint32_t frame_len(const uint8_t hdr[FRAME_HDR])
{
	return (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
}

size_t frame_size(const Ckpt__Frame *f)
{
	return FRAME_HDR + ckpt__frame__get_packed_size(f);
}

size_t frame_prepare(Ckpt__Frame *f, uint64_t req_id)
{
	f->version = WIRE_PROTOCOL_VERSION;
	f->req_id = req_id;
	return frame_size(f);
}

int frame_write(const Ckpt__Frame *f, size_t total, uint8_t *out)
{
	uint32_t len = (uint32_t)(total - FRAME_HDR);
	out[0] = (uint8_t)(len >> 24);
	out[1] = (uint8_t)(len >> 16);
	out[2] = (uint8_t)(len >> 8);
	out[3] = (uint8_t)len;
	if (ckpt__frame__pack(f, out + FRAME_HDR) != total - FRAME_HDR)
		return -EPROTO;
	return 0;
}

int frame_next(const uint8_t *buf, size_t len, uint32_t max, uint32_t *body_len)
{
	if (len < FRAME_HDR)
		return 0;
	uint32_t n = frame_len(buf);
	if (n > max)
		return -EMSGSIZE;
	if (len - FRAME_HDR < n)
		return 0;
	*body_len = n;
	return 1;
}

Ckpt__Frame *frame_unpack(const uint8_t *body, size_t len)
{
	return ckpt__frame__unpack(NULL, len, body);
}

int frame_decode(const uint8_t *body, size_t len, Ckpt__Frame **out)
{
	Ckpt__Frame *f = frame_unpack(body, len);
	if (f == NULL)
		return -EBADMSG;
	if (f->version != WIRE_PROTOCOL_VERSION) {
		ckpt__frame__free_unpacked(f, NULL);
		return -EPROTONOSUPPORT;
	}
	*out = f;
	return 0;
}

int32_t wire_status(int err)
{
	assert(err <= 0 && err > -4096);
	return (int32_t)-err;
}

int wire_errno(int32_t status)
{
	if (status == INT32_MIN)
		return -EPROTO;
	return status > 0 ? -status : status;
}
