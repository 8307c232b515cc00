/* The plane codec's decoder (base/planecodec.c), as a restore will call it
 * on bytes from storage or a peer. The input is the stored blob; the
 * destination is exactly the n bytes its header names (at most 1 MiB, else
 * 1 MiB, which it refuses), allocated to size so that ASan sees any write
 * past n. A blob that decodes must decode the same with the scalar
 * transposes, and the bytes must round-trip: encoded again with its elem,
 * decoded again, the same. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "planecodec.h"

#define MAX_N (1u << 20)

static struct planecodec pc, scalar;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int ready;
	if (!ready) {
		if (planecodec_init(&pc, 0) != 0 || planecodec_init(&scalar, 0) != 0)
			abort();
		scalar.kind = PLANECODEC_SCALAR;
		ready = 1;
	}
	uint64_t hn = 0;
	for (int i = 0; i < 8 && 8 + i < (int)size; i++)
		hn |= (uint64_t)data[8 + i] << (8 * i);
	size_t n = hn <= MAX_N ? (size_t)hn : MAX_N;
	/* One byte at least, so that malloc(0) is not a case of its own. */
	uint8_t *out = malloc(n ? n : 1), *again = malloc(n ? n : 1);
	if (out == NULL || again == NULL)
		abort();
	if (planecodec_decode(&pc, data, size, out, n) == 0) {
		if (planecodec_decode(&scalar, data, size, again, n) != 0 || memcmp(out, again, n) != 0)
			abort();
		unsigned elem = data[5];
		size_t cap = planecodec_bound(n);
		uint8_t *blob = malloc(cap);
		if (blob == NULL)
			abort();
		ssize_t len = planecodec_encode(&pc, out, n, elem, blob, cap);
		if (len < 0 || planecodec_decode(&pc, blob, (size_t)len, again, n) != 0 || memcmp(out, again, n) != 0)
			abort();
		free(blob);
	}
	free(out);
	free(again);
	return 0;
}
