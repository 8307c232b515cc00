/* The message table (daemon/wire/msgtab.c) against the wire contract: every
 * message of the Frame oneof has a row, named like its field, and is either
 * a request with a handler or marked as one only ckptd sends. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "ckpt.pb-c.h"
#include "msgtab.h"

static void test_every_body_has_a_row(void **state)
{
	(void)state;
	const ProtobufCMessageDescriptor *fd = &ckpt__frame__descriptor;
	size_t nbody = 0, nreq = 0;
	for (unsigned i = 0; i < fd->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &fd->fields[i];
		if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
			continue;
		nbody++;
		const struct msg_row *m = msg_row((int)f->id);
		if (m == NULL)
			fail_msg("Frame.%s (body case %u) has no row in daemon/wire/msgtab.c", f->name, f->id);
		/* The row's name is the field's (delete_ in C, delete on the wire). */
		assert_string_equal(m->name, f->name);
		bool request = m->handler != NULL;
		if (request == ((m->flags & MSG_NOT_REQUEST) != 0))
			fail_msg("row %s: a request has a handler, a reply or event is MSG_NOT_REQUEST", m->name);
		if (!request) {
			assert_int_equal(m->flags, MSG_NOT_REQUEST);
			continue;
		}
		nreq++;
		/* Only Hello opens a session. */
		if ((f->id == CKPT__FRAME__BODY_HELLO) == ((m->flags & MSG_NEEDS_HELLO) != 0))
			fail_msg("row %s: every request but hello needs Hello first", m->name);
		/* Background requests hold the session: bounded and refused
		 * while draining, and only they. */
		bool bg = (m->flags & MSG_BACKGROUND) != 0;
		assert_int_equal(bg, (m->flags & MSG_CAPPED) != 0);
		assert_int_equal(bg, (m->flags & MSG_REFUSE_DRAINING) != 0);
		if (m->refuse_as != 0)
			assert_int_equal(m->refuse_as, CKPT__FRAME__BODY_LOAD_FAILED);
	}
	/* The walk saw the oneof (today 27 bodies, 13 of them requests). */
	assert_true(nbody >= 27);
	assert_true(nreq >= 13);
}

static void test_no_row_outside_the_oneof(void **state)
{
	(void)state;
	for (int c = -1; c < 256; c++) {
		const struct msg_row *m = msg_row(c);
		if (m == NULL)
			continue;
		const ProtobufCFieldDescriptor *f =
			protobuf_c_message_descriptor_get_field(&ckpt__frame__descriptor, (unsigned)c);
		if (f == NULL || !(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
			fail_msg("row %s (body case %d) is not a Frame body", m->name, c);
	}
	assert_null(msg_row(CKPT__FRAME__BODY__NOT_SET));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_body_has_a_row),
		cmocka_unit_test(test_no_row_outside_the_oneof),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
