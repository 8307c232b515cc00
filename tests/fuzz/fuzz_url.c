/* Storage URLs and their options, as --check-config and a start parse them
 * (no I/O). The input is the URL; a NUL splits off the [storage] options. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 2);
	if (s == NULL)
		return 0;
	memcpy(s, data, size);
	s[size] = s[size + 1] = '\0';
	const char *opts = s + strlen(s) + 1;
	if (opts > s + size)
		opts = "";
	char err[512];
	(void)store_check(s, opts, err, sizeof(err));
	free(s);
	return 0;
}
