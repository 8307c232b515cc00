#include "cudadrv.h"

#ifdef CKPT_HAVE_CUDA

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *lib_path(void)
{
	const char *p = getenv("CKPT_CUDA_LIBRARY");
	return p && *p ? p : "libcuda.so.1";
}

int cudadrv_open(struct cudadrv *t, char *why, size_t whylen)
{
	memset(t, 0, sizeof(*t));
	const char *path = lib_path();
	t->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (t->dl == NULL) {
		const char *e = dlerror();
		snprintf(why, whylen, "no CUDA driver library: %s", e ? e : path);
		return -ENOENT;
	}
#define CUDADRV_LOAD(name, sym, args) \
	*(void **)&t->name = dlsym(t->dl, sym); \
	if (t->name == NULL) { \
		snprintf(why, whylen, "insufficient driver: %s lacks %s", path, sym); \
		cudadrv_close(t); \
		return -ENOSYS; \
	}
	CUDADRV_FUNCS(CUDADRV_LOAD)
#undef CUDADRV_LOAD
	CUresult r = t->cuInit(0);
	if (r != CUDA_SUCCESS) {
		char nb[64];
		int err = -ENODEV;
		if (r == CUDA_ERROR_STUB_LIBRARY)
			snprintf(why, whylen, "%s is a stub library (CUDA_ERROR_STUB_LIBRARY): no driver installed",
				 path);
		else if (r == CUDA_ERROR_NO_DEVICE)
			snprintf(why, whylen, "no CUDA device (CUDA_ERROR_NO_DEVICE)");
		else if (r == CUDA_ERROR_SYSTEM_DRIVER_MISMATCH || r == CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER)
			snprintf(why, whylen, "insufficient driver: %s", cudadrv_errname(t, r, nb, sizeof(nb)));
		else {
			snprintf(why, whylen, "cuInit failed: %s", cudadrv_errname(t, r, nb, sizeof(nb)));
			err = -EIO;
		}
		cudadrv_close(t);
		return err;
	}
	return 0;
}

void cudadrv_close(struct cudadrv *t)
{
	/* Never dlclose: the driver keeps threads and atexit handlers. */
	memset(t, 0, sizeof(*t));
}

const char *cudadrv_errname(const struct cudadrv *t, CUresult r, char *buf, size_t len)
{
	const char *name = NULL;
	if (t->cuGetErrorName == NULL || t->cuGetErrorName(r, &name) != CUDA_SUCCESS || name == NULL)
		name = "CUDA error";
	snprintf(buf, len, "%s (%d)", name, (int)r);
	return buf;
}

#endif /* CKPT_HAVE_CUDA */
