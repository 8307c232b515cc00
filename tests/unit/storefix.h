/* A file:// store in a fresh temporary directory, for cmocka tests:
 * cmocka_unit_test_setup_teardown(fn, sf_setup, sf_teardown), and in the
 * test struct store_fixture *f = *state. */
#ifndef CKPTD_STOREFIX_H
#define CKPTD_STOREFIX_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "backends.h"
#include "store.h"

struct store_fixture {
	char dir[64];
	struct store *s;
};

static inline int sf_writable(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	if (flag == FTW_D)
		chmod(path, 0755); /* a test's read-only directory, so its tree can go */
	return 0;
}

static inline int sf_remove(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static inline int sf_setup(void **state)
{
	struct store_fixture *f = calloc(1, sizeof(*f));
	if (f == NULL)
		return -1;
	snprintf(f->dir, sizeof(f->dir), "/tmp/ckptd-unit-XXXXXX");
	char url[128], err[256];
	if (mkdtemp(f->dir) == NULL)
		goto fail;
	snprintf(url, sizeof(url), "file://%s", f->dir);
	if (store_open(url, &f->s, err, sizeof(err)) != 0)
		goto fail;
	*state = f;
	return 0;
fail:
	free(f);
	return -1;
}

static inline int sf_teardown(void **state)
{
	struct store_fixture *f = *state;
	store_free(f->s);
	nftw(f->dir, sf_writable, 16, FTW_PHYS);
	nftw(f->dir, sf_remove, 16, FTW_DEPTH | FTW_PHYS);
	free(f);
	return 0;
}

#endif
