#include "hist.h"

#include <stddef.h>

const double metrics_bounds[HIST_BUCKETS] = {
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30
};

void hist_observe(struct histogram *h, double s)
{
	size_t i = 0;
	while (i < HIST_BUCKETS && s > metrics_bounds[i])
		i++;
	h->counts[i]++;
	h->count++;
	h->sum += s;
}
