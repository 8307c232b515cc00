/* Integration harness: start a real ckptd on a temporary socket, talk to it
 * through libckpt or with hand-made frames. */
#ifndef CKPT_TEST_HARNESS_H
#define CKPT_TEST_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ckpt.pb-c.h"
#include "ckpt/ckpt.h"

struct dctx {
	char dir[256]; /* temporary root: socket, store, state, log */
	char sock[300];
	char store[300];
	pid_t pid;
	/* If set (e.g. "6M"), the store is a tmpfs of that size in a private
	 * mount namespace (unshare -rm), to test a full disk. */
	const char *store_tmpfs;
	/* Extra environment for the daemon ("K=V"; "K=self" is replaced by
	 * the daemon's own pid, for WATCHDOG_PID/LISTEN_PID). NULL-ended. */
	const char *env[8];
	/* >= 0: pass this listening socket as fd 3 (socket activation). */
	int listen_fd;
	/* Leave --log-level off the command line (the config file decides). */
	bool no_log_flag;
	/* Leave the pool's size to the config file or the defaults; else the
	 * harness's 64 MiB of 1 MiB chunks. */
	bool default_pool;
};

/* mkdtemp a new root. */
void h_init(struct dctx *d);
/* Start ckptd on d's dirs; extra_conf (ini text) may be NULL. Waits until
 * the socket answers. */
void h_start(struct dctx *d, const char *extra_conf);
/* SIGTERM, wait; returns the exit status (or -1 if it died by a signal). */
int h_stop(struct dctx *d);
/* The daemon still runs and answers a status request on a new session. */
void h_assert_serves(struct dctx *d);
void h_cleanup(struct dctx *d);

/* Raw protocol */
int raw_connect(const char *path);
/* Send one frame (req_id, version set here) with optional fds attached. */
int raw_send(int fd, Ckpt__Frame *f, uint64_t req_id, const int *fds, int nfds);
int raw_send_bytes(int fd, const void *buf, size_t len);
/* Next frame within timeout_ms, or NULL on EOF/timeout (*eof set on EOF). */
Ckpt__Frame *raw_recv(int fd, int timeout_ms, bool *eof);
/* Send f as req_id and return the next frame, asserting that it arrives
 * within 10 s with body want_case; the caller frees it. */
Ckpt__Frame *raw_call(int fd, Ckpt__Frame *f, uint64_t req_id, int want_case);
/* Hello as job/rank/world and expect HelloReply. */
void raw_hello(int fd, const char *job, uint32_t rank, uint32_t world);
/* The next frame is a Reply with status (a positive errno, or 0) whose
 * message contains needle (if given), within timeout_ms. */
void raw_expect_reply(int fd, int status, const char *needle, int timeout_ms);
/* The session still answers (a status request). */
void raw_expect_alive(int fd);
/* Register memfd as host buffer id (nbytes, req_id id): the Reply's
 * status (a positive errno, or 0), whose message contains needle when it
 * is not 0 (if needle is given). */
int raw_register_status(int fd, uint64_t id, int memfd, uint64_t nbytes, const char *needle);
/* The same, expecting success. */
void raw_register(int fd, uint64_t id, int memfd, uint64_t nbytes);
/* A listening Unix socket bound at path (for socket activation). */
int listen_unix(const char *path);
/* The peer closes within timeout_ms. */
bool raw_wait_eof(int fd, int timeout_ms);
/* memfd of n bytes (unsealed), filled with byte v. */
int make_memfd(size_t n, int v);
/* The path of the one object in dir (a step directory) whose name starts
 * with "rank-RRRRR-of-WWWWW." and ends with "."+ext ("manifest", "shard"),
 * whatever attempt and nonce it carries; fails the test unless exactly
 * one matches. */
/* One series of the daemon's metrics; fails the test when missing. */
uint64_t h_metric(struct dctx *d, const char *name);

void h_rank_object(const char *dir, uint32_t rank, uint32_t ws, const char *ext, char *out, size_t cap);
/* Rank 0 of 1's manifest in step directory dir, decoded (the caller frees
 * it with ckpt__manifest__free_unpacked), and its shard's size. */
Ckpt__Manifest *h_rank_manifest(const char *dir);
uint64_t h_rank_shard_size(const char *dir);

/* n bytes of a pattern that seed decides. */
void h_fill(uint8_t *p, size_t n, uint64_t seed);

/* One rank's session with one u8 tensor of n bytes in a buffer of its
 * own: "blob.<rank>", which only that rank saves (so ranks may differ in
 * size), or with boxed, the rank's box [rank x n, n) of one global
 * tensor "blob" of world x n bytes. */
struct h_rank {
	ckpt_client *c;
	ckpt_buffer *b;
	ckpt_tensor t;
	uint64_t shape[1], off[1], len[1];
	char name[32];
	size_t n;
};
void h_rank_open(struct dctx *d, struct h_rank *rc, const char *job, uint32_t rank, uint32_t world, size_t n,
		 const char *attempt, const char *policy, bool boxed);
void h_rank_close(struct h_rank *rc);

/* Rank 0 of 1 saves "blob.0" (n bytes of pattern seed) as step 1 of job,
 * and waits until it is durable. */
void h_save_blob(struct dctx *d, const char *job, size_t n, uint64_t seed);

/* Run the shell command cmd: its exit status (-1: it did not exit), its
 * standard output (the first outlen - 1 bytes) in out. */
int h_run(const char *cmd, char *out, size_t outlen);
/* Run ckptctl (CKPTCTL_BIN, at most 30 s) against d with args (shell
 * words), stderr into out too when with_stderr: its exit status (-1: it
 * did not exit), its output in out. */
int h_ctl(struct dctx *d, const char *args, bool with_stderr, char *out, size_t outlen);

/* system() of the formatted command. */
int h_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A TCP port on 127.0.0.1 free now. */
int h_free_port(void);
/* Peers' certificates in a new directory dir (mkdtemp template, rewritten):
 * a CA (ca.crt, ca.key) and a certificate it signed for every node
 * (node.crt, node.key). 0 or -1. */
int h_peer_certs(char *dir);

#endif
