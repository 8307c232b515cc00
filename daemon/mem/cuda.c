#include "clock.h"
#include "cudadev.h"
#include "cudadrv.h"
#include "log.h"

#ifdef CKPT_HAVE_CUDA

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_DEVICES 64
#define HOST_REGISTER_MAX (64ull << 30)

struct cudadev {
	CUdevice dev;
	uint8_t uuid[CUDA_UUID_BYTES];
	bool ready;         /* context and streams made (loop thread) */
	_Atomic int broken; /* a sticky error (CUresult) broke the context */
	CUcontext ctx;
	CUstream *streams; /* nstreams, for staging */
	CUstream xfer;     /* restore copies, under xfer_mu */
	pthread_mutex_t xfer_mu;
};

/* A legacy IPC mapping, shared by every registration of the same
 * allocation (cuIpcOpenMemHandle may open a handle only once per
 * context): the same handle and the same allocation id. A handle alone
 * is not enough: memory freed and allocated again can come back at the
 * same address with the same handle bytes (the fake driver's do), and
 * the old mapping would show the freed memory. */
struct ipcmap {
	struct ipcmap *next;
	unsigned refs;
	int dev;
	uint64_t alloc_id; /* the trainer's CU_POINTER_ATTRIBUTE_BUFFER_ID; 0: unknown */
	uint8_t handle[CUDA_IPC_BYTES];
	CUdeviceptr base;
	size_t size; /* of the allocation: registrations stay inside */
};

struct cudaev {
	struct cudaev *next;
	struct cuda *cu;
	unsigned refs;
	int dev;
	uint8_t handle[CUDA_IPC_BYTES];
	CUevent ev;
};

enum pin_state {
	PIN_NONE,
	PIN_RUNNING,
	PIN_DONE
};

struct cuda {
	struct cudadrv drv;
	int ndev;
	struct cudadev devs[MAX_DEVICES];
	unsigned nstreams;
	struct ipcmap *ipcmaps;
	struct cudaev *events;
	void *pool_base;
	size_t pool_bytes;
	/* Pinning the pool (cuMemHostRegister) takes seconds for a large one:
	 * a thread of its own does it, started when the first device is made
	 * ready (it needs a context), so the loop never waits for it; copies
	 * into and out of device memory wait (pin_wait) until it ends. The
	 * fields below pin_mu are under it once that thread exists; the pool
	 * is pinned when pin_state is PIN_DONE and pool_err is empty. */
	pthread_t pin_thread;
	bool pin_started;     /* loop thread only */
	bool pin_thread_made; /* loop thread only: joined at close */
	int pin_dev;
	pthread_mutex_t pin_mu;
	pthread_cond_t pin_cv;
	enum pin_state pin_state;
	char pool_err[160];
};

static void pin_start(struct cuda *cu, int dev);

struct cudabuf {
	struct cuda *cu;
	int dev;
	CUdeviceptr ptr; /* the buffer's first byte */
	uint64_t nbytes;
	struct ipcmap *ipc;
	CUdeviceptr va; /* VMM reservation */
	size_t va_size;
};

static const char *ename(const struct cuda *cu, CUresult r, char *buf, size_t len)
{
	return cudadrv_errname(&cu->drv, r, buf, len);
}

static void uuid_str(const uint8_t *u, char *buf, size_t len)
{
	snprintf(buf, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
		 u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

static int find_dev(const struct cuda *cu, const uint8_t *uuid)
{
	for (int i = 0; i < cu->ndev; i++)
		if (memcmp(cu->devs[i].uuid, uuid, CUDA_UUID_BYTES) == 0)
			return i;
	return -1;
}

static int no_dev(const struct cuda *cu, const uint8_t *uuid, char *err, size_t errlen)
{
	char u[64];
	uuid_str(uuid, u, sizeof(u));
	snprintf(err, errlen, "device %s matches none of this node's %d CUDA device(s)", u, cu->ndev);
	return -ENODEV;
}

struct cuda *cuda_open(unsigned nstreams, char *why, size_t whylen)
{
	struct cuda *cu = calloc(1, sizeof(*cu));
	if (cu == NULL) {
		snprintf(why, whylen, "out of memory");
		return NULL;
	}
	if (cudadrv_open(&cu->drv, why, whylen) < 0) {
		free(cu);
		return NULL;
	}
	char eb[64];
	int n = 0;
	CUresult r = cu->drv.cuDeviceGetCount(&n);
	if (r != CUDA_SUCCESS || n <= 0) {
		snprintf(why, whylen, "no CUDA device (%s)", r ? ename(cu, r, eb, sizeof(eb)) : "count 0");
		free(cu);
		return NULL;
	}
	if (n > MAX_DEVICES)
		n = MAX_DEVICES;
	cu->nstreams = nstreams < 2 ? 2 : nstreams;
	/* Only names for now: a device's context (hundreds of MiB on a real
	 * GPU) and streams are made when a trainer first uses it. */
	for (int i = 0; i < n; i++) {
		struct cudadev *dv = &cu->devs[i];
		CUuuid u;
		r = cu->drv.cuDeviceGet(&dv->dev, i);
		if (r == CUDA_SUCCESS)
			r = cu->drv.cuDeviceGetUuid(&u, dv->dev);
		if (r != CUDA_SUCCESS) {
			snprintf(why, whylen, "device %d: %s", i, ename(cu, r, eb, sizeof(eb)));
			free(cu);
			return NULL;
		}
		memcpy(dv->uuid, u.bytes, CUDA_UUID_BYTES);
		pthread_mutex_init(&dv->xfer_mu, NULL);
		cu->ndev = i + 1;
	}
	pthread_mutex_init(&cu->pin_mu, NULL);
	pthread_cond_init(&cu->pin_cv, NULL);
	return cu;
}

/* Sticky errors leave the device's context unusable until ckptd restarts. */
static bool sticky(CUresult r)
{
	switch (r) {
	case CUDA_ERROR_ILLEGAL_ADDRESS:
	case CUDA_ERROR_LAUNCH_FAILED:
	case CUDA_ERROR_HARDWARE_STACK_ERROR:
	case CUDA_ERROR_ILLEGAL_INSTRUCTION:
	case CUDA_ERROR_MISALIGNED_ADDRESS:
	case CUDA_ERROR_INVALID_ADDRESS_SPACE:
	case CUDA_ERROR_INVALID_PC:
	case CUDA_ERROR_ECC_UNCORRECTABLE: return true;
	default: return false;
	}
}

static void note_error(struct cuda *cu, int dev, CUresult r)
{
	if (sticky(r)) {
		int zero = 0;
		if (atomic_compare_exchange_strong(&cu->devs[dev].broken, &zero, (int)r)) {
			char eb[64];
			log_err("CUDA device %d: %s is sticky; its context is unusable until ckptd restarts", dev,
				ename(cu, r, eb, sizeof(eb)));
		}
	}
}

/* Make device i usable: its primary context, copy streams, and the pool
 * pinned (once, with the first device). Loop thread. */
static int dev_ready(struct cuda *cu, int i, char *err, size_t errlen)
{
	struct cudadev *dv = &cu->devs[i];
	char eb[64];
	int broken = atomic_load(&dv->broken);
	if (broken) {
		snprintf(err, errlen, "CUDA device %d is broken (%s); restart ckptd", i,
			 ename(cu, (CUresult)broken, eb, sizeof(eb)));
		return -EIO;
	}
	if (dv->ready)
		return 0;
	const char *what = "cuDevicePrimaryCtxRetain";
	CUresult r = CUDA_SUCCESS;
	if (dv->ctx == NULL)
		r = cu->drv.cuDevicePrimaryCtxRetain(&dv->ctx, dv->dev);
	if (r == CUDA_SUCCESS)
		what = "cuCtxSetCurrent", r = cu->drv.cuCtxSetCurrent(dv->ctx);
	if (r == CUDA_SUCCESS && dv->streams == NULL && (dv->streams = calloc(cu->nstreams, sizeof(CUstream))) == NULL)
		return -ENOMEM;
	/* Non-blocking: staging never serialises with anything on the
	 * legacy default stream. */
	for (unsigned k = 0; r == CUDA_SUCCESS && k < cu->nstreams; k++)
		if (dv->streams[k] == NULL)
			what = "cuStreamCreate", r = cu->drv.cuStreamCreate(&dv->streams[k], CU_STREAM_NON_BLOCKING);
	if (r == CUDA_SUCCESS && dv->xfer == NULL)
		what = "cuStreamCreate", r = cu->drv.cuStreamCreate(&dv->xfer, CU_STREAM_NON_BLOCKING);
	if (r != CUDA_SUCCESS) {
		snprintf(err, errlen, "CUDA device %d: %s failed: %s", i, what, ename(cu, r, eb, sizeof(eb)));
		return -EIO;
	}
	dv->ready = true;
	if (cu->pool_base && !cu->pin_started)
		pin_start(cu, i);
	return 0;
}

void cuda_close(struct cuda *cu)
{
	if (cu == NULL)
		return;
	if (cu->pin_thread_made)
		pthread_join(cu->pin_thread, NULL);
	if (cu->pin_state == PIN_DONE && !cu->pool_err[0]) { /* pinned (the pin thread has ended) */
		for (int i = 0; i < cu->ndev; i++)
			if (cu->devs[i].ctx) {
				cu->drv.cuCtxSetCurrent(cu->devs[i].ctx);
				break;
			}
		for (size_t off = 0; off < cu->pool_bytes; off += HOST_REGISTER_MAX)
			cu->drv.cuMemHostUnregister((uint8_t *)cu->pool_base + off);
	}
	for (int i = 0; i < cu->ndev; i++) {
		struct cudadev *dv = &cu->devs[i];
		if (dv->ctx)
			cu->drv.cuCtxSetCurrent(dv->ctx);
		for (unsigned k = 0; dv->streams && k < cu->nstreams; k++)
			if (dv->streams[k])
				cu->drv.cuStreamDestroy(dv->streams[k]);
		if (dv->xfer)
			cu->drv.cuStreamDestroy(dv->xfer);
		free(dv->streams);
		pthread_mutex_destroy(&dv->xfer_mu);
		if (dv->ctx)
			cu->drv.cuDevicePrimaryCtxRelease(dv->dev);
	}
	pthread_mutex_destroy(&cu->pin_mu);
	pthread_cond_destroy(&cu->pin_cv);
	cudadrv_close(&cu->drv);
	free(cu);
}

/* The index of the device with this UUID, made ready; or -errno. */
static int use_dev(struct cuda *cu, const uint8_t *uuid, char *err, size_t errlen)
{
	int dev = find_dev(cu, uuid);
	if (dev < 0)
		return no_dev(cu, uuid, err, errlen);
	int r = dev_ready(cu, dev, err, errlen);
	return r < 0 ? r : dev;
}

int cuda_register_pool(struct cuda *cu, void *base, size_t bytes, char *err, size_t errlen)
{
	(void)err;
	(void)errlen;
	/* Pinned when the first device is made ready (it needs a context). */
	cu->pool_base = base;
	cu->pool_bytes = bytes;
	return 0;
}

/* Register the pool, in pieces; 0, or -EIO with err saying why (what was
 * registered is unregistered again). The pin thread, with a context current. */
static int pin_pool(struct cuda *cu, char *err, size_t errlen)
{
	void *base = cu->pool_base;
	size_t bytes = cu->pool_bytes;
	for (size_t off = 0; off < bytes; off += HOST_REGISTER_MAX) {
		size_t n = bytes - off < HOST_REGISTER_MAX ? bytes - off : HOST_REGISTER_MAX;
		/* PORTABLE: pinned for every device's context, not just this one. */
		CUresult r = cu->drv.cuMemHostRegister((uint8_t *)base + off, n, CU_MEMHOSTREGISTER_PORTABLE);
		if (r != CUDA_SUCCESS) {
			char eb[64];
			for (size_t k = 0; k < off; k += HOST_REGISTER_MAX)
				cu->drv.cuMemHostUnregister((uint8_t *)base + k);
			snprintf(err, errlen, "cuMemHostRegister of %zu bytes failed: %s", n,
				 ename(cu, r, eb, sizeof(eb)));
			return -EIO;
		}
	}
	return 0;
}

static void *pin_main(void *arg)
{
	struct cuda *cu = arg;
	char err[160] = "";
	uint64_t t0 = clock_now_ns();
	CUresult cr = cu->drv.cuCtxSetCurrent(cu->devs[cu->pin_dev].ctx);
	int r = -EIO;
	if (cr != CUDA_SUCCESS) {
		char eb[64];
		snprintf(err, sizeof(err), "cuCtxSetCurrent for pinning failed: %s", ename(cu, cr, eb, sizeof(eb)));
	} else {
		r = pin_pool(cu, err, sizeof(err));
	}
	pthread_mutex_lock(&cu->pin_mu);
	snprintf(cu->pool_err, sizeof(cu->pool_err), "%s", r == 0 ? "" : err);
	cu->pin_state = PIN_DONE;
	pthread_cond_broadcast(&cu->pin_cv);
	pthread_mutex_unlock(&cu->pin_mu);
	if (r < 0)
		log_warn("CUDA: %s; staging copies from GPUs will be slower", err);
	else
		log_info("CUDA: pool of %zu MiB pinned in %" PRIu64 " ms", cu->pool_bytes >> 20,
			 (clock_now_ns() - t0) / 1000000);
	return NULL;
}

/* Start pinning the pool with device dev's context. Loop thread. */
static void pin_start(struct cuda *cu, int dev)
{
	cu->pin_started = true;
	cu->pin_dev = dev;
	pthread_mutex_lock(&cu->pin_mu);
	cu->pin_state = PIN_RUNNING;
	pthread_mutex_unlock(&cu->pin_mu);
	int r = pthread_create(&cu->pin_thread, NULL, pin_main, cu);
	if (r == 0) {
		cu->pin_thread_made = true;
		return;
	}
	/* No thread: pin here, once. */
	log_warn("CUDA: no thread for pinning the pool (%s): pinning it on the loop thread", strerror(r));
	pin_main(cu);
}

/* Wait until the pool's pinning has ended (pinned or not): a copy started
 * before would go through pageable memory. Copy and load threads. */
static void pin_wait(struct cuda *cu)
{
	pthread_mutex_lock(&cu->pin_mu);
	while (cu->pin_state == PIN_RUNNING)
		pthread_cond_wait(&cu->pin_cv, &cu->pin_mu);
	pthread_mutex_unlock(&cu->pin_mu);
}

void cuda_describe(const struct cuda *cu, char *buf, size_t len)
{
	int v = 0, ready = 0;
	cu->drv.cuDriverGetVersion(&v);
	for (int i = 0; i < cu->ndev; i++)
		ready += cu->devs[i].ready;
	pthread_mutex_t *mu = (pthread_mutex_t *)&cu->pin_mu; /* the pin thread's fields */
	pthread_mutex_lock(mu);
	const char *pool = cu->pin_state == PIN_NONE      ? "pool pinned at first use"
			   : cu->pin_state == PIN_RUNNING ? "pool being pinned"
			   : cu->pool_err[0]              ? "pool NOT pinned: "
							  : "pool pinned";
	size_t o = (size_t)snprintf(buf, len, "on: %d device(s), %d in use, driver %d.%d, %s%s", cu->ndev, ready,
				    v / 1000, (v % 1000) / 10, pool, cu->pin_state == PIN_DONE ? cu->pool_err : "");
	pthread_mutex_unlock(mu);
	for (int i = 0; i < cu->ndev && o < len; i++) {
		int b = atomic_load(&cu->devs[i].broken);
		if (b) {
			char eb[64];
			o += (size_t)snprintf(buf + o, len - o, "; device %d BROKEN (%s), restart ckptd", i,
					      ename(cu, (CUresult)b, eb, sizeof(eb)));
		}
	}
}

static struct cudabuf *buf_new(struct cuda *cu, int dev, uint64_t nbytes)
{
	struct cudabuf *b = calloc(1, sizeof(*b));
	if (b) {
		b->cu = cu;
		b->dev = dev;
		b->nbytes = nbytes;
	}
	return b;
}

int cuda_import_ipc(struct cuda *cu, const uint8_t *uuid, const uint8_t *handle, uint64_t alloc_id, uint64_t offset,
		    uint64_t nbytes, struct cudabuf **out, char *err, size_t errlen)
{
	int dev = use_dev(cu, uuid, err, errlen);
	if (dev < 0)
		return dev;
	struct ipcmap *m;
	for (m = cu->ipcmaps; m; m = m->next)
		if (m->dev == dev && m->alloc_id == alloc_id && memcmp(m->handle, handle, CUDA_IPC_BYTES) == 0)
			break;
	if (m == NULL) {
		m = calloc(1, sizeof(*m));
		if (m == NULL)
			return -ENOMEM;
		CUipcMemHandle h;
		memcpy(h.reserved, handle, CUDA_IPC_BYTES);
		cu->drv.cuCtxSetCurrent(cu->devs[dev].ctx);
		CUresult r = cu->drv.cuIpcOpenMemHandle(&m->base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
		if (r != CUDA_SUCCESS) {
			char eb[64];
			free(m);
			snprintf(err, errlen,
				 "cuIpcOpenMemHandle failed: %s (legacy IPC needs the trainer's "
				 "PID namespace: hostPID in containers)",
				 ename(cu, r, eb, sizeof(eb)));
			return -EIO;
		}
		CUdeviceptr pb = 0;
		r = cu->drv.cuMemGetAddressRange(&pb, &m->size, m->base);
		if (r != CUDA_SUCCESS || pb != m->base) {
			char eb[64];
			cu->drv.cuIpcCloseMemHandle(m->base);
			free(m);
			snprintf(err, errlen, "cuMemGetAddressRange of the opened handle failed: %s",
				 ename(cu, r, eb, sizeof(eb)));
			return -EIO;
		}
		m->dev = dev;
		m->alloc_id = alloc_id;
		memcpy(m->handle, handle, CUDA_IPC_BYTES);
		m->next = cu->ipcmaps;
		cu->ipcmaps = m;
	}
	/* The client's word is not enough: the range must lie in the
	 * allocation, or a copy would read whatever else is mapped here. */
	if (offset > m->size || nbytes > m->size - offset) {
		snprintf(err, errlen, "[%" PRIu64 ", +%" PRIu64 ") lies outside the %zu-byte allocation", offset,
			 nbytes, m->size);
		if (m->refs == 0) {
			cu->ipcmaps = m->next;
			cu->drv.cuIpcCloseMemHandle(m->base);
			free(m);
		}
		return -ERANGE;
	}
	struct cudabuf *b = buf_new(cu, dev, nbytes);
	if (b == NULL) {
		if (m->refs == 0) {
			cu->ipcmaps = m->next;
			cu->drv.cuIpcCloseMemHandle(m->base);
			free(m);
		}
		return -ENOMEM;
	}
	m->refs++;
	b->ipc = m;
	b->ptr = m->base + offset;
	*out = b;
	return 0;
}

/* The bytes of the n VMM chunks together (*total), each size nonzero and
 * the buffer [offset, +nbytes) inside them. */
static int vmm_total(const uint64_t *sizes, size_t n, uint64_t offset, uint64_t nbytes, uint64_t *total, char *err,
		     size_t errlen)
{
	*total = 0;
	for (size_t i = 0; i < n; i++) {
		if (sizes[i] == 0 || *total + sizes[i] < *total) {
			snprintf(err, errlen, "VMM chunk %zu has a bad size", i);
			return -EINVAL;
		}
		*total += sizes[i];
	}
	if (offset > *total || nbytes > *total - offset) {
		snprintf(err, errlen, "buffer [%" PRIu64 ", +%" PRIu64 ") lies outside its %" PRIu64 " mapped bytes",
			 offset, nbytes, *total);
		return -ERANGE;
	}
	return 0;
}

/* The n chunks imported from fds and mapped one after the other into a
 * range of total bytes reserved for b on device dev, read-write. *at:
 * the bytes mapped so far, for the caller to unmap on failure (b->va is
 * set once reserved). */
static int vmm_map(struct cuda *cu, int dev, struct cudabuf *b, const int *fds, const uint64_t *sizes, size_t n,
		   uint64_t total, uint64_t *at, char *err, size_t errlen)
{
	char eb[64];
	cu->drv.cuCtxSetCurrent(cu->devs[dev].ctx);
	CUresult r = cu->drv.cuMemAddressReserve(&b->va, total, 0, 0, 0);
	if (r != CUDA_SUCCESS) {
		snprintf(err, errlen, "cuMemAddressReserve of %" PRIu64 " bytes failed: %s", total,
			 ename(cu, r, eb, sizeof(eb)));
		return -EIO;
	}
	b->va_size = total;
	for (size_t i = 0; i < n; i++) {
		CUmemGenericAllocationHandle h;
		const char *what = "cuMemImportFromShareableHandle";
		r = cu->drv.cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fds[i],
							   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		if (r == CUDA_SUCCESS) {
			what = "cuMemMap";
			r = cu->drv.cuMemMap(b->va + *at, sizes[i], 0, h, 0);
			/* The mapping keeps the allocation alive. */
			cu->drv.cuMemRelease(h);
		}
		if (r != CUDA_SUCCESS) {
			snprintf(err, errlen, "VMM chunk %zu: %s failed: %s", i, what, ename(cu, r, eb, sizeof(eb)));
			return -EIO;
		}
		*at += sizes[i];
	}
	CUmemAccessDesc acc = { .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = cu->devs[dev].dev },
				.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	r = cu->drv.cuMemSetAccess(b->va, total, &acc, 1);
	if (r != CUDA_SUCCESS) {
		snprintf(err, errlen, "cuMemSetAccess failed: %s", ename(cu, r, eb, sizeof(eb)));
		return -EIO;
	}
	return 0;
}

int cuda_import_vmm(struct cuda *cu, const uint8_t *uuid, int *fds, const uint64_t *sizes, size_t n, uint64_t offset,
		    uint64_t nbytes, struct cudabuf **out, char *err, size_t errlen)
{
	int ret = 0;
	struct cudabuf *b = NULL;
	uint64_t total = 0;
	uint64_t at = 0; /* bytes mapped (every chunk's size is nonzero) */
	int dev = use_dev(cu, uuid, err, errlen);
	if (dev < 0) {
		ret = dev;
		goto out;
	}
	ret = vmm_total(sizes, n, offset, nbytes, &total, err, errlen);
	if (ret < 0)
		goto out;
	b = buf_new(cu, dev, nbytes);
	if (b == NULL) {
		ret = -ENOMEM;
		goto out;
	}
	ret = vmm_map(cu, dev, b, fds, sizes, n, total, &at, err, errlen);
	if (ret < 0)
		goto out;
	b->ptr = b->va + offset;
	*out = b;
	b = NULL;
out:
	if (b) {
		/* Only what was mapped: the driver refuses a range with gaps. */
		if (at)
			cu->drv.cuMemUnmap(b->va, at);
		if (b->va)
			cu->drv.cuMemAddressFree(b->va, total);
		free(b);
	}
	for (size_t i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	return ret;
}

void cudabuf_free(struct cudabuf *b)
{
	if (b == NULL)
		return;
	struct cuda *cu = b->cu;
	cu->drv.cuCtxSetCurrent(cu->devs[b->dev].ctx);
	if (b->ipc && --b->ipc->refs == 0) {
		for (struct ipcmap **pp = &cu->ipcmaps; *pp; pp = &(*pp)->next)
			if (*pp == b->ipc) {
				*pp = b->ipc->next;
				break;
			}
		cu->drv.cuIpcCloseMemHandle(b->ipc->base);
		free(b->ipc);
	}
	if (b->va) {
		cu->drv.cuMemUnmap(b->va, b->va_size);
		cu->drv.cuMemAddressFree(b->va, b->va_size);
	}
	free(b);
}

const uint8_t *cudabuf_uuid(const struct cudabuf *b)
{
	return b->cu->devs[b->dev].uuid;
}

int cuda_event_get(struct cuda *cu, const uint8_t *uuid, const uint8_t *handle, struct cudaev **out, char *err,
		   size_t errlen)
{
	int dev = use_dev(cu, uuid, err, errlen);
	if (dev < 0)
		return dev;
	for (struct cudaev *e = cu->events; e; e = e->next)
		if (e->dev == dev && memcmp(e->handle, handle, CUDA_IPC_BYTES) == 0) {
			e->refs++;
			*out = e;
			return 0;
		}
	struct cudaev *e = calloc(1, sizeof(*e));
	if (e == NULL)
		return -ENOMEM;
	CUipcEventHandle h;
	memcpy(h.reserved, handle, CUDA_IPC_BYTES);
	cu->drv.cuCtxSetCurrent(cu->devs[dev].ctx);
	CUresult r = cu->drv.cuIpcOpenEventHandle(&e->ev, h);
	if (r != CUDA_SUCCESS) {
		char eb[64];
		free(e);
		snprintf(err, errlen, "cuIpcOpenEventHandle failed: %s", ename(cu, r, eb, sizeof(eb)));
		return -EIO;
	}
	e->cu = cu;
	e->refs = 1;
	e->dev = dev;
	memcpy(e->handle, handle, CUDA_IPC_BYTES);
	e->next = cu->events;
	cu->events = e;
	*out = e;
	return 0;
}

void cuda_event_put(struct cudaev *e)
{
	if (e == NULL || --e->refs > 0)
		return;
	struct cuda *cu = e->cu;
	for (struct cudaev **pp = &cu->events; *pp; pp = &(*pp)->next)
		if (*pp == e) {
			*pp = e->next;
			break;
		}
	cu->drv.cuCtxSetCurrent(cu->devs[e->dev].ctx);
	cu->drv.cuEventDestroy(e->ev);
	free(e);
}

const uint8_t *cuda_event_uuid(const struct cudaev *e)
{
	return e->cu->devs[e->dev].uuid;
}

void cuda_batch_begin(struct cuda_batch *bt, struct cuda *cu, unsigned worker)
{
	pin_wait(cu);
	bt->cu = cu;
	bt->worker = worker % cu->nstreams;
	bt->devmask = 0;
	bt->err = 0;
	bt->msg[0] = 0;
}

static int batch_fail(struct cuda_batch *bt, int dev, const char *what, CUresult r)
{
	char eb[64];
	note_error(bt->cu, dev, r);
	if (bt->err == 0) {
		bt->err = -EIO;
		snprintf(bt->msg, sizeof(bt->msg), "%s failed: %s", what, ename(bt->cu, r, eb, sizeof(eb)));
	}
	return bt->err;
}

int cuda_batch_d2h(struct cuda_batch *bt, const struct cudabuf *b, struct cudaev *const *wait, size_t nwait,
		   uint64_t off, void *dst, size_t len)
{
	struct cuda *cu = bt->cu;
	struct cudadev *dv = &cu->devs[b->dev];
	CUstream s = dv->streams[bt->worker];
	CUresult r;
	if (off > b->nbytes || len > b->nbytes - off) {
		if (bt->err == 0) {
			bt->err = -ERANGE;
			snprintf(bt->msg, sizeof(bt->msg),
				 "copy of [%" PRIu64 ", +%zu) outside the %" PRIu64 "-byte buffer", off, len,
				 b->nbytes);
		}
		return bt->err;
	}
	if (!(bt->devmask & (1ull << b->dev))) {
		bt->devmask |= 1ull << b->dev;
		if ((r = cu->drv.cuCtxSetCurrent(dv->ctx)) != CUDA_SUCCESS)
			return batch_fail(bt, b->dev, "cuCtxSetCurrent", r);
		/* Wait for the trainer's last write to this device. */
		for (size_t i = 0; i < nwait; i++)
			if (wait[i]->dev == b->dev &&
			    (r = cu->drv.cuStreamWaitEvent(s, wait[i]->ev, 0)) != CUDA_SUCCESS)
				return batch_fail(bt, b->dev, "cuStreamWaitEvent", r);
	} else if ((r = cu->drv.cuCtxSetCurrent(dv->ctx)) != CUDA_SUCCESS) {
		return batch_fail(bt, b->dev, "cuCtxSetCurrent", r);
	}
	r = cu->drv.cuMemcpyDtoHAsync(dst, b->ptr + off, len, s);
	if (r != CUDA_SUCCESS)
		return batch_fail(bt, b->dev, "cuMemcpyDtoHAsync", r);
	return 0;
}

int cuda_batch_finish(struct cuda_batch *bt)
{
	struct cuda *cu = bt->cu;
	for (int i = 0; i < cu->ndev; i++) {
		if (!(bt->devmask & (1ull << i)))
			continue;
		/* Even after an error: nothing may still write into the pool. */
		cu->drv.cuCtxSetCurrent(cu->devs[i].ctx);
		CUresult r = cu->drv.cuStreamSynchronize(cu->devs[i].streams[bt->worker]);
		if (r != CUDA_SUCCESS)
			batch_fail(bt, i, "cuStreamSynchronize", r);
	}
	return bt->err;
}

static int xfer(const struct cudabuf *b, uint64_t off, void *host, size_t len, bool h2d)
{
	struct cuda *cu = b->cu;
	struct cudadev *dv = &cu->devs[b->dev];
	if (off > b->nbytes || len > b->nbytes - off)
		return -ERANGE;
	pin_wait(cu);
	pthread_mutex_lock(&dv->xfer_mu);
	CUresult r = cu->drv.cuCtxSetCurrent(dv->ctx);
	if (r == CUDA_SUCCESS)
		r = h2d ? cu->drv.cuMemcpyHtoDAsync(b->ptr + off, host, len, dv->xfer)
			: cu->drv.cuMemcpyDtoHAsync(host, b->ptr + off, len, dv->xfer);
	CUresult r2 = cu->drv.cuStreamSynchronize(dv->xfer);
	pthread_mutex_unlock(&dv->xfer_mu);
	if (r != CUDA_SUCCESS || r2 != CUDA_SUCCESS) {
		char eb[64];
		note_error(cu, b->dev, r ? r : r2);
		log_err("CUDA %s copy of %zu bytes failed: %s", h2d ? "H2D" : "D2H", len,
			ename(cu, r ? r : r2, eb, sizeof(eb)));
		return -EIO;
	}
	return 0;
}

int cuda_write(const struct cudabuf *b, uint64_t off, const void *src, size_t len)
{
	return xfer(b, off, (void *)src, len, true);
}

int cuda_read(const struct cudabuf *b, uint64_t off, void *dst, size_t len)
{
	return xfer(b, off, dst, len, false);
}

#else /* !CKPT_HAVE_CUDA: built without cuda.h; the host path alone. */

#include <errno.h>
#include <stdio.h>

struct cuda *cuda_open(unsigned nstreams, char *why, size_t whylen)
{
	(void)nstreams;
	snprintf(why, whylen, "ckptd was built without CUDA headers");
	return NULL;
}
void cuda_close(struct cuda *cu)
{
	(void)cu;
}
int cuda_register_pool(struct cuda *cu, void *base, size_t bytes, char *err, size_t errlen)
{
	(void)cu;
	(void)base;
	(void)bytes;
	(void)err;
	(void)errlen;
	return -ENOTSUP;
}
void cuda_describe(const struct cuda *cu, char *buf, size_t len)
{
	(void)cu;
	snprintf(buf, len, "off");
}
int cuda_import_ipc(struct cuda *cu, const uint8_t *uuid, const uint8_t *handle, uint64_t alloc_id, uint64_t offset,
		    uint64_t nbytes, struct cudabuf **out, char *err, size_t errlen)
{
	(void)cu;
	(void)uuid;
	(void)handle;
	(void)alloc_id;
	(void)offset;
	(void)nbytes;
	(void)out;
	(void)err;
	(void)errlen;
	return -ENOTSUP;
}
int cuda_import_vmm(struct cuda *cu, const uint8_t *uuid, int *fds, const uint64_t *sizes, size_t n, uint64_t offset,
		    uint64_t nbytes, struct cudabuf **out, char *err, size_t errlen)
{
	(void)cu;
	(void)uuid;
	(void)fds;
	(void)sizes;
	(void)n;
	(void)offset;
	(void)nbytes;
	(void)out;
	(void)err;
	(void)errlen;
	return -ENOTSUP;
}
void cudabuf_free(struct cudabuf *b)
{
	(void)b;
}
const uint8_t *cudabuf_uuid(const struct cudabuf *b)
{
	(void)b;
	return NULL;
}
int cuda_event_get(struct cuda *cu, const uint8_t *uuid, const uint8_t *handle, struct cudaev **out, char *err,
		   size_t errlen)
{
	(void)cu;
	(void)uuid;
	(void)handle;
	(void)out;
	(void)err;
	(void)errlen;
	return -ENOTSUP;
}
void cuda_event_put(struct cudaev *e)
{
	(void)e;
}
const uint8_t *cuda_event_uuid(const struct cudaev *e)
{
	(void)e;
	return NULL;
}
void cuda_batch_begin(struct cuda_batch *bt, struct cuda *cu, unsigned worker)
{
	(void)cu;
	(void)worker;
	bt->err = -ENOTSUP;
}
int cuda_batch_d2h(struct cuda_batch *bt, const struct cudabuf *b, struct cudaev *const *wait, size_t nwait,
		   uint64_t off, void *dst, size_t len)
{
	(void)b;
	(void)wait;
	(void)nwait;
	(void)off;
	(void)dst;
	(void)len;
	return bt->err;
}
int cuda_batch_finish(struct cuda_batch *bt)
{
	return bt->err;
}
int cuda_write(const struct cudabuf *b, uint64_t off, const void *src, size_t len)
{
	(void)b;
	(void)off;
	(void)src;
	(void)len;
	return -ENOTSUP;
}
int cuda_read(const struct cudabuf *b, uint64_t off, void *dst, size_t len)
{
	(void)b;
	(void)off;
	(void)dst;
	(void)len;
	return -ENOTSUP;
}
#endif /* CKPT_HAVE_CUDA */
