/* Arrays that grow (grow.c): the doubling, its overflow checks and what a
 * failed realloc leaves, written once for every array the daemon extends
 * as it goes (systemd's GREEDY_REALLOC, with the capacity kept by the
 * caller). */
#ifndef CKPTD_GROW_H
#define CKPTD_GROW_H

#include <stddef.h>

/* Make *p, an array with room for *cap elements of size bytes, hold at
 * least need: nothing when it does, else realloc'd to the largest of need,
 * twice *cap and first, but never past max elements or SIZE_MAX bytes.
 * 0, or -ENOMEM (out of memory, or need past those limits) with *p and
 * *cap as they were. */
int grow_array(void **p, size_t *cap, size_t need, size_t size, size_t first, size_t max);

/* grow_array for an array v of any element type whose capacity cap is an
 * unsigned integer lvalue of any width (its largest value is the limit):
 *
 *	if (GROW(v, cap, n + 1, 64) < 0)
 *		return -ENOMEM;
 *	v[n++] = x;
 *
 * 0 or -ENOMEM; on failure v and cap are unchanged. v and cap are
 * evaluated more than once. */
#define GROW(v, cap, need, first) \
	__extension__({ \
		_Static_assert((__typeof__(cap))-1 > 0, "GROW: an unsigned capacity"); \
		void *grow_v_ = (v); \
		size_t grow_cap_ = (cap); \
		int grow_r_ = grow_array(&grow_v_, &grow_cap_, (need), sizeof(*(v)), (first), (__typeof__(cap))-1); \
		if (grow_r_ == 0) { \
			(v) = grow_v_; \
			(cap) = (__typeof__(cap))grow_cap_; \
		} \
		grow_r_; \
	})

#endif
