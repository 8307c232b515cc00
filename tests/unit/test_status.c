/* The status snapshot's columns (daemon/ops/status.c) in each of their views:
 * the StatusReply of ckptctl status, the Prometheus text and the sd_notify
 * STATUS= line. Every column gets a distinct value; each view must show it
 * where the column says it appears, and nowhere is a view left without its
 * column. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <inttypes.h>
#include <math.h>

#include "metrics.h"
#include "msgtab.h"
#include "status.h"

static void fake_snapshot(struct status *st)
{
	memset(st, 0, sizeof(*st));
	for (size_t i = 0; i < ST_NCOLS; i++)
		st->v[i] = 1000003ull * (i + 1) + (i % 3 ? (uint64_t)i << 32 : 0);
	/* The sums are what their families add up to. */
	st->v[ST_BYTES_RESTORED] = st->v[ST_BYTES_RESTORED_MEMORY] + st->v[ST_BYTES_RESTORED_STORAGE];
	st->v[ST_SAVES_FAILED] = st->v[ST_SAVES_SUPERSEDED] + st->v[ST_SAVES_SKIPPED] + st->v[ST_SAVES_FAILED_OTHER];
	/* The reply's uint32 fields. */
	st->v[ST_SESSIONS] = 7;
	st->v[ST_INFLIGHT_SAVES] = 5;
	st->v[ST_WAITING_SAVES] = 3;
	st->v[ST_RECOVERED_FILES] = 2;
	st->v[ST_HELD_COPIES] = 4;
	for (int m = 0; m < STATS_MSG_SLOTS; m++) {
		st->requests[m] = 100 + (uint64_t)m;
		const struct msg_row *row = msg_row(m); /* as msgtab_init names them */
		st->request_name[m] = row && !(row->flags & MSG_NOT_REQUEST) ? row->name : NULL;
	}
	hist_observe(&st->save_stall, 0.003);
	hist_observe(&st->save_durable, 2.0);
	hist_observe(&st->save_durable, 20.0);
	st->nfailures = 2;
	st->failures[0] = (struct status_failure){
		.job = "j", .msg = "newest", .step = 9, .rank = 1, .status = -ENOSPC, .unix_ns = 2000000000
	};
	st->failures[1] = (struct status_failure){
		.job = "t/k", .msg = "older", .step = 8, .rank = 0, .status = -E2BIG, .unix_ns = 1000000000
	};
	st->backend = "file";
	snprintf(st->storage, sizeof(st->storage), "file:///x");
	snprintf(st->cuda, sizeof(st->cuda), "off: test");
}

static bool numeric(const ProtobufCFieldDescriptor *f)
{
	return f->label != PROTOBUF_C_LABEL_REPEATED &&
	       (f->type == PROTOBUF_C_TYPE_UINT32 || f->type == PROTOBUF_C_TYPE_UINT64);
}

static const struct status_col *col_named(const char *name, size_t *idx)
{
	for (size_t i = 0; i < ST_NCOLS; i++)
		if (status_cols[i].name && strcmp(status_cols[i].name, name) == 0) {
			*idx = i;
			return &status_cols[i];
		}
	return NULL;
}

static void test_table_is_complete(void **state)
{
	(void)state;
	for (size_t i = 0; i < ST_NCOLS; i++) {
		const struct status_col *c = &status_cols[i];
		if (c->name == NULL || c->help == NULL || c->views == 0)
			fail_msg("status column %zu has no name, help or view", i);
		if ((c->views & SV_METRIC) && c->metric == NULL)
			fail_msg("column %s: SV_METRIC needs a family", c->name);
		if (c->metric && strncmp(c->metric, "ckptd_", 6) != 0)
			fail_msg("column %s: metric %s", c->name, c->metric);
		bool total = strlen(c->metric ? c->metric : "") > 6 &&
			     strcmp(c->metric + strlen(c->metric) - 6, "_total") == 0;
		if (c->metric && c->kind != ST_HISTOGRAM && total != (c->kind == ST_COUNTER))
			fail_msg("column %s: counters and only counters end in _total", c->name);
	}
}

/* Every numeric StatusReply field is a column, shown by the reply and as a
 * metric; every SV_REPLY column is a field of that name. */
static void test_reply_view(void **state)
{
	(void)state;
	const ProtobufCMessageDescriptor *d = &ckpt__status_reply__descriptor;
	struct status st;
	fake_snapshot(&st);
	Ckpt__StatusReply rep = CKPT__STATUS_REPLY__INIT;
	assert_int_equal(status_reply_fill(&st, &rep), 0);
	for (unsigned k = 0; k < d->n_fields; k++) {
		const ProtobufCFieldDescriptor *f = &d->fields[k];
		if (!numeric(f))
			continue;
		size_t i = 0;
		const struct status_col *c = col_named(f->name, &i);
		if (c == NULL || !(c->views & SV_REPLY))
			fail_msg("StatusReply.%s has no SV_REPLY status column", f->name);
		if (!(c->views & SV_METRIC))
			fail_msg("StatusReply.%s has no metric", f->name);
		const void *p = (const char *)&rep + f->offset;
		uint64_t got = f->type == PROTOBUF_C_TYPE_UINT32 ? *(const uint32_t *)p : *(const uint64_t *)p;
		if (got != st.v[i])
			fail_msg("StatusReply.%s = %" PRIu64 ", the snapshot has %" PRIu64, f->name, got, st.v[i]);
	}
	for (size_t i = 0; i < ST_NCOLS; i++) {
		const struct status_col *c = &status_cols[i];
		if (!(c->views & SV_REPLY))
			continue;
		const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, c->name);
		if (f == NULL || !numeric(f))
			fail_msg("column %s says SV_REPLY; StatusReply has no such number", c->name);
	}
	assert_string_equal(rep.storage, "file:///x");
	assert_string_equal(rep.cuda, "off: test");
	/* The failed saves, in order, the errno positive as on the wire. */
	assert_int_equal(rep.n_failures, 2);
	assert_string_equal(rep.failures[0]->job, "j");
	assert_string_equal(rep.failures[0]->message, "newest");
	assert_int_equal(rep.failures[0]->step, 9);
	assert_int_equal(rep.failures[0]->rank, 1);
	assert_int_equal(rep.failures[0]->status, ENOSPC);
	assert_int_equal(rep.failures[0]->unix_ns, 2000000000);
	assert_string_equal(rep.failures[1]->job, "t/k");
	assert_int_equal(rep.failures[1]->status, E2BIG);
	status_reply_free(&rep);
	assert_int_equal(rep.n_failures, 0);
}

/* The value of one series line "name{labels} value", or NAN. */
static double series(const char *text, const char *name)
{
	for (const char *p = text; (p = strstr(p, name)) != NULL; p++) {
		if (p != text && p[-1] != '\n')
			continue;
		if (p[strlen(name)] == ' ')
			return strtod(p + strlen(name) + 1, NULL);
	}
	return NAN;
}

/* The sum of every series of a family (labels of any kind). */
static double family_sum(const char *text, const char *family)
{
	double sum = 0;
	size_t n = strlen(family);
	for (const char *p = text; (p = strstr(p, family)) != NULL; p++) {
		if ((p != text && p[-1] != '\n') || (p[n] != ' ' && p[n] != '{'))
			continue;
		sum += strtod(strchr(p, ' ') + 1, NULL);
	}
	return sum;
}

static void test_metric_view(void **state)
{
	(void)state;
	struct status st;
	fake_snapshot(&st);
	char *text = NULL;
	size_t len = 0;
	assert_int_equal(metrics_format(&st, &text, &len), 0);
	assert_int_equal(strlen(text), len);
	for (size_t i = 0; i < ST_NCOLS; i++) {
		const struct status_col *c = &status_cols[i];
		if (!(c->views & SV_METRIC))
			continue;
		char want[256];
		snprintf(want, sizeof(want), "# TYPE %s %s\n", c->metric,
			 c->kind == ST_COUNTER ? "counter"
			 : c->kind == ST_GAUGE ? "gauge"
					       : "histogram");
		if (strstr(text, want) == NULL)
			fail_msg("column %s: no '%s' in the metrics", c->name, want);
		double v = (double)st.v[i];
		if (c->unit == ST_UNIT_NS)
			v /= 1e9;
		if (c->kind == ST_HISTOGRAM) {
			const struct histogram *h = (const struct histogram *)((const char *)&st + c->hist);
			snprintf(want, sizeof(want), "%s_count", c->metric);
			assert_true(series(text, want) == (double)h->count);
		} else if (c->per_message) {
			for (int m = 0; m < STATS_MSG_SLOTS; m++) {
				const struct msg_row *row = msg_row(m);
				if (row == NULL || (row->flags & MSG_NOT_REQUEST))
					continue;
				snprintf(want, sizeof(want), "%s{msg=\"%s\"}", c->metric, row->name);
				if (series(text, want) != (double)st.requests[m])
					fail_msg("no %s %" PRIu64 " in the metrics", want, st.requests[m]);
			}
		} else if (c->sum) {
			if (family_sum(text, c->metric) != v)
				fail_msg("column %s: the series of %s do not add up to it", c->name, c->metric);
		} else {
			char labels[160] = "";
			if (c->backend || c->label)
				snprintf(labels, sizeof(labels), "{%s%s%s}", c->backend ? "backend=\"file\"" : "",
					 c->backend && c->label ? "," : "", c->label ? c->label : "");
			snprintf(want, sizeof(want), "%s%s", c->metric, labels);
			double got = series(text, want);
			if (!(fabs(got - v) <= (c->unit == ST_UNIT_NS ? 0.001 : 0)))
				fail_msg("column %s: %s is %g, want %g", c->name, want, got, v);
		}
	}
	free(text);
}

static void test_line_view(void **state)
{
	(void)state;
	struct status st;
	fake_snapshot(&st);
	st.v[ST_POOL_BYTES] = 512ull << 20;
	st.v[ST_POOL_USED_BYTES] = (100ull << 20) + 5;
	char line[256];
	status_line_render(&st, line, sizeof(line));
	/* The words systemctl status shows; each SV_LINE column once. */
	assert_string_equal(line, "STATUS=7 sessions, pool 100/512 MiB used (4 held), 5 saves in flight, 3 waiting");
	for (size_t i = 0; i < ST_NCOLS; i++) {
		const struct status_col *c = &status_cols[i];
		char want[64];
		uint64_t v = c->unit == ST_UNIT_BYTES ? st.v[i] >> 20 : st.v[i];
		snprintf(want, sizeof(want), "%" PRIu64, v);
		if ((c->views & SV_LINE) && strstr(line, want) == NULL)
			fail_msg("column %s (%s) is not in the STATUS line", c->name, want);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table_is_complete),
		cmocka_unit_test(test_reply_view),
		cmocka_unit_test(test_metric_view),
		cmocka_unit_test(test_line_view),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
