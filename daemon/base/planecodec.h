/* A lossless codec for tensor bytes: byte planes, each compressed with
 * zstd or stored raw (ZipNN's method). Not yet called by the daemon: the
 * codec of a later "compression on upload", off by default, per job. */
#ifndef CKPTD_PLANECODEC_H
#define CKPTD_PLANECODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The stored format, version 1, every integer little-endian:
 *
 *   0  u8[4]  magic "CKPZ"
 *   4  u8     version (1)
 *   5  u8     elem: 1, 2, 4 or 8
 *   6  u8[2]  zero
 *   8  u64    n, the raw length
 *  16  elem entries of 16 bytes, one per plane k (byte k of each element):
 *        u8 method (0 raw, 1 zstd), u8[7] zero, u64 stored length
 *      the planes' stored bytes, plane 0 first: a raw plane is its n / elem
 *      bytes; a zstd plane one zstd frame that records its content size
 *      the n % elem bytes of the tail, raw
 *
 * and nothing after: the header, the stored lengths and the tail add up
 * to the blob's length exactly. */
#define PLANECODEC_MAGIC "CKPZ"
#define PLANECODEC_VERSION 1
#define PLANECODEC_HDR(elem) (16u + 16u * (elem))
#define PLANECODEC_HDR_MAX PLANECODEC_HDR(8)

enum planecodec_method {
	PLANECODEC_RAW,
	PLANECODEC_ZSTD,
	PLANECODEC_NMETHODS
};

/* The transposes (the split of elements into planes and its inverse),
 * picked by the CPU's features; every one gives the same bytes. */
enum planecodec_kind {
	PLANECODEC_SCALAR, /* portable C */
	PLANECODEC_SSSE3,  /* 16-byte shuffles and unpacks */
	PLANECODEC_AVX2,   /* 32-byte ones for elem 2 and 4 */
	PLANECODEC_NKINDS
};

/* One per thread: zstd's contexts and the scratch the planes are built
 * in, kept between calls (it grows to the largest piece seen). */
struct planecodec {
	void *cctx; /* ZSTD_CCtx */
	void *dctx; /* ZSTD_DCtx */
	uint8_t *scratch;
	size_t scratch_cap;
	uint8_t *sample;
	int level;                 /* zstd's; negative is its fast mode */
	enum planecodec_kind kind; /* planecodec_chosen() at init */
};

/* The level planecodec_init takes for 0: far into zstd's fast mode, with
 * Huffman-coded literals (planecodec_init), 2-3x level 1's speed and a
 * little smaller on weights and Adam moments (tests/bench/codec_bench.c). */
#define PLANECODEC_LEVEL_DEFAULT (-500)

/* 0, or -ENOMEM. level 0 is PLANECODEC_LEVEL_DEFAULT. */
int planecodec_init(struct planecodec *c, int level);
void planecodec_free(struct planecodec *c);

/* The most planecodec_encode can store for n bytes of any elem. */
size_t planecodec_bound(size_t n);

/* Store n bytes of src, elements of elem bytes, in dst: the stored length,
 * or -EINVAL (elem not 1, 2, 4 or 8), -ENOSPC (cap below
 * planecodec_bound(n)), -ENOMEM, -EIO (zstd failed). A plane is stored
 * raw where zstd does not make it smaller, or where a sample of it shows
 * zstd would not (without running zstd over the plane). */
ssize_t planecodec_encode(struct planecodec *c, const void *src, size_t n, unsigned elem, void *dst, size_t cap);

/* Whether storing src would save at least a tenth of it, from a sample of
 * at most PLANECODEC_SAMPLE bytes split into planes and compressed: the
 * rule of compression on upload, which stores a piece that fails it as it
 * is. False for an elem planecodec_encode refuses. */
#define PLANECODEC_SAMPLE (64u << 10)
bool planecodec_worth(struct planecodec *c, const void *src, size_t n, unsigned elem);

/* Restore a stored blob of srclen bytes to the n bytes of dst: 0, or
 * -EBADMSG where the blob is not one planecodec_encode could have stored
 * for n bytes (any field, length or frame off; no length is used before
 * the whole header is checked against srclen), or -ENOMEM. Never writes
 * outside [dst, dst + n); after an error dst's bytes mean nothing. */
int planecodec_decode(struct planecodec *c, const void *src, size_t srclen, void *dst, size_t n);

enum planecodec_kind planecodec_chosen(void);
bool planecodec_kind_supported(enum planecodec_kind k);
const char *planecodec_kind_name(enum planecodec_kind k);

#endif
