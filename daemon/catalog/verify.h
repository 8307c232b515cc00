/* Checking what storage holds of a step against its manifests (ckptctl
 * verify): each shard read once, in order, every chunk and tensor crc32c
 * checked from that one pass, and each older step a manifest refers to
 * checked for its ref. Runs on a threadpool thread; the caller lists or
 * reads the manifests (catalog.h). */
#ifndef CKPTD_VERIFY_H
#define CKPTD_VERIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.pb-c.h"
#include "store.h"

#define VERIFY_BLOCK (16u << 20) /* bytes read per GET of a stored shard */
#define VERIFY_MAX_PROBLEMS 100

struct verify {
	struct store *st;
	bool ok; /* no problem yet */
	uint64_t bytes_checked;
	char *problems[VERIFY_MAX_PROBLEMS]; /* the first ones, each a line */
	size_t nproblems;
	uint8_t *buf; /* VERIFY_BLOCK */
};

/* A check of what st holds: 0, or -ENOMEM. */
int verify_init(struct verify *v, struct store *st);
/* Frees what v holds (also after a failed or no verify_init of a zeroed
 * struct). */
void verify_free(struct verify *v);
/* A problem found: v is no longer ok; the line is kept while there is
 * room. */
void verify_problem(struct verify *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Check m's shard and its refs (m passed manifest_check). Requests: a ranged GET per VERIFY_BLOCK
 * of the shard (of whole pieces where it has pieces, from the step that
 * holds them), and one GET per step m refers to. */
void verify_shard(struct verify *v, const Ckpt__Manifest *m);

#endif
