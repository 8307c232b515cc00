/* An object store's URL (docs/storage.md "Object storage"):
 * SCHEME://BUCKET[/PREFIX][?OPTION=VALUE&...], parsed without I/O, and
 * its options as one table: the names an error lists, the ranges it
 * names, and what each sets. */
#include "config.h"
#include "macro.h"
#include "objstore.h"
#include "objstore_int.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where an option's value goes. */
struct url_parse {
	struct objstore *s;
	struct http_opts *ho;
	char *ca;
	size_t calen;
};

static int set_endpoint(struct url_parse *p, const char *v, char *err, size_t errlen)
{
	struct objstore *s = p->s;
	const char *h = v;
	if (!strncmp(v, "https://", 8)) {
		strcpy(s->scheme, "https");
		h = v + 8;
	} else if (!strncmp(v, "http://", 7)) {
		strcpy(s->scheme, "http");
		h = v + 7;
	} else {
		snprintf(err, errlen, "endpoint must start with http:// or https://");
		return -EINVAL;
	}
	size_t l = strcspn(h, "/");
	if (l == 0 || l >= sizeof(s->host)) {
		snprintf(err, errlen, "endpoint has no host");
		return -EINVAL;
	}
	memcpy(s->host, h, l);
	s->host[l] = 0;
	return 0;
}

static int copy(char *dst, size_t cap, const char *v)
{
	return snprintf(dst, cap, "%s", v) < (int)cap ? 0 : -EINVAL;
}

static int set_region(struct url_parse *p, const char *v, char *err, size_t errlen)
{
	(void)err;
	(void)errlen;
	return copy(p->s->region, sizeof(p->s->region), v);
}

static int set_credentials_file(struct url_parse *p, const char *v, char *err, size_t errlen)
{
	if (v[0] != '/') {
		snprintf(err, errlen, "credentials_file must be an absolute path");
		return -EINVAL;
	}
	return copy(p->s->cp.file, sizeof(p->s->cp.file), v);
}

static int set_profile(struct url_parse *p, const char *v, char *err, size_t errlen)
{
	(void)err;
	(void)errlen;
	return copy(p->s->cp.profile, sizeof(p->s->cp.profile), v);
}

static int set_path_style(struct url_parse *p, const char *v, char *err, size_t errlen)
{
	(void)err;
	(void)errlen;
	p->s->path_style = !strcmp(v, "1") || !strcmp(v, "true");
	return 0;
}

static int set_ca_bundle(struct url_parse *p, const char *v, char *err, size_t errlen)
{
	(void)err;
	(void)errlen;
	return copy(p->ca, p->calen, v);
}

static int set_payload(struct url_parse *p, const char *v, char *err, size_t errlen)
{
	if (strcmp(v, "unsigned") && strcmp(v, "sha256")) {
		snprintf(err, errlen, "payload must be unsigned or sha256");
		return -EINVAL;
	}
	p->s->sign_payload = !strcmp(v, "sha256");
	return 0;
}

static int set_part_size(struct url_parse *p, const char *v, char *err, size_t errlen)
{
	uint64_t x = 0;
	if (config_parse_size(v, &x) < 0 || x < MIN_PART || x > (5ull << 30)) {
		snprintf(err, errlen, "part_size must be 5M..5G");
		return -EINVAL;
	}
	p->s->part_size = x;
	return 0;
}

/* One option: a text option's setter, or a number in min..max for the
 * unsigned at off in the store (or, in_http, in its HTTP options). */
struct url_opt {
	const char *name;
	int (*set)(struct url_parse *p, const char *v, char *err, size_t errlen);
	uint64_t min, max;
	bool in_http;
	size_t off;
};

#define TEXT(n, fn) \
	{ \
		.name = n, .set = fn \
	}
#define NUM(n, lo, hi, field) \
	{ \
		.name = n, .min = lo, .max = hi, .off = offsetof(struct objstore, field) \
	}
#define HTTP_NUM(n, lo, hi, field) \
	{ \
		.name = n, .min = lo, .max = hi, .in_http = true, .off = offsetof(struct http_opts, field) \
	}

static const struct url_opt url_opts[] = {
	TEXT("endpoint", set_endpoint),
	TEXT("region", set_region),
	TEXT("path_style", set_path_style),
	TEXT("ca_bundle", set_ca_bundle),
	TEXT("payload", set_payload),
	TEXT("part_size", set_part_size),
	NUM("concurrency", 1, 256, concurrency),
	NUM("retry_max_attempts", 1, 100, max_attempts),
	NUM("retry_base_ms", 0, 60000, base_ms),
	NUM("retry_cap_ms", 0, 600000, cap_ms),
	HTTP_NUM("connect_timeout_ms", 100, 600000, connect_timeout_ms),
	HTTP_NUM("low_speed_time_s", 1, 3600, low_speed_time_s),
	NUM("list_page", 1, 1000, list_page),
	TEXT("credentials_file", set_credentials_file),
	TEXT("profile", set_profile),
};

static int parse_uint(const char *v, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (errno || end == v || *end || v[0] == '-')
		return -EINVAL;
	*out = x;
	return 0;
}

/* One option; err says what is wrong. */
static int set_opt(struct url_parse *p, const char *k, const char *v, char *err, size_t errlen)
{
	const struct url_opt *o = NULL;
	for (size_t i = 0; i < ELEMENTSOF(url_opts) && o == NULL; i++)
		if (strcmp(k, url_opts[i].name) == 0)
			o = &url_opts[i];
	if (o == NULL) {
		size_t l = (size_t)snprintf(err, errlen, "unknown option (known:");
		for (size_t i = 0; i < ELEMENTSOF(url_opts) && l < errlen; i++)
			l += (size_t)snprintf(err + l, errlen - l, " %s", url_opts[i].name);
		if (l < errlen)
			snprintf(err + l, errlen - l, ")");
		return -EINVAL;
	}
	if (o->set)
		return o->set(p, v, err, errlen);
	uint64_t x = 0;
	if (parse_uint(v, &x) < 0) {
		snprintf(err, errlen, "option %s: '%s' is not a number", k, v);
		return -EINVAL;
	}
	if (x < o->min || x > o->max) {
		snprintf(err, errlen, "value out of range: %s=%s (%" PRIu64 "..%" PRIu64 ")", k, v, o->min, o->max);
		return -EINVAL;
	}
	*(unsigned *)((char *)(o->in_http ? (void *)p->ho : (void *)p->s) + o->off) = (unsigned)x;
	return 0;
}

/* host_template with "{region}" replaced. */
static void default_host(struct objstore *s)
{
	const char *t = s->d->host_template, *at = strstr(t, "{region}");
	if (at)
		snprintf(s->host, sizeof(s->host), "%.*s%s%s", (int)(at - t), t, s->region, at + 8);
	else
		snprintf(s->host, sizeof(s->host), "%s", t);
}

/* S3's and GCS's common rules for a bucket name: 3 to 63 characters of
 * lower-case letters, digits, '-' and '.', starting and ending with a
 * letter or digit, no "..". (GCS allows up to 222 with dots: so do we.) */
static bool bucket_ok(const char *b, size_t cap)
{
	size_t n = strlen(b);
	size_t max = strchr(b, '.') ? 222 : 63;
	if (n < 3 || n > max || n >= cap || strspn(b, "abcdefghijklmnopqrstuvwxyz0123456789-.") != n)
		return false;
	if (!isalnum((unsigned char)b[0]) || !isalnum((unsigned char)b[n - 1]) || strstr(b, ".."))
		return false;
	return true;
}

/* The dialect's defaults, before the URL's options. */
static void defaults(struct objstore *s, const struct store_scheme *row, struct http_opts *ho)
{
	s->d = row->dialect;
	s->path_style = s->d->path_style;
	strcpy(s->scheme, "https");
	const char *reg = NULL;
	for (size_t i = 0; i < 2 && (reg == NULL || !*reg); i++)
		reg = s->d->region_env[i] ? getenv(s->d->region_env[i]) : NULL;
	snprintf(s->region, sizeof(s->region), "%s", reg && *reg ? reg : s->d->default_region);
	s->part_size = 64ull << 20;
	s->concurrency = 8;
	s->max_attempts = 8;
	s->base_ms = 100;
	s->cap_ms = 20000;
	*ho = (struct http_opts){ .connect_timeout_ms = 10000, .low_speed_time_s = 30 };
}

/* The OPTION=VALUE&... after '?' (q, written on). */
static int parse_options(struct url_parse *p, char *q, char *err, size_t errlen)
{
	bool host_set = false;
	char *save = NULL;
	for (char *tok = q ? strtok_r(q, "&", &save) : NULL; tok; tok = strtok_r(NULL, "&", &save)) {
		char *eq = strchr(tok, '=');
		if (eq == NULL) {
			snprintf(err, errlen, "storage URL option '%s' has no value", tok);
			return -EINVAL;
		}
		*eq = 0;
		char e2[256] = "";
		int r = set_opt(p, tok, eq + 1, e2, sizeof(e2));
		if (r < 0) {
			snprintf(err, errlen, "storage URL option %s: %s", tok, e2[0] ? e2 : "bad value");
			return r;
		}
		host_set |= !strcmp(tok, "endpoint");
		if (!strcmp(tok, "region") && !host_set)
			default_host(p->s);
	}
	return 0;
}

int objstore_parse_url(struct objstore *s, const struct store_scheme *row, const char *url, struct http_opts *ho,
		       char *ca, size_t calen, char *err, size_t errlen)
{
	defaults(s, row, ho);
	char *u = strdup(url + strlen(row->scheme) + 3);
	if (u == NULL)
		return -ENOMEM;
	int r = 0;
	char *q = strchr(u, '?');
	if (q)
		*q++ = 0;
	char *slash = strchr(u, '/');
	if (slash)
		*slash++ = 0;
	if (!bucket_ok(u, sizeof(s->bucket))) {
		snprintf(err, errlen,
			 "storage URL '%s': bad bucket name '%s' (3 to 63 characters of a-z, 0-9, '-' and '.', "
			 "starting and ending with a letter or digit)",
			 url, u);
		r = -EINVAL;
		goto out;
	}
	strcpy(s->bucket, u);
	const char *pfx = slash ? slash : "";
	while (*pfx == '/')
		pfx++;
	snprintf(s->prefix, sizeof(s->prefix), "%s", pfx);
	for (size_t l = strlen(s->prefix); l && s->prefix[l - 1] == '/'; l--)
		s->prefix[l - 1] = 0;
	default_host(s);
	struct url_parse p = { .s = s, .ho = ho, .ca = ca, .calen = calen };
	r = parse_options(&p, q, err, errlen);
	ho->max_conns = s->concurrency;
out:
	free(u);
	return r;
}
