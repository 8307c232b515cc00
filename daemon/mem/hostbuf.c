#include "hostbuf.h"
#include "crc32c.h"
#include "cudadev.h"
#include "memcopy.h"

#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Mappings of host files, shared by every registration of the same file
 * that fits in them: a client that registers one file many times costs
 * one mapping, one pre-fault and one fd, not one each (issue "Security":
 * 400 registrations of one 256 MiB memfd grew the page tables to 200 MB).
 * Loop thread only, as hostbuf.refs. */
struct hostmap {
	unsigned refs;
	dev_t dev;
	ino_t ino;
	int fd;
	uint8_t *map;
	uint64_t len;
	struct hostmap *next, **pprev; /* in its bucket */
};

/* By (dev, ino), chained: a trainer registers one file per tensor
 * storage, 10,000 of them for a large model, and a list made each
 * registration and each release walk all the others. */
static struct hostmap **buckets;
static size_t nbuckets, nmaps;

static size_t bucket_of(dev_t dev, ino_t ino)
{
	uint64_t h = ((uint64_t)ino * 0x9e3779b97f4a7c15ull) ^ (uint64_t)dev;
	return (size_t)(h ^ (h >> 29)) & (nbuckets - 1);
}

static void bucket_insert(struct hostmap *m)
{
	struct hostmap **head = &buckets[bucket_of(m->dev, m->ino)];
	m->next = *head;
	if (*head)
		(*head)->pprev = &m->next;
	*head = m;
	m->pprev = head;
}

/* Room for one more, growing the table at load 1. */
static int hostmap_reserve(void)
{
	if (nmaps + 1 <= nbuckets)
		return 0;
	size_t n = nbuckets ? nbuckets * 2 : 64;
	struct hostmap **nb = calloc(n, sizeof(*nb));
	if (nb == NULL)
		return -ENOMEM;
	struct hostmap **old = buckets;
	size_t oldn = nbuckets;
	buckets = nb;
	nbuckets = n;
	for (size_t i = 0; i < oldn; i++)
		for (struct hostmap *m = old[i], *next; m; m = next) {
			next = m->next;
			bucket_insert(m);
		}
	free(old);
	return 0;
}

static struct hostmap *hostmap_find(const struct stat *st, uint64_t nbytes)
{
	if (nbuckets == 0)
		return NULL;
	for (struct hostmap *m = buckets[bucket_of(st->st_dev, st->st_ino)]; m; m = m->next)
		if (m->dev == st->st_dev && m->ino == st->st_ino && m->len >= nbytes)
			return m;
	return NULL;
}

static void hostmap_put(struct hostmap *hm)
{
	if (--hm->refs > 0)
		return;
	*hm->pprev = hm->next;
	if (hm->next)
		hm->next->pprev = hm->pprev;
	nmaps--;
	munmap(hm->map, hm->len);
	close(hm->fd);
	free(hm);
}

/* Whether fd is a buffer ckptd takes: a shmem or hugetlbfs file, open
 * read-write, of nbytes at least; its stat and seals out. The fd is left
 * open (the caller closes it on an error). */
static int check_buffer_fd(int fd, uint64_t nbytes, struct stat *st, int *seals, char *err, size_t errlen)
{
	/* F_GET_SEALS answers from the kernel and only for shmem (memfd,
	 * /dev/shm) and hugetlbfs files: anything else (a FUSE or NFS file
	 * whose fstat could block the loop, a pipe, a socket) is refused
	 * before any call that could wait on a server. Reading the seals
	 * before the size also closes a race: once F_SEAL_SHRINK is seen it
	 * can never be removed, so the size checked below stays true. */
	*seals = fcntl(fd, F_GET_SEALS);
	if (*seals < 0) {
		snprintf(err, errlen, "buffer fd is not a memfd or shared-memory (/dev/shm) file");
		return -EBADF;
	}
	if (fstat(fd, st) != 0) {
		int e = errno;
		snprintf(err, errlen, "fstat of buffer fd failed: %s", strerror(e));
		return -e;
	}
	if (!S_ISREG(st->st_mode)) {
		snprintf(err, errlen, "buffer fd is not a memfd or shared-memory file");
		return -EBADF;
	}
	if (nbytes == 0 || (uint64_t)st->st_size < nbytes) {
		snprintf(err, errlen, "buffer file holds %" PRIu64 " bytes, registration asks for %" PRIu64,
			 (uint64_t)st->st_size, nbytes);
		return -EINVAL;
	}
	int acc = fcntl(fd, F_GETFL);
	if (acc < 0 || (acc & O_ACCMODE) != O_RDWR) {
		snprintf(err, errlen, "buffer fd must be open read-write (restore writes into it)");
		return -EBADF;
	}
	return 0;
}

/* A new mapping of fd (st) for b, shared with later buffers of the same
 * file. Mapped once, read-write (restore copies straight into it), and
 * faulted in now so neither a save nor a restore takes a page fault per
 * 4 KiB later. A sealed file cannot shrink; an unsealed one is copied
 * under a SIGBUS guard (see guarded_copy). A failed mmap leaves b
 * unmapped; -ENOMEM (nothing mapped) when the map cannot be kept. */
static int hostmap_new(int fd, const struct stat *st, uint64_t nbytes, struct hostbuf *b)
{
	void *m = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return 0;
	/* Not for a sparse file: that would allocate what the client
	 * never did, on the loop thread. */
	if ((uint64_t)st->st_blocks * 512 >= nbytes)
		(void)madvise(m, nbytes, MADV_POPULATE_WRITE);
	struct hostmap *hm = hostmap_reserve() == 0 ? calloc(1, sizeof(*hm)) : NULL;
	if (hm == NULL) {
		munmap(m, nbytes);
		return -ENOMEM;
	}
	*hm = (struct hostmap){ .refs = 1, .dev = st->st_dev, .ino = st->st_ino, .fd = fd, .map = m, .len = nbytes };
	bucket_insert(hm);
	nmaps++;
	b->hm = hm;
	b->map = m;
	return 0;
}

int hostbuf_open(int fd, uint64_t id, uint64_t nbytes, struct hostbuf **out, char *err, size_t errlen)
{
	struct stat st;
	int seals;
	int r = check_buffer_fd(fd, nbytes, &st, &seals, err, errlen);
	if (r < 0) {
		close(fd);
		return r;
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
	b->sealed = (seals & F_SEAL_SHRINK) != 0;
	struct hostmap *hm = hostmap_find(&st, nbytes);
	if (hm != NULL) {
		close(fd);
		hm->refs++;
		b->hm = hm;
		b->fd = hm->fd;
		b->map = hm->map;
		*out = b;
		return 0;
	}
	if (hostmap_new(fd, &st, nbytes, b) < 0) {
		close(fd);
		free(b);
		return -ENOMEM;
	}
	*out = b;
	return 0;
}

int hostbuf_from_cuda(struct cudabuf *cb, uint64_t id, uint64_t nbytes, struct hostbuf **out)
{
	struct hostbuf *b = calloc(1, sizeof(*b));
	if (b == NULL) {
		cudabuf_free(cb);
		return -ENOMEM;
	}
	b->refs = 1;
	b->id = id;
	b->fd = -1;
	b->nbytes = nbytes;
	b->cuda = cb;
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
	if (b->hm)
		hostmap_put(b->hm);
	else if (b->fd >= 0)
		close(b->fd);
	cudabuf_free(b->cuda);
	free(b);
}

/* SIGBUS guard for copies from and to unsealed mappings: a client that
 * truncates its file makes the access fault; the handler jumps back to the
 * copy, which fails with -EFAULT instead of killing the daemon. */
static __thread sigjmp_buf *guard;

static void on_sigbus(int sig, siginfo_t *si, void *uctx)
{
	(void)si;
	(void)uctx;
	if (guard != NULL)
		siglongjmp(*guard, 1);
	/* Not ours: die as the default action would. */
	signal(sig, SIG_DFL);
	raise(sig);
}

int hostbuf_init(void)
{
	struct sigaction sa = { .sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO | SA_NODEFER };
	sigemptyset(&sa.sa_mask);
	return sigaction(SIGBUS, &sa, NULL) == 0 ? 0 : -errno;
}

/* memcopy_stream (and a crc of the source) that survives the mapping
 * shrinking underneath. 0 or -EFAULT. */
static int guarded_copy(void *dst, const void *src, size_t len, uint32_t *crc)
{
	sigjmp_buf jb;
	/* No mask to save: SA_NODEFER leaves SIGBUS unblocked in the
	 * handler, and skipping the save skips a syscall per block. */
	if (sigsetjmp(jb, 0) != 0) {
		guard = NULL;
		memcopy_fence(); /* the copy's own fence was jumped over */
		return -EFAULT;
	}
	guard = &jb;
	memcopy_crc(dst, src, len, crc);
	guard = NULL;
	return 0;
}

int hostbuf_copy_out(const struct hostbuf *b, uint64_t off, void *dst, size_t len, uint32_t *crc)
{
	if (off > b->nbytes || len > b->nbytes - off)
		return -ERANGE;
	if (b->cuda) {
		int r = cuda_read(b->cuda, off, dst, len);
		if (r == 0 && crc)
			*crc = crc32c_update(*crc, dst, len);
		return r;
	}
	if (b->map) {
		if (b->sealed) {
			memcopy_crc(dst, b->map + off, len, crc);
			return 0;
		}
		return guarded_copy(dst, b->map + off, len, crc);
	}
	int r = hostbuf_read(b, off, dst, len);
	if (r == 0 && crc)
		*crc = crc32c_update(*crc, dst, len);
	return r;
}

int hostbuf_read(const struct hostbuf *b, uint64_t off, void *dst, size_t len)
{
	if (off > b->nbytes || len > b->nbytes - off)
		return -ERANGE;
	if (b->cuda)
		return cuda_read(b->cuda, off, dst, len);
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
	return hostbuf_write_crc(b, off, src, len, NULL);
}

int hostbuf_write_crc(const struct hostbuf *b, uint64_t off, const void *src, size_t len, uint32_t *crc)
{
	if (off > b->nbytes || len > b->nbytes - off)
		return -ERANGE;
	if (b->map && b->sealed) {
		memcopy_crc(b->map + off, src, len, crc);
		return 0;
	}
	if (b->map)
		return guarded_copy(b->map + off, src, len, crc);
	/* A device buffer or pwrite: the crc of src, then the copy. */
	if (crc)
		*crc = crc32c_update(*crc, src, len);
	if (b->cuda)
		return cuda_write(b->cuda, off, src, len);
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
