/* Bulk copies for staging and restore. */
#ifndef CKPTD_MEMCOPY_H
#define CKPTD_MEMCOPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The copy routines memcopy_stream can be (tests/bench/memcopy_bench.c
 * times them side by side). */
enum memcopy_kind {
	MEMCOPY_LIBC,    /* glibc's memcpy */
	MEMCOPY_SSE2_NT, /* 16-byte non-temporal stores */
	MEMCOPY_AVX2_NT, /* 32-byte non-temporal stores, where the CPU has AVX2 */
	MEMCOPY_NKINDS
};

/* A fused copy's block: small enough to stay in a core's L2 between the
 * copy and the crc. */
#define MEMCOPY_CRC_BLOCK (256u << 10)

/* Copy n bytes; large copies use non-temporal stores: the destination
 * (the staging pool on save, the trainer's buffer on restore) is not read
 * again by this thread soon, and skipping the read-for-ownership of every
 * destination line saves a third of the memory traffic. The routine is
 * memcopy_chosen(), picked once at start by the CPU's features. */
void memcopy_stream(void *dst, const void *src, size_t n);
/* memcopy_stream, and *crc (if not NULL) extended over the n bytes of
 * src, in one pass over memory: by lanes where the CPU has AVX2 and
 * SSE4.2 (the crc in the copy's loop: memcopy.c), else by blocks
 * (MEMCOPY_CRC_BLOCK at a time, each block's crc taken just after it is
 * copied, from the cache the copy filled). tests/bench/memcopy_bench
 * times both. */
void memcopy_crc(void *dst, const void *src, size_t n, uint32_t *crc);
/* The two ways memcopy_crc can take, for tests and tests/bench/memcopy_bench:
 * by blocks (any routine: a block's copy, then its crc from cache), and
 * by lanes (AVX2 and SSE4.2: the crc in the copy's loop, memcopy.c). */
void memcopy_crc_blocks(void *dst, const void *src, size_t n, uint32_t *crc);
bool memcopy_lanes_supported(void);
/* Only where memcopy_lanes_supported(). */
void memcopy_crc_lanes(void *dst, const void *src, size_t n, uint32_t *crc);

/* Order the streaming stores made so far before later ones and before
 * other threads' reads: for a copy left half way (hostbuf.c's SIGBUS
 * guard), which skipped the routine's own fence. */
void memcopy_fence(void);

enum memcopy_kind memcopy_chosen(void);
bool memcopy_kind_supported(enum memcopy_kind k);
const char *memcopy_kind_name(enum memcopy_kind k);
/* Copy with routine k, which must be supported. */
void memcopy_with(enum memcopy_kind k, void *dst, const void *src, size_t n);

#endif
