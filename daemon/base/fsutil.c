#include "fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

int fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int r = fsync(fd) == 0 ? 0 : -errno;
	close(fd);
	return r;
}
