/* S3 and GCS XML responses (listings, errors, multipart replies). */
#include <stddef.h>
#include <stdint.h>

#include "xmlmini.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct xml_doc d;
	if (xml_parse((const char *)data, size, &d) == 0) {
		(void)xml_first(&d, "/Key");
		(void)xml_first(&d, "/UploadId");
		xml_free(&d);
	}
	return 0;
}
