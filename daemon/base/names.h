/* The names ckptd keeps, their longest lengths, and the buffers that hold
 * them with their NUL. Bottom layer: the catalog's rules for a valid name
 * (manifest.h) and every buffer above use these, so a name that fits the
 * rule always fits the buffer. */
#ifndef CKPTD_NAMES_H
#define CKPTD_NAMES_H

/* A job as ckptd keeps it: NAME, or TENANT/NAME under a tenant. */
#define JOB_MAX_LEN 128
#define ATTEMPT_MAX_LEN 128
#define JOB_BUF (JOB_MAX_LEN + 1)
#define ATTEMPT_BUF (ATTEMPT_MAX_LEN + 1)

#endif
