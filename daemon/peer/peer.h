/* Peer replication (docs/tiers.md "Tiers"): replicated saves are also held in
 * the memory of the next K daemons of the ring (ring.h), over TLS with
 * client certificates (link.h); a node restores its ranks' memory-only
 * steps from those peers when it has lost them (a replacement node).
 *
 * Threads: an acceptor and one thread per peer connection serve peers; a
 * sender thread replicates, one save at a time; a load's fetch runs on
 * its own threadpool thread. None touches the daemon's state: what needs
 * the pool or the memory tier is run on the loop (a loop call), and a
 * finished replication is handed back to the loop, which unpins the save
 * and sends SaveReplicated.
 *
 * Storage requests: none. Per replicated save, its node sends the shard
 * and manifest to K peers (K x shard bytes on the network); per restore
 * from peers, one rank's shard comes back from one peer. Both are flat in
 * the job's size: a node talks to its K successors in the ring only. */
#ifndef CKPTD_PEER_H
#define CKPTD_PEER_H

#include <stddef.h>

struct daemon;

/* Start replication from the [peers] config, or leave it off (no listen,
 * or no certificates: daemon.peer_why says so, and replicated saves are
 * reported not replicated). 0; -errno with err when the config is on but
 * cannot work (a certificate that does not load, a port in use). */
int peer_start(struct daemon *d, char *err, size_t errlen);
/* Stop (loop thread): no new work; connections shut; threads joined. */
void peer_stop(struct daemon *d);

#endif
