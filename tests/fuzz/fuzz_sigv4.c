/* SigV4 canonicalisation (store/sigv4.c) of requests whose every part comes
 * from the input: NUL-separated method, path, then name/value pairs,
 * alternately query and header, as keys and listings from storage reach it.
 * Also checks what URI encoding promises: only unreserved characters and
 * %XX come out, and decoding gives back the input. */
#include <ctype.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sigv4.h"

#define MAXF 24

static int unhex(int c)
{
	return isdigit(c) ? c - '0' : c - 'A' + 10;
}

static void check_encode(const char *in, int keep_slash)
{
	char out[1024];
	int n = sigv4_uri_encode(in, keep_slash, out, sizeof(out));
	if (n < 0)
		return;
	if ((size_t)n != strlen(out))
		abort();
	char back[1024];
	size_t k = 0;
	for (int i = 0; i < n; i++) {
		unsigned char c = (unsigned char)out[i];
		if (c == '%') {
			if (i + 2 >= n)
				abort(); /* a cut %XX */
			if (!isxdigit((unsigned char)out[i + 1]) || !isxdigit((unsigned char)out[i + 2]) ||
			    islower((unsigned char)out[i + 1]) || islower((unsigned char)out[i + 2]))
				abort(); /* SigV4 wants upper-case hex */
			back[k++] = (char)(unhex(out[i + 1]) * 16 + unhex(out[i + 2]));
			i += 2;
		} else if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
			back[k++] = (char)c;
		} else {
			abort();
		}
	}
	back[k] = 0;
	if (strcmp(back, in) != 0)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1);
	if (s == NULL)
		return 0;
	memcpy(s, data, size);
	s[size] = 0;
	const char *f[2 + 4 * MAXF];
	size_t nf = 0;
	for (size_t off = 0; off <= size && nf < sizeof(f) / sizeof(f[0]); off += strlen(s + off) + 1)
		f[nf++] = s + off;
	if (nf >= 2) {
		struct sigv4_header q[MAXF], h[MAXF + 2];
		size_t nq = 0, nh = 0;
		h[nh++] = (struct sigv4_header){ "host", "bucket.s3.amazonaws.com" };
		h[nh++] = (struct sigv4_header){ "x-amz-date", "20130524T000000Z" };
		for (size_t i = 2; i + 1 < nf; i += 2) {
			if (((i / 2) & 1) && nq < MAXF)
				q[nq++] = (struct sigv4_header){ f[i], f[i + 1][0] ? f[i + 1] : NULL };
			else if (nh < MAXF + 2)
				h[nh++] = (struct sigv4_header){ f[i], f[i + 1] };
		}
		struct sigv4_request r = {
			.method = f[0],
			.path = f[1],
			.query = q,
			.nquery = nq,
			.headers = h,
			.nheaders = nh,
			.payload_sha256 = "UNSIGNED-PAYLOAD",
			.amz_date = "20130524T000000Z",
			.region = "us-east-1",
			.service = "s3",
		};
		char *canon = NULL;
		if (sigv4_canonical_request(&r, &canon) == 0)
			free(canon);
		char auth[1024];
		(void)sigv4_authorization(&r, "AKIDEXAMPLE", "secret", auth, sizeof(auth));
		r.double_encode_path = 1;
		(void)sigv4_authorization(&r, "AKIDEXAMPLE", "secret", auth, 16); /* too small */
		check_encode(f[1], 1);
		check_encode(f[0], 0);
	}
	free(s);
	return 0;
}
