/* libckpt: the client library of ckptd.
 *
 * Conventions: every function that can fail returns 0 (or a count) on success
 * and a negative errno value on failure. ckpt_strerror() turns such a value
 * into words; when the daemon refused a request, ckpt_errmsg() returns the
 * daemon's own message for the last failed call on the calling thread.
 * The library never logs or prints.
 *
 * The one rule of saving: ckpt_save() (and ckpt_save_ex, ckpt_save_table*)
 * returns as soon as the request is sent, and the daemon then copies from
 * the caller's buffers until the future reaches CKPT_STAGED. Do not write
 * to a saved buffer before ckpt_future_wait(f, CKPT_STAGED, ...) returned 0
 * (or the callback saw CKPT_STAGED): a write before then may land in the
 * checkpoint, which would then hold neither that step's bytes nor the next
 * step's, and nothing would say so. After staged the daemon works from its
 * own copy; CKPT_DURABLE says the step is in storage.
 *
 * Threads: a ckpt_client is safe to use from several threads at once. Each
 * client runs one reader thread that receives the daemon's replies and
 * pushed events (staged, durable, failed, loaded) and completes futures.
 * Completion callbacks run on that reader thread: keep them short and do not
 * call blocking libckpt functions of the same client from them.
 */
#ifndef CKPT_CKPT_H
#define CKPT_CKPT_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CKPT_PROTOCOL_VERSION 1
#define CKPT_DEFAULT_SOCKET "/run/ckptd/ckptd.sock"
/* Pass as the step to ckpt_load() for the highest complete step. */
#define CKPT_LATEST (-1)
#define CKPT_MAX_DIMS 8
/* HelloReply capability bits. */
#define CKPT_CAP_CUDA 1u   /* the daemon imports CUDA buffers */
#define CKPT_CAP_TABLES 2u /* tensor tables (ckpt_table_create) */
#define CKPT_CAP_TIERS 4u  /* memory and replicated saves, ckpt_persist, ckpt_held */

typedef struct ckpt_client ckpt_client;
typedef struct ckpt_buffer ckpt_buffer;
typedef struct ckpt_future ckpt_future;
typedef struct ckpt_table ckpt_table;

/* Values match proto/ckpt.proto's DType. */
typedef enum {
	CKPT_F32 = 1,
	CKPT_F16 = 2,
	CKPT_BF16 = 3,
	CKPT_F64 = 4,
	CKPT_I8 = 5,
	CKPT_U8 = 6,
	CKPT_I16 = 7,
	CKPT_I32 = 8,
	CKPT_I64 = 9,
	CKPT_BOOL = 10,
	CKPT_F8E4M3 = 11,
	CKPT_F8E5M2 = 12,
} ckpt_dtype;

/* Size in bytes of one element, 0 for an unknown dtype. */
size_t ckpt_dtype_size(int dtype);

typedef struct {
	const char *job; /* NULL or "": a control session (no save/load) */
	uint32_t rank;
	uint32_t world_size;
	uint32_t local_rank;
	/* Same for every rank of one launch, and never another launch's
	 * (docs/format.md "Attempts"). NULL: taken from TORCHELASTIC_RUN_ID
	 * and TORCHELASTIC_RESTART_COUNT when set, else
	 * "slurm-<SLURM_JOB_ID>-<SLURM_RESTART_COUNT>" under Slurm, else
	 * "default"; these may repeat across launches (torchrun's run id is
	 * "none" unless given), so give one per launch where they do. */
	const char *attempt_id;
	/* What a save does when the pool is full of data not yet durable:
	 * "block" (wait, up to the daemon's admit timeout), "skip" (fail at
	 * once with -EBUSY) or "coalesce" (older saves of this rank that have
	 * not started uploading fail with CKPT_SUPERSEDED). NULL: the
	 * daemon's per-job config. */
	const char *policy;
} ckpt_hello;

/* The durable future of a save replaced under the coalesce policy fails
 * with this status; nothing else uses it. */
#define CKPT_SUPERSEDED (-ECANCELED)

/* One tensor (or this rank's box of a global tensor). On save the bytes are
 * read from buffer+offset; on load they are written there. box_* with
 * ndim entries; box_lengths NULL means the box is the whole global shape. */
typedef struct {
	const char *name;
	int dtype; /* ckpt_dtype */
	uint32_t ndim;
	const uint64_t *global_shape;
	const uint64_t *box_offsets; /* NULL: all zero */
	const uint64_t *box_lengths; /* NULL: global_shape */
	ckpt_buffer *buffer;
	uint64_t offset;
	uint64_t nbytes;
} ckpt_tensor;

typedef enum {
	CKPT_STAGED = 1,  /* the daemon holds a copy; buffers may change again */
	CKPT_DURABLE = 2, /* the manifest is safely in storage */
	CKPT_LOADED = 3,  /* a load has written every requested tensor */
	/* A memory or replicated save (ckpt_tier) is checksummed and held by
	 * the daemon: a load of its step restores it from now on. The last
	 * phase of a memory save. */
	CKPT_KEPT = 4,
	/* A replicated save's copies in peer daemons' memory, or why not:
	 * waiting for it returns 0 or the reason's -errno (the save is kept
	 * all the same; ckpt_future_message says why). */
	CKPT_REPLICATED = 5,
} ckpt_phase;

/* Where a save's copy lives once it is safe (docs/tiers.md "Tiers"). A memory
 * or replicated step is not in storage until ckpt_persist() names it;
 * its future ends at CKPT_KEPT (memory) or CKPT_REPLICATED, and waiting
 * for CKPT_DURABLE on it is -EINVAL. */
typedef enum {
	CKPT_TIER_DURABLE = 0,    /* staged, then uploaded (the default) */
	CKPT_TIER_MEMORY = 1,     /* staged and held in this node's daemon only */
	CKPT_TIER_REPLICATED = 2, /* memory, and held by peer daemons too */
} ckpt_tier;

/* Connect and say hello. hello may be NULL for a control session. With a
 * job, CKPT_JOB_KEY in the environment (at most 1024 bytes, the same on
 * every rank) seals the job's replicated copies in peers' memory, and a
 * restore from peers takes only copies sealed with it (docs/tiers.md
 * "Peers"). */
int ckpt_connect(const char *socket_path, const ckpt_hello *hello, ckpt_client **out);
/* CKPT_CAP_* bits the daemon announced in its hello (0 for NULL). */
uint64_t ckpt_capabilities(const ckpt_client *c);
/* Closes the connection. Outstanding futures fail with -ECONNRESET but stay
 * valid until freed; saves already staged still become durable in the
 * daemon. Accepts NULL. */
void ckpt_close(ckpt_client *c);

/* Allocate a host buffer as a sealed memfd (it cannot shrink), map it
 * read-write for the caller and register it with the daemon. */
int ckpt_buffer_alloc(ckpt_client *c, size_t nbytes, ckpt_buffer **out);
/* Register an fd the caller already has (memfd or /dev/shm file, opened
 * read-write). The library keeps its own dup; the caller keeps fd. */
int ckpt_buffer_register_fd(ckpt_client *c, int fd, size_t nbytes, ckpt_buffer **out);
/* ckpt_buffer_register_fd for n fds at once: the requests go back to back
 * (128 per round trip), so registering the storages of a state dict of
 * 10,000 tensors costs about 80 round trips, not 10,000. All or none: on
 * an error (ckpt_errmsg names the buffer's index) none stays registered
 * and out[] is all NULL. */
int ckpt_buffer_register_fds(ckpt_client *c, const int *fds, const size_t *nbytes, size_t n, ckpt_buffer **out);
/* The caller's mapping for buffers from ckpt_buffer_alloc, else NULL. */
void *ckpt_buffer_data(ckpt_buffer *b);
size_t ckpt_buffer_size(ckpt_buffer *b);
/* Unregister and unmap. Accepts NULL. */
void ckpt_buffer_free(ckpt_buffer *b);

/* CUDA device buffers (docs/cuda.md "CUDA"). libcuda is loaded at run time
 * (dlopen of $CKPT_CUDA_LIBRARY, else libcuda.so.1); nothing links it.
 *
 * 1 when this process can register device memory, else 0 with why
 * saying why not (no library, a stub library, no device, an old driver). */
int ckpt_cuda_available(char *why, size_t whylen);
/* Register [devptr, devptr+nbytes) of device memory with the daemon:
 * a cudaMalloc (legacy) allocation goes as a cuIpcGetMemHandle of its
 * base plus an offset; VMM memory (cuMemCreate, PyTorch's expandable
 * segments) as one POSIX fd per mapped allocation the range spans. Call
 * it with the allocating device's context current or none (the CUDA
 * runtime's primary context is fine). -ENOTSUP when CUDA is off here or
 * in the daemon, -E2BIG when the range spans more VMM allocations than
 * the daemon's max_fds_per_frame. Restore writes into the memory with
 * H2D copies. */
int ckpt_register_cuda(ckpt_client *c, uint64_t devptr, size_t nbytes, ckpt_buffer **out);
/* The identity of the device memory behind [devptr, devptr+nbytes): a
 * digest of the start, size and CU_POINTER_ATTRIBUTE_BUFFER_ID (unique in
 * this process, never reused) of every allocation the range spans. A
 * registration stays good for the same range while its identity is the
 * same: memory freed and allocated again at the same address has another.
 * Keep a registration across saves only with this check (ckpt.torch
 * does); memory must not be freed while a save still reads it. 0, or
 * -EINVAL when the range is not mapped device memory, -ENOTSUP without
 * CUDA. */
int ckpt_cuda_identity(uint64_t devptr, size_t nbytes, uint64_t *ident);
/* The allocation holding devptr: its start and size. 1 for a cudaMalloc
 * (legacy IPC) allocation, which one registration of [start, start+size)
 * serves for every tensor in it; 0 for other device memory (VMM: one
 * allocation per mapped page, so register the tensor's own range); or
 * -EINVAL when devptr is not device memory, -ENOTSUP without CUDA. */
int ckpt_cuda_allocation(uint64_t devptr, uint64_t *start, uint64_t *size);

typedef struct {
	/* The CUstream whose work must finish before the daemon copies the
	 * CUDA tensors: an interprocess event is recorded on it. NULL: the
	 * legacy default stream. */
	void *cuda_stream;
	int tier; /* ckpt_tier; 0: durable */
	/* ckpt_setting: whether the daemon stores the shard compressed
	 * (lossless; docs/format.md "Pieces"). */
	int compress;
	/* ckpt_setting: whether pieces that have not changed since this
	 * rank's previous durable step are stored as references
	 * to it instead of again (docs/format.md "Pieces"). */
	int incremental;
} ckpt_save_opts;

/* A save's choice of what the daemon's configuration also decides. */
typedef enum {
	CKPT_BY_JOB = 0, /* as [pool] or the job's [job.NAME] say */
	CKPT_ON = 1,
	CKPT_OFF = 2,
} ckpt_setting;

/* Start saving step. Returns at once; the future reaches CKPT_STAGED and then
 * CKPT_DURABLE, or fails. The tensors' buffers must not change before
 * CKPT_STAGED (the rule at the top of this file). extra is opaque state
 * stored in the manifest. */
int ckpt_save(ckpt_client *c, uint64_t step, const ckpt_tensor *tensors, size_t ntensors, const void *extra,
	      size_t extra_len, ckpt_future **out);
/* ckpt_save with options; opts may be NULL. */
int ckpt_save_ex(ckpt_client *c, uint64_t step, const ckpt_tensor *tensors, size_t ntensors, const void *extra,
		 size_t extra_len, const ckpt_save_opts *opts, ckpt_future **out);
/* Tensor tables: a state dict saved again and again with the same
 * tensors in the same buffers is declared once, checked once by the
 * daemon, and each later save sends only its step (docs/python.md "Python and
 * PyTorch": the per-tensor cost). Host buffers only (-ENOTSUP for a CUDA
 * buffer: save those with ckpt_save_ex); -ENOTSUP too from a daemon
 * without CKPT_CAP_TABLES. The tensors array need not outlive the call.
 * Free the table before its buffers: while it lives the daemon refuses
 * to unregister them (-EBUSY), so a ckpt_buffer_free before it leaves the
 * registration in the daemon until the connection ends. At most 16
 * tables per client at once. */
int ckpt_table_create(ckpt_client *c, const ckpt_tensor *tensors, size_t ntensors, ckpt_table **out);
/* Number of tensors in the table (0 for NULL). */
size_t ckpt_table_size(const ckpt_table *t);
/* ckpt_save of the table's tensors. */
int ckpt_save_table(ckpt_client *c, uint64_t step, const ckpt_table *t, const void *extra, size_t extra_len,
		    ckpt_future **out);
/* ckpt_save_table with options (opts->cuda_stream is unused); opts may be NULL. */
int ckpt_save_table_ex(ckpt_client *c, uint64_t step, const ckpt_table *t, const void *extra, size_t extra_len,
		       const ckpt_save_opts *opts, ckpt_future **out);
/* Drop the table (saves made from it go on). Accepts NULL. */
void ckpt_table_free(ckpt_table *t);

/* Start loading step (or CKPT_LATEST) into the given tensors' buffers. The
 * future reaches CKPT_LOADED or fails. */
int ckpt_load(ckpt_client *c, int64_t step, const ckpt_tensor *tensors, size_t ntensors, ckpt_future **out);

/* ckpt_load with flags: CKPT_LOAD_STORAGE_ONLY reads storage even when
 * the daemon's memory tier holds the step. */
#define CKPT_LOAD_STORAGE_ONLY 1u
int ckpt_load_ex(ckpt_client *c, int64_t step, const ckpt_tensor *tensors, size_t ntensors, unsigned flags,
		 ckpt_future **out);

/* Make step of job (NULL: this session's) durable: every copy of it that
 * this daemon holds in memory only (memory and replicated saves, of any
 * rank on this node) is uploaded as a durable save's would be, and stays
 * held. The future reaches CKPT_DURABLE once all of them are, or fails
 * (the copies stay in memory); -ENOENT when this daemon holds no copy of
 * the step. Every node's ranks ask their own daemon (ckpt.torch's
 * Checkpointer.persist does, on every rank). */
int ckpt_persist(ckpt_client *c, const char *job, uint64_t step, ckpt_future **out);
/* ckpt_persist with flags: CKPT_PERSIST_REPLICAS also uploads the copies
 * of the step this daemon holds for its peers (a lost node's ranks: run
 * it on the node that holds them); a rank its origin persisted already
 * counts as durable. */
#define CKPT_PERSIST_REPLICAS 1u
int ckpt_persist_ex(ckpt_client *c, const char *job, uint64_t step, unsigned flags, ckpt_future **out);

/* Wait until the future has reached phase (or failed). timeout_ms < 0 waits
 * forever. Returns 0, -ETIMEDOUT, or the failure (-errno) with its message in
 * ckpt_future_message(). */
int ckpt_future_wait(ckpt_future *f, ckpt_phase phase, int timeout_ms);
/* 1 if phase was reached, 0 if not yet, or the failure (-errno). */
int ckpt_future_poll(ckpt_future *f, ckpt_phase phase);
/* The daemon's message for a failed future; for a replicated save that
 * was not replicated, why; "" otherwise. */
const char *ckpt_future_message(ckpt_future *f);
/* Filled in once the respective phase is reached. */
uint64_t ckpt_future_bytes(ckpt_future *f);
/* A save: the daemon's own time from the request to staged (ns), once
 * staged; 0 before. The trainer's stall less this is the client's share. */
uint64_t ckpt_future_stall_ns(ckpt_future *f);
uint64_t ckpt_future_step(ckpt_future *f);
/* A replicated save, once CKPT_REPLICATED: how many peers hold a copy. */
uint32_t ckpt_future_replicas(ckpt_future *f);
/* For loads: the extra state saved with the step (valid until freed). */
const void *ckpt_future_extra(ckpt_future *f, size_t *len);
/* For loads, once loaded: where this load's bytes came from: "memory"
 * (the daemon's memory tier), "peer" (a copy from a peer daemon's memory,
 * brought back for this load or by a show just before it: the first load
 * that reads the copy says "peer", later ones "memory"), "storage", or
 * "mixed"; "" before. */
const char *ckpt_future_source(ckpt_future *f);
/* For loads from a peer: the peer ("HOST:PORT"); "" otherwise. */
const char *ckpt_future_peer(ckpt_future *f);
/* Per requested tensor, in request order: its name and source; NULL when
 * i is out of range or the load has not completed. */
const char *ckpt_future_tensor_source(ckpt_future *f, size_t i, const char **name);
typedef void (*ckpt_future_cb)(ckpt_future *f, ckpt_phase phase, int status, void *user);
/* Called on the reader thread for every phase reached (and once on
 * failure), including right away, on this thread, for phases already
 * reached. */
int ckpt_future_set_callback(ckpt_future *f, ckpt_future_cb cb, void *user);
/* No callback of f runs once this returns (one running on another thread
 * is waited for; from inside the callback it is not), so user's memory
 * may go. */
void ckpt_future_free(ckpt_future *f);

#define CKPT_STATUS_MAX_HELD 64
#define CKPT_STATUS_MAX_RECOVERED 8
#define CKPT_STATUS_MAX_TENANTS 32
#define CKPT_STATUS_MAX_FAILURES 5

/* One tenant (docs/security.md "Tenants"): an admin sees every one, a tenant its own. */
typedef struct {
	char name[33];
	uint32_t sessions, inflight_saves;
	uint64_t pool_bytes; /* held by its saves not yet durable */
} ckpt_tenant_info;

/* One copy in the daemon's memory tier. */
typedef struct {
	char job[256];
	uint32_t rank, world_size;
	uint64_t step, bytes;
	char attempt_id[128];
	int tier;    /* ckpt_tier it was saved as */
	int durable; /* in storage too (durable, or persisted) */
	/* ckpt_held: "" held by this node's daemon; else the peer daemon
	 * ("HOST:PORT") that holds this node's replica of it. */
	char peer[128];
} ckpt_held_info;

/* A failed save (ckpt_status): what its trainer was told, and when. */
typedef struct {
	char job[256];
	uint64_t step;
	uint32_t rank;
	int status;        /* negative errno */
	char message[256]; /* the daemon keeps at most 200 bytes of it */
	int64_t unix_ns;   /* when it failed, ns since the epoch */
} ckpt_failure_info;

typedef struct {
	uint32_t sessions;
	uint64_t pool_bytes, pool_used_bytes, pool_held_bytes, chunk_bytes;
	uint32_t inflight_saves, waiting_saves;
	uint64_t saves_total, saves_failed, saves_superseded, saves_skipped;
	uint64_t bytes_staged, bytes_durable, bytes_restored, bytes_restored_memory;
	uint64_t restores_from_memory, restores_from_storage;
	uint64_t reclaimed_bytes;
	uint64_t uptime_ns;
	uint64_t cpu_ns, peak_rss_bytes; /* the daemon's own */
	char storage[512];
	char cuda[256]; /* "on: ..." or "off: why" */
	/* the memory tier: the first CKPT_STATUS_MAX_HELD of nheld */
	uint32_t nheld;
	ckpt_held_info held[CKPT_STATUS_MAX_HELD];
	/* files a restart removed after a crash */
	uint32_t recovered_files, nrecovered;
	char recovered[CKPT_STATUS_MAX_RECOVERED][256];
	uint32_t ntenants;
	ckpt_tenant_info tenants[CKPT_STATUS_MAX_TENANTS];
	/* The daemon's last failed saves, newest first (a tenant sees those of
	 * its own jobs among them); saves_failed counts every one. */
	uint32_t nfailures;
	ckpt_failure_info failures[CKPT_STATUS_MAX_FAILURES];
} ckpt_status_info;

int ckpt_status(ckpt_client *c, ckpt_status_info *out);

typedef struct {
	char job[256];
	uint64_t step;
	int complete;
	uint64_t bytes;
	uint32_t ranks_present;
	uint32_t world_size;
	char attempt_id[128];
	int bytes_unlisted;    /* layout spread: the listing has no shard sizes (bytes is 0); show has them */
	int64_t saved_unix_ns; /* the newest manifest's time as listed, ns since the epoch; 0: unknown */
	/* ckpt_list and ckpt_show: "durable" (in storage), or "memory" /
	 * "replicated" (in daemons' memory only; ranks_present of them in
	 * this daemon); "" from an older daemon. where: in words, where its
	 * copies are ("storage", "memory here: 8 of 8 ranks"). */
	char tier[16];
	char where[128];
} ckpt_step_info;

/* Decide once which step a restore loads: step CKPT_LATEST (the highest
 * complete step) or a named one, of job (NULL: this session's job). The
 * daemon decides it from storage listings and pins it (the step's commit
 * object), so every rank that then calls ckpt_load() with out->step loads
 * the same bytes. A storage error fails it (-EIO and the like, retryable);
 * it never falls back to an older step; -ENOENT when there is none. Call
 * it on one rank and broadcast out->step. */
int ckpt_resolve(ckpt_client *c, const char *job, int64_t step, ckpt_step_info *out);

/* Wait until step of job (NULL: this session's job) is complete in
 * storage (one attempt holds every rank's manifest, as ckpt_list's
 * complete says), and pin it as ckpt_resolve does. Every waiter of the
 * step on one node shares the daemon's one poll of storage (50 ms after
 * the first look, doubling to 2 s; sooner after a local rank's durable),
 * so waiting costs O(1) storage requests per node however many ranks
 * wait; a step the daemon saw complete in the last minute is answered at
 * once. timeout_ms: 0 looks once, < 0 waits without limit. 0 (with *out
 * unless out is NULL); -ETIMEDOUT when the step is not complete in time
 * (ckpt_errmsg() says how far it got); or a storage error that asking
 * again cannot mend. Use it instead of polling ckpt_list(). */
int ckpt_wait_complete(ckpt_client *c, const char *job, uint64_t step, int64_t timeout_ms, ckpt_step_info *out);

/* The copies this daemon holds in memory of job (NULL: this session's):
 * this session's rank's, or every rank's with all_ranks. With peer
 * replication, for this rank, also the copies the peers holding this
 * node's replicas have (->peer names each). No storage request: what a
 * restore could read (docs/tiers.md "Tiers": ranks agree on a memory-only step
 * by gathering these). *out is malloc'd; free(). */
int ckpt_held(ckpt_client *c, const char *job, int all_ranks, ckpt_held_info **out, size_t *count);

/* List steps of job (NULL: all jobs). *out is malloc'd; free with free(). */
int ckpt_list(ckpt_client *c, const char *job, ckpt_step_info **out, size_t *count);

/* One tensor of one rank's manifest (ckpt_show). */
typedef struct {
	uint32_t rank;
	const char *name;
	int dtype;
	uint32_t ndim;
	uint64_t global_shape[CKPT_MAX_DIMS];
	uint64_t box_offsets[CKPT_MAX_DIMS];
	uint64_t box_lengths[CKPT_MAX_DIMS];
	uint64_t shard_offset, nbytes;
	uint32_t crc32c;
} ckpt_tensor_info;

typedef struct {
	ckpt_step_info info;
	size_t ntensors;
	ckpt_tensor_info *tensors; /* every rank's, by rank */
} ckpt_step_detail;

/* The layout of the structs a binding mirrors (ckpt_hello, ckpt_tensor,
 * ckpt_save_opts, ckpt_step_info, ckpt_held_info, ckpt_tensor_info,
 * ckpt_step_detail) as this library was built: a row per field, and a row
 * per struct with field NULL and its size. Python's ckpt checks its
 * ctypes mirrors against it when it loads libckpt. *n: the rows. */
typedef struct {
	const char *type;  /* "ckpt_tensor" */
	const char *field; /* NULL: the struct itself */
	size_t offset, size;
} ckpt_abi_field;
const ckpt_abi_field *ckpt_abi_layout(size_t *n);

/* The manifests of job/step. Free with ckpt_step_detail_free. */
int ckpt_show(ckpt_client *c, const char *job, uint64_t step, ckpt_step_detail **out);
/* Only rank's manifest (rank 0's when the step has fewer ranks), of the
 * attempt a load takes: what one restoring rank needs (one manifest read,
 * not world_size). */
int ckpt_show_rank(ckpt_client *c, const char *job, uint64_t step, uint32_t rank, ckpt_step_detail **out);
void ckpt_step_detail_free(ckpt_step_detail *d);

typedef struct {
	ckpt_step_info info;
	int ok; /* every crc32c matched and the step is complete */
	uint64_t bytes_checked;
	size_t nproblems;
	char **problems; /* one line each, naming rank and tensor */
} ckpt_verify_result;

/* Re-read every shard of job/step and check every chunk and tensor
 * crc32c. Returns 0 when the check ran (see ->ok); free the result with
 * ckpt_verify_result_free. */
int ckpt_verify(ckpt_client *c, const char *job, uint64_t step, ckpt_verify_result **out);
/* The same for one rank of the attempt and world size that ckpt_show
 * gave: its manifest is read by name, without listing the step, then its
 * shard. Several at once (one client each) verify a step in parallel;
 * ->info.ranks_present is 1 when this rank's manifest was found. */
int ckpt_verify_rank(ckpt_client *c, const char *job, uint64_t step, uint32_t rank, uint32_t world_size,
		     const char *attempt_id, ckpt_verify_result **out);
void ckpt_verify_result_free(ckpt_verify_result *v);

/* Remove job/step from storage (-EBUSY while it is written or read). An
 * incomplete attempt of the step with an object younger than the job's
 * in-flight window ([retention] incomplete_grace, else an hour) may be a
 * save in flight on another node: it is left, and -EBUSY says so (the rest
 * goes; a later removal takes it), unless flags has CKPT_DELETE_FORCE.
 * ckpt_delete is ckpt_delete_flags with 0. */
int ckpt_delete(ckpt_client *c, const char *job, uint64_t step);
#define CKPT_DELETE_FORCE 1u
int ckpt_delete_flags(ckpt_client *c, const char *job, uint64_t step, unsigned flags);

typedef struct {
	ckpt_step_info info;
	char reason[128];
} ckpt_gc_entry;

/* Apply the retention policy now (job NULL: every job). *out lists what
 * was removed (or, with dry_run, would be); free() it. */
int ckpt_gc(ckpt_client *c, const char *job, int dry_run, ckpt_gc_entry **out, size_t *count);

/* The daemon's metrics in the Prometheus text format; *text is malloc'd. */
int ckpt_metrics(ckpt_client *c, char **text);

const char *ckpt_strerror(int err);
/* The daemon's message for the last failed call on this thread, or "". */
const char *ckpt_errmsg(void);

#ifdef __cplusplus
}
#endif
#endif
