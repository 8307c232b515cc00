/* SO_PEERCRED admission with the default allowed ids (the daemon's own uid
 * and root): a client of another uid is refused with EACCES and the daemon
 * goes on serving. Needs root to become another uid; without it, or where
 * root cannot drop its privileges, the test says so and is skipped (exit
 * 77), never passed. An exit-code test: cmocka 1.1.5 prints a skip as
 * "not ok # SKIP", which meson counts as a failure. (test_bad_input checks
 * the refusal of our own uid by allowed_uids wherever it runs.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "harness.h"

int main(void)
{
	if (geteuid() != 0) {
		printf("skipped: needs root, to become another uid (running as uid %u)\n", (unsigned)geteuid());
		return 77;
	}
	struct dctx d;
	h_init(&d);
	h_start(&d, NULL);
	chmod(d.dir, 0755);
	char rundir[400];
	snprintf(rundir, sizeof(rundir), "%s/run", d.dir);
	chmod(rundir, 0755);
	chmod(d.sock, 0666); /* the socket's mode is not what refuses nobody */
	pid_t pid = fork();
	if (pid < 0)
		return 1;
	if (pid == 0) {
		if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
			_exit(100);
		ckpt_client *c = NULL;
		int r = ckpt_connect(d.sock, NULL, &c);
		if (r == -EACCES && strstr(ckpt_errmsg(), "not allowed"))
			_exit(0);
		fprintf(stderr, "nobody's connect: %d (%s)\n", r, ckpt_errmsg());
		_exit(1);
	}
	int st = 0;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
		return 1;
	int rc = WEXITSTATUS(st);
	if (rc == 0)
		h_assert_serves(&d); /* aborts on failure */
	h_cleanup(&d);
	if (rc == 100) {
		printf("skipped: root cannot drop its privileges to nobody here\n");
		return 77;
	}
	printf(rc == 0 ? "a client of uid 65534 was refused (EACCES), and the daemon serves on\n"
		       : "a client of uid 65534 was not refused as it should be\n");
	return rc ? 1 : 0;
}
