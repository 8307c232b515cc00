/* What a peer sends after its certificate passed (docs/tiers.md "Peers"): a
 * PeerFrame; a ReplicaPut as a holder checks it (peer_msg_put), and a
 * ReplicaData as a restoring rank takes it (peer_msg_data), with a job key
 * (a sealed copy opened: seal.h) and without; a ReplicaListReply as an
 * asking node takes it (peer_msg_list); names for the ring, and HOST:PORT. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "link.h"
#include "manifest.h"
#include "peer_msg.h"
#include "ring.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256];
	Ckpt__PeerFrame *f = ckpt__peer_frame__unpack(NULL, size, data);
	if (f) {
		Ckpt__Manifest *m = NULL;
		if (f->body_case == CKPT__PEER_FRAME__BODY_PUT) {
			struct put_limits lim = { 65536, 1u << 20, 1ull << 30 };
			bool sealed;
			if (peer_msg_put(f->put, &lim, &m, &sealed, err, sizeof(err)) == 0)
				ckpt__manifest__free_unpacked(m, NULL);
		}
		if (f->body_case == CKPT__PEER_FRAME__BODY_DATA) {
			/* Asked for what its public manifest says, so that the
			 * checks past the match run too. */
			Ckpt__ReplicaGet g = CKPT__REPLICA_GET__INIT;
			Ckpt__Manifest *pub = ckpt__manifest__unpack(NULL, f->data->manifest.len, f->data->manifest.data);
			if (pub) {
				g.job = pub->job;
				g.step = pub->step;
				g.rank = pub->rank;
				g.world_size = pub->world_size;
			} else {
				g.job = (char *)"j";
			}
			static const uint8_t key[32] = { 1, 2, 3 };
			for (int k = 0; k < 2; k++) {
				struct sealing z = { 0 };
				if (peer_msg_data(f->data, &g, k ? key : NULL, &z, &m, err, sizeof(err)) == 0)
					ckpt__manifest__free_unpacked(m, NULL);
			}
			if (pub)
				ckpt__manifest__free_unpacked(pub, NULL);
		}
		if (f->body_case == CKPT__PEER_FRAME__BODY_LIST_REPLY) {
			/* Asked for its first copy's job and rank, so that the
			 * checks past the first run too. */
			Ckpt__ReplicaList q = CKPT__REPLICA_LIST__INIT;
			q.job = f->list_reply->n_held ? f->list_reply->held[0]->job : (char *)"j";
			q.rank = f->list_reply->n_held ? f->list_reply->held[0]->rank : 0;
			for (int all = 0; all < 2; all++) {
				q.all_ranks = all;
				(void)peer_msg_list(f->list_reply, &q, 768, err, sizeof(err));
			}
		}
		if (f->body_case == CKPT__PEER_FRAME__BODY_HELLO) {
			struct ring r;
			if (ring_build(&r, f->hello->node, f->hello->node, NULL, 0) == 0) {
				const char *out[4];
				(void)ring_successors(&r, f->hello->node, 3, out, 4);
				ring_free(&r);
			}
		}
		ckpt__peer_frame__free_unpacked(f, NULL);
	}
	char text[512], host[256], port[16];
	size_t n = size < sizeof(text) - 1 ? size : sizeof(text) - 1;
	memcpy(text, data, n);
	text[n] = '\0';
	(void)link_split(text, host, sizeof(host), port, sizeof(port));
	struct ring r;
	if (ring_build(&r, "self:1", text, NULL, 0) == 0) {
		const char *out[8];
		(void)ring_successors(&r, "self:1", 8, out, 8);
		ring_free(&r);
	}
	return 0;
}
