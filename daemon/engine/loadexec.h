/* A restore's copies (load.c plans them from the manifests it reads):
 * each saved tensor met with the requests that want it, cut into slabs of
 * whole rows, grouped into reads, and run on copy_threads threads, each
 * slab read from the memory tier or storage, checked against its CRC32C
 * and scattered into the trainer's buffers. */
#ifndef CKPTD_LOADEXEC_H
#define CKPTD_LOADEXEC_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.pb-c.h"

struct load;
struct save;
struct tplan;
struct ltask;
struct lread;

struct exec {
	struct load *ld;
	struct tplan *plans;
	size_t nplans, cap;
	struct ltask *tasks;
	size_t ntasks;
	struct lread *reads;
	size_t nreads;
	uint64_t max_read;      /* raw bytes of the largest read */
	uint64_t max_stored;    /* stored bytes of the largest read of pieces */
	struct pieces **pieces; /* of the manifests planned whose shards have pieces */
	size_t npieces, pieces_cap;
	atomic_size_t next;
	size_t rot; /* reads start at this one (shares_across), then wrap */
	atomic_int failed;
	pthread_mutex_t mu;
};

void exec_init(struct exec *ex, struct load *ld);
/* Plan the copies from manifest m (its shard in storage is key; held: a
 * memory-tier copy of it, or NULL): every saved tensor a request wants,
 * the coverage it adds. 0 or the load's failure. */
int plan_manifest(struct exec *ex, const Ckpt__Manifest *m, const char *key, const struct save *held);
/* Run the planned copies on nthreads threads; a failure is the load's. */
void execute(struct exec *ex, unsigned nthreads);
void exec_free(struct exec *ex);

#endif
