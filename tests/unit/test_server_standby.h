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

#endif
