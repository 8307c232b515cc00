/* A fake CUDA driver for CI: the entry points of common/cudadrv.h (and a
 * few more a test program needs), implemented over host memory.
 *
 * - "Device" memory is memfd-backed host memory, so legacy IPC handles and
 *   VMM POSIX fds work across processes: an IPC handle names the owner's
 *   pid and fd, opened through /proc/<pid>/fd like the real driver needs a
 *   shared PID namespace.
 * - Streams are worker threads that run their operations asynchronously
 *   and in order. Events live in a shared page, so an interprocess event
 *   recorded in the trainer can be waited on by the daemon's streams.
 * - fakecuda_fill_async() is a "kernel": it writes a pattern on a stream
 *   after a delay, so tests can check that a copy waits for it.
 *
 * Error injection, read from the environment of each process:
 *   FAKECUDA_INIT_ERROR=N       cuInit returns N (34 stub library, 100 no device)
 *   FAKECUDA_DEVICES=N          number of devices (default 1, at most 8)
 *   FAKECUDA_UUID_SALT=c        changes every device UUID (a "different machine")
 *   FAKECUDA_FAIL_OPEN=1        cuIpcOpenMemHandle / cuMemImportFromShareableHandle fail
 *   FAKECUDA_FAIL_COPY_AFTER=N  D2H copies after the first N fail (CUDA_ERROR_ILLEGAL_ADDRESS)
 *   FAKECUDA_REQUIRE_PINNED=1   D2H copies into host memory that was not
 *                               cuMemHostRegister'ed fail
 *   FAKECUDA_HOST_REGISTER_MS=N cuMemHostRegister takes N ms
 */
#include <cuda.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))
#define MAXDEV 8
#define MAGIC_MEM 0x504b4946u /* "FIKP" */
#define MAGIC_EV 0x56454b46u  /* "FKEV" */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static bool inited;
static int ndev = 1;
static _Atomic unsigned long d2h_calls;

struct fctx {
	int dev;
};
static struct fctx ctxs[MAXDEV];
static __thread struct fctx *cur;

/* A range of fake device memory in this process. */
struct region {
	struct region *next;
	uintptr_t base;
	size_t size;
	int dev;
	int kind;       /* 0 cuMemAlloc, 1 IPC-opened, 2 VMM mapping */
	int fd;         /* kinds 0 and 1 */
	struct vmmh *h; /* kind 2 */
	uint64_t id;    /* CU_POINTER_ATTRIBUTE_BUFFER_ID: never reused in a process */
};
static struct region *regions;
static uint64_t next_region_id = 1;

/* A cuMemAddressReserve range: what RANGE_START_ADDR and RANGE_SIZE say
 * of a VMM mapping in it, as the real driver does (cuda.h). */
struct resv {
	struct resv *next;
	uintptr_t base;
	size_t size;
};
static struct resv *resvs;

struct vmmh {
	int fd;
	size_t size;
	int dev;
	int refs;
};

struct hostreg {
	struct hostreg *next;
	uintptr_t base;
	size_t size;
};
static struct hostreg *hostregs;

struct evshared {
	_Atomic uint64_t recorded, completed;
};
struct fevent {
	struct evshared *sh;
	int fd; /* interprocess events: the memfd behind sh */
};

enum opkind {
	OP_COPY,
	OP_RECORD,
	OP_WAIT,
	OP_FILL
};
struct op {
	struct op *next;
	enum opkind kind;
	void *dst;
	const void *src;
	size_t n;
	struct evshared *ev;
	uint64_t target;
	unsigned char seed;
	unsigned delay_us;
};
struct fstream {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct op *head, *tail;
	uint64_t enq, done;
	bool stop;
	pthread_t th;
	int dev;
};
static struct fstream *default_stream;

static bool env_on(const char *name)
{
	const char *v = getenv(name);
	return v && *v && strcmp(v, "0") != 0;
}

static CUresult check_init(void)
{
	return inited ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

API CUresult cuInit(unsigned int flags)
{
	(void)flags;
	const char *e = getenv("FAKECUDA_INIT_ERROR");
	if (e && *e)
		return (CUresult)atoi(e);
	const char *n = getenv("FAKECUDA_DEVICES");
	if (n && *n) {
		ndev = atoi(n);
		if (ndev < 0 || ndev > MAXDEV)
			ndev = 1;
	}
	if (ndev == 0)
		return CUDA_ERROR_NO_DEVICE;
	for (int i = 0; i < MAXDEV; i++)
		ctxs[i].dev = i;
	inited = true;
	return CUDA_SUCCESS;
}

API CUresult cuDriverGetVersion(int *v)
{
	*v = 13000;
	return CUDA_SUCCESS;
}

API CUresult cuGetErrorName(CUresult r, const char **s)
{
	switch (r) {
	case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
	case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
	case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
	case CUDA_ERROR_NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; break;
	case CUDA_ERROR_STUB_LIBRARY: *s = "CUDA_ERROR_STUB_LIBRARY"; break;
	case CUDA_ERROR_NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; break;
	case CUDA_ERROR_INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
	case CUDA_ERROR_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
	case CUDA_ERROR_INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
	case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
	case CUDA_ERROR_NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; break;
	case CUDA_ERROR_LAUNCH_TIMEOUT: *s = "CUDA_ERROR_LAUNCH_TIMEOUT"; break;
	default: return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int *n)
{
	CUresult r = check_init();
	if (r == CUDA_SUCCESS)
		*n = ndev;
	return r;
}

API CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
	CUresult r = check_init();
	if (r != CUDA_SUCCESS)
		return r;
	if (ordinal < 0 || ordinal >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	*d = ordinal;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d)
{
	if (d < 0 || d >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	memset(u, 0, sizeof(*u));
	memcpy(u->bytes, "fakecuda", 8);
	const char *salt = getenv("FAKECUDA_UUID_SALT");
	u->bytes[8] = (char)(salt && *salt ? salt[0] : '0');
	u->bytes[15] = (char)d;
	return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
	CUresult r = check_init();
	if (r != CUDA_SUCCESS)
		return r;
	if (d < 0 || d >= ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	*c = (CUcontext)&ctxs[d];
	return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
	return d >= 0 && d < ndev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

API CUresult cuCtxSetCurrent(CUcontext c)
{
	cur = (struct fctx *)c;
	return CUDA_SUCCESS;
}

API CUresult cuCtxGetCurrent(CUcontext *c)
{
	*c = (CUcontext)cur;
	return CUDA_SUCCESS;
}

static struct region *find_region(uintptr_t p, size_t n);

API CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
	pthread_mutex_lock(&mu);
	struct region *r = find_region((uintptr_t)p, 1);
	if (r) {
		if (base)
			*base = r->base;
		if (size)
			*size = r->size;
	}
	pthread_mutex_unlock(&mu);
	return r ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

API CUresult cuCtxGetDevice(CUdevice *d)
{
	if (cur == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	*d = cur->dev;
	return CUDA_SUCCESS;
}

/* Callers hold mu. The region holding p. */
static struct region *find_region(uintptr_t p, size_t n)
{
	for (struct region *r = regions; r; r = r->next)
		if (p >= r->base && p - r->base < r->size && n <= r->size - (p - r->base))
			return r;
	return NULL;
}

/* [p, p+n) is device memory, possibly over back-to-back VMM mappings. */
static bool covered(uintptr_t p, size_t n)
{
	while (n > 0) {
		struct region *r = find_region(p, 1);
		if (r == NULL)
			return false;
		size_t in = r->size - (p - r->base);
		if (in >= n)
			return true;
		p += in;
		n -= in;
	}
	return true;
}

static bool is_pinned(const void *p, size_t n)
{
	uintptr_t a = (uintptr_t)p;
	for (struct hostreg *h = hostregs; h; h = h->next)
		if (a >= h->base && a - h->base < h->size && n <= h->size - (a - h->base))
			return true;
	return false;
}

static struct region *add_region(uintptr_t base, size_t size, int dev, int kind, int fd, struct vmmh *h)
{
	struct region *r = calloc(1, sizeof(*r));
	if (r == NULL)
		return NULL;
	*r = (struct region){
		.base = base, .size = size, .dev = dev, .kind = kind, .fd = fd, .h = h, .id = next_region_id++
	};
	r->next = regions;
	regions = r;
	return r;
}

static void del_region(struct region *x)
{
	for (struct region **pp = &regions; *pp; pp = &(*pp)->next)
		if (*pp == x) {
			*pp = x->next;
			free(x);
			return;
		}
}

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
	if (cur == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	int fd = memfd_create("fakecuda-mem", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)n) != 0) {
		if (fd >= 0)
			close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_mutex_lock(&mu);
	add_region((uintptr_t)m, n, cur->dev, 0, fd, NULL);
	pthread_mutex_unlock(&mu);
	*p = (CUdeviceptr)(uintptr_t)m;
	return CUDA_SUCCESS;
}

/* Unmap and forget the region of that kind starting at p. */
static CUresult drop_region(CUdeviceptr p, int kind)
{
	pthread_mutex_lock(&mu);
	struct region *r = find_region((uintptr_t)p, 0);
	if (r == NULL || r->base != (uintptr_t)p || r->kind != kind) {
		pthread_mutex_unlock(&mu);
		return CUDA_ERROR_INVALID_VALUE;
	}
	munmap((void *)r->base, r->size);
	close(r->fd);
	del_region(r);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

API CUresult cuMemFree_v2(CUdeviceptr p)
{
	return drop_region(p, 0);
}

/* Callers hold mu. The range RANGE_START_ADDR and RANGE_SIZE describe:
 * for a VMM mapping its whole reservation, else the allocation. */
static uintptr_t range_of(const struct region *r, size_t *size)
{
	if (r->kind == 2)
		for (struct resv *v = resvs; v; v = v->next)
			if (r->base >= v->base && r->base - v->base < v->size) {
				*size = v->size;
				return v->base;
			}
	*size = r->size;
	return r->base;
}

API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p)
{
	size_t n;
	pthread_mutex_lock(&mu);
	struct region *r = find_region((uintptr_t)p, 1);
	if (r == NULL) {
		pthread_mutex_unlock(&mu);
		return CUDA_ERROR_INVALID_VALUE;
	}
	CUresult res = CUDA_SUCCESS;
	switch (attr) {
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = range_of(r, &n); break;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE: range_of(r, (size_t *)data); break;
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *(int *)data = r->kind == 0; break;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = r->dev; break;
	case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data = r->id; break;
	default: res = CUDA_ERROR_INVALID_VALUE;
	}
	pthread_mutex_unlock(&mu);
	return res;
}

struct ipcmem {
	uint32_t magic;
	int32_t pid, fd, dev;
	uint64_t size;
};

API CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
	pthread_mutex_lock(&mu);
	struct region *r = find_region((uintptr_t)p, 0);
	if (r == NULL || r->base != (uintptr_t)p || r->kind != 0) {
		pthread_mutex_unlock(&mu);
		return CUDA_ERROR_INVALID_VALUE;
	}
	struct ipcmem im = { MAGIC_MEM, (int32_t)getpid(), r->fd, r->dev, r->size };
	pthread_mutex_unlock(&mu);
	memset(h, 0, sizeof(*h));
	memcpy(h->reserved, &im, sizeof(im));
	return CUDA_SUCCESS;
}

static int open_remote_fd(int pid, int fd)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
	return open(path, O_RDWR | O_CLOEXEC);
}

API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags)
{
	(void)flags;
	if (cur == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	struct ipcmem im;
	memcpy(&im, h.reserved, sizeof(im));
	if (im.magic != MAGIC_MEM || im.size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (env_on("FAKECUDA_FAIL_OPEN"))
		return CUDA_ERROR_INVALID_HANDLE;
	int fd = open_remote_fd(im.pid, im.fd);
	if (fd < 0)
		return CUDA_ERROR_INVALID_HANDLE;
	void *m = mmap(NULL, im.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_mutex_lock(&mu);
	add_region((uintptr_t)m, im.size, im.dev, 1, fd, NULL);
	pthread_mutex_unlock(&mu);
	*p = (CUdeviceptr)(uintptr_t)m;
	return CUDA_SUCCESS;
}

API CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
	return drop_region(p, 1);
}

/* ---- VMM ---- */

API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
					   CUmemAllocationGranularity_flags f)
{
	(void)prop;
	(void)f;
	*g = 2u << 20;
	return CUDA_SUCCESS;
}

API CUresult cuMemCreate(CUmemGenericAllocationHandle *out, size_t size, const CUmemAllocationProp *prop,
			 unsigned long long flags)
{
	(void)flags;
	if (size == 0 || prop == NULL || prop->location.id < 0 || prop->location.id >= ndev)
		return CUDA_ERROR_INVALID_VALUE;
	struct vmmh *h = calloc(1, sizeof(*h));
	if (h == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	h->fd = memfd_create("fakecuda-vmm", MFD_CLOEXEC);
	if (h->fd < 0 || ftruncate(h->fd, (off_t)size) != 0) {
		if (h->fd >= 0)
			close(h->fd);
		free(h);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	h->size = size;
	h->dev = prop->location.id;
	h->refs = 1;
	*out = (CUmemGenericAllocationHandle)(uintptr_t)h;
	return CUDA_SUCCESS;
}

static void vmmh_put(struct vmmh *h)
{
	if (--h->refs == 0) {
		close(h->fd);
		free(h);
	}
}

API CUresult cuMemRelease(CUmemGenericAllocationHandle hh)
{
	struct vmmh *h = (struct vmmh *)(uintptr_t)hh;
	if (h == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	vmmh_put(h);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags)
{
	(void)align;
	(void)addr;
	(void)flags;
	/* Aligned to the granularity, as the driver's. */
	const size_t g = 2u << 20;
	if (size == 0 || size % g != 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct resv *v = calloc(1, sizeof(*v));
	void *m = v ? mmap(NULL, size + g, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) : MAP_FAILED;
	if (m == MAP_FAILED) {
		free(v);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	uintptr_t a = ((uintptr_t)m + g - 1) & ~(uintptr_t)(g - 1);
	if (a > (uintptr_t)m)
		munmap(m, a - (uintptr_t)m);
	munmap((void *)(a + size), (uintptr_t)m + g - a);
	pthread_mutex_lock(&mu);
	*v = (struct resv){ .next = resvs, .base = a, .size = size };
	resvs = v;
	pthread_mutex_unlock(&mu);
	*p = (CUdeviceptr)a;
	return CUDA_SUCCESS;
}

API CUresult cuMemAddressFree(CUdeviceptr p, size_t size)
{
	pthread_mutex_lock(&mu);
	for (struct resv **pp = &resvs; *pp; pp = &(*pp)->next)
		if ((*pp)->base == (uintptr_t)p && (*pp)->size == size) {
			struct resv *v = *pp;
			*pp = v->next;
			free(v);
			pthread_mutex_unlock(&mu);
			return munmap((void *)(uintptr_t)p, size) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
		}
	pthread_mutex_unlock(&mu);
	return CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle hh,
		      unsigned long long flags)
{
	(void)flags;
	struct vmmh *h = (struct vmmh *)(uintptr_t)hh;
	if (h == NULL || offset != 0)
		return CUDA_ERROR_INVALID_VALUE;
	/* What an H100 with driver 580 answered to a size over the
	 * allocation's. */
	if (size != h->size)
		return CUDA_ERROR_NOT_SUPPORTED;
	void *m = mmap((void *)(uintptr_t)p, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, h->fd, 0);
	if (m == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&mu);
	h->refs++;
	add_region((uintptr_t)p, size, h->dev, 2, -1, h);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

API CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
	pthread_mutex_lock(&mu);
	/* Like the real driver: the range must be covered by whole mappings,
	 * with no gap. */
	for (uintptr_t at = (uintptr_t)p; at < (uintptr_t)p + size;) {
		struct region *r = find_region(at, 1);
		if (r == NULL || r->kind != 2 || r->base != at || r->size > (uintptr_t)p + size - at) {
			pthread_mutex_unlock(&mu);
			return CUDA_ERROR_INVALID_VALUE;
		}
		at += r->size;
	}
	for (;;) {
		struct region *r = NULL;
		for (struct region *x = regions; x; x = x->next)
			if (x->kind == 2 && x->base >= (uintptr_t)p && x->base - (uintptr_t)p < size)
				r = x;
		if (r == NULL)
			break;
		mmap((void *)r->base, r->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
		     0);
		vmmh_put(r->h);
		del_region(r);
	}
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

API CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *d, size_t n)
{
	(void)d;
	(void)n;
	pthread_mutex_lock(&mu);
	struct region *r = find_region((uintptr_t)p, 1);
	pthread_mutex_unlock(&mu);
	return r && size > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle hh)
{
	struct vmmh *h = (struct vmmh *)(uintptr_t)hh;
	if (h == NULL || prop == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	memset(prop, 0, sizeof(*prop));
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = h->dev;
	return CUDA_SUCCESS;
}

API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *out, void *addr)
{
	pthread_mutex_lock(&mu);
	struct region *r = find_region((uintptr_t)addr, 1);
	if (r == NULL || r->kind != 2) {
		pthread_mutex_unlock(&mu);
		return CUDA_ERROR_INVALID_VALUE;
	}
	r->h->refs++;
	*out = (CUmemGenericAllocationHandle)(uintptr_t)r->h;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

API CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle hh, CUmemAllocationHandleType type,
					  unsigned long long flags)
{
	(void)flags;
	struct vmmh *h = (struct vmmh *)(uintptr_t)hh;
	if (h == NULL || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_INVALID_VALUE;
	int fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*(int *)out = fd;
	return CUDA_SUCCESS;
}

API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *out, void *os, CUmemAllocationHandleType type)
{
	if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_INVALID_VALUE;
	if (env_on("FAKECUDA_FAIL_OPEN"))
		return CUDA_ERROR_INVALID_HANDLE;
	int fd = (int)(intptr_t)os;
	struct stat st;
	/* Only fds this fake exported: memfds with our name. */
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 || fcntl(fd, F_GET_SEALS) < 0)
		return CUDA_ERROR_INVALID_HANDLE;
	struct vmmh *h = calloc(1, sizeof(*h));
	if (h == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	h->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	h->size = (size_t)st.st_size;
	h->dev = cur ? cur->dev : 0;
	h->refs = 1;
	*out = (CUmemGenericAllocationHandle)(uintptr_t)h;
	return CUDA_SUCCESS;
}

/* ---- pinned host memory ---- */

API CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags)
{
	(void)flags;
	if (p == NULL || n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	/* A real driver takes about a second per tens of GiB: a test can say
	 * how long (the range counts as pinned only after). */
	const char *ms = getenv("FAKECUDA_HOST_REGISTER_MS");
	if (ms && atoi(ms) > 0)
		nanosleep(&(struct timespec){ atoi(ms) / 1000, (long)(atoi(ms) % 1000) * 1000000 }, NULL);
	struct hostreg *h = calloc(1, sizeof(*h));
	if (h == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	h->base = (uintptr_t)p;
	h->size = n;
	pthread_mutex_lock(&mu);
	h->next = hostregs;
	hostregs = h;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

API CUresult cuMemHostUnregister(void *p)
{
	pthread_mutex_lock(&mu);
	for (struct hostreg **pp = &hostregs; *pp; pp = &(*pp)->next)
		if ((*pp)->base == (uintptr_t)p) {
			struct hostreg *h = *pp;
			*pp = h->next;
			free(h);
			pthread_mutex_unlock(&mu);
			return CUDA_SUCCESS;
		}
	pthread_mutex_unlock(&mu);
	return CUDA_ERROR_INVALID_VALUE;
}

/* ---- streams and events ---- */

static void spin_wait(struct evshared *ev, uint64_t target)
{
	/* A real GPU never gives up on an event; a fake one whose recorder
	 * died would hang the daemon's stream forever, so give up after 60 s. */
	for (int i = 0; i < 60 * 20000; i++) {
		if (atomic_load(&ev->completed) >= target)
			return;
		nanosleep(&(struct timespec){ 0, 50000 }, NULL);
	}
}

static void run_op(struct op *o)
{
	switch (o->kind) {
	case OP_COPY: memcpy(o->dst, o->src, o->n); break;
	case OP_RECORD: {
		uint64_t c = atomic_load(&o->ev->completed);
		while (c < o->target && !atomic_compare_exchange_weak(&o->ev->completed, &c, o->target))
			;
		break;
	}
	case OP_WAIT: spin_wait(o->ev, o->target); break;
	case OP_FILL:
		if (o->delay_us)
			nanosleep(&(struct timespec){ o->delay_us / 1000000, (o->delay_us % 1000000) * 1000L }, NULL);
		for (size_t i = 0; i < o->n; i++)
			((unsigned char *)o->dst)[i] = (unsigned char)(o->seed + i * 131u + (i >> 12));
		break;
	}
}

static void *stream_main(void *arg)
{
	struct fstream *s = arg;
	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (s->head == NULL && !s->stop)
			pthread_cond_wait(&s->cv, &s->mu);
		if (s->head == NULL)
			break;
		struct op *o = s->head;
		pthread_mutex_unlock(&s->mu);
		run_op(o);
		pthread_mutex_lock(&s->mu);
		s->head = o->next;
		if (s->head == NULL)
			s->tail = NULL;
		s->done++;
		free(o);
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static struct fstream *stream_new(int dev)
{
	struct fstream *s = calloc(1, sizeof(*s));
	if (s == NULL)
		return NULL;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	s->dev = dev;
	if (pthread_create(&s->th, NULL, stream_main, s) != 0) {
		free(s);
		return NULL;
	}
	return s;
}

static struct fstream *stream_of(CUstream hs)
{
	if (hs != NULL)
		return (struct fstream *)hs;
	pthread_mutex_lock(&mu);
	if (default_stream == NULL)
		default_stream = stream_new(0);
	struct fstream *s = default_stream;
	pthread_mutex_unlock(&mu);
	return s;
}

static CUresult enqueue(CUstream hs, struct op *o)
{
	struct fstream *s = stream_of(hs);
	if (s == NULL) {
		free(o);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_mutex_lock(&s->mu);
	if (s->tail)
		s->tail->next = o;
	else
		s->head = o;
	s->tail = o;
	s->enq++;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return CUDA_SUCCESS;
}

static struct op *op_new(enum opkind k)
{
	struct op *o = calloc(1, sizeof(*o));
	if (o)
		o->kind = k;
	return o;
}

API CUresult cuCtxSynchronize(void)
{
	if (cur == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	/* Every stream of this process: the default one is enough for the
	 * tests, which write on it or on streams they synchronise. */
	return cuStreamSynchronize(NULL);
}

API CUresult cuStreamCreate(CUstream *out, unsigned int flags)
{
	(void)flags;
	if (cur == NULL)
		return CUDA_ERROR_INVALID_CONTEXT;
	struct fstream *s = stream_new(cur->dev);
	if (s == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*out = (CUstream)s;
	return CUDA_SUCCESS;
}

API CUresult cuStreamSynchronize(CUstream hs)
{
	struct fstream *s = stream_of(hs);
	if (s == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&s->mu);
	uint64_t want = s->enq;
	while (s->done < want)
		pthread_cond_wait(&s->cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
	return CUDA_SUCCESS;
}

API CUresult cuStreamDestroy_v2(CUstream hs)
{
	struct fstream *s = (struct fstream *)hs;
	if (s == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&s->mu);
	s->stop = true;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->th, NULL);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s);
	return CUDA_SUCCESS;
}

API CUresult cuEventCreate(CUevent *out, unsigned int flags)
{
	struct fevent *e = calloc(1, sizeof(*e));
	if (e == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	e->fd = -1;
	if (flags & CU_EVENT_INTERPROCESS) {
		if (!(flags & CU_EVENT_DISABLE_TIMING)) {
			free(e);
			return CUDA_ERROR_INVALID_VALUE;
		}
		e->fd = memfd_create("fakecuda-event", MFD_CLOEXEC);
		if (e->fd < 0 || ftruncate(e->fd, sizeof(struct evshared)) != 0) {
			if (e->fd >= 0)
				close(e->fd);
			free(e);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		e->sh = mmap(NULL, sizeof(struct evshared), PROT_READ | PROT_WRITE, MAP_SHARED, e->fd, 0);
	} else {
		e->sh = mmap(NULL, sizeof(struct evshared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	}
	if (e->sh == MAP_FAILED) {
		if (e->fd >= 0)
			close(e->fd);
		free(e);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*out = (CUevent)e;
	return CUDA_SUCCESS;
}

API CUresult cuEventDestroy_v2(CUevent he)
{
	struct fevent *e = (struct fevent *)he;
	if (e == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	munmap(e->sh, sizeof(struct evshared));
	if (e->fd >= 0)
		close(e->fd);
	free(e);
	return CUDA_SUCCESS;
}

API CUresult cuEventRecord(CUevent he, CUstream hs)
{
	struct fevent *e = (struct fevent *)he;
	if (e == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	struct op *o = op_new(OP_RECORD);
	if (o == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	o->ev = e->sh;
	o->target = atomic_fetch_add(&e->sh->recorded, 1) + 1;
	return enqueue(hs, o);
}

API CUresult cuEventSynchronize(CUevent he)
{
	struct fevent *e = (struct fevent *)he;
	if (e == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	spin_wait(e->sh, atomic_load(&e->sh->recorded));
	return CUDA_SUCCESS;
}

API CUresult cuStreamWaitEvent(CUstream hs, CUevent he, unsigned int flags)
{
	(void)flags;
	struct fevent *e = (struct fevent *)he;
	if (e == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	uint64_t target = atomic_load(&e->sh->recorded);
	if (target == 0)
		return CUDA_SUCCESS;
	struct op *o = op_new(OP_WAIT);
	if (o == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	o->ev = e->sh;
	o->target = target;
	return enqueue(hs, o);
}

struct ipcev {
	uint32_t magic;
	int32_t pid, fd;
};

API CUresult cuIpcGetEventHandle(CUipcEventHandle *h, CUevent he)
{
	struct fevent *e = (struct fevent *)he;
	if (e == NULL || e->fd < 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct ipcev ie = { MAGIC_EV, (int32_t)getpid(), e->fd };
	memset(h, 0, sizeof(*h));
	memcpy(h->reserved, &ie, sizeof(ie));
	return CUDA_SUCCESS;
}

API CUresult cuIpcOpenEventHandle(CUevent *out, CUipcEventHandle h)
{
	struct ipcev ie;
	memcpy(&ie, h.reserved, sizeof(ie));
	if (ie.magic != MAGIC_EV)
		return CUDA_ERROR_INVALID_VALUE;
	struct fevent *e = calloc(1, sizeof(*e));
	if (e == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	e->fd = open_remote_fd(ie.pid, ie.fd);
	if (e->fd < 0) {
		free(e);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	e->sh = mmap(NULL, sizeof(struct evshared), PROT_READ | PROT_WRITE, MAP_SHARED, e->fd, 0);
	if (e->sh == MAP_FAILED) {
		close(e->fd);
		free(e);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	*out = (CUevent)e;
	return CUDA_SUCCESS;
}

/* ---- copies ---- */

static CUresult copy_async(void *dst, const void *src, uintptr_t dev, size_t n, bool d2h, CUstream hs)
{
	if (n == 0)
		return CUDA_SUCCESS;
	if (d2h) {
		const char *e = getenv("FAKECUDA_FAIL_COPY_AFTER");
		unsigned long k = atomic_fetch_add(&d2h_calls, 1);
		if (e && *e && k >= strtoul(e, NULL, 10))
			return CUDA_ERROR_ILLEGAL_ADDRESS;
	}
	pthread_mutex_lock(&mu);
	bool ok = covered(dev, n);
	bool pinned = !d2h || is_pinned(dst, n);
	pthread_mutex_unlock(&mu);
	if (!ok)
		return CUDA_ERROR_INVALID_VALUE;
	if (!pinned && env_on("FAKECUDA_REQUIRE_PINNED"))
		return CUDA_ERROR_INVALID_VALUE;
	struct op *o = op_new(OP_COPY);
	if (o == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	o->dst = dst;
	o->src = src;
	o->n = n;
	return enqueue(hs, o);
}

API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream hs)
{
	return copy_async(dst, (const void *)(uintptr_t)src, (uintptr_t)src, n, true, hs);
}

API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream hs)
{
	return copy_async((void *)(uintptr_t)dst, src, (uintptr_t)dst, n, false, hs);
}

/* The test "kernel": after delay_us, write a pattern derived from seed
 * into [p, p+n) on stream hs. fakecuda_pattern() gives the expected byte. */
API CUresult fakecuda_fill_async(CUdeviceptr p, size_t n, unsigned char seed, unsigned delay_us, CUstream hs)
{
	pthread_mutex_lock(&mu);
	bool ok = covered((uintptr_t)p, n);
	pthread_mutex_unlock(&mu);
	if (!ok)
		return CUDA_ERROR_INVALID_VALUE;
	struct op *o = op_new(OP_FILL);
	if (o == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	o->dst = (void *)(uintptr_t)p;
	o->n = n;
	o->seed = seed;
	o->delay_us = delay_us;
	return enqueue(hs, o);
}

API unsigned char fakecuda_pattern(unsigned char seed, size_t i)
{
	return (unsigned char)(seed + i * 131u + (i >> 12));
}
