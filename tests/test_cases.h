#ifndef DSV4_TEST_CASES_H
#define DSV4_TEST_CASES_H
#include "test.h"

/* What a test needs besides the build: the runner checks it first (tests/test_needs.c) and
 * reports the test as skipped, with the command that provides it, when it is missing. */
enum test_need {
    TEST_NEEDS_NOTHING = 0,
    TEST_NEEDS_NPM_TOKENIZER, /* tokenizers.js and DeepSeek-V3 tokenizer.json (tests/tokenizer) */
    TEST_NEEDS_NPM_SERVER,    /* the official openai npm client (tests/server) */
    TEST_NEEDS_NPM_DEPLOY,    /* js-yaml and kubernetes-models (tests/deploy) */
    TEST_NEEDS_WEBUI,         /* Debian's chromium and puppeteer-core (tests/webui) */
    TEST_NEEDS_MPI,           /* a build with MPI and Open MPI's mpirun (docs/DISTRIBUTED.md) */
};

/* Tables list a need only where there is one: { "name", fn } leaves it TEST_NEEDS_NOTHING. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

struct test_case {
    const char *name;
    void (*fn)(struct test_ctx *t);
    enum test_need needs;
};

/* NULL when the need is met here; otherwise why not and the command that fixes it. */
const char *test_need_missing(enum test_need need, char *buf, size_t cap);
/* The npm directory an npm need installs into ("tests/tokenizer"), or NULL. */
const char *test_need_npm_dir(enum test_need need);
/* Only the npm part of a need: NULL when its directory is installed as locked (or it has
 * none); what `run_tests --missing` lists for tools/install_deps.sh npm. */
const char *test_need_npm_missing(enum test_need need, char *buf, size_t cap);
#endif
