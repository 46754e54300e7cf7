/*
 * test_server_limits.h - the max_tokens rule sent through the three dialects
 * (test_server_limits.c), run in the server group by test_server.c.
 */
#ifndef DSV4_TEST_SERVER_LIMITS_H
#define DSV4_TEST_SERVER_LIMITS_H

#include "test.h"
#include "test_server_util.h"

/* The same over-large and in-range limits on /v1/chat/completions, /v1/completions,
 * /v1/messages and /v1/responses of a server with a short context. */
void tlim_test_max_tokens(struct test_ctx *t, const char *model_dir);

#endif
