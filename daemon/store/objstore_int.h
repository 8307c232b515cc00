/* What objstore.c and objstore_url.c share, and nothing outside them
 * sees: the object store's state and its URL's parsing. */
#ifndef CKPTD_OBJSTORE_INT_H
#define CKPTD_OBJSTORE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "creds.h"
#include "http.h"
#include "store.h"

#define MIN_PART (5ull << 20)

struct objstore_dialect;
struct store_scheme;

struct objstore {
	struct store base;
	const struct objstore_dialect *d;
	struct http *http;
	char bucket[256];
	char prefix[512]; /* no leading or trailing '/'; may be "" */
	char scheme[8];   /* "https" or "http" */
	char host[512];   /* endpoint host[:port] */
	char region[64];
	bool path_style;
	uint64_t part_size;
	unsigned concurrency;
	bool sign_payload;
	unsigned max_attempts, base_ms, cap_ms;
	unsigned list_page; /* names per listing page; 0 for the server's 1000 */
	struct creds_provider cp;
	bool have_cp;
};

/* Defaults, then the bucket, prefix and options of url into s (and ho,
 * ca): the part of opening that needs no I/O (objstore_url.c). 0, or
 * -EINVAL/-ENOMEM with err saying what is wrong. */
int objstore_parse_url(struct objstore *s, const struct store_scheme *row, const char *url, struct http_opts *ho,
		       char *ca, size_t calen, char *err, size_t errlen);

#endif
