/* The config file (ini, inline comments, every key's parser) and the
 * validation a start runs, as --check-config reads them. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fd = memfd_create("ckptd-fuzz-conf", MFD_CLOEXEC);
	if (fd < 0)
		return 0;
	if (write(fd, data, size) == (ssize_t)size) {
		char path[64], err[512];
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		static struct config c; /* large: job sections */
		config_defaults(&c);
		if (config_load(&c, path, err, sizeof(err)) == 0)
			(void)config_validate(&c, err, sizeof(err));
	}
	close(fd);
	return 0;
}
