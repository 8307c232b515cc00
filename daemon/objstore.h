/* The object-store engine (objstore.c), shared by every object store, and
 * the dialect that says how one store differs (store_s3.c, store_gcs.c).
 *
 * The engine owns what all of them do alike: single PUTs and multipart
 * uploads sent in windows of parallel parts with their CRC32Cs, retries
 * with exponential backoff and full jitter, the abort of a failed upload,
 * journaling of open upload ids (store.on_upload), create-only PUTs and
 * their lost-answer check, ranged GETs, paginated listings, and the
 * judgement of each HTTP answer. A dialect holds the differences as data
 * and hooks: endpoint, region, credentials chain, signing, checksum and
 * precondition headers, and the listing's format. A new object store is a
 * new dialect file and one row of the scheme table in store.c. */
#ifndef CKPTD_OBJSTORE_H
#define CKPTD_OBJSTORE_H

#include "sigv4.h"
#include "store.h"

#include <stdbool.h>
#include <stddef.h>
#include <sys/uio.h>

struct creds;
struct creds_provider;
struct http;
struct objstore_hdrs;

/* One attempt of one request as a signer sees it. The signer adds every
 * header the request carries (the request's own, extra, included) through
 * objstore_add_header. */
struct objstore_sign {
	const struct creds *cr;
	const char *method;
	const char *host;                 /* the Host header */
	const char *path;                 /* the path, not yet URI-encoded */
	const struct sigv4_header *query; /* not yet encoded; value NULL: a bare name */
	size_t nquery;
	const struct sigv4_header *extra; /* the request's own headers */
	size_t nextra;
	const struct iovec *body;
	size_t nbody;
	const char *region;
	bool sign_payload;                /* payload=sha256: hash the body */
	struct objstore_hdrs *out;
};

int objstore_add_header(struct objstore_hdrs *h, const char *name, const char *value);

/* The signers the dialects share: AWS SigV4 (service "s3", x-amz-date,
 * x-amz-content-sha256, x-amz-security-token), and an OAuth bearer token
 * with no x-amz-* header at all. */
int objstore_sign_sigv4(const struct objstore_sign *q);
int objstore_sign_bearer(const struct objstore_sign *q);

/* A paginated listing with a delimiter: the query of one page and where
 * the answer's XML keeps what the engine reads. */
struct objstore_listing {
	const char *label;             /* names it in errors: "ListObjectsV2" */
	struct sigv4_header fixed;     /* sent on every page: list-type=2 */
	const char *prefix_param, *delimiter_param, *token_param, *page_param;
	/* XML paths */
	const char *key, *size, *mtime, *common_prefix, *truncated, *next_token;
};

/* ListObjectsV2, which S3 and GCS's XML API both speak. */
extern const struct objstore_listing objstore_list_v2;

struct objstore_dialect {
	const char *name;               /* "s3", "gcs" */
	/* The endpoint host when the URL names none; "{region}" is replaced
	 * by the region, also when a region option comes later. */
	const char *host_template;
	/* The region: the first of these environment variables that is set,
	 * else default_region. */
	const char *region_env[2];
	const char *default_region;
	/* The credentials chain (creds.h): walks it once, names the source. */
	int (*creds_init)(struct creds_provider *p, struct http *http, char *err, size_t errlen);
	/* Sign one attempt; called again for every retry. 0 or -errno. */
	int (*sign)(const struct objstore_sign *q);
	/* The CRC32C of a PUT and of each part: header name, and what comes
	 * before the big-endian base64 value in it. */
	const char *crc_header, *crc_prefix;
	/* Sent with CreateMultipartUpload besides content-type; {NULL}: none. */
	struct sigv4_header mpu_header;
	/* Each part's CRC32C goes into CompleteMultipartUpload's XML too. */
	bool complete_part_crc;
	/* The precondition of a create-only PUT (the object must not exist). */
	struct sigv4_header create_only;
	const struct objstore_listing *listing;
};

/* The dialects (store_s3.c, store_gcs.c), for the scheme table. */
extern const struct objstore_dialect store_s3_dialect;
extern const struct objstore_dialect store_gcs_dialect;

/* scheme://bucket/prefix?opts with row->dialect (store.c's table).
 * Options, in the URL query (the config's [storage] keys are appended):
 * endpoint, region, path_style, part_size, concurrency, ca_bundle,
 * payload (unsigned|sha256), retry_max_attempts, retry_base_ms,
 * retry_cap_ms, connect_timeout_ms, low_speed_time_s, list_page (keys
 * per listing page; tests use it to exercise pagination). */
int objstore_open(const struct store_scheme *row, const char *url, struct store **out, char *err, size_t errlen);

#endif
