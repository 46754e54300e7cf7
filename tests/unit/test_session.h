/*
 * test_session.h - helpers of the session tests (test_session_file.c), shared with the prompt
 * cache's (test_session_cache.c).
 */
#ifndef DSV4_TEST_SESSION_H
#define DSV4_TEST_SESSION_H

#include <stdint.h>

#include "dsv4.h"
#include "test.h"

/* Generates the tiny checkpoint preset (seed 31) under the test's tmpdir and opens it; NULL
 * after a failed check. */
dsv4_engine *test_session_model(struct test_ctx *t, const char *preset);
/* n random token ids of e's vocabulary from seed (malloc'd). */
int32_t     *test_session_tokens(dsv4_engine *e, unsigned long long seed, int n);
/* `printf LINES | dsv4 chat -m models/kjv-v4-tiny -n 12 --temp 0 OPTS 2>&1`: its output
 * (malloc'd), after a check that it exited 0. */
char        *test_session_chat(struct test_ctx *t, const char *lines, const char *opts);
/* The last line of out (the reply to the last turn), cut in place. */
const char  *test_session_last_line(char *out);

#endif
