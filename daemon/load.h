/* Load (restore) and List: planned and run on the libuv threadpool. The
 * planner intersects each requested box with the boxes of every manifest of
 * the step, so a step saved by N ranks loads on M ranks. */
#ifndef CKPTD_LOAD_H
#define CKPTD_LOAD_H

#include <stdint.h>

#include "ckpt.pb-c.h"

struct session;

void load_start(struct session *s, uint64_t req_id, const Ckpt__Load *m);
void list_start(struct session *s, uint64_t req_id, const Ckpt__ListRequest *m);

#endif
