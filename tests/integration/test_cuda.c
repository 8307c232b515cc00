/* The CUDA path against the fake driver (tests/fakecuda): legacy IPC and
 * VMM registrations, several tensors at offsets in one allocation, the
 * ordering of the daemon's copy after the trainer's asynchronous write,
 * restore through H2D (from memory and from storage), the daemon's
 * mappings closed on unregister, and every error path: a handle that will
 * not open, a UUID no device has, a stub library, no library at all, and a
 * copy failing in the middle of a save. The daemon runs with
 * FAKECUDA_REQUIRE_PINNED=1, so a D2H copy into memory that was not
 * cuMemHostRegister'ed fails: the pool's registration is checked too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>

#include "ckpt/ckpt.h"
#include "fakecuda.h"
#include "harness.h"

#define MIB (1u << 20)

static char lib_env[600];

static void start_conf(struct dctx *d, const char *e1, const char *e2, const char *conf)
{
	h_init(d);
	d->env[0] = lib_env;
	d->env[1] = "FAKECUDA_REQUIRE_PINNED=1";
	d->env[2] = e1;
	d->env[3] = e1 ? e2 : NULL;
	h_start(d, conf);
}

static void start(struct dctx *d, const char *e1, const char *e2)
{
	start_conf(d, e1, e2, NULL);
}

static ckpt_client *connect_job(struct dctx *d, const char *job)
{
	ckpt_hello h = { .job = job, .rank = 0, .world_size = 1, .attempt_id = "a" };
	ckpt_client *c = NULL;
	int r = ckpt_connect(d->sock, &h, &c);
	if (r < 0)
		fail_msg("connect: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	return c;
}

static void ctx_current(void)
{
	CUdevice dev;
	CUcontext ctx;
	assert_int_equal(cuInit(0), CUDA_SUCCESS);
	assert_int_equal(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
	assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
	assert_int_equal(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
}

static void fill_sync(CUdeviceptr p, size_t n, unsigned char seed)
{
	assert_int_equal(fakecuda_fill_async(p, n, seed, 0, NULL), CUDA_SUCCESS);
	assert_int_equal(cuStreamSynchronize(NULL), CUDA_SUCCESS);
}

/* Read [base+off, +n) back through the driver and compare with the
 * pattern of seed that fill_sync(base, ...) wrote. */
static void assert_pattern(CUdeviceptr base, size_t off, size_t n, unsigned char seed)
{
	uint8_t *h = malloc(n);
	assert_non_null(h);
	assert_int_equal(cuMemcpyDtoHAsync(h, base + off, n, NULL), CUDA_SUCCESS);
	assert_int_equal(cuStreamSynchronize(NULL), CUDA_SUCCESS);
	for (size_t i = 0; i < n; i++)
		if (h[i] != fakecuda_pattern(seed, off + i))
			fail_msg("byte %zu of %zu is %u, want %u (seed %u)", i, n, h[i], fakecuda_pattern(seed, i),
				 seed);
	free(h);
}

static ckpt_tensor u8(const char *name, uint64_t *shape, ckpt_buffer *b, uint64_t off, uint64_t n)
{
	shape[0] = n;
	return (ckpt_tensor){
		.name = name, .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = b, .offset = off, .nbytes = n
	};
}

static void save_ok(ckpt_client *c, uint64_t step, ckpt_tensor *t, size_t n, void *stream)
{
	ckpt_future *f = NULL;
	ckpt_save_opts o = { .cuda_stream = stream };
	int r = ckpt_save_ex(c, step, t, n, NULL, 0, &o, &f);
	if (r < 0)
		fail_msg("save: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	r = ckpt_future_wait(f, CKPT_DURABLE, 30000);
	if (r < 0)
		fail_msg("save step %llu: %s (%s)", (unsigned long long)step, ckpt_strerror(r), ckpt_future_message(f));
	ckpt_future_free(f);
}

static void load_ok(ckpt_client *c, int64_t step, ckpt_tensor *t, size_t n, unsigned flags, const char *source)
{
	ckpt_future *f = NULL;
	int r = ckpt_load_ex(c, step, t, n, flags, &f);
	if (r < 0)
		fail_msg("load: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	r = ckpt_future_wait(f, CKPT_LOADED, 30000);
	if (r < 0)
		fail_msg("load: %s (%s)", ckpt_strerror(r), ckpt_future_message(f));
	assert_string_equal(ckpt_future_source(f), source);
	ckpt_future_free(f);
}

static size_t count_steps(ckpt_client *c, const char *job)
{
	ckpt_step_info *s = NULL;
	size_t n = 0;
	int r = ckpt_list(c, job, &s, &n);
	assert_true(r >= 0);
	size_t complete = 0;
	for (size_t i = 0; i < n; i++)
		complete += s[i].complete != 0;
	free(s);
	return complete;
}

/* Mappings of the fake's device memory in the daemon. */
static int daemon_mappings(struct dctx *d, const char *what)
{
	char path[64], line[512];
	snprintf(path, sizeof(path), "/proc/%d/maps", (int)d->pid);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	int n = 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, what) != NULL;
	fclose(f);
	return n;
}

static void status_cuda(struct dctx *d, char *out, size_t len)
{
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d->sock, NULL, &c), 0);
	ckpt_status_info *st = calloc(1, sizeof(*st));
	assert_int_equal(ckpt_status(c, st), 0);
	snprintf(out, len, "%s", st->cuda);
	free(st);
	ckpt_close(c);
}

static void test_legacy_offsets_roundtrip(void **state)
{
	(void)state;
	struct dctx d;
	start(&d, NULL, NULL);
	char cs[256];
	/* No context on any GPU until a trainer uses one. */
	status_cuda(&d, cs, sizeof(cs));
	if (strncmp(cs, "on: 1 device(s), 0 in use", 25) != 0 || !strstr(cs, "pool pinned at first use"))
		fail_msg("status cuda: %s", cs);
	ctx_current();
	CUdeviceptr p;
	size_t total = 3 * MIB + 4096;
	assert_int_equal(cuMemAlloc(&p, total), CUDA_SUCCESS);
	fill_sync(p, total, 11);
	ckpt_client *c = connect_job(&d, "legacy");
	/* Two registrations inside one cudaMalloc segment, as PyTorch's
	 * caching allocator gives them: the daemon opens the handle once. */
	ckpt_buffer *b1 = NULL, *b2 = NULL;
	int r = ckpt_register_cuda(c, p + 4096, 2 * MIB, &b1);
	if (r < 0)
		fail_msg("register: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	assert_int_equal(ckpt_register_cuda(c, p + 2 * MIB + 4096, MIB, &b2), 0);
	assert_int_equal(daemon_mappings(&d, "fakecuda-mem"), 1);
	uint64_t s0[1], s1[1], s2[1];
	/* Three tensors at offsets, one of them straddling pool chunks. */
	ckpt_tensor t[3] = { u8("w0", s0, b1, 0, 1000), u8("w1", s1, b1, 1000, MIB + 5000),
			     u8("w2", s2, b2, 123, MIB - 123) };
	save_ok(c, 1, t, 3, NULL);
	/* The copies waited for the pool's pinning, which has ended. */
	status_cuda(&d, cs, sizeof(cs));
	if (strncmp(cs, "on: 1 device(s), 1 in use", 25) != 0 || !strstr(cs, ", pool pinned"))
		fail_msg("status cuda: %s", cs);
	assert_int_equal(count_steps(c, "legacy"), 1);

	/* Wipe, restore from memory (H2D from the pool), check. */
	fill_sync(p, total, 99);
	load_ok(c, 1, t, 3, 0, "memory");
	assert_pattern(p, 4096, 1000 + MIB + 5000, 11);
	for (size_t i = 0; i < MIB - 123; i += 4093) {
		uint8_t h;
		assert_int_equal(cuMemcpyDtoHAsync(&h, p + 2 * MIB + 4096 + 123 + i, 1, NULL), CUDA_SUCCESS);
		assert_int_equal(cuStreamSynchronize(NULL), CUDA_SUCCESS);
		assert_int_equal(h, fakecuda_pattern(11, 2 * MIB + 4096 + 123 + i));
	}
	/* And from storage, whose reads are not pinned. */
	fill_sync(p, total, 98);
	load_ok(c, 1, t, 3, CKPT_LOAD_STORAGE_ONLY, "storage");
	assert_pattern(p, 4096, 1000 + MIB + 5000, 11);

	/* Unregistering the last buffer of the segment closes the handle. */
	ckpt_buffer_free(b1);
	assert_int_equal(daemon_mappings(&d, "fakecuda-mem"), 1);
	ckpt_buffer_free(b2);
	assert_int_equal(daemon_mappings(&d, "fakecuda-mem"), 0);
	ckpt_close(c);
	assert_int_equal(cuMemFree(p), CUDA_SUCCESS);
	assert_int_equal(h_stop(&d), 0);
	h_cleanup(&d);
}

/* Pinning the pool takes seconds for a large one (here the fake driver's
 * cuMemHostRegister takes 3 s): a thread does it, so the first
 * registration returns and the daemon serves others meanwhile; the copies
 * wait for it (FAKECUDA_REQUIRE_PINNED fails a copy into memory not yet
 * pinned), and the step is whole. */
static void test_pool_pinning_does_not_block_the_daemon(void **state)
{
	(void)state;
	struct dctx d;
	start(&d, "FAKECUDA_HOST_REGISTER_MS=3000", NULL);
	ctx_current();
	size_t n = 2 * MIB;
	CUdeviceptr p;
	assert_int_equal(cuMemAlloc(&p, n), CUDA_SUCCESS);
	fill_sync(p, n, 31);
	ckpt_client *c = connect_job(&d, "pinning");
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_register_cuda(c, p, n, &b), 0);
	/* The registration is back before the pinning ends, and another
	 * client (ckptctl) is answered meanwhile. */
	char cs[256];
	status_cuda(&d, cs, sizeof(cs));
	if (!strstr(cs, "pool being pinned"))
		fail_msg("status cuda right after the first registration: %s", cs);
	uint64_t shape[1];
	ckpt_tensor t = u8("w", shape, b, 0, n);
	save_ok(c, 1, &t, 1, NULL);
	status_cuda(&d, cs, sizeof(cs));
	if (!strstr(cs, ", pool pinned"))
		fail_msg("status cuda after the save: %s", cs);
	fill_sync(p, n, 99);
	load_ok(c, 1, &t, 1, 0, "memory");
	assert_pattern(p, 0, n, 31);
	ckpt_buffer_free(b);
	ckpt_close(c);
	assert_int_equal(cuMemFree(p), CUDA_SUCCESS);
	assert_int_equal(h_stop(&d), 0);
	h_cleanup(&d);
}

/* An allocation freed and made again while a registration of it lives
 * (a caching allocator's empty_cache between two saves that keep their
 * registrations): the fake driver gives the new one the same address and
 * the same handle bytes (its handle names the memfd's number), the worst
 * case a real driver may or may not produce. A daemon matching handles
 * alone would copy from the freed memory's mapping; the allocation id
 * (CU_POINTER_ATTRIBUTE_BUFFER_ID) tells them apart, and
 * ckpt_cuda_identity tells the trainer that the old registration is stale. */
static void test_realloc_with_the_same_handle_is_mapped_anew(void **state)
{
	(void)state;
	struct dctx d;
	start(&d, NULL, NULL);
	ctx_current();
	size_t n = 2 * MIB;
	CUdeviceptr p, q;
	assert_int_equal(cuMemAlloc(&p, n), CUDA_SUCCESS);
	fill_sync(p, n, 21);
	ckpt_client *c = connect_job(&d, "realloc");
	uint64_t id1 = 0, id2 = 0, again = 0;
	uint64_t as = 0, asz = 0;
	assert_int_equal(ckpt_cuda_allocation(p + 4096, &as, &asz), 1); /* legacy */
	assert_true(as == p && asz == n);
	assert_int_equal(ckpt_cuda_identity(p, n, &id1), 0);
	assert_int_equal(ckpt_cuda_identity(p, n, &again), 0);
	assert_true(id1 == again);
	ckpt_buffer *b1 = NULL, *b2 = NULL;
	assert_int_equal(ckpt_register_cuda(c, p, n, &b1), 0);
	uint64_t shape[1];
	ckpt_tensor t = u8("w", shape, b1, 0, n);
	save_ok(c, 1, &t, 1, NULL);
	CUipcMemHandle h1, h2;
	assert_int_equal(cuIpcGetMemHandle(&h1, p), CUDA_SUCCESS);

	assert_int_equal(cuMemFree(p), CUDA_SUCCESS);
	assert_int_equal(cuMemAlloc(&q, n), CUDA_SUCCESS);
	assert_int_equal(cuIpcGetMemHandle(&h2, q), CUDA_SUCCESS);
	if (q != p || memcmp(h1.reserved, h2.reserved, sizeof(h1.reserved)) != 0)
		fail_msg("the fake driver no longer gives the same address and handle: the test proves nothing");
	fill_sync(q, n, 22);
	assert_int_equal(ckpt_cuda_identity(q, n, &id2), 0);
	assert_true(id2 != id1);
	/* Registered while the old registration still lives: a second mapping. */
	assert_int_equal(ckpt_register_cuda(c, q, n, &b2), 0);
	assert_int_equal(daemon_mappings(&d, "fakecuda-mem"), 2);
	t.buffer = b2;
	save_ok(c, 2, &t, 1, NULL);
	fill_sync(q, n, 99);
	load_ok(c, 2, &t, 1, 0, "memory");
	assert_pattern(q, 0, n, 22);
	ckpt_buffer_free(b1);
	assert_int_equal(daemon_mappings(&d, "fakecuda-mem"), 1);
	ckpt_buffer_free(b2);
	assert_int_equal(daemon_mappings(&d, "fakecuda-mem"), 0);
	/* Not device memory: refused, with the reason. */
	uint64_t host = 0;
	assert_int_equal(ckpt_cuda_identity((uint64_t)(uintptr_t)&host, 8, &id1), -EINVAL);
	assert_non_null(strstr(ckpt_errmsg(), "not mapped device memory"));
	ckpt_close(c);
	assert_int_equal(cuMemFree(q), CUDA_SUCCESS);
	assert_int_equal(h_stop(&d), 0);
	h_cleanup(&d);
}

/* One allocation of two granules mapped twice in one reservation (as a
 * mirrored ring buffer is), with another between: its bounds are the
 * mapping around the address asked about, never both mappings and what
 * lies between (a search that skips granules would join them). */
static void test_vmm_handle_mapped_twice(void **state)
{
	(void)state;
	ctx_current();
	size_t g = 2 * MIB;
	CUdeviceptr va;
	assert_int_equal(cuMemAddressReserve(&va, 6 * g, 0, 0, 0), CUDA_SUCCESS);
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
				     .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 } };
	CUmemGenericAllocationHandle a, b;
	assert_int_equal(cuMemCreate(&a, 2 * g, &prop, 0), CUDA_SUCCESS);
	assert_int_equal(cuMemCreate(&b, g, &prop, 0), CUDA_SUCCESS);
	assert_int_equal(cuMemMap(va, 2 * g, 0, a, 0), CUDA_SUCCESS);
	assert_int_equal(cuMemMap(va + 2 * g, g, 0, b, 0), CUDA_SUCCESS);
	assert_int_equal(cuMemMap(va + 3 * g, 2 * g, 0, a, 0), CUDA_SUCCESS);
	uint64_t start = 0, size = 0;
	assert_int_equal(ckpt_cuda_allocation(va + 4096, &start, &size), 0);
	assert_true(start == va && size == 2 * g);
	assert_int_equal(ckpt_cuda_allocation(va + 4 * g + 4096, &start, &size), 0);
	assert_true(start == va + 3 * g && size == 2 * g);
	assert_int_equal(cuMemUnmap(va, 5 * g), CUDA_SUCCESS);
	assert_int_equal(cuMemRelease(a), CUDA_SUCCESS);
	assert_int_equal(cuMemRelease(b), CUDA_SUCCESS);
	assert_int_equal(cuMemAddressFree(va, 6 * g), CUDA_SUCCESS);
}

/* cuMemCreate chunks mapped back to back, as PyTorch's expandable
 * segments do; a tensor spanning all three. */
static void test_vmm_roundtrip(void **state)
{
	(void)state;
	struct dctx d;
	start(&d, NULL, NULL);
	ctx_current();
	size_t gran = 2 * MIB, n = 3;
	CUdeviceptr va;
	assert_int_equal(cuMemAddressReserve(&va, n * gran, 0, 0, 0), CUDA_SUCCESS);
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
				     .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 } };
	for (size_t i = 0; i < n; i++) {
		CUmemGenericAllocationHandle h;
		assert_int_equal(cuMemCreate(&h, gran, &prop, 0), CUDA_SUCCESS);
		assert_int_equal(cuMemMap(va + i * gran, gran, 0, h, 0), CUDA_SUCCESS);
		assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
	}
	CUmemAccessDesc acc = { .location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	assert_int_equal(cuMemSetAccess(va, n * gran, &acc, 1), CUDA_SUCCESS);
	for (size_t i = 0; i < n; i++)
		fill_sync(va + i * gran, gran, (unsigned char)(20 + i));

	ckpt_client *c = connect_job(&d, "vmm");
	ckpt_buffer *b = NULL;
	/* From the middle of chunk 0 to the middle of chunk 2. */
	int r = ckpt_register_cuda(c, va + MIB, 4 * MIB, &b);
	if (r < 0)
		fail_msg("register: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	assert_int_equal(daemon_mappings(&d, "fakecuda-vmm"), 3);
	/* The identity covers every chunk the range spans: another range
	 * (chunks 1 and 2 only) has another. */
	uint64_t id_all = 0, id_again = 0, id_part = 0;
	assert_int_equal(ckpt_cuda_identity(va + MIB, 4 * MIB, &id_all), 0);
	assert_int_equal(ckpt_cuda_identity(va + MIB, 4 * MIB, &id_again), 0);
	assert_int_equal(ckpt_cuda_identity(va + gran, 2 * gran, &id_part), 0);
	assert_true(id_all == id_again && id_all != id_part);
	/* A VMM allocation is one chunk, and not legacy: register the range. */
	uint64_t as = 0, asz = 0;
	assert_int_equal(ckpt_cuda_allocation(va + gran + 4096, &as, &asz), 0);
	assert_true(as == va + gran && asz == gran);
	uint64_t s0[1];
	ckpt_tensor t = u8("big", s0, b, 0, 4 * MIB);
	save_ok(c, 5, &t, 1, NULL);
	for (size_t i = 0; i < n; i++)
		fill_sync(va + i * gran, gran, 0);
	load_ok(c, CKPT_LATEST, &t, 1, 0, "memory");
	uint8_t *h = malloc(4 * MIB);
	assert_int_equal(cuMemcpyDtoHAsync(h, va + MIB, 4 * MIB, NULL), CUDA_SUCCESS);
	assert_int_equal(cuStreamSynchronize(NULL), CUDA_SUCCESS);
	for (size_t i = 0; i < 4 * MIB; i++) {
		size_t at = MIB + i;
		if (h[i] != fakecuda_pattern((unsigned char)(20 + at / gran), at % gran))
			fail_msg("byte %zu differs after restore", i);
	}
	free(h);
	ckpt_buffer_free(b);
	assert_int_equal(daemon_mappings(&d, "fakecuda-vmm"), 0);
	/* Chunk 1 unmapped and another allocation mapped at its address (an
	 * expandable segment's page given back and taken again): the identity
	 * of a range starting in chunk 0 changes too, so a kept registration
	 * of the old page is not used. (The driver's RANGE_* attributes
	 * describe the whole reservation: an identity built on them alone saw
	 * chunk 0 only.) */
	assert_int_equal(cuMemUnmap(va + gran, gran), CUDA_SUCCESS);
	CUmemGenericAllocationHandle h2;
	assert_int_equal(cuMemCreate(&h2, gran, &prop, 0), CUDA_SUCCESS);
	assert_int_equal(cuMemMap(va + gran, gran, 0, h2, 0), CUDA_SUCCESS);
	assert_int_equal(cuMemRelease(h2), CUDA_SUCCESS);
	uint64_t id_new = 0;
	assert_int_equal(ckpt_cuda_identity(va + MIB, 4 * MIB, &id_new), 0);
	assert_true(id_new != id_all);
	ckpt_close(c);
	assert_int_equal(cuMemUnmap(va, n * gran), CUDA_SUCCESS);
	assert_int_equal(cuMemAddressFree(va, n * gran), CUDA_SUCCESS);
	assert_int_equal(h_stop(&d), 0);
	h_cleanup(&d);
}

/* The trainer's "kernel" writes asynchronously and slowly on its stream;
 * the save is issued right after it. The daemon's copy must wait for the
 * event and see the final values, not the old ones. */
static void test_copy_waits_for_trainer_stream(void **state)
{
	(void)state;
	struct dctx d;
	start(&d, NULL, NULL);
	ctx_current();
	CUdeviceptr p;
	size_t n = 3 * MIB;
	assert_int_equal(cuMemAlloc(&p, n), CUDA_SUCCESS);
	fill_sync(p, n, 1);
	CUstream s;
	assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ckpt_client *c = connect_job(&d, "order");
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_register_cuda(c, p, n, &b), 0);
	uint64_t s0[1];
	ckpt_tensor t = u8("x", s0, b, 0, n);
	assert_int_equal(fakecuda_fill_async(p, n, 7, 300 * 1000, s), CUDA_SUCCESS);
	save_ok(c, 1, &t, 1, s);
	/* A second save whose stream has nothing pending still waits on
	 * the re-recorded event and sees the same data. */
	assert_int_equal(cuStreamSynchronize(s), CUDA_SUCCESS);
	fill_sync(p, n, 0);
	load_ok(c, 1, &t, 1, CKPT_LOAD_STORAGE_ONLY, "storage");
	assert_pattern(p, 0, n, 7);
	ckpt_buffer_free(b);
	ckpt_close(c);
	assert_int_equal(cuStreamDestroy(s), CUDA_SUCCESS);
	assert_int_equal(cuMemFree(p), CUDA_SUCCESS);
	assert_int_equal(h_stop(&d), 0);
	h_cleanup(&d);
}

/* Registration fails with the daemon's reason; nothing becomes durable;
 * the daemon goes on serving, host buffers included. */
static void expect_register_fails(struct dctx *d, uint64_t step, bool vmm, int want, const char *needle)
{
	ctx_current();
	CUdeviceptr p = 0, va = 0;
	CUmemGenericAllocationHandle h;
	ckpt_client *c = connect_job(d, "bad");
	ckpt_buffer *b = NULL;
	int r;
	if (vmm) {
		CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
					     .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
					     .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 } };
		assert_int_equal(cuMemAddressReserve(&va, 2 * MIB, 0, 0, 0), CUDA_SUCCESS);
		assert_int_equal(cuMemCreate(&h, 2 * MIB, &prop, 0), CUDA_SUCCESS);
		assert_int_equal(cuMemMap(va, 2 * MIB, 0, h, 0), CUDA_SUCCESS);
		assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
		r = ckpt_register_cuda(c, va, 2 * MIB, &b);
	} else {
		assert_int_equal(cuMemAlloc(&p, MIB), CUDA_SUCCESS);
		r = ckpt_register_cuda(c, p, MIB, &b);
	}
	assert_null(b);
	if (r != want || !strstr(ckpt_errmsg(), needle))
		fail_msg("register: %d %s, want %d and '%s'", r, ckpt_errmsg(), want, needle);
	/* The host path still works on the same session. */
	ckpt_buffer *hb = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, 4096, &hb), 0);
	memset(ckpt_buffer_data(hb), 5, 4096);
	uint64_t s0[1];
	ckpt_tensor t = u8("host", s0, hb, 0, 4096);
	size_t before = count_steps(c, "bad");
	save_ok(c, step, &t, 1, NULL);
	assert_int_equal(count_steps(c, "bad"), before + 1);
	ckpt_buffer_free(hb);
	ckpt_close(c);
	if (vmm) {
		cuMemUnmap(va, 2 * MIB);
		cuMemAddressFree(va, 2 * MIB);
	} else {
		cuMemFree(p);
	}
	h_assert_serves(d);
}

static void test_open_fails(void **state)
{
	(void)state;
	struct dctx d;
	start(&d, "FAKECUDA_FAIL_OPEN=1", NULL);
	expect_register_fails(&d, 1, false, -EIO, "cuIpcOpenMemHandle failed: CUDA_ERROR_INVALID_HANDLE");
	expect_register_fails(&d, 2, true, -EIO, "cuMemImportFromShareableHandle failed: CUDA_ERROR_INVALID_HANDLE");
	assert_int_equal(h_stop(&d), 0);
	h_cleanup(&d);
}

static void test_uuid_matches_no_device(void **state)
{
	(void)state;
	struct dctx d;
	start(&d, "FAKECUDA_UUID_SALT=x", NULL);
	expect_register_fails(&d, 1, false, -ENODEV, "matches none of this node's 1 CUDA device(s)");
	assert_int_equal(h_stop(&d), 0);
	h_cleanup(&d);
}

static void test_stub_library_in_daemon(void **state)
{
	(void)state;
	struct dctx d;
	start(&d, "FAKECUDA_INIT_ERROR=34", NULL);
	char cs[256];
	status_cuda(&d, cs, sizeof(cs));
	if (!strstr(cs, "off: ") || !strstr(cs, "stub library (CUDA_ERROR_STUB_LIBRARY)"))
		fail_msg("status cuda: %s", cs);
	expect_register_fails(&d, 1, false, -ENOTSUP, "ckptd has CUDA off");
	assert_int_equal(h_stop(&d), 0);
	h_cleanup(&d);
}

static void test_no_library_in_daemon(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	d.env[0] = "CKPT_CUDA_LIBRARY=/nonexistent/libcuda.so.1";
	h_start(&d, NULL);
	char cs[256];
	status_cuda(&d, cs, sizeof(cs));
	if (!strstr(cs, "off: no CUDA driver library"))
		fail_msg("status cuda: %s", cs);
	expect_register_fails(&d, 1, false, -ENOTSUP, "ckptd has CUDA off");
	assert_int_equal(h_stop(&d), 0);
	h_cleanup(&d);
}

/* The trainer side of test_stub_library_in_client, in a fresh process
 * (the driver loads once per process). */
static int stub_child(const char *sock)
{
	char why[256];
	if (ckpt_cuda_available(why, sizeof(why)) != 0 || !strstr(why, "CUDA_ERROR_STUB_LIBRARY")) {
		fprintf(stderr, "available: %s\n", why);
		return 2;
	}
	ckpt_hello h = { .job = "stub", .world_size = 1 };
	ckpt_client *c = NULL;
	if (ckpt_connect(sock, &h, &c) < 0)
		return 3;
	ckpt_buffer *b = NULL;
	int r = ckpt_register_cuda(c, 0x10000, 4096, &b);
	if (r != -ENOTSUP || !strstr(ckpt_errmsg(), "stub library")) {
		fprintf(stderr, "register: %d %s\n", r, ckpt_errmsg());
		return 4;
	}
	ckpt_close(c);
	return 0;
}

static char self_exe[600];

/* In the trainer: the client library reports a stub library, and a
 * registration fails cleanly. */
static void test_stub_library_in_client(void **state)
{
	(void)state;
	struct dctx d;
	start(&d, NULL, NULL);
	pid_t pid = fork();
	if (pid == 0) {
		setenv("FAKECUDA_INIT_ERROR", "34", 1);
		execl(self_exe, self_exe, "--stub-child", d.sock, (char *)NULL);
		_exit(127);
	}
	int st = 0;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_int_equal(h_stop(&d), 0);
	h_cleanup(&d);
}

/* The third D2H copy of the daemon fails: SaveFailed names the tensor
 * and the CUDA error, staged is never reported, no step becomes durable,
 * the pool is free again, and the daemon serves on. */
static void test_copy_fails_mid_save(void **state)
{
	(void)state;
	struct dctx d;
	start(&d, "FAKECUDA_FAIL_COPY_AFTER=2", NULL);
	ctx_current();
	CUdeviceptr p;
	size_t n = 6 * MIB;
	assert_int_equal(cuMemAlloc(&p, n), CUDA_SUCCESS);
	fill_sync(p, n, 3);
	ckpt_client *c = connect_job(&d, "copyfail");
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_register_cuda(c, p, n, &b), 0);
	uint64_t s0[1];
	ckpt_tensor t = u8("layer", s0, b, 0, n);
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, 1, &t, 1, NULL, 0, &f), 0);
	int r = ckpt_future_wait(f, CKPT_DURABLE, 30000);
	assert_int_equal(r, -EIO);
	const char *m = ckpt_future_message(f);
	if (!strstr(m, "tensor 'layer'") || !strstr(m, "cuMemcpyDtoHAsync failed: CUDA_ERROR_ILLEGAL_ADDRESS"))
		fail_msg("message: %s", m);
	assert_int_equal(ckpt_future_poll(f, CKPT_STAGED), -EIO);
	ckpt_future_free(f);
	assert_int_equal(count_steps(c, "copyfail"), 0);
	ckpt_status_info *st = calloc(1, sizeof(*st));
	assert_int_equal(ckpt_status(c, st), 0);
	assert_int_equal(st->pool_used_bytes, 0);
	assert_int_equal(st->saves_failed, 1);
	/* ILLEGAL_ADDRESS is sticky on a real GPU: the device is marked
	 * broken, said in status, and refused until ckptd restarts. */
	if (!strstr(st->cuda, "device 0 BROKEN (CUDA_ERROR_ILLEGAL_ADDRESS"))
		fail_msg("status cuda: %s", st->cuda);
	free(st);
	ckpt_buffer *b2 = NULL;
	assert_int_equal(ckpt_register_cuda(c, p, MIB, &b2), -EIO);
	assert_non_null(strstr(ckpt_errmsg(), "restart ckptd"));
	ckpt_buffer_free(b);
	ckpt_close(c);
	cuMemFree(p);
	h_assert_serves(&d);
	assert_int_equal(h_stop(&d), 0);
	h_cleanup(&d);
}

static Ckpt__Frame *register_frame(int fd, uint64_t req, Ckpt__RegisterBuffer *rb, const int *fds, int nfds)
{
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_REGISTER_BUFFER;
	f.register_buffer = rb;
	assert_int_equal(raw_send(fd, &f, req, fds, nfds), 0);
	bool eof = false;
	Ckpt__Frame *rep = raw_recv(fd, 10000, &eof);
	assert_non_null(rep);
	assert_int_equal(rep->body_case, CKPT__FRAME__BODY_REPLY);
	return rep;
}

static void expect_reply(Ckpt__Frame *rep, int status, const char *needle)
{
	if (rep->reply->status != status || !strstr(rep->reply->message, needle))
		fail_msg("reply %d '%s', want %d and '%s'", rep->reply->status, rep->reply->message, status, needle);
	ckpt__frame__free_unpacked(rep, NULL);
}

/* Hand-made frames: every malformed CUDA registration and a save whose
 * CUDA tensor has no event get a clear error; the daemon serves on. */
static void test_malformed_cuda_frames(void **state)
{
	(void)state;
	struct dctx d;
	start(&d, NULL, NULL);
	ctx_current();
	CUdeviceptr p;
	assert_int_equal(cuMemAlloc(&p, MIB), CUDA_SUCCESS);
	CUipcMemHandle ih;
	assert_int_equal(cuIpcGetMemHandle(&ih, p), CUDA_SUCCESS);
	CUuuid uuid;
	assert_int_equal(cuDeviceGetUuid(&uuid, 0), CUDA_SUCCESS);
	int fd = raw_connect(d.sock);
	raw_hello(fd, "raw", 0, 1);

	Ckpt__RegisterBuffer rb = CKPT__REGISTER_BUFFER__INIT;
	rb.buffer_id = 1;
	rb.kind = CKPT__BUFFER_KIND__CUDA_IPC;
	rb.nbytes = MIB;
	rb.device_uuid.data = (uint8_t *)uuid.bytes;
	rb.device_uuid.len = 3;
	rb.ipc_handle.data = (uint8_t *)ih.reserved;
	rb.ipc_handle.len = sizeof(ih.reserved);
	expect_reply(register_frame(fd, 2, &rb, NULL, 0), EINVAL, "16-byte device UUID");
	rb.device_uuid.len = 16;
	rb.ipc_handle.len = 10;
	expect_reply(register_frame(fd, 3, &rb, NULL, 0), EINVAL, "ipc_handle must be 64 bytes");
	uint8_t junk[64];
	memset(junk, 0xab, sizeof(junk));
	rb.ipc_handle.data = junk;
	rb.ipc_handle.len = sizeof(junk);
	expect_reply(register_frame(fd, 4, &rb, NULL, 0), EIO, "cuIpcOpenMemHandle failed");
	rb.ipc_handle.data = (uint8_t *)ih.reserved;
	rb.offset = UINT64_MAX - 10;
	expect_reply(register_frame(fd, 5, &rb, NULL, 0), ERANGE, "overflows");
	/* Inside the client's claim but past the real allocation. */
	rb.offset = MIB - 100;
	rb.nbytes = 4096;
	expect_reply(register_frame(fd, 51, &rb, NULL, 0), ERANGE, "lies outside the 1048576-byte allocation");
	rb.nbytes = MIB;
	/* VMM: two sizes, one fd (a memfd, not even a VMM export). */
	int mfd = make_memfd(4096, 0);
	uint64_t sizes[2] = { 2 * MIB, 2 * MIB };
	Ckpt__RegisterBuffer vb = CKPT__REGISTER_BUFFER__INIT;
	vb.buffer_id = 6;
	vb.kind = CKPT__BUFFER_KIND__CUDA_VMM;
	vb.nbytes = MIB;
	vb.device_uuid.data = (uint8_t *)uuid.bytes;
	vb.device_uuid.len = 16;
	vb.n_vmm_sizes = 2;
	vb.vmm_sizes = sizes;
	expect_reply(register_frame(fd, 7, &vb, &mfd, 1), EBADF, "2 VMM chunk sizes but 1 file descriptors");
	/* The range outside the mapped sizes. */
	vb.n_vmm_sizes = 1;
	vb.offset = 2 * MIB;
	expect_reply(register_frame(fd, 8, &vb, &mfd, 1), ERANGE, "lies outside");
	close(mfd);

	/* A good registration, then a save with no event for its device. */
	rb.offset = 0;
	rb.buffer_id = 9;
	expect_reply(register_frame(fd, 10, &rb, NULL, 0), 0, "");
	uint64_t shape[1] = { 4096 };
	Ckpt__TensorRef tr = CKPT__TENSOR_REF__INIT;
	tr.name = "t";
	tr.dtype = CKPT__DTYPE__U8;
	tr.n_global_shape = 1;
	tr.global_shape = shape;
	tr.buffer_id = 9;
	tr.nbytes = 4096;
	Ckpt__TensorRef *trs[1] = { &tr };
	Ckpt__Save sv = CKPT__SAVE__INIT;
	sv.step = 1;
	sv.n_tensors = 1;
	sv.tensors = trs;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_SAVE;
	f.save = &sv;
	Ckpt__Frame *rep = raw_call(fd, &f, 11, CKPT__FRAME__BODY_SAVE_FAILED);
	if (!strstr(rep->save_failed->message, "no event for"))
		fail_msg("SaveFailed: %s", rep->save_failed->message);
	ckpt__frame__free_unpacked(rep, NULL);
	/* An event handle that does not open. */
	Ckpt__CudaEvent ev = CKPT__CUDA_EVENT__INIT;
	ev.device_uuid.data = (uint8_t *)uuid.bytes;
	ev.device_uuid.len = 16;
	ev.ipc_handle.data = junk;
	ev.ipc_handle.len = sizeof(junk);
	Ckpt__CudaEvent *evs[1] = { &ev };
	sv.n_cuda_events = 1;
	sv.cuda_events = evs;
	rep = raw_call(fd, &f, 12, CKPT__FRAME__BODY_SAVE_FAILED);
	if (!strstr(rep->save_failed->message, "cuIpcOpenEventHandle failed"))
		fail_msg("SaveFailed: %s", rep->save_failed->message);
	ckpt__frame__free_unpacked(rep, NULL);
	close(fd);
	cuMemFree(p);
	h_assert_serves(&d);
	assert_int_equal(h_stop(&d), 0);
	h_cleanup(&d);
}

/* A save that waits for pool space when its trainer goes away fails: its
 * copies never ran, and the trainer's event and memory went with it. */
static void test_trainer_gone_before_staged(void **state)
{
	(void)state;
	struct dctx d;
	start_conf(&d, NULL, NULL, "[debug]\nstore_delay_ms = 3000\n");
	ctx_current();
	ckpt_client *c = connect_job(&d, "gone");
	ckpt_buffer *hb = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, 40 * MIB, &hb), 0);
	uint64_t s0[1], s1[1];
	ckpt_tensor ht = u8("host", s0, hb, 0, 40 * MIB);
	ckpt_future *f1 = NULL, *f2 = NULL;
	assert_int_equal(ckpt_save(c, 1, &ht, 1, NULL, 0, &f1), 0);
	assert_int_equal(ckpt_future_wait(f1, CKPT_STAGED, 10000), 0);
	CUdeviceptr p;
	assert_int_equal(cuMemAlloc(&p, 30 * MIB), CUDA_SUCCESS);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_register_cuda(c, p, 30 * MIB, &b), 0);
	ckpt_tensor t = u8("dev", s1, b, 0, 30 * MIB);
	assert_int_equal(ckpt_save(c, 2, &t, 1, NULL, 0, &f2), 0);
	usleep(300 * 1000); /* it waits: 40 + 30 MiB > the 64 MiB pool */
	assert_int_equal(ckpt_future_poll(f2, CKPT_STAGED), 0);
	ckpt_close(c);
	ckpt_future_free(f1);
	ckpt_future_free(f2);
	ckpt_buffer_free(hb);
	ckpt_buffer_free(b);
	ckpt_client *k = NULL;
	assert_int_equal(ckpt_connect(d.sock, NULL, &k), 0);
	ckpt_status_info *st = calloc(1, sizeof(*st));
	for (int i = 0; i < 100; i++) {
		assert_int_equal(ckpt_status(k, st), 0);
		if (st->saves_failed == 1 && st->inflight_saves == 0)
			break;
		usleep(100 * 1000);
	}
	assert_int_equal(st->saves_failed, 1); /* step 2; step 1 still became durable */
	assert_int_equal(st->inflight_saves, 0);
	free(st);
	ckpt_step_info *steps = NULL;
	size_t n = 0;
	assert_true(ckpt_list(k, "gone", &steps, &n) >= 0);
	assert_int_equal(n, 1);
	assert_int_equal(steps[0].step, 1);
	free(steps);
	ckpt_close(k);
	cuMemFree(p);
	h_assert_serves(&d);
	assert_int_equal(h_stop(&d), 0);
	h_cleanup(&d);
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--stub-child") == 0)
		return stub_child(argv[2]);
	ssize_t k = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
	if (k > 0)
		self_exe[k] = 0;
	const char *lib = getenv("CKPT_CUDA_LIBRARY");
	if (lib == NULL) {
		fprintf(stderr, "CKPT_CUDA_LIBRARY must name the fake driver\n");
		return 1;
	}
	snprintf(lib_env, sizeof(lib_env), "CKPT_CUDA_LIBRARY=%s", lib);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_legacy_offsets_roundtrip),
		cmocka_unit_test(test_realloc_with_the_same_handle_is_mapped_anew),
		cmocka_unit_test(test_pool_pinning_does_not_block_the_daemon),
		cmocka_unit_test(test_vmm_roundtrip),
		cmocka_unit_test(test_vmm_handle_mapped_twice),
		cmocka_unit_test(test_copy_waits_for_trainer_stream),
		cmocka_unit_test(test_open_fails),
		cmocka_unit_test(test_uuid_matches_no_device),
		cmocka_unit_test(test_stub_library_in_daemon),
		cmocka_unit_test(test_no_library_in_daemon),
		cmocka_unit_test(test_stub_library_in_client),
		cmocka_unit_test(test_copy_fails_mid_save),
		cmocka_unit_test(test_malformed_cuda_frames),
		cmocka_unit_test(test_trainer_gone_before_staged),
	};
	return cmocka_run_group_tests_name("cuda", tests, NULL, NULL);
}
