/* Every storage backend, by URL scheme: the only place that knows the
 * schemes (fio's ioengine_ops, curl's scheme and handler). Above the
 * backends, which see only struct store_scheme (store.h). */
#ifndef CKPTD_BACKENDS_H
#define CKPTD_BACKENDS_H

#include <stddef.h>

#include "store.h"

/* The row of url's scheme, or NULL. */
const struct store_scheme *store_scheme_of(const char *url);
/* Opens the backend named by url's scheme; an unknown scheme's error
 * lists the table. */
int store_open(const char *url, struct store **out, char *err, size_t errlen);
/* 0 if url's backend takes [storage] options opts (or opts is empty);
 * else -EINVAL with err naming the schemes that do. */
int store_check_options(const char *url, const char *opts, char *err, size_t errlen);
/* Everything store_open would refuse in url (with its [storage] options
 * opts), without I/O: the scheme, store_check_options, then the backend's
 * own check (path; bucket and every option). For --check-config. */
int store_check(const char *url, const char *opts, char *err, size_t errlen);

#endif
