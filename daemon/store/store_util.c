/* What every backend shares: freeing stores and listings, and the error
 * words of a backend's last failure (store.h). Apart from the scheme
 * table (backends.c), so that the backends call down into this file, not
 * back up into the one that opens them. */
#include "store.h"

#include <errno.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void store_free(struct store *s)
{
	if (s)
		s->ops->free(s);
}

void store_names_free(char **names, size_t n)
{
	if (names == NULL)
		return;
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

void store_entries_free(struct store_entry *v, size_t n)
{
	if (v == NULL)
		return;
	for (size_t i = 0; i < n; i++)
		free(v[i].name);
	free(v);
}

int store_entries_to_names(struct store_entry *v, size_t n, char ***names, size_t *count)
{
	char **nm = malloc((n ? n : 1) * sizeof(*nm));
	if (nm == NULL) {
		store_entries_free(v, n);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		nm[i] = v[i].name;
	free(v);
	*names = nm;
	*count = n;
	return 0;
}

static __thread char last_error[1024];

const char *store_error(int r)
{
	return last_error[0] ? last_error : strerror(r < 0 ? -r : r);
}

void store_set_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
}

void store_clear_error(void)
{
	last_error[0] = 0;
}

bool store_has_error(void)
{
	return last_error[0] != 0;
}

int64_t store_parse_time(const char *t)
{
	struct tm tm = { 0 };
	const char *end = t ? strptime(t, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
	if (end == NULL)
		return 0;
	time_t secs = timegm(&tm);
	/* Before the epoch, or past 2262 (int64 ns): not a time we can hold. */
	if (secs <= 0 || secs >= INT64_MAX / 1000000000 - 1)
		return 0;
	int64_t ns = (int64_t)secs * 1000000000;
	if (*end == '.') {
		int64_t scale = 100000000;
		for (end++; *end >= '0' && *end <= '9'; end++, scale /= 10)
			ns += (*end - '0') * scale;
	}
	return ns > 0 ? ns : 0;
}

static int write_announced(struct store *s, const char *key, const struct iovec *iov, int iovcnt, bool create)
{
	uint64_t id = 0;
	if (s->on_temp_begin) {
		int r = s->on_temp_begin(s->on_temp_ctx, key, &id);
		if (r < 0)
			return r;
	}
	int r = create ? s->ops->create(s, key, iov, iovcnt, NULL) : s->ops->put(s, key, iov, (size_t)iovcnt, NULL);
	if (s->on_temp_end)
		s->on_temp_end(s->on_temp_ctx, id);
	return r;
}

int store_create_announced(struct store *s, const char *key, const struct iovec *iov, int iovcnt)
{
	return write_announced(s, key, iov, iovcnt, true);
}

int store_put_announced(struct store *s, const char *key, const struct iovec *iov, int iovcnt)
{
	return write_announced(s, key, iov, iovcnt, false);
}
