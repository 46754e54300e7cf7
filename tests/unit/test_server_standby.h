/*
 * test_server_standby.h - `dsv4 serve --standby` (test_server_standby.c), run in the
 * server group by test_server.c.
 */
#ifndef DSV4_TEST_SERVER_STANDBY_H
#define DSV4_TEST_SERVER_STANDBY_H

#include "test.h"
#include "test_server_util.h"

/* A standby answers /health 503 "standby" and the API 503 until SIGUSR1 promotes it. */
void tsby_test_signal(struct test_ctx *t, const char *model_dir);
/* POST /admin/promote: refused without the key, and on a server without --api-key. */
void tsby_test_endpoint(struct test_ctx *t, const char *model_dir);
/* Every server maps its weights before it answers: the checkpoint's pages are in its page
 * tables when /health is ok; --lazy-weights leaves them to fault in on use. */
void tsby_test_weights_mapped(struct test_ctx *t, const char *model_dir);

#endif
