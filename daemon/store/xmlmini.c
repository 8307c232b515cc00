#include "xmlmini.h"
#include "grow.h"

#include <errno.h>
#include <expat.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define XML_MAX_BYTES (64u << 20)
#define XML_MAX_ITEMS 1000000u
#define XML_MAX_TEXT (64u << 10)
#define XML_MAX_DEPTH 16

struct pstate {
	XML_Parser p;
	struct xml_doc *d;
	size_t cap;
	char path[1024];
	size_t plen[XML_MAX_DEPTH + 1];
	int depth;
	char *text;
	size_t tlen, tcap;
	size_t total; /* bytes of every item so far */
	int err;
};

static void stop(struct pstate *s, int err)
{
	if (s->err == 0)
		s->err = err;
	XML_StopParser(s->p, XML_FALSE);
}

static void on_start(void *ud, const XML_Char *name, const XML_Char **attrs)
{
	(void)attrs;
	struct pstate *s = ud;
	size_t cur = strlen(s->path), n = strlen(name);
	if (s->depth >= XML_MAX_DEPTH || cur + n + 2 > sizeof(s->path)) {
		stop(s, -E2BIG);
		return;
	}
	s->plen[s->depth++] = cur;
	if (cur)
		s->path[cur++] = '/';
	memcpy(s->path + cur, name, n + 1);
	s->tlen = 0;
}

static void on_end(void *ud, const XML_Char *name)
{
	(void)name;
	struct pstate *s = ud;
	if (s->d->n >= XML_MAX_ITEMS) {
		stop(s, -E2BIG);
		return;
	}
	if (GROW(s->d->items, s->cap, s->d->n + 1, 64) < 0) {
		stop(s, -ENOMEM);
		return;
	}
	/* Paths repeat: cap what they add up to, not just the input size. */
	s->total += strlen(s->path) + s->tlen + 2 + sizeof(struct xml_item);
	if (s->total > 4 * (size_t)XML_MAX_BYTES) {
		stop(s, -E2BIG);
		return;
	}
	struct xml_item *it = &s->d->items[s->d->n];
	it->path = strdup(s->path);
	it->text = strndup(s->text ? s->text : "", s->tlen);
	if (it->path == NULL || it->text == NULL) {
		free(it->path);
		free(it->text);
		stop(s, -ENOMEM);
		return;
	}
	s->d->n++;
	s->tlen = 0;
	if (s->depth > 0)
		s->path[s->plen[--s->depth]] = 0;
}

static void on_text(void *ud, const XML_Char *t, int len)
{
	struct pstate *s = ud;
	if (s->tlen + (size_t)len > XML_MAX_TEXT) {
		stop(s, -E2BIG);
		return;
	}
	if (GROW(s->text, s->tcap, s->tlen + (size_t)len + 1, 256) < 0) {
		stop(s, -ENOMEM);
		return;
	}
	memcpy(s->text + s->tlen, t, (size_t)len);
	s->tlen += (size_t)len;
}

static void on_doctype(void *ud, const XML_Char *name, const XML_Char *sysid, const XML_Char *pubid, int has_internal)
{
	(void)name;
	(void)sysid;
	(void)pubid;
	(void)has_internal;
	stop(ud, -EINVAL);
}

int xml_parse(const char *buf, size_t len, struct xml_doc *out)
{
	memset(out, 0, sizeof(*out));
	if (len > XML_MAX_BYTES)
		return -E2BIG;
	struct pstate s = { .d = out };
	s.p = XML_ParserCreate("UTF-8");
	if (s.p == NULL)
		return -ENOMEM;
	XML_SetUserData(s.p, &s);
	XML_SetElementHandler(s.p, on_start, on_end);
	XML_SetCharacterDataHandler(s.p, on_text);
	XML_SetStartDoctypeDeclHandler(s.p, on_doctype);
	enum XML_Status st = XML_Parse(s.p, buf, (int)len, XML_TRUE);
	XML_ParserFree(s.p);
	free(s.text);
	if (s.err == 0 && st != XML_STATUS_OK)
		s.err = -EINVAL;
	if (s.err) {
		xml_free(out);
		return s.err;
	}
	return 0;
}

void xml_free(struct xml_doc *d)
{
	for (size_t i = 0; i < d->n; i++) {
		free(d->items[i].path);
		free(d->items[i].text);
	}
	free(d->items);
	memset(d, 0, sizeof(*d));
}

const char *xml_first(const struct xml_doc *d, const char *suffix)
{
	size_t sl = strlen(suffix);
	for (size_t i = 0; i < d->n; i++) {
		size_t pl = strlen(d->items[i].path);
		if (pl >= sl && strcmp(d->items[i].path + pl - sl, suffix) == 0)
			return d->items[i].text;
	}
	return NULL;
}
