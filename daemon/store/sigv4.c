#include "sigv4.h"
#include "grow.h"

#include <ctype.h>
#include <errno.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A growing string; err sticks once set. */
struct str {
	char *p;
	size_t len, cap;
	int err;
};

static void put(struct str *s, const char *d, size_t n)
{
	if (s->err)
		return;
	if (GROW(s->p, s->cap, s->len + n + 1, 256) < 0) {
		s->err = -ENOMEM;
		return;
	}
	memcpy(s->p + s->len, d, n);
	s->len += n;
	s->p[s->len] = '\0';
}

static void puts_(struct str *s, const char *d)
{
	put(s, d, strlen(d));
}

static int unreserved(unsigned char c)
{
	return isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~';
}

static void put_encoded(struct str *s, const char *in, size_t n, int keep_slash)
{
	static const char hex[] = "0123456789ABCDEF";
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)in[i];
		if (unreserved(c) || (keep_slash && c == '/')) {
			put(s, (const char *)&c, 1);
		} else {
			char e[3] = { '%', hex[c >> 4], hex[c & 15] };
			put(s, e, 3);
		}
	}
}

int sigv4_uri_encode(const char *in, int keep_slash, char *out, size_t outlen)
{
	struct str s = { 0 };
	put_encoded(&s, in, strlen(in), keep_slash);
	int r = s.err;
	if (r == 0 && s.len + 1 > outlen)
		r = -ENAMETOOLONG;
	if (r == 0)
		memcpy(out, s.p ? s.p : "", s.len + 1);
	free(s.p);
	return r < 0 ? r : (int)s.len;
}

struct kv {
	char *k, *v; /* encoded */
};

static int cmp_kv(const void *a, const void *b)
{
	const struct kv *x = a, *y = b;
	int r = strcmp(x->k, y->k);
	return r ? r : strcmp(x->v, y->v);
}

static char *encoded(const char *in, size_t n)
{
	struct str s = { 0 };
	put_encoded(&s, in, n, 0);
	if (s.err == 0 && s.p == NULL)
		puts_(&s, "");
	if (s.err) {
		free(s.p);
		return NULL;
	}
	return s.p;
}

/* Pairs sorted by encoded name, then value; a bare key gets "=". */
static int canonical_query(const struct sigv4_header *q, size_t n, struct str *out)
{
	if (n == 0)
		return 0;
	struct kv *v = calloc(n, sizeof(*v));
	if (v == NULL)
		return -ENOMEM;
	int r = 0;
	for (size_t i = 0; i < n && r == 0; i++) {
		const char *val = q[i].value ? q[i].value : "";
		v[i].k = encoded(q[i].name, strlen(q[i].name));
		v[i].v = encoded(val, strlen(val));
		if (!v[i].k || !v[i].v)
			r = -ENOMEM;
	}
	if (r == 0) {
		qsort(v, n, sizeof(*v), cmp_kv);
		for (size_t i = 0; i < n; i++) {
			if (i)
				puts_(out, "&");
			puts_(out, v[i].k);
			puts_(out, "=");
			puts_(out, v[i].v);
		}
	}
	for (size_t i = 0; i < n; i++) {
		free(v[i].k);
		free(v[i].v);
	}
	free(v);
	return r;
}

struct hdr {
	char *name, *value;
};

static int cmp_hdr(const void *a, const void *b)
{
	return strcmp(((const struct hdr *)a)->name, ((const struct hdr *)b)->name);
}

/* Lower-case name; value trimmed, inner runs of spaces folded to one. */
static int norm_header(const struct sigv4_header *in, struct hdr *out)
{
	out->name = strdup(in->name);
	out->value = malloc(strlen(in->value) + 1);
	if (!out->name || !out->value)
		return -ENOMEM;
	for (char *c = out->name; *c; c++)
		*c = (char)tolower((unsigned char)*c);
	const char *s = in->value;
	while (*s == ' ' || *s == '\t')
		s++;
	char *d = out->value;
	int space = 0;
	for (; *s; s++) {
		if (*s == ' ' || *s == '\t') {
			space = 1;
			continue;
		}
		if (space && d != out->value)
			*d++ = ' ';
		space = 0;
		*d++ = *s;
	}
	*d = '\0';
	return 0;
}

static int build_canonical(const struct sigv4_request *rq, struct str *cr, struct str *signed_headers)
{
	if (!rq->method || !rq->path || rq->path[0] != '/' || !rq->payload_sha256)
		return -EINVAL;
	puts_(cr, rq->method);
	puts_(cr, "\n");
	if (rq->double_encode_path) {
		struct str once = { 0 };
		put_encoded(&once, rq->path, strlen(rq->path), 1);
		if (once.err)
			return once.err;
		put_encoded(cr, once.p, once.len, 1);
		free(once.p);
	} else {
		put_encoded(cr, rq->path, strlen(rq->path), 1);
	}
	puts_(cr, "\n");
	int r = canonical_query(rq->query, rq->nquery, cr);
	if (r < 0)
		return r;
	puts_(cr, "\n");
	struct hdr *h = calloc(rq->nheaders ? rq->nheaders : 1, sizeof(*h));
	if (h == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < rq->nheaders && r == 0; i++)
		r = norm_header(&rq->headers[i], &h[i]);
	if (r == 0) {
		qsort(h, rq->nheaders, sizeof(*h), cmp_hdr);
		for (size_t i = 0; i < rq->nheaders; i++) {
			/* Repeated names: values joined by ',' in order. */
			if (i && strcmp(h[i].name, h[i - 1].name) == 0) {
				cr->len--; /* drop the '\n' */
				puts_(cr, ",");
			} else {
				puts_(cr, h[i].name);
				puts_(cr, ":");
				if (signed_headers->len)
					puts_(signed_headers, ";");
				puts_(signed_headers, h[i].name);
			}
			puts_(cr, h[i].value);
			puts_(cr, "\n");
		}
		puts_(cr, "\n");
		puts_(cr, signed_headers->p ? signed_headers->p : "");
		puts_(cr, "\n");
		puts_(cr, rq->payload_sha256);
	}
	for (size_t i = 0; i < rq->nheaders; i++) {
		free(h[i].name);
		free(h[i].value);
	}
	free(h);
	return r ? r : cr->err ? cr->err : signed_headers->err;
}

int sigv4_canonical_request(const struct sigv4_request *req, char **out)
{
	struct str cr = { 0 }, sh = { 0 };
	int r = build_canonical(req, &cr, &sh);
	free(sh.p);
	if (r < 0) {
		free(cr.p);
		return r;
	}
	*out = cr.p;
	return 0;
}

static void sha256_hex(const void *d, size_t n, char out[65])
{
	unsigned char md[32];
	unsigned int len = 0;
	EVP_Digest(d, n, md, &len, EVP_sha256(), NULL);
	for (int i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", md[i]);
}

static void hmac(const void *key, size_t klen, const char *msg, unsigned char out[32])
{
	unsigned int len = 32;
	HMAC(EVP_sha256(), key, (int)klen, (const unsigned char *)msg, strlen(msg), out, &len);
}

int sigv4_authorization(const struct sigv4_request *rq, const char *access_key, const char *secret_key, char *out,
			size_t outlen)
{
	if (!rq->amz_date || strlen(rq->amz_date) != 16 || !rq->region || !rq->service || !access_key || !secret_key)
		return -EINVAL;
	struct str cr = { 0 }, sh = { 0 };
	int r = build_canonical(rq, &cr, &sh);
	if (r < 0) {
		free(cr.p);
		free(sh.p);
		return r;
	}
	char date[9], scope[256], hash[65], sts[512];
	memcpy(date, rq->amz_date, 8);
	date[8] = '\0';
	snprintf(scope, sizeof(scope), "%s/%s/%s/aws4_request", date, rq->region, rq->service);
	sha256_hex(cr.p, cr.len, hash);
	snprintf(sts, sizeof(sts), "AWS4-HMAC-SHA256\n%s\n%s\n%s", rq->amz_date, scope, hash);
	char k0[256];
	snprintf(k0, sizeof(k0), "AWS4%s", secret_key);
	unsigned char kd[32], kr[32], ks[32], kk[32], sig[32];
	hmac(k0, strlen(k0), date, kd);
	hmac(kd, 32, rq->region, kr);
	hmac(kr, 32, rq->service, ks);
	hmac(ks, 32, "aws4_request", kk);
	hmac(kk, 32, sts, sig);
	char sighex[65];
	for (int i = 0; i < 32; i++)
		snprintf(sighex + 2 * i, 3, "%02x", sig[i]);
	int n = snprintf(out, outlen, "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s", access_key,
			 scope, sh.p ? sh.p : "", sighex);
	free(cr.p);
	free(sh.p);
	OPENSSL_cleanse(kk, sizeof(kk));
	return n < 0 || (size_t)n >= outlen ? -ENAMETOOLONG : 0;
}
