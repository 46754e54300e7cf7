/*
 * test_server_anthropic.h - the Anthropic Messages API tests (test_server_anthropic.c),
 * run in the server group by test_server.c.
 */
#ifndef DSV4_TEST_SERVER_ANTHROPIC_H
#define DSV4_TEST_SERVER_ANTHROPIC_H

#include <jansson.h>

#include "test.h"
#include "test_server_util.h"

/* Stream events (parsed data objects, in order) -> the message they describe, or NULL with
 * why when they break the API's event grammar. */
json_t *tanth_replay(json_t *events, char *why, size_t cap);
/* Canned turns through srv_out: the whole message and the replayed streams. */
void tanth_test_out_messages(struct test_ctx *t);
/* A forced tool choice through srv_out (both APIs, whole and streamed). */
void tanth_test_out_forced(struct test_ctx *t);
/* Against a live server of the srv-tiny model. */
void tanth_test_messages_api(struct test_ctx *t, struct tsrv *s);
/* Against a server started with --api-key key. */
void tanth_test_api_key(struct test_ctx *t, struct tsrv *s, const char *key);

#endif
