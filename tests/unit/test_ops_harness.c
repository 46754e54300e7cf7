/*
 * test_ops_harness.c - the op checker (src/backend/op_check.h, `dsv4 test-ops`) in the suite:
 * every op of the CPU backend at every level this machine runs against the scalar
 * reference (a failure per op and level that is off), the op list against the tables, the
 * profiler's wrapper table run through the same check, and a table with a hole reported as
 * missing rather than crashing.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/op_check.h"
#include "test_cases.h"

static struct dsv4_check_report report; /* tens of KiB: not on the stack */

/* Every failed cell of a report as a failed check, every passed one as a passed check. */
static void check_report(struct test_ctx *t, const struct dsv4_check_report *r, const char *how)
{
    for (int op = 0; op < DSV4_OP_COUNT; op++)
        for (int l = 0; l < r->n_levels; l++) {
            const struct dsv4_check_cell *c = &r->cell[op][l];
            if (!r->selected[op] || !r->here[l]) continue;
            CHECKF(c->status == DSV4_CHECK_OK, "%s%s at %s: %s", how, dsv4_op_name((enum dsv4_op)op), r->level[l],
                   c->status == DSV4_CHECK_MISSING ? "missing from the op table"
                   : c->status == DSV4_CHECK_NOT_RUN ? "not run"
                                                     : c->why);
            CHECKF(c->status != DSV4_CHECK_OK || c->runs > 0, "%s at %s: no case ran", dsv4_op_name((enum dsv4_op)op),
                   r->level[l]);
        }
}

static void test_ops_vs_reference(struct test_ctx *t)
{
    struct dsv4_check_opts o = { .op = -1 };
    struct dsv4_err        err;
    CHECKF(dsv4_op_check(&o, &report, &err) == DSV4_OK, "%s", err.msg);
    check_report(t, &report, "");
    if (dsv4_op_check_failures(&report)) dsv4_op_check_print(&report, stderr);
    test_levels_not_here(t, (int)dsv4_cpu_detect(), DSV4_CPU_LEVELS - 1);
}

/* The op list names every field of the tables (op_list.c asserts the count at compile time):
 * every table of the CPU backend and the profiler's has every entry, names round-trip. */
static void test_op_list(struct test_ctx *t)
{
    const struct dsv4_backend_ops *tables[] = { &dsv4_cpu_ref_ops, &dsv4_cpu_fast_ops, &dsv4_prof_ops };
    for (int op = 0; op < DSV4_OP_COUNT; op++) {
        const char *name = dsv4_op_name((enum dsv4_op)op);
        CHECKF(dsv4_op_find(name) == op, "op %d '%s' does not find itself", op, name);
        for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]); i++)
            CHECKF(dsv4_op_entry(tables[i], (enum dsv4_op)op) != NULL, "table %s has no %s", tables[i]->name, name);
    }
    CHECK(dsv4_op_find("no_such_op") == -1);
    CHECK(!strcmp(dsv4_op_name(DSV4_OP_COUNT), "?"));
    CHECK(dsv4_op_entry(&dsv4_cpu_fast_ops, DSV4_OP_LINEAR) != dsv4_op_entry(&dsv4_cpu_ref_ops, DSV4_OP_LINEAR));
}

/* The whole check through the profiler's wrapper table at the best level: every wrapper
 * passes its arguments through (the results match the reference) and appears in the trace. */
static void test_profiled_ops(struct test_ctx *t)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/ops_trace.json", t->tmpdir);
    bool        here;
    const char *best = NULL;
    for (int i = 0; dsv4_backend_cpu.level(i, &here); i++)
        if (here) best = dsv4_backend_cpu.level(i, &here);
    struct dsv4_check_opts o = { .op = -1, .level = best, .profile = path };
    struct dsv4_err        err;
    CHECKF(dsv4_op_check(&o, &report, &err) == DSV4_OK, "%s", err.msg);
    check_report(t, &report, "profiled ");
    size_t n     = 0;
    char  *trace = test_read_file(path, &n);
    CHECKF(trace != NULL, "no trace written to %s", path);
    for (int op = 0; trace && op < DSV4_OP_COUNT; op++) {
        char key[64];
        snprintf(key, sizeof(key), "\"name\":\"%s\"", dsv4_op_name((enum dsv4_op)op));
        CHECKF(strstr(trace, key) != NULL, "the trace has no %s event", dsv4_op_name((enum dsv4_op)op));
    }
    free(trace);
}

/* A backend whose table lacks an op: the checker says "missing" for it and goes on. */
static struct dsv4_backend_ops holed;

static const struct dsv4_backend_ops *holed_ops(void *impl)
{
    (void)impl;
    holed       = dsv4_cpu_fast_ops;
    holed.scale = NULL;
    return &holed;
}

static void test_missing_op(struct test_ctx *t)
{
    struct dsv4_backend_kind kind = dsv4_backend_cpu;
    kind.ops                      = holed_ops;
    struct dsv4_err err;
    for (int op = DSV4_OP_EMBED; op <= DSV4_OP_SCALE; op++) {
        struct dsv4_check_opts o = { .kind = &kind, .level = "scalar", .op = op };
        CHECKF(dsv4_op_check(&o, &report, &err) == DSV4_OK, "%s", err.msg);
        enum dsv4_check_status want = op == DSV4_OP_SCALE ? DSV4_CHECK_MISSING : DSV4_CHECK_OK;
        CHECKF(report.cell[op][0].status == want, "%s: status %d, want %d", dsv4_op_name((enum dsv4_op)op),
               (int)report.cell[op][0].status, (int)want);
        CHECK(dsv4_op_check_failures(&report) == (op == DSV4_OP_SCALE));
    }
}

/* The registry: dsv4_backend_at lists what find finds, the default first; the name list
 * (engine open's error, `dsv4 ops`, --backend's usage) is that order, cut cleanly. */
static void test_registry_list(struct test_ctx *t)
{
    CHECK(dsv4_backend_at(0) == &dsv4_backend_cpu && dsv4_backend_find(NULL) == dsv4_backend_at(0));
    CHECK(dsv4_backend_find("") == dsv4_backend_at(0) && dsv4_backend_at(-1) == NULL);
    CHECK(dsv4_backend_find("no-such-backend") == NULL);
    char want[256] = "", got[256];
    int  n         = 0;
    bool staged = false, strict = false;
    for (const struct dsv4_backend_kind *k; (k = dsv4_backend_at(n)); n++) {
        CHECKF(dsv4_backend_find(k->name) == k, "backend %d '%s' does not find itself", n, k->name);
        staged = staged || k == &dsv4_backend_cpu_staged;
        strict = strict || k == &dsv4_backend_cpu_strict;
        size_t at = strlen(want);
        snprintf(want + at, sizeof(want) - at, "%s%s", n ? ", " : "", k->name);
    }
    CHECK(n >= 3 && staged && strict);
    dsv4_backend_list(got, sizeof(got));
    CHECKF(!strcmp(got, want), "list '%s', want '%s'", got, want);
    CHECK(!strncmp(got, "cpu, cpu-staged, cpu-strict", 27));
    dsv4_backend_list(got, 6);
    CHECKF(!strcmp(got, "cpu, "), "cut at 6: '%s'", got);
    dsv4_backend_list(got, 1);
    CHECK(got[0] == '\0');
}

/* The machine figures `dsv4 bench` reads through the table: a read bandwidth over a buffer of
 * the backend's own, and the peaks of its kernels (none for the reference table). */
static void test_machine_figures(struct test_ctx *t)
{
    const struct dsv4_backend_kind *k  = &dsv4_backend_cpu;
    const char                     *lv[2] = { "ref", NULL };
    for (int i = 0; i < 2; i++) {
        struct dsv4_backend_params bp   = { .level = lv[i], .n_threads = 2 };
        void                      *impl = NULL;
        struct dsv4_err            err;
        CHECKF(k->create(&impl, &bp, &err) == DSV4_OK, "create %s: %s", lv[i] ? lv[i] : "best", err.msg);
        if (!impl) return;
        size_t bytes = (size_t)8 << 20;
        void  *buf   = k->alloc(impl, bytes, DSV4_MEM_ACT);
        CHECK(buf != NULL);
        double bw = buf ? k->read_bandwidth(impl, buf, bytes, 2) : 0, f32 = -1, bf16 = -1;
        CHECKF(bw > 0 && isfinite(bw), "read bandwidth %g", bw);
        k->peaks(impl, &f32, &bf16);
        bool             here, any_simd = false;
        for (int l = 1; k->level(l, &here); l++) any_simd |= here; /* above scalar */
        if (i == 0) CHECKF(f32 == 0 && bf16 == 0, "ref peaks %g %g, want none", f32, bf16);
        else CHECKF(!any_simd || (f32 > 0 && bf16 >= 0), "best level peaks %g %g", f32, bf16);
        if (buf) k->free(impl, buf, bytes);
        k->destroy(impl);
    }
}

const struct test_case test_group_ops[] = {
    { "machine_figures", test_machine_figures },
    { "registry_lists_backends", test_registry_list },
    { "ops_vs_reference_all_levels", test_ops_vs_reference },
    { "op_list_covers_the_tables", test_op_list },
    { "profiled_table_complete", test_profiled_ops },
    { "missing_op_reported", test_missing_op },
    { NULL, NULL },
};
