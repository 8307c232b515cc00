/* The CUDA driver API as one table of function pointers, loaded with
 * dlopen so that neither ckptd nor libckpt has libcuda as a link-time
 * dependency: the same binaries run on CPU-only nodes. Shared by the
 * daemon (daemon/mem/cuda.c) and the client (client/cuda.c). Symbols are
 * resolved by their versioned names (cuMemcpyDtoHAsync_v2 ...), the ones
 * cuda.h's macros select. The library comes from $CKPT_CUDA_LIBRARY (the
 * tests' fake driver) or libcuda.so.1. */
#ifndef CKPT_CUDADRV_H
#define CKPT_CUDADRV_H

#include <stddef.h>
#ifdef CKPT_HAVE_CUDA
#include <cuda.h>

#define CUDADRV_FUNCS(X) \
	X(cuInit, "cuInit", (unsigned int)) \
	X(cuDriverGetVersion, "cuDriverGetVersion", (int *)) \
	X(cuGetErrorName, "cuGetErrorName", (CUresult, const char **)) \
	X(cuDeviceGetCount, "cuDeviceGetCount", (int *)) \
	X(cuDeviceGet, "cuDeviceGet", (CUdevice *, int)) \
	X(cuDeviceGetUuid, "cuDeviceGetUuid_v2", (CUuuid *, CUdevice)) \
	X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext *, CUdevice)) \
	X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", (CUdevice)) \
	X(cuCtxSetCurrent, "cuCtxSetCurrent", (CUcontext)) \
	X(cuCtxGetCurrent, "cuCtxGetCurrent", (CUcontext *)) \
	X(cuCtxSynchronize, "cuCtxSynchronize", (void)) \
	X(cuMemGetAddressRange, "cuMemGetAddressRange_v2", (CUdeviceptr *, size_t *, CUdeviceptr)) \
	X(cuPointerGetAttribute, "cuPointerGetAttribute", (void *, CUpointer_attribute, CUdeviceptr)) \
	X(cuIpcGetMemHandle, "cuIpcGetMemHandle", (CUipcMemHandle *, CUdeviceptr)) \
	X(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2", (CUdeviceptr *, CUipcMemHandle, unsigned int)) \
	X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", (CUdeviceptr)) \
	X(cuIpcGetEventHandle, "cuIpcGetEventHandle", (CUipcEventHandle *, CUevent)) \
	X(cuIpcOpenEventHandle, "cuIpcOpenEventHandle", (CUevent *, CUipcEventHandle)) \
	X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", (CUmemGenericAllocationHandle *, void *)) \
	X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle", \
	  (void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long)) \
	X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", \
	  (CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType)) \
	X(cuMemRelease, "cuMemRelease", (CUmemGenericAllocationHandle)) \
	X(cuMemGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle", \
	  (CUmemAllocationProp *, CUmemGenericAllocationHandle)) \
	X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", \
	  (size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags)) \
	X(cuMemAddressReserve, "cuMemAddressReserve", \
	  (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long)) \
	X(cuMemAddressFree, "cuMemAddressFree", (CUdeviceptr, size_t)) \
	X(cuMemMap, "cuMemMap", (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)) \
	X(cuMemUnmap, "cuMemUnmap", (CUdeviceptr, size_t)) \
	X(cuMemSetAccess, "cuMemSetAccess", (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t)) \
	X(cuMemHostRegister, "cuMemHostRegister_v2", (void *, size_t, unsigned int)) \
	X(cuMemHostUnregister, "cuMemHostUnregister", (void *)) \
	X(cuStreamCreate, "cuStreamCreate", (CUstream *, unsigned int)) \
	X(cuStreamDestroy, "cuStreamDestroy_v2", (CUstream)) \
	X(cuStreamWaitEvent, "cuStreamWaitEvent", (CUstream, CUevent, unsigned int)) \
	X(cuStreamSynchronize, "cuStreamSynchronize", (CUstream)) \
	X(cuEventCreate, "cuEventCreate", (CUevent *, unsigned int)) \
	X(cuEventRecord, "cuEventRecord", (CUevent, CUstream)) \
	X(cuEventDestroy, "cuEventDestroy_v2", (CUevent)) \
	X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", (void *, CUdeviceptr, size_t, CUstream)) \
	X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", (CUdeviceptr, const void *, size_t, CUstream))

struct cudadrv {
	void *dl;
#define CUDADRV_FIELD(name, sym, args) CUresult(*name) args;
	CUDADRV_FUNCS(CUDADRV_FIELD)
#undef CUDADRV_FIELD
};

/* dlopen the driver, resolve every entry and run cuInit(0). 0, or -errno
 * with why saying which of: no library, a missing symbol, a stub library
 * (CUDA_ERROR_STUB_LIBRARY), no device, an insufficient driver (a missing
 * symbol, CUDA_ERROR_SYSTEM_DRIVER_MISMATCH), or another
 * cuInit error. On failure nothing stays loaded. */
int cudadrv_open(struct cudadrv *t, char *why, size_t whylen);
void cudadrv_close(struct cudadrv *t);
/* "CUDA_ERROR_INVALID_VALUE (1)"; never NULL. */
const char *cudadrv_errname(const struct cudadrv *t, CUresult r, char *buf, size_t len);
#endif /* CKPT_HAVE_CUDA */

#endif
