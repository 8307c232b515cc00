/* Saves and deletions of the same (job, step) exclude each other. A save
 * holds its step from admission until durable or failed; rm and GC take
 * it, on their worker threads, just around the deletion. Thread-safe. */
#ifndef CKPTD_STEPLOCK_H
#define CKPTD_STEPLOCK_H

#include <stdint.h>

/* 0, or -EBUSY while the step is being deleted; -ENOMEM. */
int steplock_save_begin(const char *job, uint64_t step);
void steplock_save_end(const char *job, uint64_t step);
/* 0, or -EBUSY while a save of the step is in flight (or another delete). */
int steplock_delete_begin(const char *job, uint64_t step);
void steplock_delete_end(const char *job, uint64_t step);

#endif
