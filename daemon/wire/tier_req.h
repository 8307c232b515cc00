/* The requests of the memory tier (docs/tiers.md "Tiers"): which copies this
 * daemon holds, persist, and what show and list say of steps held in
 * memory only. Answered on the loop from the daemon's own memory: none
 * of them reads storage (a persist's uploads are the saves'). */
#ifndef CKPTD_TIER_REQ_H
#define CKPTD_TIER_REQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.pb-c.h"

struct session;
struct bgreq;

void held_start(struct session *s, uint64_t req_id, const Ckpt__HeldRequest *m);
void persist_request(struct session *s, uint64_t req_id, const Ckpt__PersistRequest *m);
/* A show of a step that this daemon holds in memory only, answered from
 * the copies (true); false: not such a step, the caller asks storage. */
bool show_held(struct session *s, uint64_t req_id, const char *job, uint64_t step, bool one_rank, uint32_t rank);
/* The steps held here in memory only that list request b sees (job "":
 * every job it may see), appended to *v (n of them, room for cap: GROW), and the
 * tier and where of those in v already (storage steps) that are held here
 * too. 0 or -ENOMEM. Each added entry owns its job and attempt_id. */
int list_held(struct bgreq *b, const char *job, Ckpt__StepInfo **v, size_t *n, size_t *cap);

#endif
