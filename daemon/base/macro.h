/* Small macros every layer uses. */
#ifndef CKPTD_MACRO_H
#define CKPTD_MACRO_H

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

/* The number of elements of an array; a pointer does not compile (it
 * would silently give sizeof(pointer) / sizeof(element)). */
#define ELEMENTSOF(x) \
	(__builtin_choose_expr(!__builtin_types_compatible_p(__typeof__(x), __typeof__(&*(x))), \
			       sizeof(x) / sizeof((x)[0]), (void)0))

/* Cleanup the systemd way: a variable declared with one of these is freed
 * or closed when it goes out of scope, on every return, so that a function
 * with several error returns needs no ladder of frees or closes:
 *
 *	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
 *	_cleanup_free_ char *buf = malloc(len);
 *	...
 *	*out = TAKE_PTR(buf);   (ownership moved out: nothing freed)
 *	return TAKE_FD(fd);
 *
 * The return value is computed before the cleanups run, and closing keeps
 * errno, so "return -errno" says what failed. A goto may not jump into the
 * scope of such a variable (the compiler refuses it). */
#define _cleanup_(f) __attribute__((cleanup(f)))
#define _cleanup_free_ _cleanup_(cleanup_freep)
#define _cleanup_close_ _cleanup_(cleanup_closep)

static inline void cleanup_freep(void *p)
{
	free(*(void **)p);
}

/* Closes an fd >= 0; a negative one (an -errno kept in the variable) is
 * left alone. */
static inline void cleanup_closep(int *fd)
{
	if (*fd >= 0) {
		int e = errno;
		close(*fd);
		errno = e;
	}
}

/* The value of p, with p set to NULL: ownership handed out of a
 * _cleanup_free_ variable. */
#define TAKE_PTR(p) \
	__extension__({ \
		__typeof__(p) take_ptr_ = (p); \
		(p) = NULL; \
		take_ptr_; \
	})

/* The value of fd, with fd set to -1: out of a _cleanup_close_ variable. */
#define TAKE_FD(fd) \
	__extension__({ \
		int take_fd_ = (fd); \
		(fd) = -1; \
		take_fd_; \
	})

#endif
