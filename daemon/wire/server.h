/* The listening Unix socket and SO_PEERCRED admission. */
#ifndef CKPTD_SERVER_H
#define CKPTD_SERVER_H

#include "daemon.h"

/* Bind (creating the socket's directory, mode 0660) or adopt a socket
 * passed by systemd, and start accepting. 0 or -errno with err set. */
int server_start(struct daemon *d, char *err, size_t errlen);
/* Stop accepting and remove the socket file if we created it. */
void server_stop(struct daemon *d);

#endif
