/*
 * test_house.c - the house rules that a tool can check: no function in src/ or tools/ over
 * 120 lines (tools/func_lengths.sh, with Universal Ctags). Tests are exempt: a test reads
 * best as one list of checks.
 */
#include <stdlib.h>
#include <string.h>

#include "test_cases.h"

static void test_function_lengths(struct test_ctx *t)
{
    char *out = NULL;
    int   st  = test_run("tools/func_lengths.sh 120 src tools 2>&1", &out);
    if (st == 2) {
        test_skip(t, TEST_SKIP_MISSING, "no ctags: apt-get install universal-ctags (tools/install_deps.sh test)");
        free(out);
        return;
    }
    CHECKF(st == 0, "functions over 120 lines (split them):\n%s", out ? out : "");
    free(out);
}

const struct test_case test_group_house[] = {
    { "function_lengths", test_function_lengths },
    { NULL, NULL },
};
