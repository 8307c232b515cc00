/* A small journal of uploads in flight, in the state directory, so that a
 * restart after a crash can remove what the crashed run left half-written:
 * its temporary files and shards whose manifest never followed. One line a
 * record (journal.c writes them and parses them in one place):
 *   B <id> <attempt> <shard key> <manifest key>   an upload began
 *   E <id>                                        it ended
 *   U <upload id> <key>, X <upload id>            a multipart upload opened, ended
 *   N <text>                                      a note for the next start
 *   R <id> <job> <step>, F <id>                   a step's removal began, finished
 *   T <id> <key>, F <id>                          a write outside an upload began, ended
 * A record is fdatasync'd before what it announces is done; the journal's
 * own name is made durable when it is created (the state directory's
 * fsync), and compaction replaces it by a rename, never truncating what
 * must be kept (docs/architecture.md "What is on disk").
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

/* A step's removal begins (*id, for journal_remove_end) and ends: one
 * that a crash cut short is finished by the next start (journal_recover),
 * so no object of a removed step stays behind for ever. Thread-safe,
 * fsync'd. */
int journal_remove_begin(struct journal *j, const char *job, uint64_t step, uint64_t *id);
int journal_remove_end(struct journal *j, uint64_t id);
/* A write of key outside an upload (store.on_temp_begin) begins and ends:
 * the next start removes the temporaries of one a crash cut short.
 * Thread-safe, fsync'd. */
int journal_temp_begin(struct journal *j, const char *key, uint64_t *id);
void journal_temp_end(struct journal *j, uint64_t id);

/* Empty the journal but for what is still open (multipart uploads whose
 * abort failed, removals under way): call only while no upload is in
 * flight. */
void journal_compact(struct journal *j);
/* A line for the next start to report (e.g. a save lost at shutdown). */
int journal_note(struct journal *j, const char *what);

typedef void (*journal_recover_fn)(void *ctx, const char *what);
/* Undo every write begun and never ended: abort its multipart uploads still
 * open, remove its temporaries, and its shard unless the manifest of that
 * attempt made it; and finish every step removal begun and never
 * finished. report() is told each removal. Then empty the journal.
 * Returns the number of files (and steps) removed. */
int journal_recover(struct journal *j, struct store *s, journal_recover_fn report, void *ctx);
/* The in-flight window recovery's removals use (catalog_delete_step): the
 * longest of any job's, since the journal does not keep it. */
void journal_set_in_flight(struct journal *j, uint64_t in_flight_s);
/* The same with each record's key in the store store_of(sctx, key) says
 * (a tenant's own storage: docs/security.md "Tenants"). */
typedef struct store *(*journal_store_fn)(void *sctx, const char *key);
int journal_recover_by(struct journal *j, journal_store_fn store_of, void *sctx, journal_recover_fn report, void *ctx);

#endif
