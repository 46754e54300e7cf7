/*
 * test.h - the tiny test framework of tests/run_tests.
 *
 * A test is a function `void fn(struct test_ctx *t)`; CHECK records a failed condition with
 * file:line and goes on (so one run shows every broken assertion of a test). Tests are
 * listed in the table of run_tests.c by group; `run_tests --list` shows them and
 * `run_tests GROUP...` runs some. The runner ends with "N passed, N failed, N skipped" and
 * exits non-zero when anything failed.
 *
 * A test that cannot run here calls test_skip() with a one-line reason and returns; a test
 * that ran no check is reported as skipped too, never as passed. A skip is of one of two
 * kinds: TEST_SKIP_MISSING (something installable is absent: the reason names the command
 * that installs it; `run_tests --strict`, which CI uses, fails on these) and
 * TEST_SKIP_MACHINE (this machine cannot run it: an instruction set the CPU lacks).
 * test_not_here() records levels a test could not cover without skipping the rest.
 */
#ifndef DSV4_TEST_H
#define DSV4_TEST_H

#include <stdbool.h>
#include <stdio.h>

enum test_skip_kind {
    TEST_SKIP_NONE = 0,
    TEST_SKIP_MISSING, /* an installable dependency is absent (CI fails on these) */
    TEST_SKIP_MACHINE, /* this machine cannot run it (CPU level) */
};

struct test_ctx {
    const char         *name;
    int                 checks;
    int                 failures;
    const char         *tmpdir;          /* a fresh directory for this test run (shared by all tests) */
    enum test_skip_kind skip;            /* set by test_skip() */
    char                skip_why[256];   /* its reason */
    char                not_here[128];   /* parts not run on this machine (test_not_here) */
};

/* Marks the test skipped with a reason (printf format); the test returns right after. */
void test_skip(struct test_ctx *t, enum test_skip_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Notes a part of a test this machine could not run (e.g. "avx512"); the rest still counts. */
void test_not_here(struct test_ctx *t, const char *part);

void test_fail(struct test_ctx *t, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define CHECK(cond)                                                                         \
    do {                                                                                    \
        t->checks++;                                                                        \
        if (!(cond)) test_fail(t, __FILE__, __LINE__, "%s", #cond);                         \
    } while (0)

#define CHECKF(cond, ...)                                                                   \
    do {                                                                                    \
        t->checks++;                                                                        \
        if (!(cond)) test_fail(t, __FILE__, __LINE__, __VA_ARGS__);                         \
    } while (0)

/* True in sanitizer builds (10-50x slower): the longest tests run fewer rounds of the same
 * checks there (the plain build runs them all). */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TEST_SANITIZED 1
#else
#define TEST_SANITIZED 0
#endif

/* A string a test compares, never NULL: a missing value (json_string_value of an absent or
 * non-string field, a failed render) reads as "<NULL>", which equals no expected text, so the
 * check fails instead of the runner crashing in strcmp. */
static inline const char *test_str(const char *s)
{
    return s ? s : "<NULL>";
}

/* Deterministic PRNG for tests (splitmix64). */
static inline unsigned long long test_rand_u64(unsigned long long *s)
{
    unsigned long long z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline float test_rand_f32(unsigned long long *s) /* uniform in [-1, 1) */
{
    return (float)((double)(test_rand_u64(s) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

/* The activation quantiser's plain-C rule (ops_fast.c quantise_row): x to e4m3 per group of B
 * (128 for V4, 32 for V4.1) with a power-of-two scale, dequantised into q (q may be x). The kernels' tests check every level's
 * quantiser and the FP4/FP8 kernels' inputs against it. */
void test_quant_e4m3_row(const float *x, int n, int B, float *q);

/* The backend `run_tests --backend NAME` names (NULL: the build's default), which every engine
 * a test opens through test_engine_params and every `dsv4` process the server tests start
 * (test_backend_arg) runs on. Tests about one backend (cpu against cpu-staged, the transfer
 * counts) name theirs and ignore it. */
extern const char *test_backend;
/* `run_tests --mpi N`: the server tests start `dsv4 serve` under mpirun with N ranks and
 * --ep N (tests/unit/test_server_util.c); 0 = a plain process. */
extern int         test_mpi_ranks;
struct dsv4_engine_params;
/* dsv4_engine_params_default, then the backend of the run. */
void        test_engine_params(struct dsv4_engine_params *ep);
/* " --backend NAME" for a dsv4 command line, or "" on the default backend. */
const char *test_backend_arg(void);
struct dsv4_engine;
struct dsv4_session;
/* A session of e: dsv4_session_params_default with max_ctx and max_chunk; NULL after a failed
 * check. */
struct dsv4_session *test_session_new(struct test_ctx *t, struct dsv4_engine *e, int max_ctx, int max_chunk);

/* Whether backend `name` can run here (the build has it, it starts: a Vulkan device exists,
 * and it is not Vulkan under the sanitizers, whose Mesa drivers deadlock there); when not,
 * the reason with the fix into why and the kind of skip it is, and returns false. */
bool test_backend_usable(const char *name, char *why, size_t cap, enum test_skip_kind *kind);
/* The same as a skip of t: true when the backend can run here. */
bool test_need_backend(struct test_ctx *t, const char *name);

/* Helpers shared by tests (tests/test_util.c). */
int  test_write_file(const char *path, const void *data, size_t n);
/* Reads a whole file; returns malloc'd buffer or NULL. */
void *test_read_file(const char *path, size_t *n);
/* Runs a shell command; returns its exit status (or -1). Output goes to out (malloc'd). */
int  test_run(const char *cmd, char **out);
/* Notes the CPU levels above top, up to highest (enum dsv4_cpu_level), as not run here. */
void test_levels_not_here(struct test_ctx *t, int top, int highest);
/* A light run: a sanitizer build, or DSV4_TEST_LIGHT set to other than "" or "0" (what
 * tools/cross_build.sh sets under qemu, 10-20x slower). The slowest model tests then run
 * fewer chunkings and levels of the same checks; the plain native run runs them all. */
bool test_light(void);

#endif
