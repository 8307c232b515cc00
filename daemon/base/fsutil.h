/* File-system steps the durability rules are made of
 * (docs/architecture.md "What is on disk"). */
#ifndef CKPTD_FSUTIL_H
#define CKPTD_FSUTIL_H

/* fsync the directory dir, so that the names created, renamed or removed
 * in it are durable. 0 or -errno. */
int fsync_dir(const char *dir);

#endif
