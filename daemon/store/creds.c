#include "creds.h"
#include "store.h"
#include "http.h"
#include "log.h"
#include "xmlmini.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#define REFRESH_MARGIN_S 300
#define CRED_RESP_MAX (64u << 10)

enum kind {
	K_ENV = 1,
	K_FILE,
	K_WEBID,
	K_IMDS,
	K_GCE,
	K_SA,
	K_HMAC
};

static int copy(char *dst, size_t len, const char *src)
{
	size_t n = strlen(src ? src : "");
	if (n >= len)
		return -ENAMETOOLONG;
	memcpy(dst, src ? src : "", n + 1);
	return 0;
}

static const char *env(const char *name)
{
	const char *v = getenv(name);
	return v && *v ? v : NULL;
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

static char *read_file(const char *path, size_t max)
{
	FILE *f = fopen(path, "re");
	if (f == NULL)
		return NULL;
	char *buf = malloc(max + 1);
	size_t n = buf ? fread(buf, 1, max, f) : 0;
	fclose(f);
	if (buf)
		buf[n] = 0;
	return buf;
}

/* Why the last fetch() on this thread got no HTTP answer. */
static __thread char fetch_err[256];

/* One request to a token or metadata endpoint. Returns the HTTP status (or
 * -errno) and, on 2xx, the body in *resp. */
static int fetch(struct creds_provider *p, const char *method, const char *url, const char *const *headers,
		 const char *body, char **resp)
{
	struct iovec iov = { (void *)body, body ? strlen(body) : 0 };
	/* Short: a metadata server that is not there must not hold up start. */
	struct http_req r = { .method = method,
			      .url = url,
			      .headers = headers,
			      .body = body ? &iov : NULL,
			      .nbody = body ? 1 : 0,
			      .resp_max = CRED_RESP_MAX,
			      .timeout_ms = 5000 };
	struct http_req *rp = &r;
	*resp = NULL;
	int rc = http_run(p->http, &rp, 1);
	if (rc < 0)
		return rc;
	if (r.curl_code) {
		snprintf(fetch_err, sizeof(fetch_err), "%s", r.curl_err);
		http_req_reset(&r);
		return -EHOSTUNREACH;
	}
	int st = (int)r.status;
	if (st >= 200 && st < 300) {
		*resp = r.resp ? r.resp : strdup("");
		r.resp = NULL;
	}
	http_req_reset(&r);
	return st;
}

static time_t parse_iso8601(const char *s)
{
	return (time_t)(store_parse_time(s) / 1000000000);
}

static int json_str(json_object *o, const char *k, char *dst, size_t len)
{
	json_object *v;
	if (!json_object_object_get_ex(o, k, &v) || !json_object_is_type(v, json_type_string))
		return -ENOENT;
	return copy(dst, len, json_object_get_string(v));
}

/* ---- AWS ---- */

static int from_file(const char *path, const char *profile, struct creds *c)
{
	FILE *f = fopen(path, "re");
	if (f == NULL)
		return -errno;
	char line[4096];
	int in = 0, found = 0, r = 0;
	while (r == 0 && fgets(line, sizeof(line), f)) {
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
		if (strcmp(k, "aws_access_key_id") == 0)
			r = copy(c->access_key, sizeof(c->access_key), v);
		else if (strcmp(k, "aws_secret_access_key") == 0)
			r = copy(c->secret_key, sizeof(c->secret_key), v);
		else if (strcmp(k, "aws_session_token") == 0)
			r = copy(c->token, sizeof(c->token), v);
	}
	fclose(f);
	OPENSSL_cleanse(line, sizeof(line));
	if (r < 0)
		return r;
	if (!found)
		return -ENOENT;
	return c->access_key[0] && c->secret_key[0] ? 0 : -ENOKEY;
}

static int urlenc(const char *in, char *out, size_t len)
{
	static const char hexd[] = "0123456789ABCDEF";
	size_t o = 0;
	for (const unsigned char *s = (const unsigned char *)in; *s; s++) {
		if (o + 4 > len)
			return -ENAMETOOLONG;
		if ((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '-' ||
		    *s == '_' || *s == '.' || *s == '~') {
			out[o++] = (char)*s;
		} else {
			out[o++] = '%';
			out[o++] = hexd[*s >> 4];
			out[o++] = hexd[*s & 15];
		}
	}
	out[o] = 0;
	return 0;
}

static int web_identity(struct creds_provider *p, struct creds *c, char *err, size_t errlen)
{
	const char *tf = env("AWS_WEB_IDENTITY_TOKEN_FILE"), *role = env("AWS_ROLE_ARN");
	const char *sess = env("AWS_ROLE_SESSION_NAME") ? env("AWS_ROLE_SESSION_NAME") : "ckptd";
	char *tok = read_file(tf, 16384);
	if (tok == NULL) {
		snprintf(err, errlen, "web identity token file %s: %s", tf, strerror(errno));
		return -ENOENT;
	}
	size_t cap = 3 * 16384 + 4096;
	char *body = malloc(cap), *et = malloc(3 * 16384 + 1), er[1024], es[512];
	int r = -ENOMEM;
	if (body && et && (r = urlenc(trim(tok), et, 3 * 16384 + 1)) == 0 && (r = urlenc(role, er, sizeof(er))) == 0 &&
	    (r = urlenc(sess, es, sizeof(es))) == 0)
		snprintf(body, cap,
			 "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=%s&RoleSessionName=%s"
			 "&WebIdentityToken=%s",
			 er, es, et);
	OPENSSL_cleanse(tok, strlen(tok));
	free(tok);
	free(et);
	if (r < 0) {
		free(body);
		snprintf(err, errlen, "web identity: token or role too long");
		return r;
	}
	const char *hdrs[] = { "Content-Type: application/x-www-form-urlencoded", "Accept: application/xml", NULL };
	char *resp = NULL;
	int st = fetch(p, "POST", p->sts, hdrs, body, &resp);
	OPENSSL_cleanse(body, strlen(body));
	free(body);
	if (st != 200) {
		free(resp);
		snprintf(err, errlen, "STS AssumeRoleWithWebIdentity at %s: %s", p->sts,
			 st < 0 ? fetch_err : "refused");
		if (st > 0)
			snprintf(err + strlen(err), errlen - strlen(err), " (HTTP %d)", st);
		return -EACCES;
	}
	struct xml_doc d;
	r = xml_parse(resp, strlen(resp), &d);
	OPENSSL_cleanse(resp, strlen(resp));
	free(resp);
	if (r < 0) {
		snprintf(err, errlen, "STS answered malformed XML");
		return -EPROTO;
	}
	const char *ak = xml_first(&d, "Credentials/AccessKeyId"), *sk = xml_first(&d, "Credentials/SecretAccessKey");
	const char *st2 = xml_first(&d, "Credentials/SessionToken"), *ex = xml_first(&d, "Credentials/Expiration");
	r = ak && sk ? 0 : -EPROTO;
	if (r == 0 &&
	    (copy(c->access_key, sizeof(c->access_key), ak) < 0 || copy(c->secret_key, sizeof(c->secret_key), sk) < 0 ||
	     copy(c->token, sizeof(c->token), st2 ? st2 : "") < 0))
		r = -EPROTO;
	c->expires = parse_iso8601(ex);
	xml_free(&d);
	if (r < 0)
		snprintf(err, errlen, "STS answer lacks credentials");
	else
		snprintf(c->source, sizeof(c->source), "web identity (%s)", role);
	return r;
}

static int imds(struct creds_provider *p, struct creds *c, char *err, size_t errlen)
{
	char url[512], *tok = NULL, *role = NULL, *js = NULL, th[600];
	const char *h1[] = { "X-aws-ec2-metadata-token-ttl-seconds: 21600", NULL };
	snprintf(url, sizeof(url), "%s/latest/api/token", p->imds);
	int st = fetch(p, "PUT", url, h1, "", &tok);
	if (st != 200) {
		snprintf(err, errlen, "IMDSv2 at %s: %s", p->imds, st < 0 ? fetch_err : "no session token");
		free(tok);
		return -ENOENT;
	}
	snprintf(th, sizeof(th), "X-aws-ec2-metadata-token: %s", trim(tok));
	free(tok);
	const char *h2[] = { th, NULL };
	snprintf(url, sizeof(url), "%s/latest/meta-data/iam/security-credentials/", p->imds);
	st = fetch(p, "GET", url, h2, NULL, &role);
	char rn[256] = "";
	if (st == 200 && role) {
		role[strcspn(role, "\r\n")] = 0;
		snprintf(rn, sizeof(rn), "%s", trim(role));
	}
	free(role);
	if (!rn[0]) {
		snprintf(err, errlen, "IMDSv2 at %s: no IAM role attached", p->imds);
		return -ENOENT;
	}
	snprintf(url, sizeof(url), "%s/latest/meta-data/iam/security-credentials/%s", p->imds, rn);
	st = fetch(p, "GET", url, h2, NULL, &js);
	OPENSSL_cleanse(th, sizeof(th));
	json_object *o = st == 200 && js ? json_tokener_parse(js) : NULL;
	if (js)
		OPENSSL_cleanse(js, strlen(js));
	free(js);
	int r = o && json_str(o, "AccessKeyId", c->access_key, sizeof(c->access_key)) == 0 &&
				json_str(o, "SecretAccessKey", c->secret_key, sizeof(c->secret_key)) == 0
			? 0
			: -EPROTO;
	if (r == 0) {
		json_str(o, "Token", c->token, sizeof(c->token));
		char ex[64] = "";
		json_str(o, "Expiration", ex, sizeof(ex));
		c->expires = parse_iso8601(ex);
		snprintf(c->source, sizeof(c->source), "IMDSv2 role %s", rn);
	} else {
		snprintf(err, errlen, "IMDSv2 at %s: no credentials for role %s", p->imds, rn);
	}
	json_object_put(o);
	return r;
}

/* ---- GCS ---- */

/* An OAuth token answer ({"access_token", "expires_in"}) into c; frees js. */
static int take_oauth_token(char *js, struct creds *c)
{
	json_object *o = json_tokener_parse(js);
	OPENSSL_cleanse(js, strlen(js));
	free(js);
	json_object *ei;
	int r = o && json_str(o, "access_token", c->token, sizeof(c->token)) == 0 ? 0 : -EPROTO;
	if (r == 0 && json_object_object_get_ex(o, "expires_in", &ei))
		c->expires = time(NULL) + json_object_get_int64(ei);
	json_object_put(o);
	return r;
}

static int gce_metadata(struct creds_provider *p, struct creds *c, char *err, size_t errlen)
{
	const char *host = env("GCE_METADATA_HOST") ? env("GCE_METADATA_HOST") : "metadata.google.internal";
	char url[512], *js = NULL;
	snprintf(url, sizeof(url), "http://%s/computeMetadata/v1/instance/service-accounts/default/token", host);
	const char *h[] = { "Metadata-Flavor: Google", NULL };
	int st = fetch(p, "GET", url, h, NULL, &js);
	if (st != 200) {
		free(js);
		snprintf(err, errlen, "metadata server %s: %s", host, st < 0 ? fetch_err : "no token");
		return -ENOENT;
	}
	int r = take_oauth_token(js, c);
	if (r < 0) {
		snprintf(err, errlen, "metadata server %s: malformed token answer", host);
		return r;
	}
	c->bearer = true;
	snprintf(c->source, sizeof(c->source), "metadata server %s", host);
	return 0;
}

static void b64url(const unsigned char *in, size_t n, char *out)
{
	EVP_EncodeBlock((unsigned char *)out, in, (int)n);
	char *w = out;
	for (char *r = out; *r; r++) {
		if (*r == '=')
			continue;
		*w++ = *r == '+' ? '-' : *r == '/' ? '_' : *r;
	}
	*w = 0;
}

static int load_service_account(struct creds_provider *p, const char *path, char *err, size_t errlen)
{
	char *js = read_file(path, 65536);
	if (js == NULL) {
		snprintf(err, errlen, "service-account key %s: %s", path, strerror(errno));
		return -ENOENT;
	}
	json_object *o = json_tokener_parse(js);
	OPENSSL_cleanse(js, strlen(js));
	free(js);
	char key[8192];
	int r = o && json_str(o, "client_email", p->sa_email, sizeof(p->sa_email)) == 0 &&
				json_str(o, "private_key", key, sizeof(key)) == 0
			? 0
			: -EINVAL;
	if (r == 0 && json_str(o, "token_uri", p->token_uri, sizeof(p->token_uri)) < 0)
		snprintf(p->token_uri, sizeof(p->token_uri), "https://oauth2.googleapis.com/token");
	json_object_put(o);
	if (r < 0) {
		snprintf(err, errlen, "service-account key %s lacks client_email or private_key", path);
		return r;
	}
	p->sa_key_pem = strdup(key);
	OPENSSL_cleanse(key, sizeof(key));
	return p->sa_key_pem ? 0 : -ENOMEM;
}

static int service_account(struct creds_provider *p, struct creds *c, char *err, size_t errlen)
{
	time_t now = time(NULL);
	char hdr[64], claims[1024], hb[128], cb[1500], signing[1700], sigb[4 * ((512 + 2) / 3) + 1];
	snprintf(hdr, sizeof(hdr), "{\"alg\":\"RS256\",\"typ\":\"JWT\"}");
	snprintf(claims, sizeof(claims),
		 "{\"iss\":\"%s\",\"scope\":\"https://www.googleapis.com/auth/devstorage.read_write\","
		 "\"aud\":\"%s\",\"iat\":%lld,\"exp\":%lld}",
		 p->sa_email, p->token_uri, (long long)now, (long long)now + 3600);
	b64url((const unsigned char *)hdr, strlen(hdr), hb);
	b64url((const unsigned char *)claims, strlen(claims), cb);
	snprintf(signing, sizeof(signing), "%s.%s", hb, cb);
	BIO *bio = BIO_new_mem_buf(p->sa_key_pem, -1);
	EVP_PKEY *pk = bio ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
	BIO_free(bio);
	unsigned char sig[512];
	size_t siglen = sizeof(sig);
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	int ok = pk && md && EVP_DigestSignInit(md, NULL, EVP_sha256(), NULL, pk) == 1 &&
		 EVP_DigestSign(md, sig, &siglen, (const unsigned char *)signing, strlen(signing)) == 1;
	EVP_MD_CTX_free(md);
	EVP_PKEY_free(pk);
	if (!ok) {
		snprintf(err, errlen, "signing the service-account JWT failed (is private_key an RSA PEM key?)");
		return -EINVAL;
	}
	b64url(sig, siglen, sigb);
	char *body = NULL;
	if (asprintf(&body, "grant_type=urn%%3Aietf%%3Aparams%%3Aoauth%%3Agrant-type%%3Ajwt-bearer&assertion=%s.%s",
		     signing, sigb) < 0)
		return -ENOMEM;
	const char *h[] = { "Content-Type: application/x-www-form-urlencoded", NULL };
	char *js = NULL;
	int st = fetch(p, "POST", p->token_uri, h, body, &js);
	free(body);
	if (st != 200) {
		free(js);
		snprintf(err, errlen, "token exchange at %s for %s: %s", p->token_uri, p->sa_email,
			 st < 0 ? fetch_err : "refused");
		return -EACCES;
	}
	int r = take_oauth_token(js, c);
	if (r < 0) {
		snprintf(err, errlen, "token exchange at %s: malformed answer", p->token_uri);
		return r;
	}
	c->bearer = true;
	snprintf(c->source, sizeof(c->source), "service account %s", p->sa_email);
	return 0;
}

/* ---- the chain ---- */

static int fetch_kind(struct creds_provider *p, struct creds *c, char *err, size_t errlen)
{
	memset(c, 0, sizeof(*c));
	switch (p->kind) {
	case K_WEBID: return web_identity(p, c, err, errlen);
	case K_IMDS: return imds(p, c, err, errlen);
	case K_GCE: return gce_metadata(p, c, err, errlen);
	case K_SA: return service_account(p, c, err, errlen);
	default: return -EINVAL;
	}
}

static int static_aws(struct creds *c, const char *ak_env, const char *sk_env, const char *tok_env, const char *what)
{
	const char *ak = env(ak_env), *sk = env(sk_env);
	if (!ak || !sk)
		return -ENOENT;
	if (copy(c->access_key, sizeof(c->access_key), ak) < 0 || copy(c->secret_key, sizeof(c->secret_key), sk) < 0 ||
	    copy(c->token, sizeof(c->token), tok_env ? env(tok_env) : "") < 0)
		return -EINVAL;
	snprintf(c->source, sizeof(c->source), "%s", what);
	return 0;
}

/* A source that answered with r < 0: its values did not fit. */
static int too_long(int r, char *err, size_t errlen)
{
	if (r < 0)
		snprintf(err, errlen, "credentials too long");
	return r;
}

static int chain_aws(struct creds_provider *p, char *err, size_t errlen)
{
	struct creds *c = &p->cur;
	char e1[512] = "", e2[512] = "";
	int r;
	snprintf(p->imds, sizeof(p->imds), "%s",
		 env("AWS_EC2_METADATA_SERVICE_ENDPOINT") ? env("AWS_EC2_METADATA_SERVICE_ENDPOINT")
							  : "http://169.254.169.254");
	for (size_t l = strlen(p->imds); l && p->imds[l - 1] == '/'; l--)
		p->imds[l - 1] = 0;
	snprintf(p->sts, sizeof(p->sts), "%s",
		 env("AWS_ENDPOINT_URL_STS") ? env("AWS_ENDPOINT_URL_STS") : "https://sts.amazonaws.com/");
	if (p->file[0]) { /* the URL names them: nothing else */
		const char *prof = p->profile[0] ? p->profile : "default";
		r = from_file(p->file, prof, c);
		if (r == 0) {
			snprintf(c->source, sizeof(c->source), "credentials_file %s [%s]", p->file, prof);
			p->kind = K_FILE;
			return 0;
		}
		memset(c, 0, sizeof(*c));
		snprintf(err, errlen, "credentials_file %s [%s]: %s", p->file, prof,
			 r == -ENOKEY ? "lacks aws_access_key_id or aws_secret_access_key" : "no such profile or file");
		return r == -ENOKEY ? r : -ENOENT;
	}
	if ((r = static_aws(c, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "environment")) !=
	    -ENOENT) {
		p->kind = K_ENV;
		return too_long(r, err, errlen);
	}
	char path[1024];
	if (env("AWS_SHARED_CREDENTIALS_FILE"))
		snprintf(path, sizeof(path), "%s", env("AWS_SHARED_CREDENTIALS_FILE"));
	else
		snprintf(path, sizeof(path), "%s/.aws/credentials", env("HOME") ? env("HOME") : "/root");
	const char *profile = env("AWS_PROFILE") ? env("AWS_PROFILE") : "default";
	r = from_file(path, profile, c);
	if (r == 0) {
		snprintf(c->source, sizeof(c->source), "shared file %s [%s]", path, profile);
		p->kind = K_FILE;
		return 0;
	}
	if (r == -ENOKEY) {
		snprintf(err, errlen, "profile [%s] in %s lacks aws_access_key_id or aws_secret_access_key", profile,
			 path);
		return r;
	}
	snprintf(e1, sizeof(e1), "not in %s [%s]", path, profile);
	memset(c, 0, sizeof(*c));
	if (env("AWS_WEB_IDENTITY_TOKEN_FILE") && env("AWS_ROLE_ARN")) {
		p->kind = K_WEBID;
		/* configured, so its failure is the answer */
		return fetch_kind(p, c, err, errlen);
	}
	p->kind = K_IMDS;
	r = fetch_kind(p, c, e2, sizeof(e2));
	if (r == 0)
		return 0;
	snprintf(err, errlen,
		 "no AWS credentials: not in the environment (AWS_ACCESS_KEY_ID), %s, no web "
		 "identity (AWS_WEB_IDENTITY_TOKEN_FILE), %s",
		 e1, e2);
	return -ENOENT;
}

static int chain_gcs(struct creds_provider *p, char *err, size_t errlen)
{
	struct creds *c = &p->cur;
	char e1[512] = "";
	int r;
	if (p->file[0]) { /* the URL names a service-account key: nothing else */
		r = load_service_account(p, p->file, err, errlen);
		if (r < 0)
			return r;
		p->kind = K_SA;
		return fetch_kind(p, c, err, errlen);
	}
	p->kind = K_GCE;
	r = fetch_kind(p, c, e1, sizeof(e1));
	if (r == 0)
		return 0;
	if (env("GCE_METADATA_HOST")) {
		snprintf(err, errlen, "%s", e1); /* pointed there on purpose */
		return r;
	}
	if (env("GOOGLE_APPLICATION_CREDENTIALS")) {
		r = load_service_account(p, env("GOOGLE_APPLICATION_CREDENTIALS"), err, errlen);
		if (r < 0)
			return r;
		p->kind = K_SA;
		return fetch_kind(p, c, err, errlen);
	}
	if ((r = static_aws(c, "GCS_HMAC_ACCESS_KEY_ID", "GCS_HMAC_SECRET", NULL,
			    "HMAC key (GCS_HMAC_ACCESS_KEY_ID)")) != -ENOENT) {
		p->kind = K_HMAC;
		return too_long(r, err, errlen);
	}
	snprintf(err, errlen,
		 "no GCS credentials: %s, no service-account key (GOOGLE_APPLICATION_CREDENTIALS), "
		 "no HMAC key (GCS_HMAC_ACCESS_KEY_ID)",
		 e1);
	return -ENOENT;
}

static int start(struct creds_provider *p, int (*chain)(struct creds_provider *, char *, size_t), struct http *http,
		 char *err, size_t errlen)
{
	char file[sizeof(p->file)], profile[sizeof(p->profile)];
	memcpy(file, p->file, sizeof(file));
	memcpy(profile, p->profile, sizeof(profile));
	memset(p, 0, sizeof(*p));
	memcpy(p->file, file, sizeof(file));
	memcpy(p->profile, profile, sizeof(profile));
	pthread_mutex_init(&p->mu, NULL);
	p->http = http;
	int r = chain(p, err, errlen);
	if (r == 0) {
		p->fetches = 1;
		return 0;
	}
	creds_fini(p);
	return r < 0 ? r : -ENOENT;
}

int creds_init_aws(struct creds_provider *p, struct http *http, char *err, size_t errlen)
{
	return start(p, chain_aws, http, err, errlen);
}

int creds_init_gcs(struct creds_provider *p, struct http *http, char *err, size_t errlen)
{
	return start(p, chain_gcs, http, err, errlen);
}

int creds_get(struct creds_provider *p, struct creds *out, char *err, size_t errlen)
{
	pthread_mutex_lock(&p->mu);
	int r = 0;
	time_t now = time(NULL);
	/* A refresh that failed is not retried by every request while the
	 * old credentials still work. */
	bool backoff = p->failed_at && now - p->failed_at < 30 && p->cur.expires > now;
	if (p->cur.expires && p->cur.expires - now < REFRESH_MARGIN_S && !backoff) {
		struct creds n;
		r = fetch_kind(p, &n, err, errlen);
		if (r == 0) {
			p->cur = n;
			p->fetches++;
			p->failed_at = 0;
			log_debug("credentials refreshed from %s", n.source);
		} else {
			p->failed_at = now;
			if (p->cur.expires > now) {
				/* Still valid: use them and try again later. */
				log_warn("refreshing credentials: %s", err);
				r = 0;
			}
		}
		creds_clear(&n);
	}
	if (r == 0)
		*out = p->cur;
	pthread_mutex_unlock(&p->mu);
	return r;
}

void creds_fini(struct creds_provider *p)
{
	creds_clear(&p->cur);
	if (p->sa_key_pem) {
		OPENSSL_cleanse(p->sa_key_pem, strlen(p->sa_key_pem));
		free(p->sa_key_pem);
		p->sa_key_pem = NULL;
	}
	pthread_mutex_destroy(&p->mu);
}

void creds_clear(struct creds *c)
{
	OPENSSL_cleanse(c, sizeof(*c));
}
