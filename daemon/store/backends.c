#include "backends.h"
#include "objstore.h"
#include "macro.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct store_scheme schemes[] = {
	{ "file", "file", "/abs/path", false, store_fs_open, NULL, store_fs_check },
	{ "s3", "s3", "bucket/prefix", true, objstore_open, &store_s3_dialect, objstore_check },
	{ "gs", "gcs", "bucket/prefix", true, objstore_open, &store_gcs_dialect, objstore_check },
};
#define NSCHEMES ELEMENTSOF(schemes)

const struct store_scheme *store_scheme_of(const char *url)
{
	for (size_t i = 0; i < NSCHEMES; i++) {
		size_t l = strlen(schemes[i].scheme);
		if (strncmp(url, schemes[i].scheme, l) == 0 && strncmp(url + l, "://", 3) == 0)
			return &schemes[i];
	}
	return NULL;
}

static int unknown_scheme(const char *url, char *err, size_t errlen)
{
	char list[512] = "";
	size_t l = 0;
	for (size_t i = 0; i < NSCHEMES && l < sizeof(list); i++)
		l += (size_t)snprintf(list + l, sizeof(list) - l, "%s%s://%s", i ? ", " : "", schemes[i].scheme,
				      schemes[i].example);
	snprintf(err, errlen, "storage URL '%s': unsupported scheme (supported: %s)", url, list);
	return -EPROTONOSUPPORT;
}

int store_open(const char *url, struct store **out, char *err, size_t errlen)
{
	const struct store_scheme *row = store_scheme_of(url);
	if (row == NULL)
		return unknown_scheme(url, err, errlen);
	int r = row->open(row, url, out, err, errlen);
	if (r == 0)
		(*out)->backend = row->label;
	return r;
}

int store_check(const char *url, const char *opts, char *err, size_t errlen)
{
	const struct store_scheme *row = store_scheme_of(url);
	if (row == NULL)
		return unknown_scheme(url, err, errlen);
	int r = store_check_options(url, opts, err, errlen);
	return r < 0 ? r : row->check(row, url, err, errlen);
}

int store_check_options(const char *url, const char *opts, char *err, size_t errlen)
{
	const struct store_scheme *row = store_scheme_of(url);
	if (opts[0] == 0 || (row && row->options))
		return 0;
	/* "s3:// and gs://", "a://, b:// and c://" */
	size_t n = 0, k = 0, l = 0;
	for (size_t i = 0; i < NSCHEMES; i++)
		n += schemes[i].options;
	char list[256] = "";
	for (size_t i = 0; i < NSCHEMES && l < sizeof(list); i++) {
		if (!schemes[i].options)
			continue;
		l += (size_t)snprintf(list + l, sizeof(list) - l, "%s%s://",
				      k == 0      ? ""
				      : k + 1 < n ? ", "
						  : " and ",
				      schemes[i].scheme);
		k++;
	}
	snprintf(err, errlen, "[storage] options (%s) apply to %s only", opts, list);
	return -EINVAL;
}
