/*
 * test_server_responses.h - the OpenAI Responses API tests (test_server_responses.c), run
 * in the server group by test_server.c.
 */
#ifndef DSV4_TEST_SERVER_RESPONSES_H
#define DSV4_TEST_SERVER_RESPONSES_H

#include "test.h"
#include "test_server_util.h"

/* The canned turn through srv_out: whole and replayed streams. */
void tresp_test_out_responses(struct test_ctx *t);
/* Against a live server of the srv-tiny model. */
void tresp_test_responses_api(struct test_ctx *t, struct tsrv *s);

/* Ten turns through each chat API: the prefix cache covers all but a page of the turn before. */
void tresp_test_turn_cache(struct test_ctx *t, struct tsrv *s);
/* A server with --responses-store 2 evicts the oldest. */
void tresp_test_store_bound(struct test_ctx *t, const char *model_dir);

#endif
