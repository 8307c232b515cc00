/* The daemon's clocks: monotonic nanoseconds, for stalls, deadlines and
 * uptime; and wall-clock nanoseconds, for what is compared with times
 * other nodes or the store wrote (removal.c, upload.c). A leaf: every
 * layer may use it. */
#ifndef CKPTD_CLOCK_H
#define CKPTD_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t clock_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline int64_t clock_wall_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#endif
