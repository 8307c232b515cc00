#include "memcopy.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>

#define STREAM_MIN (4u << 10)

void memcopy_stream(void *dst, const void *src, size_t n)
{
	uint8_t *d = dst;
	const uint8_t *s = src;
	if (n < STREAM_MIN) {
		memcpy(d, s, n);
		return;
	}
	/* Align the destination to 16 bytes for the streaming stores. */
	size_t head = (16 - ((uintptr_t)d & 15)) & 15;
	memcpy(d, s, head);
	d += head;
	s += head;
	n -= head;
	size_t i = 0;
	for (; i + 64 <= n; i += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)(s + i));
		__m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
		_mm_stream_si128((__m128i *)(d + i), a);
		_mm_stream_si128((__m128i *)(d + i + 16), b);
		_mm_stream_si128((__m128i *)(d + i + 32), c);
		_mm_stream_si128((__m128i *)(d + i + 48), e);
	}
	/* Streaming stores are weakly ordered: fence before anyone (another
	 * thread, the kernel writing the shard) may read them. */
	_mm_sfence();
	memcpy(d + i, s + i, n - i);
}
#else
void memcopy_stream(void *dst, const void *src, size_t n)
{
	memcpy(dst, src, n);
}
#endif
