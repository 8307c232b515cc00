/* What a peer's messages must be before a daemon acts on them (peer_serve.c, peer_fetch.c):
 * a ReplicaPut a holder takes, and the ReplicaData a restoring node takes
 * (docs/tiers.md "Peers"). Pure: no I/O, no daemon state; fuzzed as the
 * peer sends them (tests/fuzz/fuzz_peer.c). */
#ifndef CKPTD_PEER_MSG_H
#define CKPTD_PEER_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.pb-c.h"
#include "seal.h"

/* A sealed replica's seal (seal.h): the nonce, the associated data that
 * binds it to its public manifest, and, as sent, the whole manifest
 * sealed (ciphertext, tag). */
struct sealing {
	bool on;
	uint8_t nonce[SEAL_NONCE_BYTES];
	char aad[400];
	size_t aadlen;
	uint8_t *sm; /* sealed manifest (sender) */
	size_t smlen;
};

/* z's associated data for a replica of those fields. 0 or -ENAMETOOLONG. */
int sealing_aad(struct sealing *z, const char *job, uint64_t step, uint32_t rank, uint32_t world, const char *attempt,
		uint64_t shard_bytes);

/* This node's limits on what a peer puts. */
struct put_limits {
	uint32_t max_tensors, max_extra_state;
	uint64_t pool_bytes;
};

/* A ReplicaPut: its manifest decoded and checked (manifest_check), within
 * lim; a sealed one (*sealed) with a well-formed seal and a public
 * manifest only (no tensors, no extra state, no larger than the pool).
 * 0 and *m (free with ckpt__manifest__free_unpacked); -EBADMSG or -E2BIG
 * and why. */
int peer_msg_put(const Ckpt__ReplicaPut *put, const struct put_limits *lim, Ckpt__Manifest **m, bool *sealed, char *why,
		 size_t whylen);

/* A ReplicaData (status 0) that answers g: its manifest is of the job,
 * step, rank and world size g names. A rank with a key takes a sealed copy
 * only, opened with it: *m is then the whole manifest (of the same job,
 * step, rank, world size, attempt and size as the public one), and z the
 * seal its shard's pieces open with; a rank without a key takes no sealed
 * copy. 0 and *m; -EBADMSG (another copy, malformed, or it does not open),
 * -EACCES (sealed and no key, or not sealed and a key) and why. */
int peer_msg_data(const Ckpt__ReplicaData *data, const Ckpt__ReplicaGet *g, const uint8_t *key, struct sealing *z,
		  Ckpt__Manifest **m, char *why, size_t whylen);

/* A ReplicaListReply that answers q: at most max copies, each of q's job
 * (and q's rank unless all_ranks), a world size a save could have had, its
 * rank within it, and a well-formed attempt id. A peer's answer is all or
 * nothing: 0, or -E2BIG (over max) or -EBADMSG (a copy not asked for, or
 * malformed) and why. */
int peer_msg_list(const Ckpt__ReplicaListReply *rep, const Ckpt__ReplicaList *q, uint32_t max, char *why,
		  size_t whylen);

#endif
