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
 * new dialect file and one row of the scheme table in backends.c. */
#ifndef CKPTD_OBJSTORE_H
#define CKPTD_OBJSTORE_H

#include "http.h"
#include "sigv4.h"
#include "store.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct creds;
struct creds_provider;
struct objstore;

#define OBJSTORE_MAX_HEADERS 10

/* The headers of one attempt, as the signer made them. */
struct objstore_hdrs {
	char *hdr[OBJSTORE_MAX_HEADERS];
	const char *hdrp[OBJSTORE_MAX_HEADERS + 1];
	int n;
};

/* One logical request; the engine signs it anew for every attempt. */
struct objstore_call {
	const char *method;
	const char *key; /* object key under the bucket; NULL: the bucket */
	struct sigv4_header query[6];
	size_t nquery;
	struct sigv4_header extra[3]; /* signed headers besides the standard ones */
	size_t nextra;
	const struct iovec *body;
	size_t nbody;
	void *dst;
	size_t dst_len;
	size_t resp_max;
	bool ok_404;       /* 404 is an answer (HEAD, DELETE), not a failure */
	bool error_in_200; /* CompleteMultipartUpload: a 200 may carry an <Error> */
	const char *label; /* names it in errors instead of "METHOD key" (a listing has no key) */
	/* Per attempt: the engine's. req holds the answer once run. */
	struct http_req req;
	char url[4096];
	struct objstore_hdrs h;
	int result; /* 0, -errno, or 1: retry */
};

/* Run calls in parallel, each until it succeeded, failed for good, or ran
 * out of attempts (full-jitter backoff between rounds, fresh credentials
 * and signatures for each). 0 or the first failure; store_error says it. */
int objstore_run(struct objstore *s, struct objstore_call *calls, size_t n);
/* Free what running c left (headers, the answer). */
void objstore_call_free(struct objstore_call *c);
const struct objstore_dialect *objstore_dialect_of(const struct objstore *s);
/* A CRC32C as the object stores want it: big-endian, base64. */
void objstore_crc_b64(uint32_t crc, char out[16]);

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
	bool sign_payload; /* payload=sha256: hash the body */
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
	const char *label;            /* names it in errors: "ListObjectsV2" */
	struct sigv4_header fixed[2]; /* sent on every page: list-type=2; {NULL}: none */
	const char *prefix_param, *delimiter_param, *token_param, *page_param;
	/* XML paths. truncated NULL: there is another page iff next_token. */
	const char *key, *size, *mtime, *common_prefix, *truncated, *next_token;
	/* mtime's text to ns since the epoch, 0 if it does not parse; NULL:
	 * ISO 8601 ("2009-10-12T17:50:30.000Z"). */
	int64_t (*parse_time)(const char *t);
};

/* ListObjectsV2, which S3 and GCS's XML API both speak (store_s3.c). */
extern const struct objstore_listing objstore_list_v2;

/* One page of a listing: resp's XML read with ls's paths. Appends to
 * *v (count *n, capacity *cap; the caller frees) the entries directly
 * under the full prefix fp, named past it; sets token to the next page's
 * token ("" if none) and *truncated. 0; -EPROTO for malformed XML or a
 * size that is not a number (store_error says what, with label); -ENOMEM.
 * The listing's only reader of storage's answer (tests/fuzz/fuzz_xml.c). */
int objstore_list_page(const struct objstore_listing *ls, const char *fp, const char *resp, size_t len,
		       const char *label, struct store_entry **v, size_t *n, size_t *cap, char *token, size_t toklen,
		       bool *truncated);

/* One part of a multipart upload, as the engine cut it. */
struct objstore_part {
	struct iovec *iov;
	size_t niov;
	uint64_t len;
	uint32_t crc; /* CRC32C of the part */
	char crchdr[48];
	char num[16]; /* 1-based number, as text */
};

/* The requests of a multipart upload. The engine cuts the parts, sends
 * them in windows with their CRCs, journals the id between begin and
 * complete (store.on_upload), checks a lost Complete's answer (-ENOENT:
 * the object may be there) and aborts on any failure. */
struct objstore_multipart {
	/* Open an upload of key; its id into id. 0 or -errno (store_error). */
	int (*begin)(struct objstore *s, const char *key, char *id, size_t idlen);
	/* Make c (key, body and CRC header set) part p of upload id: its
	 * method and query. */
	void (*part)(struct objstore_call *c, const struct objstore_part *p, const char *id);
	/* Commit the parts in order; sent[k] is part k's answered request
	 * (sent[k].req.etag). -ENOENT: the upload is gone. */
	int (*complete)(struct objstore *s, const char *key, const char *id, const struct objstore_part *parts,
			const struct objstore_call *sent, size_t np);
	/* Drop upload id of key; 0 also when it is gone already. */
	int (*abort)(struct objstore *s, const char *key, const char *id);
};

/* CreateMultipartUpload, UploadPart, CompleteMultipartUpload (with each
 * part's CRC where the dialect's complete_part_crc says),
 * AbortMultipartUpload: S3's, which GCS's XML API speaks too (store_s3.c). */
extern const struct objstore_multipart objstore_mpu_s3;

struct objstore_dialect {
	const char *name; /* "s3", "gcs" */
	/* The endpoint host when the URL names none; "{region}" is replaced
	 * by the region, also when a region option comes later. */
	const char *host_template;
	/* The region: the first of these environment variables that is set,
	 * else default_region. */
	const char *region_env[2];
	const char *default_region;
	bool path_style; /* bucket in the path by default (path_style option) */
	/* The credentials chain (creds.h): walks it once, names the source. */
	int (*creds_init)(struct creds_provider *p, struct http *http, char *err, size_t errlen);
	/* Sign one attempt; called again for every retry. 0 or -errno. */
	int (*sign)(const struct objstore_sign *q);
	/* The CRC32C of a PUT and of each part: header name (NULL: none is
	 * sent), and what comes before the big-endian base64 value in it. */
	const char *crc_header, *crc_prefix;
	const struct objstore_multipart *multipart;
	/* objstore_mpu_s3: sent with CreateMultipartUpload besides
	 * content-type ({NULL}: none), and whether each part's CRC32C goes
	 * into CompleteMultipartUpload's XML too. */
	struct sigv4_header mpu_header;
	bool complete_part_crc;
	/* The precondition of a create-only PUT (the object must not exist). */
	struct sigv4_header create_only;
	const struct objstore_listing *listing;
};

/* The dialects (store_s3.c, store_gcs.c), for the scheme table. */
extern const struct objstore_dialect store_s3_dialect;
extern const struct objstore_dialect store_gcs_dialect;

/* scheme://bucket/prefix?opts with row->dialect (backends.c's table).
 * Options, in the URL query (the config's [storage] keys are appended):
 * endpoint, region, path_style, part_size, concurrency, ca_bundle,
 * payload (unsigned|sha256), retry_max_attempts, retry_base_ms,
 * retry_cap_ms, connect_timeout_ms, low_speed_time_s, list_page (keys
 * per listing page; tests use it to exercise pagination). */
int objstore_open(const struct store_scheme *row, const char *url, struct store **out, char *err, size_t errlen);
/* The bucket, prefix and options of url as objstore_open parses them, with
 * no connection and no credentials. */
int objstore_check(const struct store_scheme *row, const char *url, char *err, size_t errlen);

#endif
