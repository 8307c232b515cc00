#include "crc32c.h"

#include <isa-l/crc.h>
#include <limits.h>

/* ISA-L's crc32_iscsi takes an int length and works on the non-inverted
 * register, so we do the standard pre/post inversion here and feed it in
 * pieces below INT_MAX. */
uint32_t crc32c_update(uint32_t crc, const void *buf, size_t len)
{
	const unsigned char *p = buf;
	uint32_t r = ~crc;
	while (len > 0) {
		size_t n = len > (size_t)(1u << 30) ? (size_t)(1u << 30) : len;
		r = crc32_iscsi((unsigned char *)p, (int)n, r);
		p += n;
		len -= n;
	}
	return ~r;
}

/* GF(2) matrix method (as in zlib's crc32_combine) for the reflected
 * Castagnoli polynomial: advance crc_a over len_b zero bytes, then xor. */
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
	uint32_t sum = 0;
	for (int i = 0; vec; i++, vec >>= 1)
		if (vec & 1)
			sum ^= mat[i];
	return sum;
}

static void gf2_square(uint32_t *sq, const uint32_t *mat)
{
	for (int n = 0; n < 32; n++)
		sq[n] = gf2_times(mat, mat[n]);
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
	uint32_t even[32], odd[32];
	if (len_b == 0)
		return crc_a;
	odd[0] = 0x82f63b78u; /* reflected polynomial: one zero bit */
	uint32_t row = 1;
	for (int n = 1; n < 32; n++) {
		odd[n] = row;
		row <<= 1;
	}
	gf2_square(even, odd); /* two zero bits */
	gf2_square(odd, even); /* four zero bits */
	do {
		gf2_square(even, odd);
		if (len_b & 1)
			crc_a = gf2_times(even, crc_a);
		len_b >>= 1;
		if (len_b == 0)
			break;
		gf2_square(odd, even);
		if (len_b & 1)
			crc_a = gf2_times(odd, crc_a);
		len_b >>= 1;
	} while (len_b != 0);
	return crc_a ^ crc_b;
}
