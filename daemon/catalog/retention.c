#include "retention.h"

size_t retention_plan(const struct retention *r, struct step_view *v, size_t n, uint64_t now_ns)
{
	size_t marked = 0;
	for (size_t i = 0; i < n; i++) {
		v[i].remove = false;
		v[i].reason = NULL;
	}
	if (!retention_active(r))
		return 0;
	/* Incomplete steps newer than the newest complete one may still be
	 * in progress on other nodes: never removed. */
	uint64_t newest_complete = 0;
	bool any_complete = false;
	for (size_t k = 0; k < n; k++)
		if (v[k].complete && (!any_complete || v[k].step > newest_complete)) {
			newest_complete = v[k].step;
			any_complete = true;
		}
	/* Newest first: index among complete steps decides keep_last. */
	bool seen_newest = false;
	uint32_t idx = 0;
	for (size_t k = n; k-- > 0;) {
		struct step_view *s = &v[k];
		uint64_t age_s = now_ns > s->newest_ns ? (now_ns - s->newest_ns) / 1000000000ull : 0;
		if (!s->complete) {
			/* An incomplete step may still be written by other
			 * nodes: only the grace period ends it. */
			if (r->incomplete_grace_s && age_s > r->incomplete_grace_s && !s->busy && any_complete &&
			    s->step < newest_complete) {
				s->remove = true;
				s->reason = "incomplete past its grace period";
				marked++;
			}
			continue;
		}
		if (!seen_newest) {
			seen_newest = true;
			idx++;
			continue; /* the newest complete step always stays */
		}
		uint32_t my = idx++;
		if (s->busy)
			continue;
		bool count_rules = r->keep_last || r->keep_every;
		bool in_last = r->keep_last && my < r->keep_last;
		bool every = r->keep_every && s->step % r->keep_every == 0;
		if (r->max_age_s && age_s > r->max_age_s) {
			s->remove = true;
			s->reason = "older than max_age";
		} else if (count_rules && !in_last && !every) {
			s->remove = true;
			s->reason = r->keep_every ? "not among keep_last and not a keep_every step"
						  : "not among keep_last";
		}
		if (s->remove)
			marked++;
	}
	return marked;
}
