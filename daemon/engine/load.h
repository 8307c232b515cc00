/* Load (restore): planned and run on the libuv threadpool. The
 * planner intersects each requested box with the boxes of every manifest of
 * the step, so a step saved by N ranks loads on M ranks. */
#ifndef CKPTD_LOAD_H
#define CKPTD_LOAD_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.pb-c.h"
#include "names.h"

struct daemon;
struct requester;

void load_start(struct daemon *d, const struct requester *rq, const Ckpt__Load *m);
/* The jobs of loads in flight (at most max): retention and rm leave their
 * steps alone. */
size_t load_busy_jobs(struct daemon *d, char (*out)[JOB_BUF], size_t max);

#endif
