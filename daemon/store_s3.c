/* s3://bucket/prefix: S3 and S3-compatible endpoints (MinIO, Ceph,
 * moto), as a dialect of the object-store engine (objstore.h). DESIGN §5.
 *
 * Endpoint s3.<region>.amazonaws.com (virtual-hosted, or path_style=1),
 * region from $AWS_REGION or $AWS_DEFAULT_REGION else us-east-1, the AWS
 * credentials chain (creds.h), SigV4, CRC32Cs in x-amz-checksum-crc32c
 * (per part, and in CompleteMultipartUpload), create-only through
 * If-None-Match: *, ListObjectsV2. */
#include "creds.h"
#include "objstore.h"

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
