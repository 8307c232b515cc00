/* Latency histograms with fixed bucket bounds, as Prometheus exposes them.
 * A leaf: the engine observes, metrics.c renders. */
#ifndef CKPTD_HIST_H
#define CKPTD_HIST_H

#include <stdint.h>

#define HIST_BUCKETS 14

struct histogram {
	uint64_t counts[HIST_BUCKETS + 1]; /* last: +Inf */
	uint64_t count;
	double sum;
};

/* Bucket bounds in seconds, shared by every latency histogram. */
extern const double metrics_bounds[HIST_BUCKETS];

void hist_observe(struct histogram *h, double seconds);

#endif
