#ifndef DSV4_TEST_CASES_H
#define DSV4_TEST_CASES_H
#include "test.h"
struct test_case {
    const char *name;
    void (*fn)(struct test_ctx *t);
};
#endif
