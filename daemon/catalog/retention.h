/* The retention policy as a pure decision over one job's steps, so it can
 * be tested without storage. */
#ifndef CKPTD_RETENTION_H
#define CKPTD_RETENTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

struct step_view {
	uint64_t step;
	bool complete;
	uint64_t newest_ns; /* creation time of its newest manifest */
	bool busy;          /* being written or read */
	/* out */
	bool remove;
	const char *reason;
};

/* Mark v[i].remove (with a reason) for the steps the policy drops. v is
 * sorted by step, ascending. Never the newest complete step, never a busy
 * one, never an incomplete step newer than the newest complete one (it may
 * be in progress). Returns how many are marked. */
size_t retention_plan(const struct retention *r, struct step_view *v, size_t n, uint64_t now_ns);

#endif
