// Real-GPU test of ckptd's CUDA path (DESIGN §6), built with nvcc by
// tests/gpu/run.sh. Needs a GPU, a running ckptd with CUDA on, and
// libckpt. It:
//  1. allocates one buffer with cudaMalloc (legacy IPC) and one with
//     cuMemCreate (VMM, POSIX fd), fills both with a kernel on a stream;
//  2. saves both through ckptd with the stream's event, waits for durable;
//  3. wipes them, restores (from the daemon's memory, then from storage),
//     and verifies every byte on the GPU;
//  4. measures D2H staging bandwidth (bytes / time to staged, seen by the
//     trainer) against a plain cudaMemcpyAsync D2H into pinned memory of
//     the same size, in the same run (the goal is at least 90%), the H2D
//     restore from the daemon's memory against cudaMemcpyAsync H2D, and
//     the first save (IPC opens, pool pinning) against the later ones;
//  5. frees the cudaMalloc buffer and allocates it again (at the same
//     address, when the driver gives it back), saves new contents and
//     checks that the step holds them, not a stale IPC mapping's.
// Exit status 0 only if every check passed.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ckpt/ckpt.h"

#define CK(x)                                                                                  \
	do {                                                                                   \
		cudaError_t e_ = (x);                                                          \
		if (e_ != cudaSuccess) {                                                       \
			fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
			exit(1);                                                               \
		}                                                                              \
	} while (0)
#define CU(x)                                                                                  \
	do {                                                                                   \
		CUresult r_ = (x);                                                             \
		if (r_ != CUDA_SUCCESS) {                                                      \
			const char *s_ = "?";                                                  \
			cuGetErrorName(r_, &s_);                                               \
			fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_);         \
			exit(1);                                                               \
		}                                                                              \
	} while (0)
#define CP(x)                                                                                  \
	do {                                                                                   \
		int r_ = (x);                                                                  \
		if (r_ < 0) {                                                                  \
			fprintf(stderr, "%s:%d %s: %s (%s)\n", __FILE__, __LINE__, #x, ckpt_strerror(r_), \
				ckpt_errmsg());                                                \
			exit(1);                                                               \
		}                                                                              \
	} while (0)

__global__ void fill(uint32_t *p, size_t n, uint32_t seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = (uint32_t)(i * 2654435761u) ^ seed;
}

__global__ void check(const uint32_t *p, size_t n, uint32_t seed, unsigned long long *bad)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		if (p[i] != ((uint32_t)(i * 2654435761u) ^ seed))
			atomicAdd(bad, 1ull);
}

static double now_s()
{
	return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Plain device memory for the counter: managed memory is best avoided on
// the lent machines (device/README.md).
static unsigned long long count_bad(const uint32_t *p, size_t n, uint32_t seed, cudaStream_t s)
{
	unsigned long long *bad, r = 0;
	CK(cudaMalloc(&bad, sizeof(*bad)));
	CK(cudaMemsetAsync(bad, 0, sizeof(*bad), s));
	check<<<1024, 256, 0, s>>>(p, n, seed, bad);
	CK(cudaMemcpyAsync(&r, bad, sizeof(r), cudaMemcpyDeviceToHost, s));
	CK(cudaStreamSynchronize(s));
	CK(cudaFree(bad));
	return r;
}

static double median(std::vector<double> v)
{
	if (v.empty())
		return 0;
	std::sort(v.begin(), v.end());
	return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

int main(int argc, char **argv)
{
	const char *sock = argc > 1 ? argv[1] : CKPT_DEFAULT_SOCKET;
	size_t mib = argc > 2 ? strtoull(argv[2], nullptr, 10) : 1024;
	size_t bytes = mib << 20, words = bytes / 4;
	int rounds = argc > 3 ? atoi(argv[3]) : 3;
	char why[256];
	if (!ckpt_cuda_available(why, sizeof(why))) {
		fprintf(stderr, "CUDA unavailable to libckpt: %s\n", why);
		return 1;
	}
	CK(cudaSetDevice(0));
	CK(cudaFree(0)); // the runtime's primary context, current from here on
	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

	// Legacy: cudaMalloc.
	uint32_t *legacy;
	CK(cudaMalloc(&legacy, bytes));
	// VMM: cuMemCreate with a POSIX fd handle type, as expandable segments.
	CUdevice dev;
	CU(cuDeviceGet(&dev, 0));
	CUmemAllocationProp prop = {};
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	size_t gran = 0;
	CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
	size_t vbytes = (bytes + gran - 1) / gran * gran;
	// Several chunks, as PyTorch maps 20 MiB pages: at most 32 of them.
	size_t chunk = gran;
	while (vbytes / chunk > 32)
		chunk *= 2;
	vbytes = (vbytes + chunk - 1) / chunk * chunk;
	CUdeviceptr va;
	CU(cuMemAddressReserve(&va, vbytes, 0, 0, 0));
	for (size_t off = 0; off < vbytes; off += chunk) {
		CUmemGenericAllocationHandle h;
		CU(cuMemCreate(&h, chunk, &prop, 0));
		CU(cuMemMap(va + off, chunk, 0, h, 0));
		CU(cuMemRelease(h));
	}
	CUmemAccessDesc acc = {};
	acc.location = prop.location;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CU(cuMemSetAccess(va, vbytes, &acc, 1));
	uint32_t *vmm = (uint32_t *)va;

	// What the driver says of a VMM chunk (cuda.h: RANGE_* describe the
	// reservation, cuMemGetAddressRange the mapped region), and what
	// libckpt makes of it: the chunk.
	{
		CUdeviceptr at = va + chunk + 4096, rs = 0, gb = 0;
		size_t rsz = 0, gsz = 0;
		unsigned long long id0 = 0, id1 = 0;
		uint64_t as = 0, asz = 0;
		CU(cuPointerGetAttribute(&rs, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, at));
		CU(cuPointerGetAttribute(&rsz, CU_POINTER_ATTRIBUTE_RANGE_SIZE, at));
		CU(cuMemGetAddressRange(&gb, &gsz, at));
		CU(cuPointerGetAttribute(&id0, CU_POINTER_ATTRIBUTE_BUFFER_ID, va));
		CU(cuPointerGetAttribute(&id1, CU_POINTER_ATTRIBUTE_BUFFER_ID, at));
		int rc = ckpt_cuda_allocation(at, &as, &asz);
		printf("vmm chunk 1 of %zu x %zu MiB: RANGE_* +%llu %zu MiB, cuMemGetAddressRange +%llu %zu MiB, "
		       "buffer ids %llu %llu, ckpt_cuda_allocation %d +%llu %llu MiB\n",
		       vbytes / chunk, chunk >> 20, (unsigned long long)(rs - va), rsz >> 20,
		       (unsigned long long)(gb - va), gsz >> 20, id0, id1, rc, (unsigned long long)(as - va),
		       (unsigned long long)(asz >> 20));
	}

	ckpt_hello hello = {};
	hello.job = "gpu-test";
	hello.world_size = 1;
	hello.attempt_id = "gpu";
	ckpt_client *c;
	CP(ckpt_connect(sock, &hello, &c));
	ckpt_buffer *bl, *bv;
	double t0 = now_s();
	CP(ckpt_register_cuda(c, (uint64_t)(uintptr_t)legacy, bytes, &bl));
	double t1 = now_s();
	CP(ckpt_register_cuda(c, (uint64_t)va, bytes, &bv));
	double t2 = now_s();
	printf("register: legacy %.1f ms, vmm (%zu chunks) %.1f ms\n", (t1 - t0) * 1e3, vbytes / chunk,
	       (t2 - t1) * 1e3);
	uint64_t shape[1] = { words };
	ckpt_tensor t[2] = {};
	t[0] = { "legacy", CKPT_I32, 1, shape, nullptr, nullptr, bl, 0, bytes };
	t[1] = { "vmm", CKPT_I32, 1, shape, nullptr, nullptr, bv, 0, bytes };

	// Baseline: cudaMemcpyAsync D2H of the same bytes into pinned memory.
	void *pinned;
	CK(cudaHostAlloc(&pinned, 2 * bytes, cudaHostAllocDefault));
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	int failures = 0;
	std::vector<double> ratio, staged_ms, load_gbs, h2d_gbs;
	for (int round = 0; round < rounds; round++) {
		uint32_t seed = 0x1234u + round;
		fill<<<1024, 256, 0, s>>>(legacy, words, seed);
		fill<<<1024, 256, 0, s>>>(vmm, words, seed ^ 0xffu);
		// No synchronisation: the save's event orders the daemon's copy.
		ckpt_save_opts o = {};
		o.cuda_stream = s;
		ckpt_future *f;
		double a = now_s();
		CP(ckpt_save_ex(c, 100 + round, t, 2, nullptr, 0, &o, &f));
		CP(ckpt_future_wait(f, CKPT_STAGED, 600000));
		double staged = now_s() - a;
		staged_ms.push_back(staged * 1e3);
		CP(ckpt_future_wait(f, CKPT_DURABLE, 600000));
		ckpt_future_free(f);
		CK(cudaStreamSynchronize(s));

		CK(cudaEventRecord(e0, s));
		CK(cudaMemcpyAsync(pinned, legacy, bytes, cudaMemcpyDeviceToHost, s));
		CK(cudaMemcpyAsync((char *)pinned + bytes, vmm, bytes, cudaMemcpyDeviceToHost, s));
		CK(cudaEventRecord(e1, s));
		CK(cudaEventSynchronize(e1));
		float ms = 0;
		CK(cudaEventElapsedTime(&ms, e0, e1));
		double ours = 2.0 * bytes / staged / 1e9, base = 2.0 * bytes / (ms / 1e3) / 1e9;
		ratio.push_back(ours / base);
		printf("round %d: staged 2 x %zu MiB in %.1f ms = %.1f GB/s; cudaMemcpyAsync D2H %.1f ms = %.1f GB/s; "
		       "ratio %.2f\n", round, mib, staged * 1e3, ours, ms, base, ours / base);

		// Baseline for the restore: cudaMemcpyAsync H2D of the same bytes.
		CK(cudaEventRecord(e0, s));
		CK(cudaMemcpyAsync(legacy, pinned, bytes, cudaMemcpyHostToDevice, s));
		CK(cudaMemcpyAsync(vmm, (char *)pinned + bytes, bytes, cudaMemcpyHostToDevice, s));
		CK(cudaEventRecord(e1, s));
		CK(cudaEventSynchronize(e1));
		CK(cudaEventElapsedTime(&ms, e0, e1));
		h2d_gbs.push_back(2.0 * bytes / (ms / 1e3) / 1e9);

		for (int from_storage = 0; from_storage < 2; from_storage++) {
			CK(cudaMemsetAsync(legacy, 0, bytes, s));
			CK(cudaMemsetAsync(vmm, 0, bytes, s));
			CK(cudaStreamSynchronize(s));
			ckpt_future *lf;
			double l0 = now_s();
			CP(ckpt_load_ex(c, 100 + round, t, 2, from_storage ? CKPT_LOAD_STORAGE_ONLY : 0, &lf));
			CP(ckpt_future_wait(lf, CKPT_LOADED, 600000));
			double lt = now_s() - l0;
			if (!from_storage)
				load_gbs.push_back(2.0 * bytes / lt / 1e9);
			const char *src = ckpt_future_source(lf);
			unsigned long long bad = count_bad(legacy, words, seed, s) + count_bad(vmm, words, seed ^ 0xffu, s);
			printf("  restore from %s: %.1f ms = %.1f GB/s (cudaMemcpyAsync H2D %.1f GB/s); %llu bad words\n",
			       src, lt * 1e3, 2.0 * bytes / lt / 1e9, h2d_gbs.back(), bad);
			if (bad || strcmp(src, from_storage ? "storage" : "memory") != 0)
				failures++;
			ckpt_future_free(lf);
		}
	}
	double best = 0;
	for (double r : ratio)
		best = r > best ? r : best;
	printf("best staging/baseline ratio %.2f (goal >= 0.90): %s\n", best, best >= 0.9 ? "met" : "NOT met");
	double lbest = 0, hbest = 0;
	for (size_t i = 0; i < load_gbs.size(); i++) {
		lbest = std::max(lbest, load_gbs[i]);
		hbest = std::max(hbest, h2d_gbs[i]);
	}
	printf("restore from memory: best %.1f GB/s, cudaMemcpyAsync H2D %.1f GB/s: ratio %.2f\n", lbest, hbest,
	       hbest > 0 ? lbest / hbest : 0);
	if (staged_ms.size() > 1)
		printf("first save staged in %.1f ms, later ones %.1f ms (median): %.2fx\n", staged_ms[0],
		       median(std::vector<double>(staged_ms.begin() + 1, staged_ms.end())),
		       staged_ms[0] / median(std::vector<double>(staged_ms.begin() + 1, staged_ms.end())));

	// 5. Freed and allocated again: the registration goes first (the
	// daemon closes its mapping), then the memory; the new allocation,
	// often at the same address, holds new contents the step must show.
	ckpt_buffer_free(bl);
	uint32_t *old = legacy;
	CK(cudaFree(legacy));
	CK(cudaMalloc(&legacy, bytes));
	printf("freed and allocated again: %s address\n", legacy == old ? "the same" : "another");
	uint32_t seed = 0xbeefu;
	fill<<<1024, 256, 0, s>>>(legacy, words, seed);
	CP(ckpt_register_cuda(c, (uint64_t)(uintptr_t)legacy, bytes, &bl));
	t[0].buffer = bl;
	{
		ckpt_save_opts o = {};
		o.cuda_stream = s;
		ckpt_future *f;
		CP(ckpt_save_ex(c, 200, t, 1, nullptr, 0, &o, &f));
		CP(ckpt_future_wait(f, CKPT_DURABLE, 600000));
		ckpt_future_free(f);
		CK(cudaMemsetAsync(legacy, 0, bytes, s));
		CK(cudaStreamSynchronize(s));
		CP(ckpt_load_ex(c, 200, t, 1, 0, &f));
		CP(ckpt_future_wait(f, CKPT_LOADED, 600000));
		unsigned long long bad = count_bad(legacy, words, seed, s);
		printf("  the new allocation's step, from %s: %llu bad words\n", ckpt_future_source(f), bad);
		if (bad)
			failures++;
		ckpt_future_free(f);
	}
	ckpt_buffer_free(bl);
	ckpt_buffer_free(bv);
	ckpt_close(c);
	printf("%s\n", failures ? "FAIL" : "PASS");
	return failures ? 1 : 0;
}
