/*
 * test_ops_harness.c - the op checker (src/backend/op_check.h, `dsv4 test-ops`) in the suite:
 * every op of the CPU backend at every level this machine runs against the scalar
 * reference (a failure per op and level that is off), the op list against the tables, the
 * profiler's wrapper table run through the same check, a table with a hole reported as
 * missing rather than crashing, whole-step ops that skip sequences reported as failing, and a
 * backend whose buffers are not host memory (cpu-staged) checked through its memory half,
 * with a corrupting download caught.
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
    /* the CPU's best level itself (the level list ends with the -int sub-levels) */
    const char            *best = dsv4_cpu_level_name(dsv4_cpu_detect());
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

/* The checker on kind (level scalar) for each op of first .. last alone: each gets the status
 * want(op), and counts as one failure exactly when that is not ok. */
static void expect_status(struct test_ctx *t, struct dsv4_backend_kind *kind, int first, int last,
                          enum dsv4_check_status (*want)(int op))
{
    struct dsv4_err err;
    for (int op = first; op <= last; op++) {
        struct dsv4_check_opts o = { .kind = kind, .level = "scalar", .op = op };
        CHECKF(dsv4_op_check(&o, &report, &err) == DSV4_OK, "%s", err.msg);
        enum dsv4_check_status w = want(op);
        CHECKF(report.cell[op][0].status == w, "%s: status %d, want %d", dsv4_op_name((enum dsv4_op)op),
               (int)report.cell[op][0].status, (int)w);
        CHECK(dsv4_op_check_failures(&report) == (w != DSV4_CHECK_OK));
    }
}

static enum dsv4_check_status scale_missing(int op)
{
    return op == DSV4_OP_SCALE ? DSV4_CHECK_MISSING : DSV4_CHECK_OK;
}

static void test_missing_op(struct test_ctx *t)
{
    struct dsv4_backend_kind kind = dsv4_backend_cpu;
    kind.ops                      = holed_ops;
    expect_status(t, &kind, DSV4_OP_EMBED, DSV4_OP_SCALE, scale_missing);
}

/* A backend whose whole-step ops run the descriptor's first sequence only (a device kernel
 * that launched one block, say): the checker's steps of several sequences fail each of them. */
static struct dsv4_backend_ops first_only;

static struct dsv4_step_desc first_seq(const struct dsv4_step_desc *d)
{
    struct dsv4_step_desc one = *d;
    one.n_seqs                = d->n_seqs ? 1 : 0;
    return one;
}

static void fo_attention(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int n_head, int d_head, int d_rope,
                         const float *q, const struct dsv4_attn_src *src, enum dsv4_row_fmt fmt, const float *sink,
                         float scale, float *o)
{
    struct dsv4_step_desc one = first_seq(desc);
    dsv4_cpu_fast_ops.attention(be, &one, n_head, d_head, d_rope, q, src, fmt, sink, scale, o);
}

static void fo_indexer_topk(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int ratio, int n_head, int d,
                            const float *q, const float *w, size_t keys_off, int key_bytes, int topk, int *sel,
                            int *n_sel, const struct dsv4_idx_cand *cand)
{
    struct dsv4_step_desc one = first_seq(desc);
    dsv4_cpu_fast_ops.indexer_topk(be, &one, ratio, n_head, d, q, w, keys_off, key_bytes, topk, sel, n_sel, cand);
}

static void fo_compress(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int ratio, bool overlap, int d,
                        const float *a, const float *g, const float *ape, size_t kv_off, size_t sc_off, float *out)
{
    struct dsv4_step_desc one = first_seq(desc);
    dsv4_cpu_fast_ops.compress(be, &one, ratio, overlap, d, a, g, ape, kv_off, sc_off, out);
}

static void fo_store_rows(struct dsv4_backend *be, const struct dsv4_step_desc *desc, enum dsv4_row_fmt fmt, int d,
                          int d_rope, const float *x, int ldx, const struct dsv4_store_dst *dst)
{
    struct dsv4_step_desc one = first_seq(desc);
    dsv4_cpu_fast_ops.store_rows(be, &one, fmt, d, d_rope, x, ldx, dst);
}

static const struct dsv4_backend_ops *first_only_ops(void *impl)
{
    (void)impl;
    first_only              = dsv4_cpu_fast_ops;
    first_only.attention    = fo_attention;
    first_only.indexer_topk = fo_indexer_topk;
    first_only.compress     = fo_compress;
    first_only.store_rows   = fo_store_rows;
    return &first_only;
}

static enum dsv4_check_status whole_step_fails(int op)
{
    return op == DSV4_OP_STEP_BEGIN || op == DSV4_OP_INDEXER_SCORES ? DSV4_CHECK_OK : DSV4_CHECK_FAIL;
}

static void test_whole_step_cases(struct test_ctx *t)
{
    struct dsv4_backend_kind kind = dsv4_backend_cpu;
    kind.ops                      = first_only_ops;
    expect_status(t, &kind, DSV4_OP_STEP_BEGIN, DSV4_OP_STORE_ROWS, whole_step_fails);
}

/* cpu-staged (buffers not host memory): the checker moves every input, output and scratch
 * through alloc, upload and download; every op passes at every level with the same figures
 * as cpu, whose ops are the same. */
static struct dsv4_check_report staged_report;

/* The whole check of a backend whose buffers are not host memory, through its memory half
 * at level (NULL: every level), against cpu's report in `report`: the same cells, figure for
 * figure. */
static void memory_half_ops(struct test_ctx *t, const char *backend, const char *level)
{
    struct dsv4_check_opts s = { .backend = backend, .level = level, .op = -1 };
    struct dsv4_err        err;
    char                   tag[64];
    snprintf(tag, sizeof(tag), "%s ", backend);
    CHECKF(dsv4_op_check(&s, &staged_report, &err) == DSV4_OK, "%s: %s", backend, err.msg);
    check_report(t, &staged_report, tag);
    if (dsv4_op_check_failures(&staged_report)) dsv4_op_check_print(&staged_report, stderr);
    CHECK(staged_report.n_levels == report.n_levels);
    for (int op = 0; op < DSV4_OP_COUNT; op++)
        for (int l = 0; l < report.n_levels; l++) {
            const struct dsv4_check_cell *a = &report.cell[op][l], *b = &staged_report.cell[op][l];
            CHECKF(a->status == b->status && a->runs == b->runs && a->values == b->values && a->differ == b->differ &&
                       a->max_abs == b->max_abs,
                   "%s at %s: %s %zu of %zu values differ (largest %g), cpu %zu of %zu (%g)",
                   dsv4_op_name((enum dsv4_op)op), report.level[l], backend, b->differ, b->values, b->max_abs,
                   a->differ, a->values, a->max_abs);
        }
}

/* cpu-staged: every value through upload and download; cpu-strict: the same on memory the
 * checker could not touch in place without faulting. */
static void test_staged_ops(struct test_ctx *t)
{
    /* sanitizer builds check the scalar level only: the whole check three times over takes
     * minutes there (the plain build checks every level) */
    const char            *level = TEST_SANITIZED ? "scalar" : NULL;
    struct dsv4_check_opts o     = { .level = level, .op = -1 };
    struct dsv4_err        err;
    CHECKF(dsv4_op_check(&o, &report, &err) == DSV4_OK, "%s", err.msg); /* cpu's, once for both */
    memory_half_ops(t, "cpu-staged", level);
    memory_half_ops(t, "cpu-strict", level);
}

/* A download that brings back one wrong byte (the sign and exponent of the first value):
 * the checker compares what comes back through download, so the op checks fail. */
static void corrupt_download(void *impl, void *dst, const void *src, size_t bytes)
{
    dsv4_backend_cpu_staged.download(impl, dst, src, bytes);
    if (bytes >= 4) ((uint8_t *)dst)[3] ^= 0xc0;
}

/* Sanitizer builds corrupt the downloads of one op (rmsnorm): the whole scalar check there takes
 * minutes under ThreadSanitizer, and its memory paths are staged_ops_through_memory_half's;
 * the plain build catches the corruption in every op. */
static void test_corrupt_download(struct test_ctx *t)
{
    struct dsv4_backend_kind kind = dsv4_backend_cpu_staged;
    kind.download                 = corrupt_download;
    struct dsv4_check_opts o      = { .kind = &kind, .level = "scalar", .op = TEST_SANITIZED ? DSV4_OP_RMSNORM : -1 };
    struct dsv4_err        err;
    CHECKF(dsv4_op_check(&o, &report, &err) == DSV4_OK, "%s", err.msg);
    CHECK(report.selected[DSV4_OP_RMSNORM]);
    for (int op = 0; op < DSV4_OP_COUNT; op++) {
        if (!report.selected[op]) continue;
        /* the experts' tolerance lets 1% of the values off: one per output goes unseen */
        bool lenient = op == DSV4_OP_EXPERT || op == DSV4_OP_EXPERTS;
        CHECKF(lenient || report.cell[op][0].status == DSV4_CHECK_FAIL, "%s: a corrupted download not caught (%d)",
               dsv4_op_name((enum dsv4_op)op), (int)report.cell[op][0].status);
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

/* The backend options string: entries split at commas, a piece without '=' continuing the
 * value (gemm_min=3,7,9), the last of a key winning; the CPU refuses an unknown key, naming
 * the backend and the key, and a bad value; its settings report what the options said. */
struct seen {
    char text[128];
};

static int note_opt(const char *key, const char *val, void *ud)
{
    struct seen *s = ud;
    size_t       n = strlen(s->text);
    snprintf(s->text + n, sizeof(s->text) - n, "[%s|%s]", key, val);
    return DSV4_OK;
}

static void test_backend_options(struct test_ctx *t)
{
    struct seen     s = { "" };
    struct dsv4_err err;
    CHECK(dsv4_backend_opts_each("level=avx2,gemm_min=3,7,9,tiles=0,level=scalar", "x", &err, note_opt, &s) == DSV4_OK);
    CHECKF(!strcmp(s.text, "[level|avx2][gemm_min|3,7,9][tiles|0][level|scalar]"), "split as %s", s.text);
    CHECK(dsv4_backend_opts_each(NULL, "x", &err, note_opt, &s) == DSV4_OK);
    CHECK(dsv4_backend_opts_each("avx2", "x", &err, note_opt, &s) == DSV4_EINVAL && strstr(err.msg, "'avx2'"));
    CHECK(dsv4_backend_opts_each("=1", "x", &err, note_opt, &s) == DSV4_EINVAL);
    char v[16];
    CHECK(dsv4_backend_opt_get("level=avx2,tiles=0,level=scalar", "level", v, sizeof(v)) && !strcmp(v, "scalar"));
    CHECK(!dsv4_backend_opt_get("tiles=0", "level", v, sizeof(v)));
    static const char *const bad[] = { "colour=blue", "tiles=2", "level=no-such-level", "gemm_min=1,2" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct dsv4_backend_params bp   = { .opts = bad[i], .n_threads = 1 };
        void                      *impl = NULL;
        CHECKF(dsv4_backend_cpu_staged.create(&impl, &bp, &err) != DSV4_OK && !impl, "'%s' accepted", bad[i]);
        if (i == 0) CHECKF(strstr(err.msg, "'cpu-staged'") && strstr(err.msg, "'colour'"), "error: %s", err.msg);
        if (impl) dsv4_backend_cpu_staged.destroy(impl);
    }
    struct dsv4_backend_params bp   = { .opts = "gemm_min=3,7,9,tiles=0,level=scalar", .n_threads = 1 };
    void                      *impl = NULL;
    CHECKF(dsv4_backend_cpu.create(&impl, &bp, &err) == DSV4_OK, "%s", err.msg);
    if (!impl) return;
    struct dsv4_backend_settings st = { .level = "" };
    dsv4_backend_cpu.settings(impl, &st);
    CHECKF(!strcmp(st.level, "scalar") && st.gemm_min[0] == 3 && st.gemm_min[1] == 7 && st.gemm_min[2] == 9 && !st.tiles,
           "settings: level %s, gemm_min %d,%d,%d, tiles %d", st.level, st.gemm_min[0], st.gemm_min[1], st.gemm_min[2],
           st.tiles);
    dsv4_backend_cpu.destroy(impl);
}

/* The machine figures `dsv4 bench` reads through the table: a read bandwidth over a buffer of
 * the backend's own, and the peaks of its kernels (none for the reference table). */
static void test_machine_figures(struct test_ctx *t)
{
    const struct dsv4_backend_kind *k  = &dsv4_backend_cpu;
    const char                     *lv[2] = { "ref", NULL };
    for (int i = 0; i < 2; i++) {
        struct dsv4_backend_params bp   = { .opts = i == 0 ? "level=ref" : NULL, .n_threads = 2 };
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
    { "backend_options_parsed", test_backend_options },
    { "ops_vs_reference_all_levels", test_ops_vs_reference },
    { "op_list_covers_the_tables", test_op_list },
    { "profiled_table_complete", test_profiled_ops },
    { "missing_op_reported", test_missing_op },
    { "whole_step_cases_see_every_sequence", test_whole_step_cases },
    { "staged_ops_through_memory_half", test_staged_ops },
    { "corrupt_download_caught", test_corrupt_download },
    { NULL, NULL },
};
