/* ckptctl's catalogue requests: list, show, verify, resolve, rm and gc
 * (a retention pass: engine/gc.c). */
#ifndef CKPTD_CATALOG_REQ_H
#define CKPTD_CATALOG_REQ_H

#include <stdint.h>

#include "ckpt.pb-c.h"

struct session;
struct daemon;

void list_start(struct session *s, uint64_t req_id, const Ckpt__ListRequest *m);
/* Which step a restore loads (latest, or a named one), pinned. */
void resolve_start(struct session *s, uint64_t req_id, const Ckpt__ResolveRequest *m);
void show_start(struct session *s, uint64_t req_id, const Ckpt__ShowRequest *m);
void verify_start(struct session *s, uint64_t req_id, const Ckpt__VerifyRequest *m);
void delete_start(struct session *s, uint64_t req_id, const Ckpt__DeleteRequest *m);
void gc_start(struct session *s, uint64_t req_id, const Ckpt__GcRequest *m);

#endif
