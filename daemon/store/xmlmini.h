/* S3/GCS XML responses, flattened with expat into (path, text) pairs:
 * "ListBucketResult/Contents/Key" -> "a/b". Caps on size and count; a
 * DOCTYPE (and so any entity declaration) is refused. */
#ifndef CKPTD_XMLMINI_H
#define CKPTD_XMLMINI_H

#include <stddef.h>

struct xml_item {
	char *path;
	char *text;
};

struct xml_doc {
	struct xml_item *items;
	size_t n;
};

/* 0, or -EINVAL for malformed or refused XML, -E2BIG over the caps. */
int xml_parse(const char *buf, size_t len, struct xml_doc *out);
void xml_free(struct xml_doc *d);
/* The text of the first item whose path ends with suffix ("/UploadId"),
 * or NULL. */
const char *xml_first(const struct xml_doc *d, const char *suffix);

#endif
