/* A save: admission into the pool, staging copies, upload, events.
 * Every state change goes through save_set_state(). */
#ifndef CKPTD_SAVE_H
#define CKPTD_SAVE_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "ckpt.pb-c.h"

struct session;
struct save;
struct daemon;

void save_start(struct session *s, uint64_t req_id, const Ckpt__Save *m);
/* The session is going away; the save goes on without it. */
void save_detach_session(struct save *sv);
/* Chunks were released: admit waiting saves that now fit. */
void save_admit_waiting(struct daemon *d);
/* Fail saves still waiting for admission (shutdown). */
void save_cancel_waiting(struct daemon *d, int status, const char *why);
void save_on_admit_timer(uv_timer_t *t);
/* Tensor names: 1..max bytes, no control characters. */
int save_validate_name(const char *name, uint32_t max, char *err, size_t errlen);

#endif
