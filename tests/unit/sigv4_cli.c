/* Sign requests read one JSON object per line from stdin and print one
 * Authorization value per line: the C side of the differential SigV4 test
 * against botocore (tests/python/test_sigv4_diff.py). */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sigv4.h"

static const char *str(json_object *o, const char *k)
{
	json_object *v;
	return json_object_object_get_ex(o, k, &v) ? json_object_get_string(v) : NULL;
}

int main(void)
{
	static char line[1 << 16];
	while (fgets(line, sizeof(line), stdin)) {
		json_object *o = json_tokener_parse(line), *hs, *qs = NULL;
		if (o == NULL || !json_object_object_get_ex(o, "headers", &hs)) {
			puts("ERROR parse");
			continue;
		}
		size_t n = json_object_array_length(hs);
		struct sigv4_header *h = calloc(n ? n : 1, sizeof(*h));
		for (size_t i = 0; i < n; i++) {
			json_object *p = json_object_array_get_idx(hs, i);
			h[i].name = json_object_get_string(json_object_array_get_idx(p, 0));
			h[i].value = json_object_get_string(json_object_array_get_idx(p, 1));
		}
		size_t nq = json_object_object_get_ex(o, "query", &qs) ? json_object_array_length(qs) : 0;
		struct sigv4_header *q = calloc(nq ? nq : 1, sizeof(*q));
		for (size_t i = 0; i < nq; i++) {
			json_object *p = json_object_array_get_idx(qs, i);
			q[i].name = json_object_get_string(json_object_array_get_idx(p, 0));
			json_object *v = json_object_array_get_idx(p, 1);
			q[i].value = v ? json_object_get_string(v) : NULL;
		}
		struct sigv4_request rq = { .method = str(o, "method"), .path = str(o, "path"), .query = q, .nquery = nq,
					    .headers = h, .nheaders = n, .payload_sha256 = str(o, "payload"),
					    .amz_date = str(o, "date"), .region = str(o, "region"),
					    .service = str(o, "service") };
		if (getenv("SIGV4_CANONICAL")) {
			char *cr = NULL;
			if (sigv4_canonical_request(&rq, &cr) == 0) {
				for (char *c = cr; *c; c++)
					if (*c == '\n')
						*c = '|';
				printf("%s\n", cr);
				free(cr);
			}
			free(h);
			free(q);
			json_object_put(o);
			continue;
		}
		char auth[2048];
		int r = sigv4_authorization(&rq, str(o, "ak"), str(o, "sk"), auth, sizeof(auth));
		if (r < 0)
			printf("ERROR %d\n", r);
		else
			printf("%s\n", auth);
		fflush(stdout);
		free(h);
		free(q);
		json_object_put(o);
	}
	return 0;
}
