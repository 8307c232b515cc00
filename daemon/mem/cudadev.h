/* cuda.c, the daemon's CUDA side (docs/cuda.md "CUDA"; not named cuda.h, which is the
 * toolkit's): devices found by UUID, one primary
 * context each, copy streams per device, the staging pool registered as
 * pinned memory, trainer allocations imported once per registration
 * (legacy IPC handles are shared daemon-wide by (device UUID, handle), so
 * many tensors of one cudaMalloc segment open it once), and the trainers'
 * interprocess events. Everything loop-thread only, except the copy
 * functions, which run on the copy workers and the threadpool. */
#ifndef CKPTD_CUDADEV_H
#define CKPTD_CUDADEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CUDA_UUID_BYTES 16
#define CUDA_IPC_BYTES 64

struct cuda;
struct cudabuf;
struct cudaev;

/* NULL when CUDA is off here, with why saying so (no library, a stub
 * library, no device, an old driver). nstreams: copy streams per device,
 * one per copy worker (at least 2). */
struct cuda *cuda_open(unsigned nstreams, char *why, size_t whylen);
void cuda_close(struct cuda *cu);
/* Register the pool as pinned memory, in pieces of at most 64 GiB. */
int cuda_register_pool(struct cuda *cu, void *base, size_t bytes, char *err, size_t errlen);
/* "on: N device(s), pool pinned" for ckptctl status. */
void cuda_describe(const struct cuda *cu, char *buf, size_t len);

/* Import a trainer buffer. 0, or -errno with err saying what failed:
 * -ENODEV for a UUID no device here has, -EIO when the driver refuses.
 * Legacy IPC: one mapping per (device, handle, alloc_id), shared by
 * refcount; alloc_id is the trainer's CU_POINTER_ATTRIBUTE_BUFFER_ID of
 * the allocation (0: unknown). */
int cuda_import_ipc(struct cuda *cu, const uint8_t *uuid, const uint8_t *handle, uint64_t alloc_id, uint64_t offset,
		    uint64_t nbytes, struct cudabuf **out, char *err, size_t errlen);
/* Takes ownership of fds (closed in every case). */
int cuda_import_vmm(struct cuda *cu, const uint8_t *uuid, int *fds, const uint64_t *sizes, size_t n, uint64_t offset,
		    uint64_t nbytes, struct cudabuf **out, char *err, size_t errlen);
void cudabuf_free(struct cudabuf *b);
const uint8_t *cudabuf_uuid(const struct cudabuf *b);

/* An interprocess event from a Save, opened once per (UUID, handle) and
 * shared by refcount. */
int cuda_event_get(struct cuda *cu, const uint8_t *uuid, const uint8_t *handle, struct cudaev **out, char *err,
		   size_t errlen);
void cuda_event_put(struct cudaev *e);
const uint8_t *cuda_event_uuid(const struct cudaev *e);

/* One copy job's D2H copies: on the worker's stream of each device it
 * touches, after that stream waited on the trainer's event for the
 * device. Thread-safe across workers (each uses its own streams). */
struct cuda_batch {
	struct cuda *cu;
	unsigned worker;
	uint64_t devmask;
	int err;
	char msg[200];
};
void cuda_batch_begin(struct cuda_batch *bt, struct cuda *cu, unsigned worker);
/* Queue [off, off+len) of b into dst; wait: the save's events (any
 * order), of which the one for b's device is waited on. */
int cuda_batch_d2h(struct cuda_batch *bt, const struct cudabuf *b, struct cudaev *const *wait, size_t nwait,
		   uint64_t off, void *dst, size_t len);
/* Wait for every queued copy. 0, or the first error (bt->msg says it). */
int cuda_batch_finish(struct cuda_batch *bt);

/* Synchronous copies for restore (H2D) and reads, on a per-device
 * stream shared under a lock. Thread-safe. */
int cuda_write(const struct cudabuf *b, uint64_t off, const void *src, size_t len);
int cuda_read(const struct cudabuf *b, uint64_t off, void *dst, size_t len);

#endif
