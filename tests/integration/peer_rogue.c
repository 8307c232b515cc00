/* A peer that speaks ckptd's peer protocol (proto PeerFrame over TLS,
 * daemon/peer/link.h) as an attacker would: with a certificate the peers'
 * CA signed (a compromised node, or any pod that can read the Secret) it
 * puts replicas of its own making and asks for copies; with none, it
 * holds connections open. test_peers.c runs it; every address is one the
 * test made.
 *
 *   peer_rogue put  HOST:PORT CERTDIR NODE JOB STEP RANK WORLD NBYTES SEED [CLAIM]
 *       a ReplicaPut from "NODE" of one u8 tensor "blob" of NBYTES bytes
 *       (rank RANK's box of a [NBYTES * WORLD] tensor, attempt "p", as
 *       harness.h saves it), filled by h_fill(SEED), with matching chunk
 *       CRCs; the tensor's CRC32C is that of h_fill(CLAIM) (default SEED):
 *       a manifest that says "the genuine save" over other bytes.
 *       Prints "ready S MSG" and "ack S MSG"; exit 0 if both are 0.
 *       With ROGUE_EXTRA=N in the environment, N bytes of extra state.
 *   peer_rogue get  HOST:PORT CERTDIR JOB STEP RANK WORLD
 *       a ReplicaGet; prints "data S BYTES CRC32C [sealed] MSG" (the CRC of
 *       the first BYTES bytes that follow); exit 0 if S is 0.
 *   peer_rogue list HOST:PORT CERTDIR JOB
 *       a ReplicaList of every rank; prints "held STEP RANK WORLD BYTES"
 *       per copy and "listed N".
 *   peer_rogue drip HOST:PORT N SECONDS
 *       no certificate: N connections that each send a TLS record header,
 *       then one byte each half second for SECONDS. Prints "open K" (how
 *       many the server has not closed by then); exit 0.
 *   peer_rogue frame HOST:PORT CERTDIR CLAIM INTERVAL_MS SECONDS
 *       with a certificate: PeerHello, then a frame header claiming CLAIM
 *       bytes and one byte every INTERVAL_MS. Prints "closed after MS" when
 *       the server closes it, or "open" after SECONDS; exit 0.
 *
 *   peer_rogue serve PORT CERTDIR SECONDS STEP WORLD N
 *       a peer that listens on 127.0.0.1:PORT for SECONDS and lies: every
 *       ReplicaList is answered with N copies of step STEP claiming world
 *       size WORLD (N empty entries past the first: a reply of 2 bytes
 *       per copy), every ReplicaGet with "no copy", every ReplicaPut
 *       refused. Prints "served K" (requests answered). With ROGUE_DRIP=1
 *       in the environment it answers a ReplicaGet or ReplicaPut with a
 *       frame header claiming 1000 bytes and then a byte every 200 ms,
 *       until the asker hangs up.
 *
 * CERTDIR holds ca.crt, node.crt and node.key (ROGUE_CERT=NAME in the
 * environment: NAME.crt and NAME.key instead). */
#include "crc32c.h"
#include "link.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/ssl.h>

#define CHUNK (1u << 20)

static void fill(uint8_t *p, size_t n, uint64_t seed) /* h_fill (harness.c) */
{
	for (size_t i = 0; i < n; i += 8) {
		uint64_t v = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed * 0xBF58476D1CE4E5B9ull;
		memcpy(p + i, &v, n - i < 8 ? n - i : 8);
	}
}

static int open_peer(const char *hostport, const char *dir, const char *node, struct link *l)
{
	char cert[512], key[512], ca[512], err[300];
	const char *name = getenv("ROGUE_CERT") ? getenv("ROGUE_CERT") : "node";
	snprintf(cert, sizeof(cert), "%s/%s.crt", dir, name);
	snprintf(key, sizeof(key), "%s/%s.key", dir, name);
	snprintf(ca, sizeof(ca), "%s/ca.crt", dir);
	static struct link_tls tls;
	int r = link_tls_init(&tls, cert, key, ca, err, sizeof(err));
	if (r == 0)
		r = link_connect(&tls, hostport, 5000, 0, l, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "peer_rogue: %s: %s\n", hostport, err);
		return r;
	}
	Ckpt__PeerHello h = CKPT__PEER_HELLO__INIT;
	h.protocol_version = 1;
	h.node = (char *)node;
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	f.body_case = CKPT__PEER_FRAME__BODY_HELLO;
	f.hello = &h;
	return link_send(l, &f);
}

static int put(const char *hp, const char *dir, const char *node, const char *job, uint64_t step, uint32_t rank,
	       uint32_t world, uint64_t n, uint64_t seed, uint64_t claim)
{
	uint8_t *buf = malloc(n ? n : 1);
	uint64_t nchunks = (n + CHUNK - 1) / CHUNK;
	uint32_t *crcs = calloc(nchunks ? nchunks : 1, sizeof(*crcs));
	if (buf == NULL || crcs == NULL)
		return 2;
	fill(buf, n, seed);
	for (uint64_t c = 0; c < nchunks; c++)
		crcs[c] = crc32c_update(0, buf + c * CHUNK, n - c * CHUNK < CHUNK ? n - c * CHUNK : CHUNK);
	uint64_t gshape = n * world, off = n * rank, len = n;
	Ckpt__ManifestTensor t = CKPT__MANIFEST_TENSOR__INIT;
	t.name = (char *)"blob";
	t.dtype = CKPT__DTYPE__U8;
	t.n_global_shape = 1;
	t.global_shape = &gshape;
	t.n_box_offsets = 1;
	t.box_offsets = &off;
	t.n_box_lengths = 1;
	t.box_lengths = &len;
	t.nbytes = n;
	fill(buf, n, claim);
	t.crc32c = crc32c_update(0, buf, n);
	fill(buf, n, seed);
	Ckpt__ManifestTensor *tp = &t;
	char shard[256];
	snprintf(shard, sizeof(shard), "rank-%05u-of-%05u.p.0000000000000000.shard", rank, world);
	Ckpt__Manifest m = CKPT__MANIFEST__INIT;
	m.format_version = 1;
	m.job = (char *)job;
	m.step = step;
	m.rank = rank;
	m.world_size = world;
	m.attempt_id = (char *)"p";
	m.shard_name = shard;
	m.shard_dir = (char *)"";
	m.shard_bytes = n;
	m.chunk_bytes = CHUNK;
	m.n_chunk_crc32c = nchunks;
	m.chunk_crc32c = crcs;
	m.n_tensors = 1;
	m.tensors = &tp;
	const char *ex = getenv("ROGUE_EXTRA");
	size_t exn = ex ? strtoull(ex, NULL, 10) : 0;
	m.extra_state.len = exn;
	m.extra_state.data = calloc(exn ? exn : 1, 1);
	size_t ml = ckpt__manifest__get_packed_size(&m);
	uint8_t *mb = malloc(ml ? ml : 1);
	ckpt__manifest__pack(&m, mb);
	free(m.extra_state.data);
	free(crcs);
	int st = 1;
	struct link l;
	if (open_peer(hp, dir, node, &l) < 0)
		goto out;
	Ckpt__ReplicaPut p = CKPT__REPLICA_PUT__INIT;
	p.manifest.data = mb;
	p.manifest.len = ml;
	p.tier = CKPT__TIER__TIER_REPLICATED;
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	f.body_case = CKPT__PEER_FRAME__BODY_PUT;
	f.put = &p;
	Ckpt__PeerFrame *in = NULL;
	int r = link_send(&l, &f);
	if (r == 0)
		r = link_recv(&l, 1 << 16, &in);
	if (r < 0 || in->body_case != CKPT__PEER_FRAME__BODY_READY) {
		printf("ready: %s\n", r < 0 ? strerror(-r) : "another message");
		goto close;
	}
	printf("ready %d %s\n", in->ready->status, in->ready->message);
	st = in->ready->status;
	ckpt__peer_frame__free_unpacked(in, NULL);
	in = NULL;
	if (st != 0)
		goto close;
	st = 1;
	r = link_write(&l, buf, n);
	if (r == 0)
		r = link_recv(&l, 1 << 16, &in);
	if (r < 0 || in->body_case != CKPT__PEER_FRAME__BODY_ACK) {
		printf("ack: %s\n", r < 0 ? strerror(-r) : "another message");
		goto close;
	}
	printf("ack %d %s\n", in->ack->status, in->ack->message);
	st = in->ack->status;
close:
	if (in)
		ckpt__peer_frame__free_unpacked(in, NULL);
	link_close(&l);
out:
	free(buf);
	free(mb);
	return st == 0 ? 0 : 1;
}

static int get(const char *hp, const char *dir, const char *job, uint64_t step, uint32_t rank, uint32_t world)
{
	struct link l;
	if (open_peer(hp, dir, "127.0.0.1:1", &l) < 0)
		return 1;
	Ckpt__ReplicaGet g = CKPT__REPLICA_GET__INIT;
	g.job = (char *)job;
	g.step = step;
	g.rank = rank;
	g.world_size = world;
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	f.body_case = CKPT__PEER_FRAME__BODY_GET;
	f.get = &g;
	Ckpt__PeerFrame *in = NULL;
	int r = link_send(&l, &f);
	if (r == 0)
		r = link_recv(&l, 256u << 20, &in);
	if (r < 0 || in->body_case != CKPT__PEER_FRAME__BODY_DATA) {
		printf("data: %s\n", r < 0 ? strerror(-r) : "another message");
		return 1;
	}
	int st = in->data->status;
	uint64_t n = 0;
	uint32_t crc = 0;
	if (st == 0) {
		Ckpt__Manifest *m = ckpt__manifest__unpack(NULL, in->data->manifest.len, in->data->manifest.data);
		if (m == NULL)
			return 1;
		n = m->shard_bytes;
		uint8_t *buf = malloc(n ? n : 1);
		if (buf == NULL || link_read(&l, buf, n) < 0)
			return 1;
		crc = crc32c_update(0, buf, n);
		free(buf);
		ckpt__manifest__free_unpacked(m, NULL);
	}
	printf("data %d %llu %08x %s%s\n", st, (unsigned long long)n, crc, in->data->seal_nonce.len ? "sealed " : "",
	       in->data->message);
	ckpt__peer_frame__free_unpacked(in, NULL);
	link_close(&l);
	return st == 0 ? 0 : 1;
}

static int list(const char *hp, const char *dir, const char *job)
{
	struct link l;
	if (open_peer(hp, dir, "127.0.0.1:1", &l) < 0)
		return 1;
	Ckpt__ReplicaList q = CKPT__REPLICA_LIST__INIT;
	q.job = (char *)job;
	q.all_ranks = 1;
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	f.body_case = CKPT__PEER_FRAME__BODY_LIST;
	f.list = &q;
	Ckpt__PeerFrame *in = NULL;
	int r = link_send(&l, &f);
	if (r == 0)
		r = link_recv(&l, 256u << 20, &in);
	if (r < 0 || in->body_case != CKPT__PEER_FRAME__BODY_LIST_REPLY) {
		printf("list: %s\n", r < 0 ? strerror(-r) : "another message");
		return 1;
	}
	for (size_t i = 0; i < in->list_reply->n_held; i++) {
		const Ckpt__HeldCopy *h = in->list_reply->held[i];
		printf("held %llu %u %u %llu\n", (unsigned long long)h->step, h->rank, h->world_size,
		       (unsigned long long)h->bytes);
	}
	printf("listed %zu\n", in->list_reply->n_held);
	ckpt__peer_frame__free_unpacked(in, NULL);
	link_close(&l);
	return 0;
}

static uint64_t ms_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Whether the server closed fd (EOF or an error on a read that does not
 * wait). */
static int closed(int fd)
{
	char b;
	ssize_t r = recv(fd, &b, 1, MSG_DONTWAIT);
	return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

static int drip(const char *hp, int n, int seconds)
{
	const char *colon = strrchr(hp, ':');
	if (colon == NULL)
		return 2;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1)) };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int *fds = calloc((size_t)n, sizeof(int));
	const uint8_t hdr[5] = { 0x16, 0x03, 0x01, 0x02, 0x00 }; /* a handshake record of 512 bytes, to come */
	for (int i = 0; i < n; i++) {
		fds[i] = socket(AF_INET, SOCK_STREAM, 0);
		if (fds[i] < 0 || connect(fds[i], (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
		    send(fds[i], hdr, sizeof(hdr), MSG_NOSIGNAL) != sizeof(hdr)) {
			if (fds[i] >= 0)
				close(fds[i]);
			fds[i] = -1;
		}
	}
	for (int t = 0; t < 2 * seconds; t++) {
		usleep(500 * 1000);
		for (int i = 0; i < n; i++)
			if (fds[i] >= 0 && (closed(fds[i]) || send(fds[i], "x", 1, MSG_NOSIGNAL) != 1)) {
				close(fds[i]);
				fds[i] = -1;
			}
	}
	int open = 0;
	for (int i = 0; i < n; i++)
		open += fds[i] >= 0 && !closed(fds[i]);
	free(fds);
	printf("open %d\n", open);
	return 0;
}

static int frame(const char *hp, const char *dir, uint32_t claim, int interval_ms, int seconds)
{
	struct link l;
	if (open_peer(hp, dir, "127.0.0.1:1", &l) < 0)
		return 1;
	uint8_t hdr[4] = { (uint8_t)(claim >> 24), (uint8_t)(claim >> 16), (uint8_t)(claim >> 8), (uint8_t)claim };
	uint64_t t0 = ms_now();
	if (link_write(&l, hdr, 4) < 0) {
		printf("closed after %llu\n", (unsigned long long)(ms_now() - t0));
		link_close(&l);
		return 0;
	}
	while (ms_now() - t0 < (uint64_t)seconds * 1000) {
		struct pollfd pf = { .fd = l.fd, .events = POLLIN };
		if (poll(&pf, 1, interval_ms) > 0) { /* the server's close_notify, or its end */
			char b;
			int r = SSL_read(l.ssl, &b, 1);
			if (r <= 0 && SSL_get_error(l.ssl, r) != SSL_ERROR_WANT_READ) {
				printf("closed after %llu\n", (unsigned long long)(ms_now() - t0));
				link_close(&l);
				return 0;
			}
		}
		int w = SSL_write(l.ssl, "x", 1);
		if (w <= 0 && SSL_get_error(l.ssl, w) != SSL_ERROR_WANT_WRITE) {
			printf("closed after %llu\n", (unsigned long long)(ms_now() - t0));
			link_close(&l);
			return 0;
		}
	}
	printf("open\n");
	link_close(&l);
	return 0;
}

static int serve(int port, const char *dir, int seconds, uint64_t step, uint32_t world, size_t n)
{
	char cert[512], key[512], ca[512], err[300];
	snprintf(cert, sizeof(cert), "%s/node.crt", dir);
	snprintf(key, sizeof(key), "%s/node.key", dir);
	snprintf(ca, sizeof(ca), "%s/ca.crt", dir);
	struct link_tls tls = { 0 };
	if (link_tls_init(&tls, cert, key, ca, err, sizeof(err)) < 0)
		return 1;
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1;
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 16) < 0)
		return 1;
	Ckpt__HeldCopy *v = calloc(n ? n : 1, sizeof(*v));
	Ckpt__HeldCopy **pv = calloc(n ? n : 1, sizeof(*pv));
	for (size_t i = 0; i < n; i++) {
		ckpt__held_copy__init(&v[i]);
		pv[i] = &v[i];
	}
	unsigned served = 0;
	uint64_t end = ms_now() + (uint64_t)seconds * 1000;
	while (ms_now() < end) {
		struct pollfd pf = { .fd = lfd, .events = POLLIN };
		if (poll(&pf, 1, 100) <= 0)
			continue;
		int fd = accept(lfd, NULL, NULL);
		struct link l;
		if (fd < 0)
			continue;
		if (link_accept(&tls, fd, 3000, 0, &l, err, sizeof(err)) < 0) {
			close(fd);
			continue;
		}
		Ckpt__PeerFrame *in = NULL;
		while (link_recv(&l, 1 << 20, &in) == 0) {
			Ckpt__PeerFrame out = CKPT__PEER_FRAME__INIT;
			Ckpt__ReplicaListReply rep = CKPT__REPLICA_LIST_REPLY__INIT;
			Ckpt__ReplicaData data = CKPT__REPLICA_DATA__INIT;
			Ckpt__ReplicaReady rd = CKPT__REPLICA_READY__INIT;
			bool answer = true;
			if (in->body_case == CKPT__PEER_FRAME__BODY_LIST) {
				if (n > 0) {
					v[0].job = in->list->job;
					v[0].rank = in->list->rank;
					v[0].step = step;
					v[0].world_size = world;
					v[0].attempt_id = (char *)"p";
				}
				rep.n_held = n;
				rep.held = pv;
				out.body_case = CKPT__PEER_FRAME__BODY_LIST_REPLY;
				out.list_reply = &rep;
			} else if (in->body_case == CKPT__PEER_FRAME__BODY_GET) {
				data.status = 2;
				data.message = (char *)"no copy of it is held here";
				out.body_case = CKPT__PEER_FRAME__BODY_DATA;
				out.data = &data;
			} else if (in->body_case == CKPT__PEER_FRAME__BODY_PUT) {
				rd.status = 28;
				rd.message = (char *)"full";
				out.body_case = CKPT__PEER_FRAME__BODY_READY;
				out.ready = &rd;
			} else {
				answer = false; /* the hello */
			}
			if (answer && getenv("ROGUE_DRIP") && out.body_case != CKPT__PEER_FRAME__BODY_LIST_REPLY) {
				const uint8_t hdr[4] = { 0, 0, 0x03, 0xe8 };
				int w = link_write(&l, hdr, 4);
				for (int k = 0; w == 0 && k < 150 && ms_now() < end; k++) {
					usleep(200 * 1000);
					w = link_write(&l, "x", 1);
				}
				served++;
				answer = false;
			}
			if (answer && link_send(&l, &out) == 0)
				served++;
			ckpt__peer_frame__free_unpacked(in, NULL);
			in = NULL;
		}
		link_close(&l);
	}
	close(lfd);
	free(v);
	free(pv);
	link_tls_fini(&tls);
	printf("served %u\n", served);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	if (argc == 5 && strcmp(argv[1], "drip") == 0)
		return drip(argv[2], atoi(argv[3]), atoi(argv[4]));
	if (argc == 8 && strcmp(argv[1], "serve") == 0)
		return serve(atoi(argv[2]), argv[3], atoi(argv[4]), strtoull(argv[5], NULL, 10),
			     (uint32_t)strtoul(argv[6], NULL, 10), strtoull(argv[7], NULL, 10));
	if (argc == 7 && strcmp(argv[1], "frame") == 0)
		return frame(argv[2], argv[3], (uint32_t)strtoul(argv[4], NULL, 10), atoi(argv[5]), atoi(argv[6]));
	if ((argc == 11 || argc == 12) && strcmp(argv[1], "put") == 0)
		return put(argv[2], argv[3], argv[4], argv[5], strtoull(argv[6], NULL, 10),
			   (uint32_t)strtoul(argv[7], NULL, 10), (uint32_t)strtoul(argv[8], NULL, 10),
			   strtoull(argv[9], NULL, 10), strtoull(argv[10], NULL, 10),
			   strtoull(argv[argc == 12 ? 11 : 10], NULL, 10));
	if (argc == 8 && strcmp(argv[1], "get") == 0)
		return get(argv[2], argv[3], argv[4], strtoull(argv[5], NULL, 10), (uint32_t)strtoul(argv[6], NULL, 10),
			   (uint32_t)strtoul(argv[7], NULL, 10));
	if (argc == 5 && strcmp(argv[1], "list") == 0)
		return list(argv[2], argv[3], argv[4]);
	fprintf(stderr, "usage: see the comment at the top of peer_rogue.c\n");
	return 2;
}
