/* The on-disk manifest (proto Manifest) and the storage layout names. */
#ifndef CKPTD_MANIFEST_H
#define CKPTD_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.pb-c.h"

#define MANIFEST_FORMAT_VERSION 1
#define MANIFEST_MAX_BYTES (256u << 20)
#define JOB_MAX_LEN 128
#define ATTEMPT_MAX_LEN 128

/* "<job>/step-<12 digits>/rank-<5>-of-<5>.<ext>"; ext is "shard" or
 * "manifest". 0 or -ENAMETOOLONG. */
int manifest_key(char *out, size_t cap, const char *job, uint64_t step,
		 uint32_t rank, uint32_t world_size, const char *ext);
int manifest_step_dir(char *out, size_t cap, const char *job, uint64_t step);
/* Parses "step-000000000123"; 0 or -EINVAL. */
int manifest_parse_step_dir(const char *name, uint64_t *step);
/* Parses "rank-00003-of-00008.manifest"; 0 or -EINVAL. */
int manifest_parse_name(const char *name, uint32_t *rank, uint32_t *world_size);
/* Job and attempt names: [A-Za-z0-9._-], not starting with '.', bounded. */
int manifest_name_valid(const char *s, size_t max);

/* Unpack and check every field against itself; on failure -EBADMSG with
 * the reason in err. The caller frees with ckpt__manifest__free_unpacked. */
int manifest_decode(const void *buf, size_t len, Ckpt__Manifest **out,
		    char *err, size_t errlen);
int manifest_check(const Ckpt__Manifest *m, char *err, size_t errlen);

#endif
