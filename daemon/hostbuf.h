/* Registered host buffers: a memfd or /dev/shm file handed over by a
 * trainer. Reads and writes never fault on a file the client shrank:
 * sealed memfds (F_SEAL_SHRINK) are mapped once at registration and
 * copied with memcpy both ways; anything else goes through pread/pwrite,
 * which return a short count instead of raising SIGBUS. */
#ifndef CKPTD_HOSTBUF_H
#define CKPTD_HOSTBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct hostbuf {
	unsigned refs;       /* loop thread only */
	uint64_t id;
	int fd;
	uint64_t nbytes;
	bool sealed;
	uint8_t *map;        /* sealed only: shared, read-write */
};

/* Takes ownership of fd (closed on failure too). */
int hostbuf_open(int fd, uint64_t id, uint64_t nbytes, struct hostbuf **out,
		 char *err, size_t errlen);
struct hostbuf *hostbuf_ref(struct hostbuf *b);
void hostbuf_unref(struct hostbuf *b);
/* Thread-safe. 0, or -EFAULT when the file is shorter than the range. */
int hostbuf_read(const struct hostbuf *b, uint64_t off, void *dst, size_t len);
int hostbuf_write(const struct hostbuf *b, uint64_t off, const void *src, size_t len);

#endif
