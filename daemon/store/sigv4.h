/* AWS Signature Version 4, our own, on OpenSSL (docs/storage.md "Object storage": Debian 12's
 * libcurl 7.88 signer mis-signs our requests). Pure functions: the S3/GCS
 * backends (issue "Object storage") will call them; nothing here does I/O. */
#ifndef CKPTD_SIGV4_H
#define CKPTD_SIGV4_H

#include <stddef.h>

struct sigv4_header {
	const char *name;  /* any case */
	const char *value; /* trimmed and inner runs of spaces folded when signed */
};

struct sigv4_request {
	const char *method;               /* "PUT" */
	const char *path;                 /* unencoded, "/bucket/key with space" */
	const struct sigv4_header *query; /* unencoded name/value pairs in any order;
					   * value NULL for a bare key ("?uploads") */
	size_t nquery;
	const struct sigv4_header *headers; /* must include host and x-amz-date */
	size_t nheaders;
	const char *payload_sha256; /* hex, or "UNSIGNED-PAYLOAD" */
	const char *amz_date;       /* "20130524T000000Z" */
	const char *region;         /* "us-east-1" */
	const char *service;        /* "s3" */
	int double_encode_path;     /* 0 for S3 (and GCS); 1 for other AWS services */
};

/* The Authorization header value for req signed with the given keys.
 * 0, -ENAMETOOLONG if out is too small, -EINVAL on a malformed request. */
int sigv4_authorization(const struct sigv4_request *req, const char *access_key, const char *secret_key, char *out,
			size_t outlen);
/* The canonical request (for tests and debugging), malloc'd. */
int sigv4_canonical_request(const struct sigv4_request *req, char **out);
/* URI-encode per SigV4: unreserved characters stay, everything else %XX;
 * '/' stays when keep_slash. Returns the length or -ENAMETOOLONG. */
int sigv4_uri_encode(const char *in, int keep_slash, char *out, size_t outlen);

#endif
