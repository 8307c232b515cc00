/* The replica ring (ring.h). */
#include "ring.h"
#include "grow.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int cmp_name(const void *a, const void *b)
{
	return strcmp(a, b);
}

static int add(struct ring *r, size_t *cap, const char *s, size_t len)
{
	while (len > 0 && (s[0] == ' ' || s[0] == '\t'))
		s++, len--;
	while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t'))
		len--;
	if (len == 0)
		return 0;
	if (len >= RING_NAME_MAX)
		return -EINVAL;
	if (r->n == RING_MAX)
		return -E2BIG;
	if (GROW(r->names, *cap, r->n + 1, 16) < 0)
		return -ENOMEM;
	memcpy(r->names[r->n], s, len);
	r->names[r->n][len] = '\0';
	r->n++;
	return 0;
}

int ring_build(struct ring *r, const char *self, const char *list, const char *const *extra, size_t nextra)
{
	memset(r, 0, sizeof(*r));
	size_t cap = 0;
	int e = self ? add(r, &cap, self, strlen(self)) : -EINVAL;
	if (e == 0 && r->n == 0)
		e = -EINVAL; /* self is blank */
	for (const char *p = list ? list : ""; e == 0 && *p;) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		e = add(r, &cap, p, len);
		p += len + (comma != NULL);
	}
	for (size_t i = 0; e == 0 && i < nextra; i++)
		e = add(r, &cap, extra[i], strlen(extra[i]));
	if (e < 0) {
		ring_free(r);
		return e;
	}
	qsort(r->names, r->n, sizeof(*r->names), cmp_name);
	size_t w = 0;
	for (size_t i = 0; i < r->n; i++)
		if (w == 0 || strcmp(r->names[w - 1], r->names[i]) != 0)
			memmove(r->names[w++], r->names[i], RING_NAME_MAX);
	r->n = w;
	return 0;
}

void ring_free(struct ring *r)
{
	free(r->names);
	r->names = NULL;
	r->n = 0;
}

size_t ring_successors(const struct ring *r, const char *self, uint32_t k, const char **out, size_t max)
{
	size_t at = r->n;
	for (size_t i = 0; i < r->n; i++)
		if (strcmp(r->names[i], self) == 0)
			at = i;
	if (at == r->n)
		return 0;
	size_t n = 0;
	for (size_t step = 1; step < r->n && n < k && n < max; step++)
		out[n++] = r->names[(at + step) % r->n];
	return n;
}
