#include "hostbuf.h"
#include "memcopy.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int hostbuf_open(int fd, uint64_t id, uint64_t nbytes, struct hostbuf **out,
		 char *err, size_t errlen)
{
	/* F_GET_SEALS answers from the kernel and only for shmem (memfd,
	 * /dev/shm) and hugetlbfs files: anything else (a FUSE or NFS file
	 * whose fstat could block the loop, a pipe, a socket) is refused
	 * before any call that could wait on a server. Reading the seals
	 * before the size also closes a race: once F_SEAL_SHRINK is seen it
	 * can never be removed, so the size checked below stays true. */
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0) {
		snprintf(err, errlen, "buffer fd is not a memfd or shared-memory (/dev/shm) file");
		close(fd);
		return -EBADF;
	}
	struct stat st;
	if (fstat(fd, &st) != 0) {
		int e = errno;
		snprintf(err, errlen, "fstat of buffer fd failed: %s", strerror(e));
		close(fd);
		return -e;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "buffer fd is not a memfd or shared-memory file");
		close(fd);
		return -EBADF;
	}
	if (nbytes == 0 || (uint64_t)st.st_size < nbytes) {
		snprintf(err, errlen, "buffer file holds %" PRIu64 " bytes, registration asks for %" PRIu64,
			 (uint64_t)st.st_size, nbytes);
		close(fd);
		return -EINVAL;
	}
	int acc = fcntl(fd, F_GETFL);
	if (acc < 0 || (acc & O_ACCMODE) != O_RDWR) {
		snprintf(err, errlen, "buffer fd must be open read-write (restore writes into it)");
		close(fd);
		return -EBADF;
	}
	struct hostbuf *b = calloc(1, sizeof(*b));
	if (b == NULL) {
		close(fd);
		return -ENOMEM;
	}
	b->refs = 1;
	b->id = id;
	b->fd = fd;
	b->nbytes = nbytes;
	if (seals & F_SEAL_SHRINK) {
		/* Read-write: restore copies straight into it. */
		void *m = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (m != MAP_FAILED) {
			/* Fault the whole mapping in now, writable, so neither
			 * a save (reads) nor a restore (writes) takes a page
			 * fault per 4 KiB later. */
			(void)madvise(m, nbytes, MADV_POPULATE_WRITE);
			b->map = m;
			b->sealed = true;
		}
	}
	*out = b;
	return 0;
}

struct hostbuf *hostbuf_ref(struct hostbuf *b)
{
	b->refs++;
	return b;
}

void hostbuf_unref(struct hostbuf *b)
{
	if (b == NULL || --b->refs > 0)
		return;
	if (b->map)
		munmap((void *)b->map, b->nbytes);
	if (b->fd >= 0)
		close(b->fd);
	free(b);
}

int hostbuf_read(const struct hostbuf *b, uint64_t off, void *dst, size_t len)
{
	if (off > b->nbytes || len > b->nbytes - off)
		return -ERANGE;
	if (b->sealed) {
		memcpy(dst, b->map + off, len);
		return 0;
	}
	uint8_t *p = dst;
	while (len > 0) {
		ssize_t n = pread(b->fd, p, len, (off_t)off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EFAULT; /* the client truncated its file */
		p += n;
		off += (uint64_t)n;
		len -= (size_t)n;
	}
	return 0;
}

int hostbuf_write(const struct hostbuf *b, uint64_t off, const void *src, size_t len)
{
	if (off > b->nbytes || len > b->nbytes - off)
		return -ERANGE;
	if (b->sealed) {
		memcopy_stream(b->map + off, src, len);
		return 0;
	}
	/* pwrite past EOF would grow a file the client shrank; refuse. */
	struct stat st;
	if (fstat(b->fd, &st) != 0)
		return -errno;
	if ((uint64_t)st.st_size < off + len)
		return -EFAULT;
	const uint8_t *p = src;
	while (len > 0) {
		ssize_t n = pwrite(b->fd, p, len, (off_t)off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		p += n;
		off += (uint64_t)n;
		len -= (size_t)n;
	}
	return 0;
}
