/* The wire between libckpt and ckptd, shared by both: the protocol version,
 * the capability bits of HelloReply, the fd limit of SCM_RIGHTS and the
 * framing of Ckpt__Frame (proto/ckpt.proto) on the Unix stream socket.
 *
 * Frame: a 4-byte big-endian length, then one packed Ckpt__Frame whose
 * version is WIRE_PROTOCOL_VERSION. A frame's fds (SCM_RIGHTS) travel with
 * its first byte. This header is internal: libckpt's public ckpt/ckpt.h
 * repeats the version and the capability bits, and libckpt asserts at build
 * time that the two agree (client/client_internal.h). */
#ifndef CKPT_PROTO_WIRE_H
#define CKPT_PROTO_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.pb-c.h"

/* Frame.version and Hello(Reply).protocol_version. */
#define WIRE_PROTOCOL_VERSION 1
/* HelloReply capability bits. */
#define WIRE_CAP_CUDA 1u   /* the daemon imports CUDA buffers */
#define WIRE_CAP_TABLES 2u /* DeclareTable, DropTable, Save.table_id */
#define WIRE_CAP_TIERS 4u  /* Save.tier, PersistRequest, HeldRequest (docs/tiers.md "Tiers") */

/* The length prefix. */
#define FRAME_HDR 4
/* At most this many fds in one frame (the kernel's SCM_MAX_FD). */
#define WIRE_MAX_FDS 253
/* The largest frame libckpt sends or accepts. ckptd's own cap on what it
 * accepts is [limits] max_frame_bytes (daemon/base/config.h). */
#define WIRE_CLIENT_MAX_FRAME_BYTES (64u * 1024 * 1024)

/* Errors, the one conversion between the two conventions: inside ckptd and
 * libckpt a function returns 0 or -errno; a message's status field carries
 * 0 or the errno, positive (Reply, SaveFailed, LoadFailed). wire_status
 * takes 0 or -errno (asserted) to the field; wire_errno takes a field back
 * to 0 or -errno, and reads anything out of range as -EPROTO. */
int32_t wire_status(int err);
int wire_errno(int32_t status);

/* The body length a header announces. */
uint32_t frame_len(const uint8_t hdr[FRAME_HDR]);
/* Bytes frame_write() needs for f: the header and the packed body. */
size_t frame_size(const Ckpt__Frame *f);
/* Set f's version and req_id; returns frame_size(f). */
size_t frame_prepare(Ckpt__Frame *f, uint64_t req_id);
/* Header and body into out (frame_size()'s total). 0, or -EPROTO if the
 * body packed to another size. */
int frame_write(const Ckpt__Frame *f, size_t total, uint8_t *out);
/* Is a whole frame at buf? 1 with *body_len set, 0 if more bytes are
 * needed, -EMSGSIZE if the announced length exceeds max. */
int frame_next(const uint8_t *buf, size_t len, uint32_t max, uint32_t *body_len);
/* Unpack a body, whatever its version; NULL if malformed. */
Ckpt__Frame *frame_unpack(const uint8_t *body, size_t len);
/* Unpack and check the version: 0, -EBADMSG or -EPROTONOSUPPORT. */
int frame_decode(const uint8_t *body, size_t len, Ckpt__Frame **out);

#endif
