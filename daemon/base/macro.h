/* Small macros every layer uses. */
#ifndef CKPTD_MACRO_H
#define CKPTD_MACRO_H

/* The number of elements of an array; a pointer does not compile (it
 * would silently give sizeof(pointer) / sizeof(element)). */
#define ELEMENTSOF(x) \
	(__builtin_choose_expr(!__builtin_types_compatible_p(__typeof__(x), __typeof__(&*(x))), \
			       sizeof(x) / sizeof((x)[0]), (void)0))

#endif
