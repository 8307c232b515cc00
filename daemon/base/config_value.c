/* The values of ckptd.conf (ckptd.conf(5)): sizes, durations, quotas, id
 * lists, and one parse/print/compare type per kind of key, which the key
 * tables of config.c name. */
#include "config_value.h"
#include "log.h"
#include "macro.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The decimal number s starts with, *end just after it. strtoull would
 * skip leading blanks and accept a sign (" -1" is ULLONG_MAX), so a digit
 * must come first. 0, -EINVAL or -ERANGE. */
static int leading_number(const char *s, unsigned long long *v, char **end)
{
	if (s == NULL || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	*v = strtoull(s, end, 10);
	if (errno == ERANGE)
		return -ERANGE;
	return errno != 0 || *end == s ? -EINVAL : 0;
}

int config_parse_duration(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	int r = leading_number(s, &v, &end);
	if (r < 0)
		return r;
	uint64_t mul = 1;
	switch (*end) {
	case '\0': break;
	case 's':
		mul = 1;
		end++;
		break;
	case 'm':
		mul = 60;
		end++;
		break;
	case 'h':
		mul = 3600;
		end++;
		break;
	case 'd':
		mul = 86400;
		end++;
		break;
	default: return -EINVAL;
	}
	if (*end != '\0')
		return -EINVAL;
	if (v > UINT64_MAX / mul)
		return -ERANGE;
	*out = v * mul;
	return 0;
}

/* "50%" or a size: exactly one of *pct, *bytes is set. */
static int parse_quota(const char *s, uint64_t *bytes, uint32_t *pct)
{
	size_t n = strlen(s);
	if (n > 1 && s[n - 1] == '%') {
		char buf[32];
		if (n >= sizeof(buf))
			return -EINVAL;
		memcpy(buf, s, n - 1);
		buf[n - 1] = '\0';
		uint64_t v;
		int r = config_parse_size(buf, &v);
		if (r < 0 || v == 0 || v > 100)
			return -EINVAL;
		*pct = (uint32_t)v;
		*bytes = 0;
		return 0;
	}
	int r = config_parse_size(s, bytes);
	if (r < 0)
		return r;
	if (*bytes == 0)
		return -EINVAL;
	*pct = 0;
	return 0;
}

int config_parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	int r = leading_number(s, &v, &end);
	if (r < 0)
		return r;
	unsigned shift = 0;
	switch (*end) {
	case '\0': break;
	case 'k':
	case 'K':
		shift = 10;
		end++;
		break;
	case 'm':
	case 'M':
		shift = 20;
		end++;
		break;
	case 'g':
	case 'G':
		shift = 30;
		end++;
		break;
	case 't':
	case 'T':
		shift = 40;
		end++;
		break;
	default: return -EINVAL;
	}
	if (*end == 'i' || *end == 'I')
		end++;
	if (*end == 'b' || *end == 'B')
		end++;
	if (*end != '\0')
		return -EINVAL;
	if (shift && v > (UINT64_MAX >> shift))
		return -ERANGE;
	*out = (uint64_t)v << shift;
	return 0;
}

/* A size up to 2^32-1. */
static int parse_size32(const char *s, uint64_t *out)
{
	int r = config_parse_size(s, out);
	return r < 0 ? r : *out > UINT32_MAX ? -ERANGE : 0;
}

/* "1000, 0 42": a list of numeric ids; an empty value clears the list. */
static int parse_ids(const char *s, unsigned *ids, size_t cap, size_t *n)
{
	size_t k = 0;
	const char *p = s;
	while (*p) {
		while (*p == ' ' || *p == ',' || *p == '\t')
			p++;
		if (*p == '\0')
			break;
		if (*p < '0' || *p > '9') /* strtoul takes "-0" and wraps signs */
			return -EINVAL;
		char *end;
		errno = 0;
		unsigned long v = strtoul(p, &end, 10);
		if (errno || end == p || v > UINT32_MAX - 1)
			return -EINVAL;
		if (k == cap)
			return -E2BIG;
		ids[k++] = (unsigned)v;
		p = end;
		if (*p && *p != ' ' && *p != ',' && *p != '\t')
			return -EINVAL;
	}
	*n = k;
	return 0;
}

static int copy_str(char *dst, size_t cap, const char *v)
{
	if (strlen(v) >= cap)
		return -ENAMETOOLONG;
	memcpy(dst, v, strlen(v) + 1);
	return 0;
}

/* ---- Value types: parse, print, compare ----
 * base is the struct config (struct job_config in job rows); the value is
 * at k->off in it (and k->off2 for a second field). */

static uint64_t get_uint(const void *p, size_t size)
{
	uint8_t u8;
	uint32_t u32;
	uint64_t u64;
	switch (size) {
	case 1: memcpy(&u8, p, 1); return u8;
	case 4: memcpy(&u32, p, 4); return u32;
	case 8: memcpy(&u64, p, 8); return u64;
	}
	assert(!"a number field of 1, 4 or 8 bytes");
	return 0;
}

void cfg_set_uint(void *p, size_t size, uint64_t v)
{
	uint8_t u8 = (uint8_t)v;
	uint32_t u32 = (uint32_t)v;
	switch (size) {
	case 1: memcpy(p, &u8, 1); return;
	case 4: memcpy(p, &u32, 4); return;
	case 8: memcpy(p, &v, 8); return;
	}
	assert(!"a number field of 1, 4 or 8 bytes");
}

uint64_t cfg_key_uint(const struct config_key *k, const void *base)
{
	return get_uint(CFLD(base, k->off), k->size);
}

static bool same_bytes(const struct config_key *k, const void *a, const void *b)
{
	return memcmp(CFLD(a, k->off), CFLD(b, k->off), k->size) == 0 &&
	       (k->size2 == 0 || memcmp(CFLD(a, k->off2), CFLD(b, k->off2), k->size2) == 0);
}

static int parse_str(const struct config_key *k, void *base, const char *name, const char *v)
{
	(void)name;
	return copy_str(FLD(base, k->off), k->size, v);
}

static void print_str(const struct config_key *k, const void *base, FILE *f)
{
	fprintf(f, "%s = %s\n", k->name, (const char *)CFLD(base, k->off));
}

static bool same_str(const struct config_key *k, const void *a, const void *b)
{
	return strcmp(CFLD(a, k->off), CFLD(b, k->off)) == 0;
}

/* A number key's field set from the text by conv (0 or -errno). */
static int parse_number(const struct config_key *k, void *base, const char *v, int (*conv)(const char *, uint64_t *))
{
	uint64_t x;
	int r = conv(v, &x);
	if (r == 0)
		cfg_set_uint(FLD(base, k->off), k->size, x);
	return r;
}

/* A number up to 2^32-1, with the size suffixes of config_parse_size. */
static int parse_num32(const struct config_key *k, void *base, const char *name, const char *v)
{
	(void)name;
	return parse_number(k, base, v, parse_size32);
}

static int parse_size(const struct config_key *k, void *base, const char *name, const char *v)
{
	(void)name;
	return parse_number(k, base, v, config_parse_size);
}

static void print_num(const struct config_key *k, const void *base, FILE *f)
{
	fprintf(f, "%s = %" PRIu64 "\n", k->name, cfg_key_uint(k, base));
}

/* "90", "30s", "15m", "2h", "7d": seconds; printed as "Ns". */
static int parse_duration(const struct config_key *k, void *base, const char *name, const char *v)
{
	(void)name;
	return parse_number(k, base, v, config_parse_duration);
}

static void print_duration(const struct config_key *k, const void *base, FILE *f)
{
	fprintf(f, "%s = %" PRIu64 "s\n", k->name, cfg_key_uint(k, base));
}

/* true | yes | 1, false | no | 0. */
/* A file mode in octal, "0640": permission bits only (no setuid, sticky). */
static int parse_mode(const struct config_key *k, void *base, const char *name, const char *v)
{
	(void)name;
	char *end = NULL;
	errno = 0;
	unsigned long x = strtoul(v, &end, 8);
	if (v[0] < '0' || v[0] > '7' || *end || errno || x > 0777 || !(x & 0400))
		return -EINVAL; /* the daemon must be able to read what it writes */
	cfg_set_uint(FLD(base, k->off), k->size, x);
	return 0;
}

static void print_mode(const struct config_key *k, const void *base, FILE *f)
{
	fprintf(f, "%s = %04" PRIo64 "\n", k->name, cfg_key_uint(k, base));
}

static int parse_bool(const struct config_key *k, void *base, const char *name, const char *v)
{
	(void)name;
	bool on = strcmp(v, "true") == 0 || strcmp(v, "yes") == 0 || strcmp(v, "1") == 0;
	if (!on && strcmp(v, "false") && strcmp(v, "no") && strcmp(v, "0"))
		return -EINVAL;
	cfg_set_uint(FLD(base, k->off), k->size, on);
	return 0;
}

static void print_bool(const struct config_key *k, const void *base, FILE *f)
{
	fprintf(f, "%s = %s\n", k->name, cfg_key_uint(k, base) ? "true" : "false");
}

/* One of k->names; the value is its index. */
static int parse_enum(const struct config_key *k, void *base, const char *name, const char *v)
{
	(void)name;
	for (size_t i = 0; i < k->nnames; i++)
		if (k->names[i] && strcmp(v, k->names[i]) == 0) {
			cfg_set_uint(FLD(base, k->off), k->size, i);
			return 0;
		}
	return -EINVAL;
}

/* A value between names prints as the next named one above it (log level
 * 5 as info); past the last, as the last. */
static void print_enum(const struct config_key *k, const void *base, FILE *f)
{
	uint64_t v = cfg_key_uint(k, base);
	const char *n = k->names[k->nnames - 1];
	for (size_t i = v < k->nnames ? v : k->nnames; i < k->nnames; i++)
		if (k->names[i]) {
			n = k->names[i];
			break;
		}
	fprintf(f, "%s = %s\n", k->name, n);
}

/* "50%" or a size: off is the bytes (uint64_t), off2 the percentage
 * (uint32_t); neither set is not printed. */
static int parse_quota_key(const struct config_key *k, void *base, const char *name, const char *v)
{
	(void)name;
	return parse_quota(v, FLD(base, k->off), FLD(base, k->off2));
}

static void print_quota(const struct config_key *k, const void *base, FILE *f)
{
	uint64_t bytes;
	uint32_t pct;
	memcpy(&bytes, CFLD(base, k->off), sizeof(bytes));
	memcpy(&pct, CFLD(base, k->off2), sizeof(pct));
	if (pct)
		fprintf(f, "%s = %u%%\n", k->name, pct);
	else if (bytes)
		fprintf(f, "%s = %" PRIu64 "\n", k->name, bytes);
}

/* "1000, 0 42": off is the array (unsigned[CONFIG_MAX_IDS]), off2 the
 * count (size_t). */
static int parse_ids_key(const struct config_key *k, void *base, const char *name, const char *v)
{
	(void)name;
	return parse_ids(v, FLD(base, k->off), k->size / sizeof(unsigned), FLD(base, k->off2));
}

static void print_ids(const struct config_key *k, const void *base, FILE *f)
{
	const unsigned *ids = CFLD(base, k->off);
	size_t n;
	memcpy(&n, CFLD(base, k->off2), sizeof(n));
	fprintf(f, "%s =", k->name);
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%s %u", i ? "," : "", ids[i]);
	fprintf(f, "\n");
}

static bool same_ids(const struct config_key *k, const void *a, const void *b)
{
	size_t na, nb;
	memcpy(&na, CFLD(a, k->off2), sizeof(na));
	memcpy(&nb, CFLD(b, k->off2), sizeof(nb));
	return na == nb && memcmp(CFLD(a, k->off), CFLD(b, k->off), na * sizeof(unsigned)) == 0;
}

/* The "*" row of [storage]: object-store options (endpoint, region,
 * part_size ...) gathered as k=v&k=v, checked by the backend when it opens. */
static int parse_opts(const struct config_key *k, void *base, const char *name, const char *v)
{
	char *opts = FLD(base, k->off);
	size_t l = strlen(opts);
	int n = snprintf(opts + l, k->size - l, "%s%s=%s", l ? "&" : "", name, v);
	return (n < 0 || (size_t)n >= k->size - l || strpbrk(v, "&?")) ? -EINVAL : 0;
}

static void print_opts(const struct config_key *k, const void *base, FILE *f)
{
	char *o = strndup(CFLD(base, k->off), k->size);
	if (o == NULL)
		return;
	for (char *t = strtok(o, "&"); t; t = strtok(NULL, "&")) {
		char *eq = strchr(t, '=');
		if (eq) {
			*eq = 0;
			fprintf(f, "%s = %s\n", t, eq + 1);
		}
	}
	free(o);
}

const struct config_type cfg_str = { parse_str, print_str, same_str };
const struct config_type cfg_u32 = { parse_num32, print_num, same_bytes };
const struct config_type cfg_size = { parse_size, print_num, same_bytes };
const struct config_type cfg_duration = { parse_duration, print_duration, same_bytes };
const struct config_type cfg_bool = { parse_bool, print_bool, same_bytes };
const struct config_type cfg_mode = { parse_mode, print_mode, same_bytes };
const struct config_type cfg_enum = { parse_enum, print_enum, same_bytes };
const struct config_type cfg_quota = { parse_quota_key, print_quota, same_bytes };
const struct config_type cfg_ids = { parse_ids_key, print_ids, same_ids };
const struct config_type cfg_opts = { parse_opts, print_opts, same_str };
