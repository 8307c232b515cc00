#include "creds.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

static int copy(char *dst, size_t len, const char *src)
{
	size_t n = strlen(src);
	if (n >= len)
		return -ENAMETOOLONG;
	memcpy(dst, src, n + 1);
	return 0;
}

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	size_t n = strlen(s);
	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
		s[--n] = 0;
	return s;
}

/* The [profile] section of an AWS credentials file (INI). */
static int from_file(const char *path, const char *profile, struct creds *c)
{
	FILE *f = fopen(path, "re");
	if (f == NULL)
		return -errno;
	char line[4096];
	int in = 0, found = 0;
	while (fgets(line, sizeof(line), f)) {
		char *l = trim(line);
		if (*l == '#' || *l == ';' || *l == 0)
			continue;
		if (*l == '[') {
			char *e = strchr(l, ']');
			if (e)
				*e = 0;
			in = strcmp(trim(l + 1), profile) == 0;
			found |= in;
			continue;
		}
		char *eq = strchr(l, '=');
		if (!in || eq == NULL)
			continue;
		*eq = 0;
		char *k = trim(l), *v = trim(eq + 1);
		int r = 0;
		if (strcmp(k, "aws_access_key_id") == 0)
			r = copy(c->access_key, sizeof(c->access_key), v);
		else if (strcmp(k, "aws_secret_access_key") == 0)
			r = copy(c->secret_key, sizeof(c->secret_key), v);
		else if (strcmp(k, "aws_session_token") == 0)
			r = copy(c->token, sizeof(c->token), v);
		if (r < 0) {
			fclose(f);
			OPENSSL_cleanse(line, sizeof(line));
			return r;
		}
	}
	fclose(f);
	OPENSSL_cleanse(line, sizeof(line));
	if (!found)
		return -ENOENT;
	return c->access_key[0] && c->secret_key[0] ? 0 : -ENOKEY;
}

int creds_aws(struct creds *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof(*out));
	const char *ak = getenv("AWS_ACCESS_KEY_ID"), *sk = getenv("AWS_SECRET_ACCESS_KEY");
	if (ak && *ak && sk && *sk) {
		const char *tok = getenv("AWS_SESSION_TOKEN");
		if (copy(out->access_key, sizeof(out->access_key), ak) < 0 ||
		    copy(out->secret_key, sizeof(out->secret_key), sk) < 0 ||
		    copy(out->token, sizeof(out->token), tok ? tok : "") < 0) {
			creds_clear(out);
			snprintf(err, errlen, "AWS credentials in the environment are too long");
			return -EINVAL;
		}
		snprintf(out->source, sizeof(out->source), "environment");
		return 0;
	}
	char path[1024];
	const char *p = getenv("AWS_SHARED_CREDENTIALS_FILE");
	if (p && *p)
		snprintf(path, sizeof(path), "%s", p);
	else
		snprintf(path, sizeof(path), "%s/.aws/credentials", getenv("HOME") ? getenv("HOME") : "/root");
	const char *profile = getenv("AWS_PROFILE");
	if (profile == NULL || *profile == 0)
		profile = "default";
	int r = from_file(path, profile, out);
	if (r == 0) {
		snprintf(out->source, sizeof(out->source), "shared file %s [%s]", path, profile);
		return 0;
	}
	creds_clear(out);
	if (r == -ENOKEY)
		snprintf(err, errlen, "profile [%s] in %s lacks aws_access_key_id or aws_secret_access_key", profile,
			 path);
	else
		snprintf(err, errlen, "no AWS credentials: not in the environment (AWS_ACCESS_KEY_ID), "
			 "not in %s [%s]: %s", path, profile, strerror(-r));
	return -ENOENT;
}

void creds_clear(struct creds *c)
{
	OPENSSL_cleanse(c, sizeof(*c));
}
