/* A small journal of uploads in flight, in the state directory, so that a
 * restart after a crash can remove what the crashed run left half-written:
 * its temporary files and shards whose manifest never followed. One line a
 * record (journal.c writes them and parses them in one place):
 *   B <id> <attempt> <shard key> <manifest key>   an upload began
 *   E <id>                                        it ended
 *   U <upload id> <key>, X <upload id>            a multipart upload opened, ended
 *   N <text>                                      a note for the next start
 */
#ifndef CKPTD_JOURNAL_H
#define CKPTD_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct journal;
struct store;

/* Open (creating) <state_dir>/journal. */
int journal_open(const char *state_dir, struct journal **out, char *err, size_t errlen);
void journal_close(struct journal *j);
/* Thread-safe; each record is fsync'd before the write it announces. */
int journal_begin(struct journal *j, uint64_t id, const char *shard_key, const char *man_key, const char *attempt);
int journal_end(struct journal *j, uint64_t id);
/* A multipart upload of key opened (open) or ended; recovery aborts the
 * ones still open. Thread-safe, fsync'd. */
int journal_upload(struct journal *j, const char *key, const char *upload_id, bool open);

/* Empty the journal: call only while no upload is in flight. */
void journal_compact(struct journal *j);
/* A line for the next start to report (e.g. a save lost at shutdown). */
int journal_note(struct journal *j, const char *what);

typedef void (*journal_recover_fn)(void *ctx, const char *what);
/* Undo every write begun and never ended: abort its multipart uploads still
 * open, remove its temporaries, and its shard unless the manifest of that
 * attempt made it. report() is told each
 * removal. Then empty the journal. Returns the number of files removed. */
int journal_recover(struct journal *j, struct store *s, journal_recover_fn report, void *ctx);
/* The same with each record's key in the store store_of(sctx, key) says
 * (a tenant's own storage: docs/manual.md "Tenants"). */
typedef struct store *(*journal_store_fn)(void *sctx, const char *key);
int journal_recover_by(struct journal *j, journal_store_fn store_of, void *sctx, journal_recover_fn report, void *ctx);

#endif
