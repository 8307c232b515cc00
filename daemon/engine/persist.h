/* Persist: make a memory-only step durable on request (docs/tiers.md "Tiers"),
 * for example when the job is told to stop. Every copy of the step this
 * daemon holds in memory only is uploaded as a durable save's would be
 * (save_persist), and stays held; the request is answered once all of
 * them ended. Loop thread only. */
#ifndef CKPTD_PERSIST_H
#define CKPTD_PERSIST_H

#include <stdbool.h>
#include <stdint.h>

struct daemon;
struct requester;

/* Set daemon.on_persist_end. */
void persist_init(struct daemon *d);
/* job as ckptd keeps it. Answers SaveDurable (the copies' bytes in all)
 * once every copy of (job, step) held here is durable, SaveFailed if one
 * could not be written, or a Reply: ENOENT when none is held here. */
void persist_start(struct daemon *d, const struct requester *rq, const char *job, uint64_t step, bool replicas);

#endif
