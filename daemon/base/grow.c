#include "grow.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

int grow_array(void **p, size_t *cap, size_t need, size_t size, size_t first, size_t max)
{
	if (need <= *cap)
		return 0;
	if (size == 0)
		size = 1;
	if (max > SIZE_MAX / size)
		max = SIZE_MAX / size;
	if (need > max)
		return -ENOMEM;
	size_t nc = *cap > max / 2 ? max : 2 * *cap;
	if (nc < first)
		nc = first;
	if (nc < need)
		nc = need;
	if (nc > max)
		nc = max;
	void *nv = realloc(*p, nc * size);
	if (nv == NULL)
		return -ENOMEM;
	*p = nv;
	*cap = nc;
	return 0;
}
