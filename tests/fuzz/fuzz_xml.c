/* S3 and GCS XML responses: the parser (expat, with its caps and DOCTYPE
 * refusal), what the engine reads from error and multipart answers, and a
 * listing page as objstore_list_page reads it, under a prefix and at the
 * bucket's top. Every entry it keeps must lie directly under the prefix. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "objstore.h"
#include "xmlmini.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct xml_doc d;
	if (xml_parse((const char *)data, size, &d) == 0) {
		(void)xml_first(&d, "/Key");
		(void)xml_first(&d, "/UploadId");
		(void)xml_first(&d, "Error/Code");
		xml_free(&d);
	}
	static const char *prefixes[2] = { "pre/job/", "" };
	for (int k = 0; k < 2; k++) {
		struct store_entry *v = NULL;
		size_t n = 0, cap = 0;
		char token[64];
		bool truncated;
		(void)objstore_list_page(&objstore_list_v2, prefixes[k], (const char *)data, size, "fuzz", &v, &n, &cap,
					 token, sizeof(token), &truncated);
		for (size_t i = 0; i < n; i++) {
			if (v[i].name[0] == 0 || strchr(v[i].name, '/') != NULL)
				abort(); /* an entry not directly under the prefix */
			free(v[i].name);
		}
		free(v);
	}
	return 0;
}
