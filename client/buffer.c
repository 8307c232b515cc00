/* Host buffers shared with the daemon as file descriptors. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_internal.h"

/* Send RegisterBuffer with b->fd attached. */
static int buffer_register(ckpt_client *c, ckpt_buffer *b)
{
	Ckpt__Frame req = CKPT__FRAME__INIT, *rep = NULL;
	Ckpt__RegisterBuffer rb = CKPT__REGISTER_BUFFER__INIT;
	int r;

	b->id = buffer_next_id(c);
	rb.buffer_id = b->id;
	rb.kind = CKPT__BUFFER_KIND__HOST_FD;
	rb.nbytes = b->size;
	req.body_case = CKPT__FRAME__BODY_REGISTER_BUFFER;
	req.register_buffer = &rb;
	r = client_call(c, &req, b->fd, &rep);
	if (r < 0)
		return r;
	if (rep->body_case != CKPT__FRAME__BODY_REPLY) {
		ckpt__frame__free_unpacked(rep, NULL);
		client_set_errmsg("ckptd answered register_buffer with "
				  "something else");
		return -EPROTO;
	}
	ckpt__frame__free_unpacked(rep, NULL);
	/* The daemon holds its own reference now and the mapping (if any)
	 * keeps the memory: one fd less per buffer in the trainer. */
	close(b->fd);
	b->fd = -1;
	return 0;
}

static void buffer_destroy(ckpt_buffer *b)
{
	if (b->map)
		munmap(b->map, b->size);
	if (b->fd >= 0)
		close(b->fd);
	free(b);
}

uint64_t buffer_next_id(ckpt_client *c)
{
	pthread_mutex_lock(&c->mu);
	uint64_t id = c->next_buffer_id++;
	pthread_mutex_unlock(&c->mu);
	return id;
}

void buffer_adopt(ckpt_client *c, ckpt_buffer *b, ckpt_buffer **out)
{
	client_ref(c);
	b->client = c;
	*out = b;
}

/* Take a client reference, register, and hand b out, or clean up. */
static int buffer_finish(ckpt_client *c, ckpt_buffer *b, ckpt_buffer **out)
{
	int r = buffer_register(c, b);

	if (r < 0) {
		buffer_destroy(b);
		return r;
	}
	buffer_adopt(c, b, out);
	return 0;
}

int ckpt_buffer_alloc(ckpt_client *c, size_t nbytes, ckpt_buffer **out)
{
	ckpt_buffer *b;
	int r;

	if (out)
		*out = NULL;
	if (!c || !out || nbytes == 0 || nbytes > (size_t)INT64_MAX) {
		client_set_errmsg("");
		return -EINVAL;
	}
	b = calloc(1, sizeof(*b));
	if (!b) {
		client_set_errmsg("");
		return -ENOMEM;
	}
	b->fd = -1;
	b->size = nbytes;
	b->fd = memfd_create("ckpt-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (b->fd < 0)
		goto fail_errno;
	if (ftruncate(b->fd, (off_t)nbytes) < 0)
		goto fail_errno;
	/* The daemon maps this file; with a shrink seal we cannot make its
	 * mapping fault (SIGBUS) by truncating later. */
	if (fcntl(b->fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0)
		goto fail_errno;
	/* Populate now: first-touch faults are slow, and paying for them at
	 * allocation keeps them off the training loop. */
	b->map = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, b->fd, 0);
	if (b->map == MAP_FAILED) {
		b->map = NULL;
		goto fail_errno;
	}
	return buffer_finish(c, b, out);

fail_errno:
	r = -errno;
	buffer_destroy(b);
	client_set_errmsg("");
	return r;
}

/* A buffer for fd (checked, dup'd), not registered yet. */
static int buffer_for_fd(int fd, size_t nbytes, ckpt_buffer **out)
{
	ckpt_buffer *b;
	struct stat st;
	int fl, r;

	if (fd < 0 || nbytes == 0 || nbytes > (size_t)INT64_MAX) {
		client_set_errmsg("");
		return -EINVAL;
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		client_set_errmsg("");
		return r;
	}
	if (!S_ISREG(st.st_mode)) {
		client_set_errmsg("fd is not a memfd or shared-memory file");
		return -EINVAL;
	}
	if ((uint64_t)st.st_size < (uint64_t)nbytes) {
		client_set_errmsg("file is smaller than nbytes");
		return -EINVAL;
	}
	fl = fcntl(fd, F_GETFL);
	if (fl < 0) {
		r = -errno;
		client_set_errmsg("");
		return r;
	}
	if ((fl & O_ACCMODE) != O_RDWR) {
		/* restore writes into it */
		client_set_errmsg("fd must be open read-write");
		return -EINVAL;
	}
	b = calloc(1, sizeof(*b));
	if (!b) {
		client_set_errmsg("");
		return -ENOMEM;
	}
	b->size = nbytes;
	b->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (b->fd < 0) {
		r = -errno;
		free(b);
		client_set_errmsg("");
		return r;
	}
	*out = b;
	return 0;
}

int ckpt_buffer_register_fd(ckpt_client *c, int fd, size_t nbytes, ckpt_buffer **out)
{
	ckpt_buffer *b;
	int r;

	if (out)
		*out = NULL;
	if (!c || !out) {
		client_set_errmsg("");
		return -EINVAL;
	}
	r = buffer_for_fd(fd, nbytes, &b);
	if (r < 0)
		return r;
	return buffer_finish(c, b, out);
}

/* Requests per batch: the fds in flight on the socket at once stay well
 * below the kernel's cap on descriptors in flight. */
#define REGISTER_BATCH 128

/* Register bs[0..n) (fds checked, ids unset) in one round trip. On any
 * failure every one of them is destroyed, the registered ones first
 * unregistered. */
static int register_batch(ckpt_client *c, ckpt_buffer **bs, size_t n, size_t first)
{
	Ckpt__Frame frames[REGISTER_BATCH], *reqs[REGISTER_BATCH];
	Ckpt__RegisterBuffer rbs[REGISTER_BATCH];
	int fds[REGISTER_BATCH], status[REGISTER_BATCH];
	char *msgs[REGISTER_BATCH];
	int r = 0;

	for (size_t i = 0; i < n; i++) {
		bs[i]->id = buffer_next_id(c);
		ckpt__register_buffer__init(&rbs[i]);
		rbs[i].buffer_id = bs[i]->id;
		rbs[i].kind = CKPT__BUFFER_KIND__HOST_FD;
		rbs[i].nbytes = bs[i]->size;
		ckpt__frame__init(&frames[i]);
		frames[i].body_case = CKPT__FRAME__BODY_REGISTER_BUFFER;
		frames[i].register_buffer = &rbs[i];
		reqs[i] = &frames[i];
		fds[i] = bs[i]->fd;
	}
	r = client_call_batch(c, reqs, fds, n, status, msgs);
	if (r < 0) {
		for (size_t i = 0; i < n; i++) {
			buffer_destroy(bs[i]);
			bs[i] = NULL;
		}
		return r;
	}
	for (size_t i = 0; i < n && r == 0; i++)
		if (status[i] < 0) {
			r = status[i];
			client_set_errmsgf("buffer %zu: %s", first + i, msgs[i] ? msgs[i] : ckpt_strerror(r));
		}
	for (size_t i = 0; i < n; i++) {
		free(msgs[i]);
		/* The daemon holds its own reference now: one fd less here. */
		if (status[i] == 0) {
			close(bs[i]->fd);
			bs[i]->fd = -1;
			buffer_adopt(c, bs[i], &bs[i]);
		}
	}
	if (r < 0) {
		char saved[CLIENT_ERRMSG_LEN];
		snprintf(saved, sizeof(saved), "%s", ckpt_errmsg());
		for (size_t i = 0; i < n; i++) {
			if (status[i] == 0) {
				ckpt_buffer_free(bs[i]);
			} else {
				buffer_destroy(bs[i]);
			}
			bs[i] = NULL;
		}
		client_set_errmsg(saved);
	}
	return r;
}

int ckpt_buffer_register_fds(ckpt_client *c, const int *fds, const size_t *nbytes, size_t n, ckpt_buffer **out)
{
	int r = 0;
	size_t done = 0;

	if (!c || !out || (n && (!fds || !nbytes))) {
		client_set_errmsg("");
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++)
		out[i] = NULL;
	while (done < n && r == 0) {
		size_t k = n - done < REGISTER_BATCH ? n - done : REGISTER_BATCH;
		size_t made = 0;
		for (; made < k; made++) {
			r = buffer_for_fd(fds[done + made], nbytes[done + made], &out[done + made]);
			if (r < 0) {
				char why[CLIENT_ERRMSG_LEN];
				snprintf(why, sizeof(why), "buffer %zu: %s", done + made,
					 *ckpt_errmsg() ? ckpt_errmsg() : ckpt_strerror(r));
				client_set_errmsg(why);
				break;
			}
		}
		if (r < 0) {
			for (size_t i = 0; i < made; i++) {
				buffer_destroy(out[done + i]);
				out[done + i] = NULL;
			}
			break;
		}
		r = register_batch(c, out + done, k, done);
		if (r == 0)
			done += k;
	}
	if (r < 0) {
		/* All or none: the batches before this one go too. */
		char saved[CLIENT_ERRMSG_LEN];
		snprintf(saved, sizeof(saved), "%s", ckpt_errmsg());
		for (size_t i = 0; i < done; i++) {
			ckpt_buffer_free(out[i]);
			out[i] = NULL;
		}
		client_set_errmsg(saved);
	}
	return r;
}

void *ckpt_buffer_data(ckpt_buffer *b)
{
	return b ? b->map : NULL;
}

size_t ckpt_buffer_size(ckpt_buffer *b)
{
	return b ? b->size : 0;
}

void ckpt_buffer_free(ckpt_buffer *b)
{
	Ckpt__Frame req = CKPT__FRAME__INIT, *rep = NULL;
	Ckpt__Unregister u = CKPT__UNREGISTER__INIT;
	char saved[CLIENT_ERRMSG_LEN];
	ckpt_client *c;

	if (!b)
		return;
	c = b->client;
	/* a void cleanup call must not clobber the caller's ckpt_errmsg() */
	snprintf(saved, sizeof(saved), "%s", ckpt_errmsg());
	u.buffer_id = b->id;
	req.body_case = CKPT__FRAME__BODY_UNREGISTER;
	req.unregister = &u;
	/* Best effort: on a closed session the daemon dropped it already. */
	if (client_call(c, &req, -1, &rep) == 0)
		ckpt__frame__free_unpacked(rep, NULL);
	client_set_errmsg(saved);
	buffer_destroy(b);
	client_unref(c);
}
