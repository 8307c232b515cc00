/* The wire's framing and decoding, as a session meets bytes from a client:
 * frame_next over a stream of frames, then frame_decode of each body. */
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t off = 0;
	while (off < size) {
		uint32_t body = 0;
		int r = frame_next(data + off, size - off, 1u << 20, &body);
		if (r <= 0)
			break; /* incomplete, or refused (too large) */
		Ckpt__Frame *f = NULL;
		if (frame_decode(data + off + FRAME_HDR, body, &f) == 0)
			ckpt__frame__free_unpacked(f, NULL);
		off += FRAME_HDR + (size_t)body;
	}
	return 0;
}
