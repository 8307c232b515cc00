/* The daemon's life after start-up (lifecycle.c): readiness and STATUS=
 * for systemd, and the drain on SIGTERM/SIGINT. Only main.c calls these;
 * the modules below reach the drain through daemon_work_ended(). */
#ifndef CKPTD_LIFECYCLE_H
#define CKPTD_LIFECYCLE_H

#include <uv.h>

struct daemon;

/* SIGTERM/SIGINT: start draining; a second signal exits at once. */
void daemon_on_signal(uv_signal_t *h, int signum);
/* sd_notify READY=1 and STATUS=, and start the STATUS/WATCHDOG timer. */
void daemon_notify_start(struct daemon *d);

#endif
