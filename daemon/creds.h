/* Credentials for the object stores (DESIGN §5). AWS, in order: the
 * environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
 * AWS_SESSION_TOKEN), then the shared credentials file
 * ($AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials, profile
 * $AWS_PROFILE or "default"). The source is named for ckptctl status;
 * secrets never reach a log or the status. */
#ifndef CKPTD_CREDS_H
#define CKPTD_CREDS_H

#include <stddef.h>

struct creds {
	char access_key[256];
	char secret_key[256];
	char token[4096];  /* session token, or "" */
	char source[128];  /* "environment", "shared file ~/.aws/credentials [default]" */
};

/* 0, or -ENOENT with err saying which sources were tried. */
int creds_aws(struct creds *out, char *err, size_t errlen);
/* Wipe the secrets. */
void creds_clear(struct creds *c);

#endif
