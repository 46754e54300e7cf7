/*
 * run_tests.c - the test runner behind `make test`.
 *
 *   run_tests              run every group
 *   run_tests GROUP...     run only these groups
 *   run_tests --list       list groups and tests
 *
 * Prints one line per failed check, a line per test, and finally "N passed, N failed"
 * (counting tests); exits 1 if any test failed. Tests share a fresh temporary directory,
 * removed at the end unless DSV4_KEEP_TMP is set.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test.h"
#include "test_cases.h"

#define X(name) extern const struct test_case test_group_##name[];
#include "groups.h"
#undef X

struct group {
    const char             *name;
    const struct test_case *cases;
};

static const struct group groups[] = {
#define X(name) { #name, test_group_##name },
#include "groups.h"
#undef X
};

void test_fail(struct test_ctx *t, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    t->failures++;
    if (t->failures > 20) {
        if (t->failures == 21) fprintf(stderr, "    (further failures of %s not shown)\n", t->name);
        return;
    }
    fprintf(stderr, "    FAIL %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static bool selected(const char *g, int argc, char **argv)
{
    if (argc <= 1) return true;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], g) == 0) return true;
    return false;
}

int main(int argc, char **argv)
{
    size_t ng = sizeof(groups) / sizeof(groups[0]);
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (size_t g = 0; g < ng; g++)
            for (const struct test_case *c = groups[g].cases; c->name; c++)
                printf("%s %s\n", groups[g].name, c->name);
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        bool known = false;
        for (size_t g = 0; g < ng; g++) known |= strcmp(argv[i], groups[g].name) == 0;
        if (!known) {
            fprintf(stderr, "run_tests: unknown group '%s' (see --list)\n", argv[i]);
            return 2;
        }
    }
    char tmpl[] = "/tmp/dsv4-test-XXXXXX";
    const char *tmpdir = mkdtemp(tmpl);
    if (!tmpdir) {
        perror("mkdtemp");
        return 2;
    }
    int passed = 0, failed = 0;
    for (size_t g = 0; g < ng; g++) {
        if (!selected(groups[g].name, argc, argv)) continue;
        for (const struct test_case *c = groups[g].cases; c->name; c++) {
            struct test_ctx t = { c->name, 0, 0, tmpdir };
            struct timespec a, b;
            clock_gettime(CLOCK_MONOTONIC, &a);
            c->fn(&t);
            clock_gettime(CLOCK_MONOTONIC, &b);
            double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
            if (t.failures) failed++;
            else passed++;
            printf("%s %-10s %-40s %5d checks %8.1f ms\n", t.failures ? "FAIL" : "ok  ",
                   groups[g].name, c->name, t.checks, ms);
            fflush(stdout);
        }
    }
    if (!getenv("DSV4_KEEP_TMP")) {
        char cmd[256];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "run_tests: could not remove %s\n", tmpdir);
    } else {
        printf("temporary files kept in %s\n", tmpdir);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
