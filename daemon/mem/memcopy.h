/* Bulk copies for staging and restore. */
#ifndef CKPTD_MEMCOPY_H
#define CKPTD_MEMCOPY_H

#include <stddef.h>

/* Copy n bytes; large copies use non-temporal stores: the destination
 * (the staging pool on save, the trainer's buffer on restore) is not read
 * again by this thread soon, and skipping the read-for-ownership of every
 * destination line saves a third of the memory traffic. */
void memcopy_stream(void *dst, const void *src, size_t n);

#endif
