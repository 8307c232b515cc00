/* Registered buffers: a memfd or /dev/shm file handed over by a trainer,
 * mapped once at registration, or an imported CUDA allocation (cuda
 * non-NULL; copies then go through cuda.c). Copies never take the daemon down
 * when a client shrinks its file: sealed memfds (F_SEAL_SHRINK) cannot
 * shrink; unsealed files are copied under a SIGBUS guard that turns the
 * fault into -EFAULT. If mapping fails, pread/pwrite are used. */
#ifndef CKPTD_HOSTBUF_H
#define CKPTD_HOSTBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct hostmap;

struct hostbuf {
	unsigned refs;   /* loop thread only */
	unsigned tables; /* entries of tensor tables naming it (savetab.c): it stays registered */
	uint64_t id;
	int fd; /* the mapping's (shared with other registrations of the file) */
	uint64_t nbytes;
	bool sealed;
	uint8_t *map;         /* shared, read-write; NULL: use pread/pwrite */
	struct cudabuf *cuda; /* a device buffer: fd -1, map NULL */
	struct hostmap *hm;   /* the shared mapping of map; NULL: pread, own fd */
};

struct cudabuf;

/* Takes ownership of fd (closed on failure too). A file already mapped
 * for another registration (the same inode, through this fd or another,
 * in any session) whose mapping covers nbytes shares that mapping, its
 * pre-fault and its fd: fd is closed. Loop thread only. */
int hostbuf_open(int fd, uint64_t id, uint64_t nbytes, struct hostbuf **out, char *err, size_t errlen);
/* Wrap an imported device buffer; takes ownership of cb. */
int hostbuf_from_cuda(struct cudabuf *cb, uint64_t id, uint64_t nbytes, struct hostbuf **out);
struct hostbuf *hostbuf_ref(struct hostbuf *b);
void hostbuf_unref(struct hostbuf *b);
/* Install the SIGBUS guard's handler; once, at start. */
int hostbuf_init(void);
/* Copy [off, off+len) into dst and extend *crc (if not NULL) over them.
 * Thread-safe. 0, -EFAULT when the client truncated its file, -ERANGE.
 * Device buffers copy synchronously here; saves batch them instead
 * (save.c's copy_run). */
int hostbuf_copy_out(const struct hostbuf *b, uint64_t off, void *dst, size_t len, uint32_t *crc);
/* Thread-safe. 0, or -EFAULT when the file is shorter than the range. */
int hostbuf_read(const struct hostbuf *b, uint64_t off, void *dst, size_t len);
int hostbuf_write(const struct hostbuf *b, uint64_t off, const void *src, size_t len);
/* hostbuf_write, and *crc (if not NULL) extended over the len bytes of
 * src, fused with the copy into a mapping (memcopy_crc: one pass over
 * memory). Thread-safe. */
int hostbuf_write_crc(const struct hostbuf *b, uint64_t off, const void *src, size_t len, uint32_t *crc);

#endif
