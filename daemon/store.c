#include "store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int store_open(const char *url, struct store **out, char *err, size_t errlen)
{
	if (strncmp(url, "file://", 7) == 0)
		return store_fs_open(url, out, err, errlen);
	snprintf(err, errlen, "storage URL '%s': unsupported scheme (supported: file:///abs/path)", url);
	return -EPROTONOSUPPORT;
}

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
