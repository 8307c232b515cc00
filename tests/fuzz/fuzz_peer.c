/* What a peer sends after its certificate passed (docs/manual.md "Tiers"): a
 * PeerFrame, the manifest a ReplicaPut or ReplicaData carries (decoded and
 * checked as the receiver does), names for the ring, and HOST:PORT. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "link.h"
#include "manifest.h"
#include "ring.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256];
	Ckpt__PeerFrame *f = ckpt__peer_frame__unpack(NULL, size, data);
	if (f) {
		const ProtobufCBinaryData *mb = f->body_case == CKPT__PEER_FRAME__BODY_PUT	 ? &f->put->manifest
						: f->body_case == CKPT__PEER_FRAME__BODY_DATA ? &f->data->manifest
											      : NULL;
		Ckpt__Manifest *m = NULL;
		if (mb && manifest_decode(mb->data, mb->len, &m, err, sizeof(err)) == 0)
			ckpt__manifest__free_unpacked(m, NULL);
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
