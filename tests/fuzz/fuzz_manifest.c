/* What storage hands the catalogue: a manifest (decoded, checked, its shard
 * named, its pieces mapped and decoded from the input itself as their
 * object), a step index, and object names from a listing. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "manifest.h"
#include "pieces.h"
#include "planecodec.h"

#include <stdlib.h>

/* A checked manifest's pieces: every piece's span, and, where the raw
 * shard is small, a decode of the input as their object. */
static void fuzz_pieces(const Ckpt__Manifest *m, const uint8_t *data, size_t size)
{
	static struct planecodec c;
	static int have = -1;
	if (have < 0)
		have = planecodec_init(&c, 0) == 0;
	struct pieces x;
	if (pieces_index(&x, m) < 0 || x.n == 0)
		return;
	for (size_t i = 0; i < x.n; i++) {
		size_t p0, p1;
		pieces_span(&x, x.raw[i], x.raw[i + 1] - x.raw[i], &p0, &p1);
		if (p0 != i || p1 != i + 1)
			abort();
	}
	char key[1200];
	for (size_t a = 0, b; a < x.n; a = b) {
		b = pieces_segment(&x, a, x.n);
		if (b <= a || b > x.n)
			abort();
		(void)pieces_key(&x, a, "own", key, sizeof(key));
	}
	char why[500];
	uint8_t *out = x.raw[x.n] <= (1u << 20) ? malloc(x.raw[x.n] ? x.raw[x.n] : 1) : NULL;
	if (out && have && x.cum[x.n] <= size)
		(void)pieces_decode(&x, &c, 0, x.n, data, out, why, sizeof(why));
	free(out);
	pieces_free(&x);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256], key[1024];
	Ckpt__Manifest *m = NULL;
	if (manifest_decode(data, size, &m, err, sizeof(err)) == 0) {
		if (manifest_check(m, err, sizeof(err)) == 0) {
			(void)manifest_shard_of(m, key, sizeof(key));
			fuzz_pieces(m, data, size);
		}
		ckpt__manifest__free_unpacked(m, NULL);
	}
	Ckpt__StepIndex *ix = ckpt__step_index__unpack(NULL, size, data);
	if (ix) {
		for (size_t i = 0; i < ix->n_manifests; i++)
			(void)manifest_check(ix->manifests[i], err, sizeof(err));
		ckpt__step_index__free_unpacked(ix, NULL);
	}
	char name[512];
	size_t n = size < sizeof(name) - 1 ? size : sizeof(name) - 1;
	memcpy(name, data, n);
	name[n] = '\0';
	struct step_name sn;
	manifest_parse_object(name, &sn);
	uint64_t step;
	(void)manifest_parse_step_dir(name, &step);
	(void)manifest_name_valid(name, 128);
	return 0;
}
