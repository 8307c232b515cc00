/* s3://bucket/prefix: S3 and S3-compatible endpoints (MinIO, Ceph,
 * moto), as a dialect of the object-store engine (objstore.h), and S3's
 * multipart and listing requests, which GCS's XML API speaks too
 * (store_gcs.c). docs/architecture.md §5.
 *
 * Endpoint s3.<region>.amazonaws.com (virtual-hosted, or path_style=1),
 * region from $AWS_REGION or $AWS_DEFAULT_REGION else us-east-1, the AWS
 * credentials chain (creds.h), SigV4, CRC32Cs in x-amz-checksum-crc32c
 * (per part, and in CompleteMultipartUpload), create-only through
 * If-None-Match: *, ListObjectsV2. */
#include "creds.h"
#include "objstore.h"
#include "store.h"
#include "xmlmini.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct objstore_listing objstore_list_v2 = {
	.label = "ListObjectsV2",
	.fixed = { { "list-type", "2" } },
	.prefix_param = "prefix",
	.delimiter_param = "delimiter",
	.token_param = "continuation-token",
	.page_param = "max-keys",
	.key = "ListBucketResult/Contents/Key",
	.size = "ListBucketResult/Contents/Size",
	.mtime = "ListBucketResult/Contents/LastModified",
	.common_prefix = "ListBucketResult/CommonPrefixes/Prefix",
	.truncated = "ListBucketResult/IsTruncated",
	.next_token = "ListBucketResult/NextContinuationToken",
};

/* ---- S3's multipart API, which GCS's XML API speaks too ---- */

static int mpu_begin(struct objstore *s, const char *key, char *id, size_t idlen)
{
	const struct objstore_dialect *d = objstore_dialect_of(s);
	struct objstore_call c = { .method = "POST", .key = key, .resp_max = 64u << 10 };
	c.query[c.nquery++] = (struct sigv4_header){ "uploads", NULL };
	c.extra[c.nextra++] = (struct sigv4_header){ "content-type", "application/octet-stream" };
	if (d->mpu_header.name)
		c.extra[c.nextra++] = d->mpu_header;
	int r = objstore_run(s, &c, 1);
	id[0] = 0;
	if (r == 0) {
		struct xml_doc x;
		if (xml_parse(c.req.resp, c.req.resp_len, &x) == 0) {
			const char *v = xml_first(&x, "/UploadId");
			if (v)
				snprintf(id, idlen, "%s", v);
			xml_free(&x);
		}
		if (!id[0]) {
			store_set_error("POST %s?uploads: no UploadId in the answer", key);
			r = -EPROTO;
		}
	}
	objstore_call_free(&c);
	return r;
}

static void mpu_part(struct objstore_call *c, const struct objstore_part *p, const char *id)
{
	c->method = "PUT";
	c->query[c->nquery++] = (struct sigv4_header){ "partNumber", p->num };
	c->query[c->nquery++] = (struct sigv4_header){ "uploadId", id };
}

/* CompleteMultipartUpload, parts in order with their ETags. */
static int mpu_complete(struct objstore *s, const char *key, const char *id, const struct objstore_part *parts,
			const struct objstore_call *sent, size_t np)
{
	size_t cap = 128 + np * 320, len = 0;
	char *xml = malloc(cap);
	if (xml == NULL)
		return -ENOMEM;
	len += (size_t)snprintf(xml + len, cap - len, "<CompleteMultipartUpload>");
	bool crcs_in = objstore_dialect_of(s)->complete_part_crc;
	for (size_t k = 0; k < np; k++) {
		char b64[16];
		objstore_crc_b64(parts[k].crc, b64);
		/* The server's ETag goes into our XML: nothing that could
		 * break out of the element. */
		if (!sent[k].req.etag[0] || strpbrk(sent[k].req.etag, "<>&")) {
			free(xml);
			store_set_error("PUT %s part %zu: no usable ETag in the answer", key, k + 1);
			return -EPROTO;
		}
		len += (size_t)snprintf(xml + len, cap - len,
					"<Part><PartNumber>%zu</PartNumber><ETag>%s</ETag>%s%s%s</Part>", k + 1,
					sent[k].req.etag, crcs_in ? "<ChecksumCRC32C>" : "", crcs_in ? b64 : "",
					crcs_in ? "</ChecksumCRC32C>" : "");
	}
	len += (size_t)snprintf(xml + len, cap - len, "</CompleteMultipartUpload>");
	struct iovec body = { xml, len };
	struct objstore_call cc = {
		.method = "POST", .key = key, .body = &body, .nbody = 1, .resp_max = 64u << 10, .error_in_200 = true
	};
	cc.query[cc.nquery++] = (struct sigv4_header){ "uploadId", id };
	/* Not curl's default form type: servers would parse the XML as a form. */
	cc.extra[cc.nextra++] = (struct sigv4_header){ "content-type", "application/xml" };
	int r = objstore_run(s, &cc, 1);
	objstore_call_free(&cc);
	free(xml);
	return r;
}

static int mpu_abort(struct objstore *s, const char *key, const char *id)
{
	struct objstore_call c = { .method = "DELETE", .key = key, .ok_404 = true };
	c.query[c.nquery++] = (struct sigv4_header){ "uploadId", id };
	int r = objstore_run(s, &c, 1);
	objstore_call_free(&c);
	return r;
}

const struct objstore_multipart objstore_mpu_s3 = {
	.begin = mpu_begin,
	.part = mpu_part,
	.complete = mpu_complete,
	.abort = mpu_abort,
};

const struct objstore_dialect store_s3_dialect = {
	.name = "s3",
	.host_template = "s3.{region}.amazonaws.com",
	.region_env = { "AWS_REGION", "AWS_DEFAULT_REGION" },
	.default_region = "us-east-1",
	.creds_init = creds_init_aws,
	.sign = objstore_sign_sigv4,
	.crc_header = "x-amz-checksum-crc32c",
	.crc_prefix = "",
	.multipart = &objstore_mpu_s3,
	.mpu_header = { "x-amz-checksum-algorithm", "CRC32C" },
	.complete_part_crc = true,
	.create_only = { "if-none-match", "*" },
	.listing = &objstore_list_v2,
};
