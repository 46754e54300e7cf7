/*
 * run_tests.c - the test runner behind `make test`.
 *
 *   run_tests [--strict] [--backend B] [--mpi N] [GROUP...]
 *                                     run every group, or only these (GROUP/TEST: one test);
 *                                     --backend: the engines the tests open run on B
 *                                     (test_backend in test.h; `make test` runs a pass of
 *                                     the model groups on cpu-strict); --mpi N: the
 *                                     server tests' `dsv4 serve` runs under mpirun on N
 *                                     ranks (expert parallelism, docs/DISTRIBUTED.md)
 *   run_tests --list                  list groups and tests, with what each needs here
 *   run_tests --missing               the npm directories whose packages are missing or
 *                                     stale, one per line (tests/install_deps.sh reads it)
 *
 * Each test ends ok, FAIL or skip. A test is skipped when what it needs is missing (checked
 * before it runs, tests/test_needs.c), when it calls test_skip(), or when it ran no check.
 * Prints one line per failed check, a line per test, the reasons of the skips, and finally
 * "N passed, N failed, N skipped" (counting tests). Exits 1 if any test failed; with
 * --strict (CI) also if any test was skipped for a missing dependency or ran no check.
 * Tests share a fresh temporary directory, removed at the end unless DSV4_KEEP_TMP is set.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
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

enum { N_GROUPS = sizeof(groups) / sizeof(groups[0]) };

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

void test_skip(struct test_ctx *t, enum test_skip_kind kind, const char *fmt, ...)
{
    va_list ap;
    t->skip = kind;
    va_start(ap, fmt);
    vsnprintf(t->skip_why, sizeof(t->skip_why), fmt, ap);
    va_end(ap);
}

void test_not_here(struct test_ctx *t, const char *part)
{
    size_t n = strlen(t->not_here);
    snprintf(t->not_here + n, sizeof(t->not_here) - n, "%s%s", n ? ", " : "", part);
}

/* Whether test c of group g is selected: by its group's name or by "group/test". */
static bool selected(const char *g, const char *c, int n_sel, char **sel)
{
    if (n_sel == 0) return true;
    size_t n = strlen(g);
    for (int i = 0; i < n_sel; i++)
        if (strcmp(sel[i], g) == 0 || (!strncmp(sel[i], g, n) && sel[i][n] == '/' && !strcmp(sel[i] + n + 1, c)))
            return true;
    return false;
}

static int list_tests(void)
{
    char why[512];
    for (size_t g = 0; g < N_GROUPS; g++)
        for (const struct test_case *c = groups[g].cases; c->name; c++) {
            const char *miss = test_need_missing(c->needs, why, sizeof(why));
            if (miss) printf("%s %s  [skips here: %s]\n", groups[g].name, c->name, miss);
            else printf("%s %s\n", groups[g].name, c->name);
        }
    return 0;
}

static int list_missing(void)
{
    static const enum test_need npm[] = { TEST_NEEDS_NPM_TOKENIZER, TEST_NEEDS_NPM_SERVER, TEST_NEEDS_NPM_DEPLOY,
                                          TEST_NEEDS_WEBUI };
    char why[512];
    for (size_t i = 0; i < sizeof(npm) / sizeof(npm[0]); i++)
        if (test_need_npm_missing(npm[i], why, sizeof(why))) printf("%s\n", test_need_npm_dir(npm[i]));
    return 0;
}

/* Why the backend of --backend cannot run here (a Vulkan build on a machine with no Vulkan
 * device): every test of the pass is skipped with the reason, rather than each one failing. */
static char                backend_why[1200];
static enum test_skip_kind backend_skip;

/* One test: its needs, then the function; fills the result into t. */
static double run_one(const struct test_case *c, struct test_ctx *t)
{
    char        why[512];
    const char *miss = test_need_missing(c->needs, why, sizeof(why));
    if (miss) {
        test_skip(t, TEST_SKIP_MISSING, "%s", miss);
        return 0;
    }
    if (backend_why[0]) {
        test_skip(t, backend_skip, "%s", backend_why);
        return 0;
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    c->fn(t);
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (!t->failures && !t->skip && t->checks == 0)
        test_skip(t, TEST_SKIP_MISSING, "ran no check (a test that checks nothing is not a pass)");
    return (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
}

int main(int argc, char **argv)
{
    bool   strict = false;
    char **sel    = argv + 1;
    int    n_sel  = argc - 1;
    if (argc > 1 && strcmp(argv[1], "--list") == 0) return list_tests();
    if (argc > 1 && strcmp(argv[1], "--missing") == 0) return list_missing();
    while (n_sel > 0 && (!strcmp(sel[0], "--strict") || !strcmp(sel[0], "--backend") || !strcmp(sel[0], "--mpi"))) {
        if (!strcmp(sel[0], "--strict")) {
            strict = true;
            sel++;
            n_sel--;
            continue;
        }
        if (!strcmp(sel[0], "--mpi")) {
            if (n_sel < 2 || atoi(sel[1]) < 2 || atoi(sel[1]) > 64) {
                fprintf(stderr, "run_tests: --mpi takes a rank count from 2 to 64\n");
                return 2;
            }
            test_mpi_ranks = atoi(sel[1]);
            sel += 2;
            n_sel -= 2;
            continue;
        }
        if (n_sel < 2 || !dsv4_backend_find(sel[1])) {
            char names[256];
            dsv4_backend_list(names, sizeof(names));
            fprintf(stderr, "run_tests: --backend takes one of: %s\n", names);
            return 2;
        }
        test_backend = sel[1];
        sel += 2;
        n_sel -= 2;
    }
    for (int i = 0; i < n_sel; i++) {
        bool known = false;
        for (size_t g = 0; g < N_GROUPS; g++)
            for (const struct test_case *c = groups[g].cases; c->name; c++)
                known |= selected(groups[g].name, c->name, 1, &sel[i]);
        if (!known) {
            fprintf(stderr, "run_tests: unknown group or test '%s' (see --list)\n", sel[i]);
            return 2;
        }
    }
    if (test_backend && test_backend_usable(test_backend, backend_why, sizeof(backend_why), &backend_skip))
        backend_why[0] = '\0';
    char tmpl[] = "/tmp/dsv4-test-XXXXXX";
    const char *tmpdir = mkdtemp(tmpl);
    if (!tmpdir) {
        perror("mkdtemp");
        return 2;
    }
    int   passed = 0, failed = 0, skipped = 0, skipped_missing = 0;
    char *notes = NULL; /* the skip reasons and parts not run, repeated at the end */
    size_t notes_len = 0;
    FILE *nf = open_memstream(&notes, &notes_len);
    for (size_t g = 0; g < N_GROUPS; g++) {
        for (const struct test_case *c = groups[g].cases; c->name; c++) {
            if (!selected(groups[g].name, c->name, n_sel, sel)) continue;
            struct test_ctx t  = { .name = c->name, .tmpdir = tmpdir };
            double          ms = run_one(c, &t);
            const char     *res;
            if (t.failures) {
                failed++;
                res = "FAIL";
            } else if (t.skip) {
                skipped++;
                skipped_missing += t.skip == TEST_SKIP_MISSING;
                res = "skip";
            } else {
                passed++;
                res = "ok  ";
            }
            printf("%s %-10s %-40s %5d checks %8.1f ms", res, groups[g].name, c->name, t.checks, ms);
            if (t.skip && !t.failures) printf("  %s", t.skip_why);
            if (t.not_here[0]) printf("  (not run on this machine: %s)", t.not_here);
            printf("\n");
            fflush(stdout);
            if (nf && t.skip && !t.failures) fprintf(nf, "  skip %s %s: %s\n", groups[g].name, c->name, t.skip_why);
            if (nf && t.not_here[0])
                fprintf(nf, "  part %s %s not run on this machine: %s\n", groups[g].name, c->name, t.not_here);
        }
    }
    if (nf) fclose(nf);
    if (!getenv("DSV4_KEEP_TMP")) {
        char cmd[256];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "run_tests: could not remove %s\n", tmpdir);
    } else {
        printf("temporary files kept in %s\n", tmpdir);
    }
    if (notes && notes_len) printf("not run:\n%s", notes);
    free(notes);
    if (strict && skipped_missing)
        printf("run_tests --strict: %d test%s skipped for a missing dependency or ran no check: CI must run them all\n",
               skipped_missing, skipped_missing == 1 ? "" : "s");
    printf("%d passed, %d failed, %d skipped%s%s\n", passed, failed, skipped, test_backend ? " on backend " : "",
           test_backend ? test_backend : "");
    return failed || (strict && skipped_missing) ? 1 : 0;
}
