/* gs://bucket/prefix: Google Cloud Storage through its XML API, as a
 * dialect of the object-store engine (objstore.h). docs/architecture.md §5.
 *
 * Endpoint storage.googleapis.com, region "auto" (what SigV4 with HMAC
 * keys signs), the GCS credentials chain (creds.h): an OAuth bearer token
 * from the metadata server or a service-account key, else HMAC keys
 * through SigV4. CRC32Cs in x-goog-hash: crc32c=... (not x-amz-*, which
 * GCS refuses, and not in CompleteMultipartUpload); create-only through
 * x-goog-if-generation-match: 0 (GCS ignores If-None-Match on PUT, and its
 * XML multipart uploads take no preconditions); ListObjectsV2. */
#include "creds.h"
#include "objstore.h"

static int gcs_sign(const struct objstore_sign *q)
{
	return q->cr->bearer ? objstore_sign_bearer(q) : objstore_sign_sigv4(q);
}

const struct objstore_dialect store_gcs_dialect = {
	.name = "gcs",
	.host_template = "storage.googleapis.com",
	.default_region = "auto",
	.creds_init = creds_init_gcs,
	.sign = gcs_sign,
	.crc_header = "x-goog-hash",
	.crc_prefix = "crc32c=",
	.multipart = &objstore_mpu_s3,
	.complete_part_crc = false,
	.create_only = { "x-goog-if-generation-match", "0" },
	.listing = &objstore_list_v2,
};
