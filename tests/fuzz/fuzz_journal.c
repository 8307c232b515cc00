/* The upload journal (catalog/journal.c) as a start after a crash reads it:
 * journal_compact, then journal_recover against a file:// store. The journal
 * is the input; the store holds one step with a manifest and a shard, and a
 * file beside the store stands for everything outside it: whatever the
 * journal names, recovery must never remove that file, and may remove only
 * shards and temporaries inside the store. */
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends.h"
#include "journal.h"

static char top[64], state[96], outside[96];
static struct store *st;

static void report(void *ctx, const char *what)
{
	(void)ctx;
	(void)what;
}

static void put(const char *path, const void *data, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || write(fd, data, len) != (ssize_t)len)
		abort();
	close(fd);
}

static void setup(void)
{
	snprintf(top, sizeof(top), "/tmp/ckpt-fuzz-journal-XXXXXX");
	if (mkdtemp(top) == NULL)
		abort();
	char url[128], dir[128];
	snprintf(state, sizeof(state), "%s/state", top);
	snprintf(dir, sizeof(dir), "%s/store", top);
	snprintf(outside, sizeof(outside), "%s/outside", top);
	if (mkdir(state, 0700) != 0 || mkdir(dir, 0700) != 0)
		abort();
	snprintf(url, sizeof(url), "file://%s", dir);
	char err[256];
	if (store_open(url, &st, err, sizeof(err)) != 0)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (st == NULL)
		setup();
	put(outside, "x", 1);
	char path[160];
	snprintf(path, sizeof(path), "%s/journal", state);
	for (int pass = 0; pass < 2; pass++) {
		put(path, data, size);
		struct journal *j;
		char err[256];
		if (journal_open(state, &j, err, sizeof(err)) != 0)
			abort();
		if (pass == 0)
			journal_compact(j);
		else
			(void)journal_recover(j, st, report, NULL);
		journal_close(j);
	}
	struct stat sb;
	if (stat(outside, &sb) != 0)
		abort(); /* recovery removed a file outside the store */
	return 0;
}
