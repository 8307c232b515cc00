/* The on-disk manifest (proto Manifest) and the storage layout names. */
#ifndef CKPTD_MANIFEST_H
#define CKPTD_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.pb-c.h"
#include "names.h"

#define MANIFEST_FORMAT_VERSION 1
#define MANIFEST_MAX_BYTES (256u << 20)
/* The largest world size: object names carry ranks in five digits. */
#define MANIFEST_WORLD_MAX 99999u

/* The layout (docs/architecture.md, "Storage layout"). In the directory
 * "<job>/step-<12 digits>/" of a step:
 *   rank-<5>-of-<5>.<attempt>.manifest        created create-only, last
 *   rank-<5>-of-<5>.<attempt>.<16 hex>.shard  a fresh name per save
 *   commit                                    the step's pin (StepCommit)
 *   index                                     every manifest of the pinned
 *                                             attempt (StepIndex), optional
 * so that one LIST of the directory says which attempt holds which ranks,
 * with no manifest read. Format 1 steps (before attempts were in names)
 * hold rank-<5>-of-<5>.manifest and .shard, and stay readable. */
#define MANIFEST_NONCE_HEX 16
#define COMMIT_NAME "commit"
/* A removal's markers in a step directory (removal.c):
 * - KEPT_NAME ".<attempt>": a removal takes this attempt (complete, or
 *   forced), written before any of its objects goes, naming its manifests
 *   whose shards are in spread directories; the removal that finishes a
 *   cut-short one takes it too;
 * - DEAD_NAME ".<attempt>": a removal judged this incomplete attempt dead
 *   (every object older than the in-flight window), written before any
 *   of it goes and left for twice the window: a slow save of it that
 *   sees it fails (upload.c check_not_taken);
 * - LEFT_NAME, empty: a removal left something (a save in flight, or
 *   another step refers to its shard): retention finishes the step.
 * KEPT_NAME alone is an older ckptd's marker, naming every manifest it
 * took; it is read, and removed with the rest. An older ckptd knows no
 * other marker (it finishes a step marked KEPT_NAME by taking all). */
#define KEPT_NAME "kept"
#define DEAD_NAME "dead"
#define LEFT_NAME "removal-pending"
#define INDEX_NAME "index"
/* The step index is never written larger, nor read past this: a step
 * whose manifests together exceed it is shown from its manifests. */
#define STEP_INDEX_MAX_BYTES (64u << 20)
#define STEP_INDEX_FORMAT_VERSION 1

/* Format 1 names: "<job>/step-<12>/rank-<5>-of-<5>.<ext>", ext "shard" or
 * "manifest". 0 or -ENAMETOOLONG. */
int manifest_key(char *out, size_t cap, const char *job, uint64_t step, uint32_t rank, uint32_t world_size,
		 const char *ext);
/* "<job>/step-<12>/rank-<5>-of-<5>.<attempt>.manifest" */
int manifest_key_attempt(char *out, size_t cap, const char *job, uint64_t step, uint32_t rank, uint32_t world_size,
			 const char *attempt);
/* Layout spread (config [storage] layout): a step's shards go to
 * "<job>/shards/<2 hex of rank % 256>/step-<12>/", 256 key prefixes that
 * stay the same from step to step, so an object store that partitions its
 * key space by prefix spreads one step's requests over all of them; the
 * manifests and the commit stay in the step's directory. */
#define SPREAD_FANOUT 256
/* "shards/<hh>/step-<12>", relative to the job (Manifest.shard_dir). */
int manifest_spread_dir(char *out, size_t cap, uint32_t rank, uint64_t step);
/* "<job>/step-<12>/rank-<5>-of-<5>.<attempt>.<nonce as 16 hex>.shard", or
 * with spread "<job>/shards/<hh>/step-<12>/..." */
int manifest_shard_key(char *out, size_t cap, const char *job, uint64_t step, uint32_t rank, uint32_t world_size,
		       const char *attempt, uint64_t nonce, bool spread);
/* "<job>/step-<12>/commit" */
int manifest_commit_key(char *out, size_t cap, const char *job, uint64_t step);
/* "<job>/step-<12>/index" */
int manifest_index_key(char *out, size_t cap, const char *job, uint64_t step);
int manifest_step_dir(char *out, size_t cap, const char *job, uint64_t step);
/* References between steps (incremental steps: a step's pieces stored in
 * an older step's shard; docs/architecture.md "References between
 * steps"). A rank of step S whose pieces lie in step T's shard puts the
 * empty object "<job>/refs/step-<S12>/step-<T12>/rank-<5>-of-<5>.<attempt>"
 * before its manifest; retention keeps T while S is kept, and removing S
 * removes its refs. They live outside the step directories, so restores,
 * waits and listings of steps never page through them. */
#define REFS_DIR "refs"
/* "<job>/refs/step-<12>": what step refers to. */
int manifest_refs_dir(char *out, size_t cap, const char *job, uint64_t step);
/* "<job>/refs/step-<S12>/step-<T12>/rank-<5>-of-<5>.<attempt>" */
int manifest_ref_key(char *out, size_t cap, const char *job, uint64_t step, uint64_t target, uint32_t rank,
		     uint32_t world_size, const char *attempt);
/* Parses "step-000000000123"; 0 or -EINVAL. */
int manifest_parse_step_dir(const char *name, uint64_t *step);

enum step_obj {
	OBJ_OTHER,
	OBJ_MANIFEST,
	OBJ_SHARD,
	OBJ_COMMIT,
	OBJ_INDEX
};
struct step_name {
	enum step_obj kind;
	uint32_t rank, world_size;
	char attempt[ATTEMPT_BUF]; /* "" in format 1 names */
};
/* What a name in a step directory is. Never fails: unknown names (other
 * nodes' temporaries, stray files) are OBJ_OTHER. */
void manifest_parse_object(const char *name, struct step_name *out);
/* Job and attempt names: [A-Za-z0-9._-], not starting with '.', no "..",
 * bounded: 1 if s is one, else 0. */
int manifest_name_valid(const char *s, size_t max);
/* The attempt of a marker KEPT_NAME ".<attempt>", or NULL. */
const char *manifest_kept_attempt(const char *name);
/* The attempt of a marker DEAD_NAME ".<attempt>", or NULL. */
const char *manifest_dead_attempt(const char *name);
/* Whether name is a removal's marker (KEPT_NAME, LEFT_NAME, or an
 * attempt's). */
bool manifest_is_marker(const char *name);
/* A job as ckptd keeps it: a name, or TENANT/NAME (docs/security.md "Tenants"): a
 * tenant name of [A-Za-z0-9_-] and a valid name, JOB_MAX_LEN in all. */
int manifest_job_valid(const char *job);

/* Unpack and check every field against itself; on failure -EBADMSG with
 * the reason in err. The caller frees with ckpt__manifest__free_unpacked. */
int manifest_decode(const void *buf, size_t len, Ckpt__Manifest **out, char *err, size_t errlen);
int manifest_check(const Ckpt__Manifest *m, char *err, size_t errlen);
/* The pieces' part of manifest_check (pieces.h): a format 2 manifest has pieces,
 * a format 1 none; they tile [0, shard_bytes); each has a known codec and
 * a stored length it can have. 0 or -EBADMSG with err. */
int pieces_check(const Ckpt__Manifest *m, char *err, size_t errlen);
/* The key of m's shard: its step directory (or shard_dir, which must be
 * the spread directory of m's rank and step) and shard_name, which must
 * name a shard of m's own rank (and attempt, in format 2 names). */
int manifest_shard_of(const Ckpt__Manifest *m, char *out, size_t cap);
/* m's shard relative to its job, as a later step's pieces refer to it
 * (ManifestPiece.ref): "step-<12>/<name>" or "<shard_dir>/<name>". */
int manifest_shard_ref(const Ckpt__Manifest *m, char *out, size_t cap);
/* Whether ref may be a piece's reference in m: the shard of an older step
 * of m's rank and world size, named as a save names it, in that step's
 * directory or its spread one. 0 with *step (the older step's), or
 * -EBADMSG. */
int manifest_ref_check(const Ckpt__Manifest *m, const char *ref, uint64_t *step);

#endif
