/* CRC32C (Castagnoli), hardware accelerated through ISA-L. */
#ifndef CKPTD_CRC32C_H
#define CKPTD_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extend crc (0 to start) over buf. */
uint32_t crc32c_update(uint32_t crc, const void *buf, size_t len);
/* crc of A||B from crc(A), crc(B) and len(B). */
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

#endif
