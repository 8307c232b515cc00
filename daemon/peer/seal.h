/* Sealed replicas (docs/tiers.md "Peers"): a job whose trainers give a
 * secret (CKPT_JOB_KEY, in Hello) has its replicas encrypted and
 * authenticated with AES-256-GCM under a key derived from the secret and
 * the job's name. A holder keeps what it cannot read; a daemon restores a
 * sealed replica only with the key its own trainer gave, and a copy that
 * does not authenticate (another key, altered bytes, another job's or
 * step's) never reaches a trainer.
 *
 * What is sealed: the manifest (tensor names, shapes, CRCs, extra state)
 * and every byte of the shard, in SEAL_CHUNK pieces, each with its own
 * tag. What a holder sees: the job, step, rank, world size, attempt and
 * sizes (the public manifest), bound to the sealed parts as associated
 * data, so that a holder cannot pass one step's or rank's replica off as
 * another's. Nonces: 12 random bytes per replica, the piece's index in
 * the last 4 (the manifest's: 0xffffffff).
 *
 * On the wire, after a sealed ReplicaPut or ReplicaData: each piece's
 * ciphertext, then its 16-byte tag. Pure: no I/O. */
#ifndef CKPTD_SEAL_H
#define CKPTD_SEAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SEAL_KEY_BYTES 32
#define SEAL_NONCE_BYTES 12
#define SEAL_TAG_BYTES 16
#define SEAL_CHUNK (1u << 20) /* bytes of shard per tag */
#define SEAL_SECRET_MAX 1024  /* bytes of a job's secret (Hello.job_key) */

/* The key of job's replicas from the secret its trainers gave. 0, -EINVAL
 * (an empty secret), -EIO (OpenSSL). */
int seal_derive(const void *secret, size_t len, const char *job, uint8_t key[SEAL_KEY_BYTES]);
/* A fresh random nonce base. 0 or -EIO. */
int seal_nonce(uint8_t nonce[SEAL_NONCE_BYTES]);
/* The associated data that binds a replica's sealed parts to what its
 * holder sees of it; the length, or -ENAMETOOLONG. */
int seal_aad(char *out, size_t cap, const char *job, uint64_t step, uint32_t rank, uint32_t world_size,
	     const char *attempt, uint64_t shard_bytes);
/* Pieces of a shard of n bytes, and the bytes on the wire. */
uint64_t seal_pieces(uint64_t n);
uint64_t seal_wire_bytes(uint64_t n);
/* Encrypt (or decrypt and authenticate) n bytes of piece index with
 * nonce and aad: in to out (in == out allowed), tag out (or checked). 0,
 * -EBADMSG when a piece does not authenticate, -EIO (OpenSSL). */
int seal_piece(const uint8_t key[SEAL_KEY_BYTES], const uint8_t nonce[SEAL_NONCE_BYTES], uint32_t index,
	       const void *aad, size_t aadlen, const void *in, void *out, size_t n, uint8_t tag[SEAL_TAG_BYTES],
	       bool encrypt);
#define SEAL_MANIFEST_INDEX 0xffffffffu

#endif
