/* Credentials for the object stores (docs/storage.md "Object storage"), cached and refreshed
 * before they expire.
 *
 * AWS, in order: the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
 * AWS_SESSION_TOKEN); the shared credentials file
 * ($AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials, profile $AWS_PROFILE
 * or "default"); web identity (AWS_WEB_IDENTITY_TOKEN_FILE and
 * AWS_ROLE_ARN: STS AssumeRoleWithWebIdentity at $AWS_ENDPOINT_URL_STS or
 * https://sts.amazonaws.com); IMDSv2 ($AWS_EC2_METADATA_SERVICE_ENDPOINT or
 * http://169.254.169.254).
 *
 * GCS, in order: the metadata server's token ($GCE_METADATA_HOST or
 * metadata.google.internal, Metadata-Flavor: Google); a service-account
 * JSON key ($GOOGLE_APPLICATION_CREDENTIALS: an RS256 JWT signed with
 * OpenSSL, exchanged at its token_uri); HMAC keys (GCS_HMAC_ACCESS_KEY_ID
 * and GCS_HMAC_SECRET, signed with SigV4).
 *
 * The source is named for ckptctl status; secrets never reach a log or the
 * status. */
#ifndef CKPTD_CREDS_H
#define CKPTD_CREDS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>

struct http;

struct creds {
	bool bearer; /* OAuth access token in token; else SigV4 keys */
	char access_key[256];
	char secret_key[256];
	char token[4096]; /* session token (SigV4) or access token (bearer) */
	char source[256]; /* "environment", "IMDSv2 role r" ... */
	time_t expires;   /* 0: never */
};

struct creds_provider {
	pthread_mutex_t mu;
	struct http *http;
	int kind; /* which source of the chain answered */
	struct creds cur;
	unsigned fetches; /* tokens fetched (tests, status) */
	time_t failed_at; /* last failed refresh: not retried for 30 s */
	char sa_email[256], token_uri[512];
	char *sa_key_pem; /* service-account private key */
	char imds[256], sts[256];
	/* The storage URL's options credentials_file and profile: when set,
	 * the only source (a tenant's own credentials: docs/security.md "Tenants"). S3:
	 * a shared credentials file and its profile; GCS: a service-account
	 * key file. Set before init. */
	char file[1024], profile[128];
};

/* Walk a chain (AWS or GCS, as above) once and fetch the first
 * credentials. 0, or -errno with err saying which sources were tried. */
int creds_init_aws(struct creds_provider *p, struct http *http, char *err, size_t errlen);
int creds_init_gcs(struct creds_provider *p, struct http *http, char *err, size_t errlen);
/* The current credentials, refreshed first when they expire within five
 * minutes. Thread-safe. */
int creds_get(struct creds_provider *p, struct creds *out, char *err, size_t errlen);
void creds_fini(struct creds_provider *p);
/* Wipe the secrets. */
void creds_clear(struct creds *c);

#endif
