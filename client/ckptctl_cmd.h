/* ckptctl's commands that live in files of their own, and the options
 * every command sees. */
#ifndef CKPTCTL_CMD_H
#define CKPTCTL_CMD_H

#include <stdint.h>

#include "ckpt/ckpt.h"

struct opts {
	int json, dry_run, jobs, replicas, force;
	int64_t timeout_ms; /* wait: -1 no limit */
	const char *sock;
};

/* ckptctl status (ckptctl_status.c). */
int cmd_status(ckpt_client *c, int json);
/* ckptctl verify JOB STEP (ckptctl_verify.c). */
int cmd_verify(ckpt_client *c, const char *job, uint64_t step, const struct opts *o);

#endif
