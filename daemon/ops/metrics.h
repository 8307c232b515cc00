/* Metrics in the Prometheus text format, served by ckptctl metrics and by
 * an optional HTTP listener (metrics_listen). Loop thread only. */
#ifndef CKPTD_METRICS_H
#define CKPTD_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "hist.h"

struct daemon;
struct status;

/* The whole exposition of a status snapshot, one series per SV_METRIC
 * column (status.h), malloc'd. 0 or -ENOMEM. */
int metrics_format(const struct status *st, char **out, size_t *len);
/* metrics_format of a fresh snapshot of d. */
int metrics_render(struct daemon *d, char **out, size_t *len);
/* Start the HTTP listener on "host:port" (IPv4 or [IPv6]); 0 or -errno. */
int metrics_listen(struct daemon *d, const char *addr, char *err, size_t errlen);
void metrics_stop(struct daemon *d);

#endif
