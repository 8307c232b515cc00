/* What storage hands the catalogue: a manifest (decoded, checked, its shard
 * named), a step index, and object names from a listing. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256], key[1024];
	Ckpt__Manifest *m = NULL;
	if (manifest_decode(data, size, &m, err, sizeof(err)) == 0) {
		if (manifest_check(m, err, sizeof(err)) == 0)
			(void)manifest_shard_of(m, key, sizeof(key));
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
