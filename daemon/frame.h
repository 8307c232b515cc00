/* Framing: a 4-byte big-endian length, then one packed Frame. */
#ifndef CKPTD_FRAME_H
#define CKPTD_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.pb-c.h"

#define FRAME_HDR 4

/* Bytes frame_write() needs for f after setting version and req_id. */
size_t frame_prepare(Ckpt__Frame *f, uint64_t req_id);
/* Header and body into out (frame_prepare()'s size). */
void frame_write(const Ckpt__Frame *f, size_t total, uint8_t *out);
/* Is a whole frame at buf? 1 with *body_len set, 0 if more bytes are
 * needed, -EMSGSIZE if the announced length exceeds max. */
int frame_next(const uint8_t *buf, size_t len, uint32_t max, uint32_t *body_len);
/* Unpack and check the version: 0, -EBADMSG or -EPROTONOSUPPORT. */
int frame_decode(const uint8_t *body, size_t len, Ckpt__Frame **out);

#endif
