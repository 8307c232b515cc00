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

/* Combining, as zlib does since 1.2.12: crc(A||B) = crc(A) * x^(8 len(B))
 * mod P, xor crc(B), in the reflected bit order. x^(8n) comes from a
 * table of x^(2^k), one carry-less multiply per set bit of n: about 32
 * shifts per set bit, where the GF(2) matrix method squared a 32x32
 * matrix per bit (a per-tensor cost a save of 10,000 tensors paid
 * 30,000 times: tests/bench/py_tensors.py). */
#define CRC32C_POLY 0x82f63b78u /* reflected Castagnoli */

/* a(x) * b(x) mod P; bit 31 is x^0. */
static uint32_t mult_mod_p(uint32_t a, uint32_t b)
{
	uint32_t m = 1u << 31, p = 0;
	for (;;) {
		if (a & m) {
			p ^= b;
			if ((a & (m - 1)) == 0)
				break;
		}
		m >>= 1;
		b = b & 1 ? (b >> 1) ^ CRC32C_POLY : b >> 1;
	}
	return p;
}

/* x^(2^k) mod P for k < 67: a 64-bit length's bit 63 needs x^(2^66). */
static uint32_t x2k_table[67];

__attribute__((constructor)) static void x2k_init(void)
{
	uint32_t p = 1u << 30; /* x^1 */
	for (int k = 0; k < 67; k++) {
		x2k_table[k] = p;
		p = mult_mod_p(p, p);
	}
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
	/* x^(8 len_b): bit j of len_b stands for x^(2^(j+3)). */
	uint32_t x = 1u << 31; /* x^0 */
	for (int k = 3; len_b; len_b >>= 1, k++)
		if (len_b & 1)
			x = mult_mod_p(x2k_table[k], x);
	return mult_mod_p(x, crc_a) ^ crc_b;
}
