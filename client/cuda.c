/* CUDA device buffers and the trainer's events (docs/cuda.md "CUDA"), the client's
 * twin of daemon/mem/cuda.c. The driver table is loaded once per process. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"
#include "cudadrv.h"

#ifdef CKPT_HAVE_CUDA

#define MAX_EVENT_DEVICES 16

static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static struct cudadrv drv;
static int drv_rc;
static char drv_why[256];

static void drv_load(void)
{
	drv_rc = cudadrv_open(&drv, drv_why, sizeof(drv_why));
}

/* One interprocess event per device, created once per client and
 * recorded again at every save. */
struct client_cuda {
	pthread_mutex_t mu;
	int n;
	struct {
		uint8_t uuid[16];
		CUdevice dev;
		CUevent ev;
		CUipcEventHandle h;
	} e[MAX_EVENT_DEVICES];
};

static void client_cuda_free(ckpt_client *c);

static const char *ename(CUresult r)
{
	static __thread char buf[64];
	return cudadrv_errname(&drv, r, buf, sizeof(buf));
}

int ckpt_cuda_available(char *why, size_t whylen)
{
	pthread_once(&drv_once, drv_load);
	if (drv_rc < 0) {
		if (why && whylen)
			snprintf(why, whylen, "%s", drv_why);
		return 0;
	}
	if (why && whylen)
		why[0] = 0;
	return 1;
}

static int drv_ready(ckpt_client *c)
{
	pthread_once(&drv_once, drv_load);
	if (drv_rc < 0) {
		client_set_errmsgf("CUDA is unavailable in this process: %s", drv_why);
		return -ENOTSUP;
	}
	if (c && !(c->capabilities & CKPT_CAP_CUDA)) {
		client_set_errmsg("ckptd has CUDA off (ckptctl status says why)");
		return -ENOTSUP;
	}
	return 0;
}

static void close_fds(int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

/* Whether the VMM allocation h is mapped at a. */
static bool maps(CUmemGenericAllocationHandle h, CUdeviceptr a)
{
	CUmemGenericAllocationHandle x;
	if (drv.cuMemRetainAllocationHandle(&x, (void *)(uintptr_t)a) != CUDA_SUCCESS)
		return false;
	drv.cuMemRelease(x);
	return x == h;
}

/* How many whole granules g next to the one at base (dir -1: below, +1:
 * above), at most max, map h, one by one: the same handle may be mapped
 * twice in one reservation (a mirrored ring buffer), so a search that
 * skipped granules could join two mappings into one. A 1 GiB allocation
 * of 2 MiB granules costs 512 questions, once per registration. */
static size_t same_run(CUmemGenericAllocationHandle h, CUdeviceptr base, size_t g, int dir, size_t max)
{
	size_t k = 0;
	while (k < max && maps(h, dir < 0 ? base - (CUdeviceptr)(k + 1) * g : base + (CUdeviceptr)(k + 1) * g))
		k++;
	return k;
}

/* The start and size of the allocation holding p. For cudaMalloc memory
 * the driver's RANGE_START_ADDR and RANGE_SIZE say it. For VMM memory they
 * describe the whole reserved range (cuda.h says so, and on an H100,
 * driver 580, a registration built on them asked the daemon to map a
 * 1 GiB reservation with one 64 MiB allocation: cuMemMap failed with
 * CUDA_ERROR_NOT_SUPPORTED): the allocation mapped at p is the run of
 * granules around p that cuMemRetainAllocationHandle says map the same
 * handle (the driver promises the handle value used to map), within that
 * reservation. *handle (when given): that handle for VMM memory, else 0. */
static CUresult alloc_range_h(CUdeviceptr p, CUdeviceptr *start, size_t *size, unsigned long long *handle)
{
	CUresult r = drv.cuPointerGetAttribute(start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
	if (r == CUDA_SUCCESS)
		r = drv.cuPointerGetAttribute(size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p);
	if (handle)
		*handle = 0;
	CUmemGenericAllocationHandle h;
	if (r != CUDA_SUCCESS || drv.cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)p) != CUDA_SUCCESS)
		return r; /* not VMM memory: the range is the allocation */
	CUmemAllocationProp prop;
	size_t g = 0;
	memset(&prop, 0, sizeof(prop));
	r = drv.cuMemGetAllocationPropertiesFromHandle(&prop, h);
	if (r == CUDA_SUCCESS)
		r = drv.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	CUdeviceptr rs = *start, re = *start + *size, base = p & ~(CUdeviceptr)(g - 1);
	if (r == CUDA_SUCCESS && (g == 0 || (g & (g - 1)) != 0 || base < rs || base + g > re))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		size_t below = same_run(h, base, g, -1, (size_t)((base - rs) / g));
		size_t above = same_run(h, base, g, +1, (size_t)((re - base - g) / g));
		*start = base - (CUdeviceptr)below * g;
		*size = (below + 1 + above) * g;
		if (handle)
			*handle = (unsigned long long)h;
	}
	drv.cuMemRelease(h);
	return r;
}

static CUresult alloc_range(CUdeviceptr p, CUdeviceptr *start, size_t *size)
{
	return alloc_range_h(p, start, size, NULL);
}

/* The mapped VMM allocations [devptr, devptr+nbytes) spans: an fd and a
 * size each. */
static int vmm_export(CUdeviceptr start, CUdeviceptr devptr, size_t nbytes, int *fds, uint64_t *sizes, size_t cap,
		      size_t *n)
{
	CUdeviceptr at = start, end = devptr + nbytes;
	*n = 0;
	while (at < end) {
		CUdeviceptr s = 0;
		size_t sz = 0;
		CUmemGenericAllocationHandle h;
		CUresult r = alloc_range(at, &s, &sz);
		if (r != CUDA_SUCCESS || sz == 0) {
			client_set_errmsgf("device range at offset %llu is not mapped device memory: %s",
					   (unsigned long long)(at - devptr), ename(r));
			goto fail;
		}
		if (*n == cap) {
			client_set_errmsgf("the range spans more than %zu VMM allocations; ckptd takes at most "
					   "%zu per buffer (max_fds_per_frame): register smaller ranges",
					   cap, cap);
			close_fds(fds, *n);
			return -E2BIG;
		}
		r = drv.cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)s);
		if (r != CUDA_SUCCESS) {
			client_set_errmsgf("cuMemRetainAllocationHandle failed: %s", ename(r));
			goto fail;
		}
		int fd = -1;
		r = drv.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
		drv.cuMemRelease(h);
		if (r != CUDA_SUCCESS) {
			client_set_errmsgf("cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR) failed: %s "
					   "(allocate with requestedHandleTypes = POSIX_FILE_DESCRIPTOR)",
					   ename(r));
			goto fail;
		}
		fds[*n] = fd;
		sizes[*n] = sz;
		(*n)++;
		at = s + sz;
	}
	return 0;
fail:
	close_fds(fds, *n);
	return -EINVAL;
}

/* One 64-bit step of a digest (splitmix64's finaliser over h ^ v). */
static uint64_t mix(uint64_t h, uint64_t v)
{
	h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
	h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
	h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
	return h ^ (h >> 31);
}

int ckpt_cuda_identity(uint64_t devptr, size_t nbytes, uint64_t *ident)
{
	if (!ident || nbytes == 0 || devptr == 0 || devptr + nbytes < devptr) {
		client_set_errmsg("");
		return -EINVAL;
	}
	int r = drv_ready(NULL);
	if (r < 0)
		return r;
	uint64_t h = 0, at = devptr, end = devptr + nbytes;
	while (at < end) {
		CUdeviceptr s = 0;
		size_t sz = 0;
		unsigned long long id = 0, vh = 0;
		CUresult cr = alloc_range_h(at, &s, &sz, &vh);
		if (cr == CUDA_SUCCESS)
			cr = drv.cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, at);
		if (cr != CUDA_SUCCESS || sz == 0 || s + sz <= at) {
			client_set_errmsgf("0x%llx is not mapped device memory (cuPointerGetAttribute: %s)",
					   (unsigned long long)at, ename(cr));
			return -EINVAL;
		}
		h = mix(mix(mix(mix(h, s), sz), id), vh);
		at = s + sz;
	}
	*ident = h;
	return 0;
}

int ckpt_cuda_allocation(uint64_t devptr, uint64_t *start, uint64_t *size)
{
	if (!start || !size || devptr == 0) {
		client_set_errmsg("");
		return -EINVAL;
	}
	int r = drv_ready(NULL);
	if (r < 0)
		return r;
	CUdeviceptr s = 0;
	size_t sz = 0;
	int legacy = 0;
	CUresult cr = alloc_range(devptr, &s, &sz);
	if (cr == CUDA_SUCCESS)
		cr = drv.cuPointerGetAttribute(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, devptr);
	if (cr != CUDA_SUCCESS || sz == 0) {
		client_set_errmsgf("0x%llx is not device memory (cuPointerGetAttribute: %s)",
				   (unsigned long long)devptr, ename(cr));
		return -EINVAL;
	}
	*start = s;
	*size = sz;
	return legacy ? 1 : 0;
}

/* Where devptr lives: its allocation (start, size), whether it is legacy
 * (cudaMalloc) memory, its device and that device's UUID. */
static int locate(CUdeviceptr devptr, CUdeviceptr *start, size_t *size, int *legacy, CUdevice *dev, CUuuid *uuid)
{
	int ordinal = -1;
	CUresult cr = alloc_range(devptr, start, size);
	if (cr == CUDA_SUCCESS)
		cr = drv.cuPointerGetAttribute(legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, devptr);
	if (cr == CUDA_SUCCESS)
		cr = drv.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, devptr);
	if (cr != CUDA_SUCCESS) {
		client_set_errmsgf("0x%llx is not device memory (cuPointerGetAttribute: %s)",
				   (unsigned long long)devptr, ename(cr));
		return -EINVAL;
	}
	cr = drv.cuDeviceGet(dev, ordinal);
	if (cr == CUDA_SUCCESS)
		cr = drv.cuDeviceGetUuid(uuid, *dev);
	if (cr != CUDA_SUCCESS) {
		client_set_errmsgf("device %d: cuDeviceGetUuid failed: %s", ordinal, ename(cr));
		return -EIO;
	}
	return 0;
}

/* A cudaMalloc allocation's registration: its IPC handle (into ih), the
 * offset in it, and which allocation it is. */
static int legacy_register(CUdeviceptr devptr, size_t nbytes, CUdeviceptr start, size_t size, CUipcMemHandle *ih,
			   Ckpt__RegisterBuffer *rb)
{
	if (devptr + nbytes > start + size) {
		client_set_errmsgf("[0x%llx, +%zu) runs past its allocation of %zu bytes", (unsigned long long)devptr,
				   nbytes, size);
		return -ERANGE;
	}
	CUresult cr = drv.cuIpcGetMemHandle(ih, start);
	if (cr != CUDA_SUCCESS) {
		client_set_errmsgf("cuIpcGetMemHandle failed: %s", ename(cr));
		return -EIO;
	}
	/* Which allocation this is, so the daemon never serves it from a
	 * mapping of a freed one with the same handle (0: unknown). */
	unsigned long long id = 0;
	if (drv.cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, start) == CUDA_SUCCESS)
		rb->alloc_id = id;
	rb->kind = CKPT__BUFFER_KIND__CUDA_IPC;
	rb->ipc_handle.data = (uint8_t *)ih->reserved;
	rb->ipc_handle.len = sizeof(ih->reserved);
	rb->offset = devptr - start;
	return 0;
}

int ckpt_register_cuda(ckpt_client *c, uint64_t devptr, size_t nbytes, ckpt_buffer **out)
{
	if (out)
		*out = NULL;
	if (!c || !out || nbytes == 0 || devptr == 0 || devptr + nbytes < devptr) {
		client_set_errmsg("");
		return -EINVAL;
	}
	int r = drv_ready(c);
	if (r < 0)
		return r;
	CUdeviceptr start = 0;
	size_t size = 0;
	int legacy = 0;
	CUdevice dev;
	CUuuid uuid;
	if ((r = locate(devptr, &start, &size, &legacy, &dev, &uuid)) < 0)
		return r;
	Ckpt__RegisterBuffer rb = CKPT__REGISTER_BUFFER__INIT;
	CUipcMemHandle ih;
	int fds[WIRE_MAX_FDS];
	uint64_t sizes[WIRE_MAX_FDS];
	size_t nfds = 0;
	rb.nbytes = nbytes;
	rb.device_uuid.data = (uint8_t *)uuid.bytes;
	rb.device_uuid.len = sizeof(uuid.bytes);
	if (legacy) {
		r = legacy_register(devptr, nbytes, start, size, &ih, &rb);
	} else {
		size_t cap = c->max_fds && c->max_fds < WIRE_MAX_FDS ? c->max_fds : WIRE_MAX_FDS;
		r = vmm_export(start, devptr, nbytes, fds, sizes, cap, &nfds);
		rb.kind = CKPT__BUFFER_KIND__CUDA_VMM;
		rb.n_vmm_sizes = nfds;
		rb.vmm_sizes = sizes;
		rb.offset = devptr - start;
	}
	if (r < 0)
		return r;
	ckpt_buffer *b = calloc(1, sizeof(*b));
	if (!b) {
		close_fds(fds, nfds);
		client_set_errmsg("");
		return -ENOMEM;
	}
	b->fd = -1;
	b->size = nbytes;
	b->cuda = true;
	b->cuda_dev = dev;
	memcpy(b->uuid, uuid.bytes, sizeof(b->uuid));
	b->id = buffer_next_id(c);
	rb.buffer_id = b->id;
	Ckpt__Frame req = CKPT__FRAME__INIT, *rep = NULL;
	req.body_case = CKPT__FRAME__BODY_REGISTER_BUFFER;
	req.register_buffer = &rb;
	r = client_call_fds(c, &req, fds, nfds, &rep);
	/* The daemon holds its own fds now. */
	close_fds(fds, nfds);
	if (r < 0) {
		free(b);
		return r;
	}
	ckpt__frame__free_unpacked(rep, NULL);
	buffer_adopt(c, b, out);
	return 0;
}

static int event_for(struct client_cuda *cc, const ckpt_buffer *b)
{
	for (int i = 0; i < cc->n; i++)
		if (memcmp(cc->e[i].uuid, b->uuid, 16) == 0)
			return i;
	if (cc->n == MAX_EVENT_DEVICES) {
		client_set_errmsgf("CUDA tensors on more than %d devices in one save", MAX_EVENT_DEVICES);
		return -E2BIG;
	}
	CUcontext prev = NULL, ctx = NULL;
	drv.cuCtxGetCurrent(&prev);
	CUresult r = drv.cuDevicePrimaryCtxRetain(&ctx, b->cuda_dev);
	if (r == CUDA_SUCCESS)
		r = drv.cuCtxSetCurrent(ctx);
	int i = cc->n;
	if (r == CUDA_SUCCESS)
		r = drv.cuEventCreate(&cc->e[i].ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
	if (r == CUDA_SUCCESS) {
		r = drv.cuIpcGetEventHandle(&cc->e[i].h, cc->e[i].ev);
		if (r != CUDA_SUCCESS)
			drv.cuEventDestroy(cc->e[i].ev);
	}
	drv.cuCtxSetCurrent(prev);
	if (r != CUDA_SUCCESS) {
		if (ctx)
			drv.cuDevicePrimaryCtxRelease(b->cuda_dev);
		client_set_errmsgf("creating an interprocess CUDA event failed: %s", ename(r));
		return -EIO;
	}
	memcpy(cc->e[i].uuid, b->uuid, 16);
	cc->e[i].dev = b->cuda_dev;
	cc->n++;
	return i;
}

/* The connection's CUDA state, made on first use; NULL when out of
 * memory. */
static struct client_cuda *client_cuda_of(ckpt_client *c)
{
	pthread_mutex_lock(&c->mu);
	if (c->cuda == NULL) {
		c->cuda = calloc(1, sizeof(*c->cuda));
		if (c->cuda) {
			pthread_mutex_init(&c->cuda->mu, NULL);
			c->cuda_free = client_cuda_free;
		}
	}
	struct client_cuda *cc = c->cuda;
	pthread_mutex_unlock(&c->mu);
	return cc;
}

/* The devices whose events the CUDA tensors need (used[k] for cc->e[k],
 * made by event_for as needed): how many, or an error. Under cc->mu. */
static int devices_used(struct client_cuda *cc, const ckpt_tensor *tensors, size_t n, bool *used)
{
	int nused = 0;
	for (size_t i = 0; i < n; i++) {
		if (!tensors[i].buffer->cuda)
			continue;
		int k = event_for(cc, tensors[i].buffer);
		if (k < 0)
			return k;
		if (!used[k]) {
			used[k] = true;
			nused++;
		}
	}
	return nused;
}

/* Each used device's event recorded on stream and described in evs (ptrs
 * and handles beside them), the current context as it was after. Under
 * cc->mu. */
static int record_events(struct client_cuda *cc, const bool *used, void *stream, Ckpt__CudaEvent *evs,
			 Ckpt__CudaEvent **ptrs, CUipcEventHandle *handles)
{
	int j = 0;
	CUcontext prev = NULL;
	drv.cuCtxGetCurrent(&prev);
	for (int k = 0; k < cc->n; k++) {
		if (!used[k])
			continue;
		CUcontext ctx = NULL;
		CUresult cr = drv.cuDevicePrimaryCtxRetain(&ctx, cc->e[k].dev);
		if (cr == CUDA_SUCCESS) {
			drv.cuCtxSetCurrent(ctx);
			cr = drv.cuEventRecord(cc->e[k].ev, (CUstream)stream);
			drv.cuDevicePrimaryCtxRelease(cc->e[k].dev);
		}
		if (cr != CUDA_SUCCESS) {
			drv.cuCtxSetCurrent(prev);
			client_set_errmsgf("cuEventRecord on the save's stream failed: %s", ename(cr));
			return -EIO;
		}
		handles[j] = cc->e[k].h;
		ckpt__cuda_event__init(&evs[j]);
		evs[j].device_uuid.data = cc->e[k].uuid;
		evs[j].device_uuid.len = 16;
		evs[j].ipc_handle.data = (uint8_t *)handles[j].reserved;
		evs[j].ipc_handle.len = sizeof(handles[j].reserved);
		ptrs[j] = &evs[j];
		j++;
	}
	drv.cuCtxSetCurrent(prev);
	return 0;
}

int client_cuda_events(ckpt_client *c, const ckpt_tensor *tensors, size_t n, void *stream, Ckpt__Save *s,
		       void **storage)
{
	*storage = NULL;
	bool any = false;
	for (size_t i = 0; i < n && !any; i++)
		any = tensors[i].buffer && tensors[i].buffer->cuda;
	if (!any)
		return 0;
	int r = drv_ready(NULL);
	if (r < 0)
		return r;
	struct client_cuda *cc = client_cuda_of(c);
	if (cc == NULL) {
		client_set_errmsg("");
		return -ENOMEM;
	}
	pthread_mutex_lock(&cc->mu);
	bool used[MAX_EVENT_DEVICES] = { false };
	int nused = devices_used(cc, tensors, n, used);
	if (nused < 0) {
		pthread_mutex_unlock(&cc->mu);
		return nused;
	}
	Ckpt__CudaEvent *evs = calloc((size_t)nused, sizeof(*evs) + sizeof(Ckpt__CudaEvent *) + sizeof(cc->e[0].h));
	if (evs == NULL) {
		pthread_mutex_unlock(&cc->mu);
		client_set_errmsg("");
		return -ENOMEM;
	}
	Ckpt__CudaEvent **ptrs = (Ckpt__CudaEvent **)(evs + nused);
	r = record_events(cc, used, stream, evs, ptrs, (CUipcEventHandle *)(ptrs + nused));
	pthread_mutex_unlock(&cc->mu);
	if (r < 0) {
		free(evs);
		return r;
	}
	s->n_cuda_events = (size_t)nused;
	s->cuda_events = ptrs;
	*storage = evs;
	return 0;
}

int client_cuda_sync(const ckpt_tensor *tensors, size_t n)
{
	uint64_t done = 0; /* ordinals synchronised (the first 64) */
	for (size_t i = 0; i < n; i++) {
		const ckpt_buffer *b = tensors[i].buffer;
		if (!b || !b->cuda || (b->cuda_dev < 64 && (done >> b->cuda_dev) & 1))
			continue;
		int r = drv_ready(NULL);
		if (r < 0)
			return r;
		CUcontext prev = NULL, ctx = NULL;
		drv.cuCtxGetCurrent(&prev);
		CUresult cr = drv.cuDevicePrimaryCtxRetain(&ctx, b->cuda_dev);
		if (cr == CUDA_SUCCESS) {
			drv.cuCtxSetCurrent(ctx);
			cr = drv.cuCtxSynchronize();
			drv.cuCtxSetCurrent(prev);
			drv.cuDevicePrimaryCtxRelease(b->cuda_dev);
		}
		if (cr != CUDA_SUCCESS) {
			client_set_errmsgf("waiting for device %d before the restore: %s", b->cuda_dev, ename(cr));
			return -EIO;
		}
		if (b->cuda_dev < 64)
			done |= 1ull << b->cuda_dev;
	}
	return 0;
}

/* c->cuda_free, from the last client_unref(). */
static void client_cuda_free(ckpt_client *c)
{
	struct client_cuda *cc = c->cuda;
	if (cc == NULL)
		return;
	for (int i = 0; i < cc->n; i++) {
		CUcontext ctx = NULL;
		if (drv.cuDevicePrimaryCtxRetain(&ctx, cc->e[i].dev) == CUDA_SUCCESS) {
			CUcontext prev = NULL;
			drv.cuCtxGetCurrent(&prev);
			drv.cuCtxSetCurrent(ctx);
			drv.cuEventDestroy(cc->e[i].ev);
			drv.cuCtxSetCurrent(prev);
			drv.cuDevicePrimaryCtxRelease(cc->e[i].dev);
			/* the retain in event_for */
			drv.cuDevicePrimaryCtxRelease(cc->e[i].dev);
		}
	}
	pthread_mutex_destroy(&cc->mu);
	free(cc);
	c->cuda = NULL;
}

#else /* !CKPT_HAVE_CUDA */

int ckpt_cuda_available(char *why, size_t whylen)
{
	if (why && whylen)
		snprintf(why, whylen, "libckpt was built without CUDA headers");
	return 0;
}

int ckpt_register_cuda(ckpt_client *c, uint64_t devptr, size_t nbytes, ckpt_buffer **out)
{
	(void)c;
	(void)devptr;
	(void)nbytes;
	if (out)
		*out = NULL;
	client_set_errmsg("libckpt was built without CUDA headers");
	return -ENOTSUP;
}

int ckpt_cuda_identity(uint64_t devptr, size_t nbytes, uint64_t *ident)
{
	(void)devptr;
	(void)nbytes;
	(void)ident;
	client_set_errmsg("libckpt was built without CUDA headers");
	return -ENOTSUP;
}

int ckpt_cuda_allocation(uint64_t devptr, uint64_t *start, uint64_t *size)
{
	(void)devptr;
	(void)start;
	(void)size;
	client_set_errmsg("libckpt was built without CUDA headers");
	return -ENOTSUP;
}

int client_cuda_events(ckpt_client *c, const ckpt_tensor *tensors, size_t n, void *stream, Ckpt__Save *s,
		       void **storage)
{
	(void)c;
	(void)stream;
	(void)s;
	*storage = NULL;
	for (size_t i = 0; i < n; i++)
		if (tensors[i].buffer && tensors[i].buffer->cuda) {
			client_set_errmsg("libckpt was built without CUDA headers");
			return -ENOTSUP;
		}
	return 0;
}

int client_cuda_sync(const ckpt_tensor *tensors, size_t n)
{
	(void)tensors;
	(void)n;
	return 0;
}

#endif
