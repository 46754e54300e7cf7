/* test_v41.h - the cases of group v41 defined in test_v41_ckpt.c (the tiny-v41 checkpoint). */
#ifndef DSV4_TEST_V41_H
#define DSV4_TEST_V41_H

#include "test.h"

void test_v41_gen_binds(struct test_ctx *t);
void test_v41_gen_sizes(struct test_ctx *t);
void test_v41_inspect(struct test_ctx *t);
void test_v41_corrupted(struct test_ctx *t);
void test_v41_vision(struct test_ctx *t);
void test_v41_cli_dspark(struct test_ctx *t);

struct dsv4_engine;
/* A DeepSeek-V4.1 engine on a backend whose memory the host cannot reach (cpu-strict in the
 * strict pass of `make test`): checks that a session refuses it with the reason and returns
 * true, the caller's V4.1 cases then not applying; false for any other engine. */
bool test_v41_refused_here(struct test_ctx *t, struct dsv4_engine *e);

#endif
