/* The storage side of a save (upload.c), run on the libuv threadpool once
 * the save is staged and hashed: the shard under a name no other save uses,
 * then the manifest create-only, each announced in the journal first. Two
 * requests besides the shard's own (a commit GET and the manifest PUT),
 * flat in the world size. */
#ifndef CKPTD_UPLOAD_H
#define CKPTD_UPLOAD_H

struct save;

/* Write sv's shard and manifest. On failure sets sv->status (-errno) and
 * sv->msg; on success sv->shard_name. Threadpool; touches only sv and the
 * thread-safe store and journal. */
void save_upload(struct save *sv);

#endif
