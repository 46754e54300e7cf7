/*
 * test_kernels.c - every optimised CPU kernel and op against a plain reference, on seeded
 * random inputs with awkward sizes (one row, rows not a multiple of 4, K not a multiple of
 * the vector width, offsets into a tensor), at every dispatch level this CPU supports; and
 * the thread pool's parallel-for.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/ops_data.h"
#include "backend/cpu/ref.h"
#include "backend/cpu/ref_num.h"
#include "core/pool.h"
#include "test_cases.h"

/* A random projection of the given format, with its own storage. */
struct rand_lin {
    struct dsv4_linear l;
    uint8_t           *w, *s;
};

/* Scales of l (FP8: BxB blocks, B = l->block; FP4: per 32 of a row; else none). */
static size_t n_scales(const struct dsv4_linear *l)
{
    return l->fmt == DSV4_WFMT_FP8 ? dsv4_fp8_scale_index(l, l->n_out - 1, l->n_in - 1) + 1
         : l->fmt == DSV4_WFMT_FP4 ? (size_t)l->n_out * (size_t)(l->n_in / 32) : 0;
}

/* A random projection with FP8 blocks / activation groups of `block` (128 V4, 32 V4.1). */
static void make_lin_b(struct rand_lin *r, enum dsv4_wfmt fmt, int n_out, int n_in, bool f32_scales,
                       unsigned long long seed, int block)
{
    memset(r, 0, sizeof(*r));
    size_t nw = fmt == DSV4_WFMT_FP8 ? (size_t)n_out * n_in : fmt == DSV4_WFMT_FP4 ? (size_t)n_out * n_in / 2
              : fmt == DSV4_WFMT_BF16 ? (size_t)n_out * n_in * 2 : (size_t)n_out * n_in * 4;
    r->l      = (struct dsv4_linear){ .fmt = fmt, .n_out = n_out, .n_in = n_in, .block = block };
    size_t ns = n_scales(&r->l);
    r->w = malloc(nw + 64);
    r->s = malloc(ns * 4 + 64);
    for (size_t i = 0; i < nw; i++) r->w[i] = (uint8_t)test_rand_u64(&seed);
    if (fmt == DSV4_WFMT_FP8)
        for (size_t i = 0; i < nw; i++)
            if ((r->w[i] & 0x7f) == 0x7f) r->w[i] ^= 1; /* no NaN codes */
    if (fmt == DSV4_WFMT_BF16)
        for (size_t i = 0; i < nw / 2; i++) {
            uint16_t h = dsv4_bf16_from_f32(test_rand_f32(&seed));
            memcpy(r->w + 2 * i, &h, 2);
        }
    if (fmt == DSV4_WFMT_F32)
        for (size_t i = 0; i < nw / 4; i++) {
            float f = test_rand_f32(&seed);
            memcpy(r->w + 4 * i, &f, 4);
        }
    for (size_t i = 0; i < ns; i++) {
        if (f32_scales) {
            float f = ldexpf(1.0f + 0.3f * test_rand_f32(&seed), (int)(test_rand_u64(&seed) % 7) - 10);
            memcpy(r->s + 4 * i, &f, 4);
        } else {
            r->s[i] = (uint8_t)(117 + test_rand_u64(&seed) % 7);
        }
    }
    r->l = (struct dsv4_linear){ .fmt = fmt, .n_out = n_out, .n_in = n_in, .w = r->w, .scale = ns ? r->s : NULL,
                                 .scale_f32 = f32_scales, .block = block };
}

static void make_lin(struct rand_lin *r, enum dsv4_wfmt fmt, int n_out, int n_in, bool f32_scales,
                     unsigned long long seed)
{
    make_lin_b(r, fmt, n_out, n_in, f32_scales, seed, 128);
}

static void free_lin(struct rand_lin *r)
{
    free(r->w);
    free(r->s);
}

/* Exact (double) weight value. */
static double wval(const struct dsv4_linear *l, int o, int k)
{
    const uint8_t *w = l->w;
    double         s = 1;
    if (l->fmt == DSV4_WFMT_FP8 || l->fmt == DSV4_WFMT_FP4) {
        /* the FP8 block of (o, k), written out (not dsv4_fp8_scale_index: checked against it) */
        int    B   = l->block;
        size_t idx = l->fmt == DSV4_WFMT_FP8 ? (size_t)(o / B) * (size_t)((l->n_in + B - 1) / B) + (size_t)(k / B)
                                             : (size_t)o * (size_t)(l->n_in / 32) + (size_t)(k / 32);
        if (l->scale_f32) {
            float f;
            memcpy(&f, (const uint8_t *)l->scale + idx * 4, 4);
            s = f;
        } else {
            s = dsv4_f32_from_e8m0(((const uint8_t *)l->scale)[idx]);
        }
    }
    switch (l->fmt) {
    case DSV4_WFMT_FP8: return dsv4_f32_from_e4m3(w[(size_t)o * l->n_in + k]) * s;
    case DSV4_WFMT_FP4: {
        uint8_t b = w[(size_t)o * (l->n_in / 2) + k / 2];
        return dsv4_f32_from_e2m1(k % 2 ? b >> 4 : b & 15) * s;
    }
    case DSV4_WFMT_BF16: {
        uint16_t h;
        memcpy(&h, w + ((size_t)o * l->n_in + k) * 2, 2);
        return dsv4_f32_from_bf16(h);
    }
    default: {
        float f;
        memcpy(&f, w + ((size_t)o * l->n_in + k) * 4, 4);
        return f;
    }
    }
}

static void check_dot(struct test_ctx *t, const char *what, const struct dsv4_linear *l, int o0, int o1, int nt,
                      const float *x, const float *y)
{
    for (int tt = 0; tt < nt; tt++)
        for (int o = o0; o < o1; o++) {
            double exact = 0, mag = 0;
            for (int k = 0; k < l->n_in; k++) {
                double p = wval(l, o + l->row_off, k) * x[(size_t)tt * l->n_in + k];
                exact += p;
                mag += fabs(p);
            }
            double got = y[(size_t)tt * (size_t)l->n_out + (size_t)o];
            CHECKF(fabs(got - exact) <= 2e-6 * mag + 1e-30, "%s fmt %d [%d x %d] block %d row %d tok %d: %.9g vs %.9g",
                   what, (int)l->fmt, l->n_out, l->n_in, l->block, o, tt, got, exact);
        }
}

static void test_projection_kernels(struct test_ctx *t)
{
    enum dsv4_cpu_level top = dsv4_cpu_detect();
    /* odd: some e8m0 scales outside the range the kernels fold into bf16 exponents; block:
     * FP8 blocks of 32 (V4.1) where set, else 128 */
    struct { enum dsv4_wfmt fmt; int n_out, n_in; bool f32s, odd; int block; } shapes[] = {
        { DSV4_WFMT_FP8, 1, 32, false, false, 32 },  { DSV4_WFMT_FP8, 37, 96, false, false, 32 },
        { DSV4_WFMT_FP8, 130, 160, true, false, 32 }, { DSV4_WFMT_FP8, 260, 384, false, true, 32 },
        { DSV4_WFMT_FP8, 66, 1056, false, false, 32 },
        { DSV4_WFMT_FP4, 12, 1024, false, true }, { DSV4_WFMT_FP8, 260, 384, false, true },
        { DSV4_WFMT_FP8, 1, 128, false, false },   { DSV4_WFMT_FP8, 5, 384, false, false },   { DSV4_WFMT_FP8, 130, 256, true, false },
        { DSV4_WFMT_FP8, 260, 1024, false, false }, { DSV4_WFMT_FP4, 1, 32, false, false },   { DSV4_WFMT_FP4, 7, 160, true, false },
        { DSV4_WFMT_FP4, 66, 512, false, false },  { DSV4_WFMT_BF16, 3, 37, false, false },   { DSV4_WFMT_BF16, 9, 200, false, false },
        { DSV4_WFMT_BF16, 64, 1024, false, false }, { DSV4_WFMT_F32, 5, 33, false, false },   { DSV4_WFMT_F32, 16, 256, false, false },
    };
    unsigned long long seed = 77;
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        struct rand_lin r;
        make_lin_b(&r, shapes[si].fmt, shapes[si].n_out, shapes[si].n_in, shapes[si].f32s, seed++,
                   shapes[si].block ? shapes[si].block : 128);
        if (shapes[si].odd) {
            size_t ns = n_scales(&r.l);
            /* small ones everywhere, large ones (2^114) only where sums stay finite */
            for (size_t i = 0; i < ns; i++)
                if (i % 5 == 2) r.s[i] = 5;
                else if (i % 11 == 3 && shapes[si].fmt == DSV4_WFMT_FP4) r.s[i] = 241;
        }
        int    nmax = 6, K = r.l.n_in, O = r.l.n_out;
        float *x = malloc(sizeof(float) * (size_t)nmax * K), *y = malloc(sizeof(float) * (size_t)nmax * O);
        uint16_t *xb = malloc(2 * (size_t)nmax * K);
        for (int i = 0; i < nmax * K; i++) {
            x[i]  = dsv4_round_bf16(test_rand_f32(&seed) * 4.0f);
            xb[i] = dsv4_bf16_from_f32(x[i]);
        }
        /* a view starting at a row offset, as the grouped wo_a uses */
        struct dsv4_linear view = r.l;
        if (O >= 8 && O % 4 == 0) {
            view.row_off = 4;
            view.n_out   = O - 4;
        }
        for (int lv = 0; lv < 3 && lv <= (int)top; lv++) {
            const struct dsv4_kernels *k = dsv4_cpu_kernels((enum dsv4_cpu_level)lv);
            void (*f)(const struct dsv4_linear *, int, int, int, const float *, int, float *, int, int) =
                r.l.fmt == DSV4_WFMT_FP8 ? k->dot_fp8 : r.l.fmt == DSV4_WFMT_FP4 ? k->dot_fp4
                : r.l.fmt == DSV4_WFMT_BF16 ? k->dot_bf16 : k->dot_f32;
            for (int nt = 1; nt <= nmax; nt++) {
                memset(y, 0, sizeof(float) * (size_t)nmax * O);
                f(&r.l, 0, O, nt, x, K, y, O, DSV4_F32_GEMM_MIN_TOKENS);
                check_dot(t, k->name, &r.l, 0, O, nt, x, y);
            }
            memset(y, 0, sizeof(float) * (size_t)nmax * O);
            f(&view, 1, view.n_out, 2, x, K, y, view.n_out, DSV4_F32_GEMM_MIN_TOKENS);
            check_dot(t, k->name, &view, 1, view.n_out, 2, x, y);
            /* many tokens (the f32 levels' batched path: token groups, tiles of 3, leftover
             * rows) give every row the bits one token alone gets (batch invariance) */
            if (k->gemm_tn > 0) {
                /* the GEMV everywhere (crossovers above every count here) and the GEMM
                 * everywhere (from one token): the same bits as the level's own crossovers, at
                 * token counts below, at and above each of them */
                static const int ntv[] = { 1, 3, 4, 5, 8, 13, 16, 17, 24, 53 };
                int              own[4], all_gemv = DSV4_F32_GEMM_MIN_MAX, all_gemm = 1;
                struct dsv4_err  gerr;
                CHECK(dsv4_cpu_gemm_min((enum dsv4_cpu_level)lv, NULL, own, &gerr) == DSV4_OK);
                const struct dsv4_linear *l = view.row_off ? &view : &r.l;
                int    n_o = l->n_out, ntm = 53;
                float *xg = malloc(sizeof(float) * (size_t)ntm * K), *ya = malloc(sizeof(float) * (size_t)ntm * n_o);
                float *yb = malloc(sizeof(float) * (size_t)ntm * n_o);
                for (int i = 0; i < ntm * K; i++) xg[i] = dsv4_round_bf16(test_rand_f32(&seed) * 2.0f);
                bool same = true;
                for (size_t i = 0; i < sizeof(ntv) / sizeof(ntv[0]); i++) {
                    int kind = r.l.fmt == DSV4_WFMT_FP8 ? 0 : r.l.fmt == DSV4_WFMT_FP4 ? 1 : r.l.fmt == DSV4_WFMT_BF16 ? 2 : 3;
                    f(l, 0, n_o, ntv[i], xg, K, ya, n_o, own[kind]);
                    for (int m = 0; m < 2; m++) {
                        f(l, 0, n_o, ntv[i], xg, K, yb, n_o, m ? all_gemm : all_gemv);
                        same = same && memcmp(ya, yb, sizeof(float) * (size_t)ntv[i] * (size_t)n_o) == 0;
                    }
                }
                CHECKF(same, "%s %s %dx%d block %d: the GEMV and the GEMM differ in bits", k->name,
                       dsv4_wfmt_name(r.l.fmt), O, K, r.l.block);
                free(xg);
                free(ya);
                free(yb);
            }
            {
                int    ntg = 53, o0 = O > 2 ? 1 : 0;
                const struct dsv4_linear *l = view.row_off ? &view : &r.l;
                int    n_o = l->n_out;
                float *xg = malloc(sizeof(float) * (size_t)ntg * K), *yg = malloc(sizeof(float) * (size_t)ntg * n_o);
                float *y1 = malloc(sizeof(float) * (size_t)n_o);
                for (int i = 0; i < ntg * K; i++) xg[i] = dsv4_round_bf16(test_rand_f32(&seed) * 2.0f);
                memset(yg, 0, sizeof(float) * (size_t)ntg * n_o);
                f(l, o0, n_o, ntg, xg, K, yg, n_o, DSV4_F32_GEMM_MIN_TOKENS);
                check_dot(t, k->name, l, o0, n_o, ntg, xg, yg);
                bool same = true;
                for (int tt = 0; tt < ntg; tt++) {
                    f(l, o0, n_o, 1, xg + (size_t)tt * K, K, y1, n_o, DSV4_F32_GEMM_MIN_TOKENS);
                    same = same && memcmp(y1 + o0, yg + (size_t)tt * n_o + o0, sizeof(float) * (size_t)(n_o - o0)) == 0;
                }
                CHECKF(same, "%s %s %dx%d: %d tokens and one token differ in bits", k->name, dsv4_wfmt_name(r.l.fmt), O, K,
                       ntg);
                free(xg);
                free(yg);
                free(y1);
            }
        }
        if (top >= DSV4_CPU_AVX512BF16 && r.l.fmt != DSV4_WFMT_F32) {
            const struct dsv4_kernels *k = dsv4_cpu_kernels_bf16(DSV4_CPU_AVX512BF16);
            void (*f)(const struct dsv4_linear *, int, int, int, const uint16_t *, int, float *, int) =
                r.l.fmt == DSV4_WFMT_FP8 ? k->dotb_fp8 : r.l.fmt == DSV4_WFMT_FP4 ? k->dotb_fp4 : k->dotb_bf16;
            for (int nt = 1; nt <= nmax; nt++) {
                memset(y, 0, sizeof(float) * (size_t)nmax * O);
                f(&r.l, 0, O, nt, xb, K, y, O);
                check_dot(t, k->name, &r.l, 0, O, nt, x, y);
            }
            /* the prefill GEMM path: panels, token blocks, odd row ranges, a row offset; and
             * bit for bit what the GEMV kernel gives each row (chunk and batch invariance) */
            if (!r.l.scale_f32 && K % 32 == 0) {
                int    ntg = 29;
                float *xg  = malloc(sizeof(float) * (size_t)ntg * K), *yg = malloc(sizeof(float) * (size_t)ntg * O);
                float *yv  = malloc(sizeof(float) * (size_t)ntg * O);
                uint16_t *xgb = malloc(2 * (size_t)ntg * K), *panel = malloc(2 * DSV4_GEMM_PANEL * (size_t)K);
                for (int i = 0; i < ntg * K; i++) {
                    xg[i]  = dsv4_round_bf16(test_rand_f32(&seed) * 2.0f);
                    xgb[i] = dsv4_bf16_from_f32(xg[i]);
                }
                memset(yg, 0, sizeof(float) * (size_t)ntg * O);
                int o0 = O > 2 ? 1 : 0;
                k->gemmb(&r.l, o0, O, ntg, xgb, K, yg, O, panel);
                check_dot(t, "gemmb", &r.l, o0, O, ntg, xg, yg);
                memcpy(yv, yg, sizeof(float) * (size_t)ntg * O);
                f(&r.l, o0, O, ntg, xgb, K, yv, O);
                CHECKF(memcmp(yv, yg, sizeof(float) * (size_t)ntg * O) == 0, "%s %s %dx%d: GEMM and GEMV differ in bits",
                       k->name, dsv4_wfmt_name(r.l.fmt), O, K);
                if (view.row_off) {
                    memset(yg, 0, sizeof(float) * (size_t)ntg * O);
                    k->gemmb(&view, 0, view.n_out, ntg, xgb, K, yg, view.n_out, panel);
                    check_dot(t, "gemmb view", &view, 0, view.n_out, ntg, xg, yg);
                }
                free(xg);
                free(yg);
                free(yv);
                free(xgb);
                free(panel);
            }
            uint16_t cv[300];
            k->to_bf16(x, K < 300 ? K : 300, cv);
            CHECK(memcmp(cv, xb, sizeof(uint16_t) * (size_t)(K < 300 ? K : 300)) == 0);
        }
        free(x);
        free(y);
        free(xb);
        free_lin(&r);
    }
    test_levels_not_here(t, (int)dsv4_cpu_detect(), DSV4_CPU_AVX512);
}

/* Every e4m3 code through the bf16-path decoder equals the number-format decoder. */
static void test_fp8_all_codes(struct test_ctx *t)
{
    if (dsv4_cpu_detect() < DSV4_CPU_AVX2) {
        test_skip(t, TEST_SKIP_MACHINE, "the bf16-path decoders need AVX2, which %s",
                  dsv4_cpu_level_built(DSV4_CPU_AVX2) ? "this CPU lacks" : "is not built for this architecture");
        return;
    }
    struct rand_lin r;
    make_lin(&r, DSV4_WFMT_FP8, 2, 256, false, 1);
    for (int c = 0; c < 256; c++) r.w[c] = (uint8_t)(c == 0x7f || c == 0xff ? 0 : c);
    memset(r.s, 127, 4);
    /* x = one-hot rows pick single weights */
    float *x = calloc(256 * 256, sizeof(float)), *y = calloc(256 * 2, sizeof(float));
    uint16_t *xb = calloc(256 * 256, 2);
    for (int c = 0; c < 256; c++) {
        x[c * 256 + c]  = 1.0f;
        xb[c * 256 + c] = 0x3f80;
    }
    enum dsv4_cpu_level lv[] = { DSV4_CPU_AVX2, DSV4_CPU_AVX512, DSV4_CPU_AVX512BF16 };
    for (int i = 0; i < 3; i++) {
        if (dsv4_cpu_detect() < lv[i]) continue;
        /* the level's decoder: its bf16-activation table where it has one */
        const struct dsv4_kernels *k = dsv4_cpu_kernels_bf16(lv[i]) ? dsv4_cpu_kernels_bf16(lv[i]) : dsv4_cpu_kernels(lv[i]);
        memset(y, 0, 256 * 2 * sizeof(float));
        if (k->dotb_fp8) k->dotb_fp8(&r.l, 0, 1, 256, xb, 256, y, 2);
        else k->dot_fp8(&r.l, 0, 1, 256, x, 256, y, 2, DSV4_F32_GEMM_MIN_TOKENS);
        for (int c = 0; c < 256; c++) {
            float want = r.w[c] == 0 ? 0.0f : dsv4_f32_from_e4m3(r.w[c]);
            CHECKF(y[c * 2] == want, "%s: e4m3 code 0x%02x gives %g, want %g", k->name, c, y[c * 2], want);
        }
    }
    free(x);
    free(xb);
    free(y);
    free_lin(&r);
    test_levels_not_here(t, (int)dsv4_cpu_detect(), DSV4_CPU_AVX512BF16);
}

/*
 * The scalar reference's linear (ref_linear.c) against a direct computation here: the
 * activations quantised by the test's own rule (test_quant_e4m3_row, groups of B), each
 * weight dequantised by wval (its BxB or 1x32 scale), the dot product in double. FP8 blocks
 * and activation groups of 128 (V4) and 32 (V4.1), with and without activation
 * quantisation, rows and K not multiples of 128 (K a multiple of 32). The reference sums in
 * double and rounds once to f32, so it is within 2^-24 of the dot product plus double
 * rounding of the magnitudes.
 */
static void test_reference_linear(struct test_ctx *t)
{
    static const struct { enum dsv4_wfmt fmt; int n_out, n_in, block; bool f32s; enum dsv4_act act; } cases[] = {
        { DSV4_WFMT_FP8, 37, 96, 32, false, DSV4_ACT_FP8 },  { DSV4_WFMT_FP8, 70, 224, 32, true, DSV4_ACT_FP8 },
        { DSV4_WFMT_FP8, 33, 160, 32, false, DSV4_ACT_NONE }, { DSV4_WFMT_FP8, 130, 384, 128, false, DSV4_ACT_FP8 },
        { DSV4_WFMT_FP8, 5, 200, 128, false, DSV4_ACT_FP8 },  { DSV4_WFMT_FP4, 9, 160, 32, false, DSV4_ACT_FP8 },
        { DSV4_WFMT_FP4, 9, 160, 128, false, DSV4_ACT_FP8 },
    };
    enum { NT = 3 };
    unsigned long long seed = 91;
    size_t             sc = 1 << 16;
    float             *scratch = malloc(sizeof(float) * sc);
    struct dsv4_backend ref = { .ops = &dsv4_cpu_ref_ops, .scratch = scratch, .scratch_len = sc };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct rand_lin r;
        int             K = cases[c].n_in, O = cases[c].n_out, B = cases[c].block;
        make_lin_b(&r, cases[c].fmt, O, K, cases[c].f32s, seed++, B);
        float *x = malloc(sizeof(float) * NT * (size_t)K), *q = malloc(sizeof(float) * NT * (size_t)K);
        float *y = malloc(sizeof(float) * NT * (size_t)O);
        for (int i = 0; i < NT * K; i++) x[i] = dsv4_round_bf16(test_rand_f32(&seed) * (i % 7 ? 1.0f : 64.0f));
        for (int tk = 0; tk < NT; tk++) {
            if (cases[c].act == DSV4_ACT_FP8) test_quant_e4m3_row(x + (size_t)tk * K, K, B, q + (size_t)tk * K);
            else memcpy(q + (size_t)tk * K, x + (size_t)tk * K, sizeof(float) * (size_t)K);
        }
        ref.ops->linear(&ref, &r.l, NT, x, K, y, O, cases[c].act, DSV4_OUT_F32);
        int bad = 0;
        for (int tk = 0; tk < NT; tk++)
            for (int o = 0; o < O; o++) {
                double exact = 0, mag = 0;
                for (int k = 0; k < K; k++) {
                    double p = wval(&r.l, o, k) * q[(size_t)tk * K + k];
                    exact += p;
                    mag += fabs(p);
                }
                bad += !(fabs(y[(size_t)tk * O + o] - exact) <= 0x1p-24 * fabs(exact) + 1e-12 * mag + 1e-30);
            }
        CHECKF(bad == 0, "%s [%d x %d] block %d act %d: %d outputs are not the direct dot product",
               dsv4_wfmt_name(cases[c].fmt), O, K, B, (int)cases[c].act, bad);
        free(x);
        free(q);
        free(y);
        free_lin(&r);
    }
    free(scratch);
}

/* The fast op table against the reference op table on the same inputs, at one level. */
static void fast_ops_vs_ref_at(struct test_ctx *t, enum dsv4_cpu_level level)
{
    struct dsv4_err  err;
    struct dsv4_cpu *cpu;
    if (dsv4_cpu_create_at(&cpu, level, false, 2, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    size_t              sc = 1 << 22;
    float              *scratch = malloc(sizeof(float) * sc);
    struct dsv4_backend fast = { .ops = &dsv4_cpu_fast_ops, .impl = cpu, .scratch = scratch, .scratch_len = sc };
    struct dsv4_backend ref  = { .ops = &dsv4_cpu_ref_ops, .impl = cpu, .scratch = scratch, .scratch_len = sc };
    unsigned long long  seed = 5;

    /* every SIMD level (avx2, avx512, neon: simd_rows.inc) runs the row and data ops on its own
     * kernels, so the comparisons with the reference below test those kernels and not the
     * fallback to the reference's plain C; `dsv4 ops` says so */
    if (level != DSV4_CPU_SCALAR) {
        const struct dsv4_kernels *k = cpu->k;
        CHECKF(k->fp4_sim_rows && k->sumsq_bf16 && k->scale_bf16 && k->swiglu_bf16 && k->fp8_sim_rows &&
                   k->rmsnorm_row && k->rope_row && k->hadamard_rows && k->quant_f32 && k->bf16_to_f32 &&
                   k->scale_rows && k->add_rows && k->combine_row,
               "level %s: a row op without a kernel", k->name);
        static const enum dsv4_op rows[] = { DSV4_OP_RMSNORM, DSV4_OP_HEAD_RMS, DSV4_OP_ROPE, DSV4_OP_HADAMARD,
                                             DSV4_OP_FP8_SIM, DSV4_OP_FP4_SIM, DSV4_OP_EXPERTS, DSV4_OP_MOE_COMBINE };
        for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
            char line[512];
            int  plain = dsv4_cpu_describe_op(cpu, rows[i], line, sizeof(line));
            CHECKF(!plain && strstr(line, k->name), "level %s, op %d: described as '%s'", k->name, (int)rows[i], line);
        }
    }

    /* attention over cached rows, both row formats, 1 to 300 rows, head counts that fill
     * 16-head groups partly (4, 20) and exactly (64, as in V4), d_head 128 and V4's 512 */
    static const int shapes[][3] = { { 4, 128, 64 }, { 20, 128, 64 }, { 64, 512, 64 } };
    for (int sh = 0; sh < 3; sh++)
    for (int fmt = 0; fmt < 2; fmt++)
        for (int n_rows = 1; n_rows <= 300; n_rows = n_rows * 3 + 2) {
            int H = shapes[sh][0], D = shapes[sh][1], R = shapes[sh][2];
            if (H == 64 && n_rows < 20) continue;
            int      rb   = dsv4_row_bytes((enum dsv4_row_fmt)fmt, D, R);
            /* row 0: the query's own (chunk) row; rows 1..: compressed rows in pages of 8,
             * the page table and the selection both reversed, so rows come in any order */
            int      nc = n_rows - 1, np = (nc + 7) / 8 + 1;
            uint8_t *rows = malloc((size_t)rb * (size_t)(np * 8 + 1));
            int32_t *pt   = malloc(sizeof(int32_t) * (size_t)np);
            int     *sel  = malloc(sizeof(int) * (size_t)(nc + 1));
            float *kv = malloc(sizeof(float) * D), *q = malloc(sizeof(float) * H * D), *sink = malloc(sizeof(float) * H);
            float *o1 = malloc(sizeof(float) * H * D), *o2 = malloc(sizeof(float) * H * D);
            for (int k = 0; k < np; k++) pt[k] = np - 1 - k;
            /* one sequence of one row at position 0: its window is the staging row; the
             * compressed rows in its pages (8 rows of 4 positions a page) */
            struct dsv4_step_seq  seq  = { .row0 = 0, .n = 1, .p0 = 0, .slot = rows, .page_base = rows + rb, .page = pt };
            struct dsv4_step_desc desc = { .n_seqs = 1, .n_rows = 1, .seq = &seq, .page_tokens = 32,
                                           .page_bytes = (size_t)8 * (size_t)rb };
            struct dsv4_attn_src  src  = { .window = 4, .ratio = 4, .ring_rows = 1, .row_bytes = rb, .chunk = rows,
                                           .n_sel = &nc, .sel = sel, .sel_stride = nc };
            struct dsv4_kv_rows   comp = dsv4_step_page_rows(&desc, 0, 0, 4, rb);
            for (int i = 0; i < n_rows; i++) {
                for (int d = 0; d < D; d++) kv[d] = dsv4_round_bf16(test_rand_f32(&seed) * 2);
                if (fmt == DSV4_ROW_FP8) ref.ops->fp8_sim(&ref, 1, D - R, D, kv, 64);
                dsv4_row_encode((enum dsv4_row_fmt)fmt, D, R, kv, i ? dsv4_kv_row_at(&comp, i - 1) : rows);
                if (i) sel[i - 1] = nc - i;
            }
            for (int i = 0; i < H * D; i++) q[i] = dsv4_round_bf16(test_rand_f32(&seed) * 3);
            for (int h = 0; h < H; h++) sink[h] = test_rand_f32(&seed) * 2;
            float scale = 1.0f / sqrtf((float)D);
            fast.ops->attention(&fast, &desc, H, D, R, q, &src, (enum dsv4_row_fmt)fmt, sink, scale, o1);
            ref.ops->attention(&ref, &desc, H, D, R, q, &src, (enum dsv4_row_fmt)fmt, sink, scale, o2);
            /* one bf16 rounding of the output, plus f32 sums over the rows in another order:
             * |values| <= 2, so n_rows * 2^-22 bounds the absolute error of a cancelling sum */
            int   bad = 0;
            float tol = 1e-6f + (float)n_rows * 0x1p-22f;
            for (int i = 0; i < H * D; i++)
                if (!(fabsf(o1[i] - o2[i]) <= 0.0079f * fabsf(o2[i]) + tol) && bad++ < 3)
                    CHECKF(0, "attention H %d D %d rows %d fmt %d [%d]: %g vs %g", H, D, n_rows, fmt, i, o1[i], o2[i]);
            CHECKF(!bad, "attention H %d D %d rows %d: %d outputs off", H, D, n_rows, bad);
            free(rows);
            free(pt);
            free(sel);
            free(kv);
            free(q);
            free(sink);
            free(o1);
            free(o2);
        }

    /* indexer scores; keys in blocks of 8 rows (as in KV pages), blocks in reverse memory
     * order; 4 heads (a partly filled 16-head group) and V4's 64; positive head weights so
     * that the relative tolerance (bf16 roundings summed in another order) is meaningful */
    for (int nI = 4; nI <= 64; nI *= 16)
        for (int nk = 1; nk <= 300; nk = nk * 6 + 1) {
            int      dI = 128, kb = dsv4_idx_key_bytes(dI), bk = 8, nb = (nk + bk - 1) / bk;
            uint8_t *keys = malloc((size_t)kb * (size_t)(nb * bk));
            int32_t *pt   = malloc(sizeof(int32_t) * (size_t)nb);
            float    key[128], *q = malloc(sizeof(float) * nI * dI), w[64], *s1 = malloc(sizeof(float) * nk),
                     *s2 = malloc(sizeof(float) * nk);
            for (int b = 0; b < nb; b++) pt[b] = nb - 1 - b;
            struct dsv4_kv_rows kr = { .base = keys, .page = pt, .page_bytes = (size_t)(bk * kb), .page_rows = bk,
                                       .row_bytes = kb };
            for (int j = 0; j < nk; j++) {
                for (int d = 0; d < dI; d++) key[d] = test_rand_f32(&seed);
                dsv4_idx_key_encode(dI, key, dsv4_kv_row_at(&kr, j));
            }
            for (int i = 0; i < nI * dI; i++) q[i] = dsv4_round_bf16(test_rand_f32(&seed));
            for (int h = 0; h < nI; h++) w[h] = dsv4_round_bf16(fabsf(test_rand_f32(&seed)) + 0.01f);
            fast.ops->indexer_scores(&fast, nI, dI, q, w, &kr, nk, s1);
            ref.ops->indexer_scores(&ref, nI, dI, q, w, &kr, nk, s2);
            for (int j = 0; j < nk; j++)
                CHECKF(fabsf(s1[j] - s2[j]) <= 0.016f * fabsf(s2[j]) + 1e-6f, "indexer %d heads, %d keys, key %d: %g vs %g",
                       nI, nk, j, s1[j], s2[j]);
            free(keys);
            free(pt);
            free(q);
            free(s1);
            free(s2);
        }

    /* FP4 simulation and per-head RMS norm: the same bits as the reference, on random rows
     * of several magnitudes, rows of exact e2m1 ties (odd multiples of a quarter step), signed
     * zeros and a NaN */
    {
        int    n = 7, d = 160, ld = 170;
        float *a = malloc(sizeof(float) * n * ld), *b = malloc(sizeof(float) * n * ld);
        for (int r = 0; r < n; r++)
            for (int i = 0; i < ld; i++) {
                float v = test_rand_f32(&seed) * ldexpf(1.0f, (int)(test_rand_u64(&seed) % 20) - 10);
                if (r == 1) v = (float)((int)(test_rand_u64(&seed) % 25) - 12) * 0.25f; /* ties at 0.25, 0.75, 2.5... */
                if (r == 2 && i % 5 == 0) v = i % 2 ? -0.0f : 0.0f;
                if (r == 3 && i == 17) v = NAN;
                if (r == 4 && i == 40) v = -INFINITY;
                a[r * ld + i] = v;
            }
        memcpy(b, a, sizeof(float) * n * ld);
        fast.ops->fp4_sim(&fast, n, d, ld, a, 32, false);
        ref.ops->fp4_sim(&ref, n, d, ld, b, 32, false);
        int bad = 0;
        for (int i = 0; i < n * ld; i++) bad += memcmp(&a[i], &b[i], 4) != 0;
        CHECKF(!bad, "fp4_sim: %d values differ from the reference", bad);
        /* FP8 simulation in blocks of 64 and 32, with a NaN and a negative zero */
        for (int blk = 32; blk <= 64; blk *= 2) {
            for (int r = 0; r < n; r++)
                for (int i = 0; i < ld; i++)
                    a[r * ld + i] = test_rand_f32(&seed) * ldexpf(1.0f, (int)(test_rand_u64(&seed) % 24) - 12);
            a[2 * ld + 9] = NAN;
            a[3 * ld + 1] = -0.0f;
            a[4 * ld + 3] = INFINITY; /* a block with an infinity saturates (scale 1), as the codec */
            a[5 * ld + 70] = -INFINITY;
            a[6 * ld + 5]  = -NAN; /* any NaN becomes the codec's +qNaN */
            memcpy(b, a, sizeof(float) * n * ld);
            fast.ops->fp8_sim(&fast, n, 128, ld, a, blk); /* widths are whole blocks (d_nope = 7 x 64) */
            ref.ops->fp8_sim(&ref, n, 128, ld, b, blk);
            bad = 0;
            for (int i = 0; i < n * ld; i++) bad += memcmp(&a[i], &b[i], 4) != 0;
            CHECKF(!bad, "fp8_sim (block %d): %d values differ from the reference", blk, bad);
        }
        /* RMSNorm (rows of 160 with stride 170, in place too) */
        {
            uint16_t w[160];
            for (int i = 0; i < 160; i++) w[i] = dsv4_bf16_from_f32(1.0f + 0.5f * test_rand_f32(&seed));
            for (int i = 0; i < n * ld; i++) a[i] = b[i] = test_rand_f32(&seed) * (float)(1 + i % 13);
            float *y1 = malloc(sizeof(float) * n * ld), *y2 = malloc(sizeof(float) * n * ld);
            fast.ops->rmsnorm(&fast, n, d, a, ld, w, 1e-6, y1, ld);
            ref.ops->rmsnorm(&ref, n, d, b, ld, w, 1e-6, y2, ld);
            bad = 0;
            for (int r = 0; r < n; r++)
                for (int i = 0; i < d; i++) bad += memcmp(&y1[r * ld + i], &y2[r * ld + i], 4) != 0;
            CHECKF(!bad, "rmsnorm: %d values differ from the reference", bad);
            fast.ops->rmsnorm(&fast, n, d, a, ld, w, 1e-6, a, ld);
            bad = 0;
            for (int r = 0; r < n; r++)
                for (int i = 0; i < d; i++) bad += memcmp(&a[r * ld + i], &y2[r * ld + i], 4) != 0;
            CHECKF(!bad, "rmsnorm in place: %d values differ from the reference", bad);
            free(y1);
            free(y2);
        }
        /* RoPE forward and inverse, 3 vectors a row, d_rope 64 of 96 and 16 of 40 (a tail pair
         * count below the vector width), positions up to 70000 */
        for (int shape = 0; shape < 2; shape++) {
            int   dr = shape ? 16 : 64, df = shape ? 40 : 96, nv = 3, rows = 4; /* rows * nv * df <= n * ld */
            float freq[32];
            int   pos[4] = { 0, 17, 4095, 70000 };
            for (int i = 0; i < dr / 2; i++) freq[i] = powf(10000.0f, -2.0f * (float)i / (float)dr);
            struct dsv4_rope_table rt = { dr, freq };
            for (int inv = 0; inv < 2; inv++) {
                for (int i = 0; i < rows * nv * df; i++) a[i] = b[i] = dsv4_round_bf16(test_rand_f32(&seed) * 3);
                fast.ops->rope(&fast, rows, nv, df, a, pos, &rt, inv);
                ref.ops->rope(&ref, rows, nv, df, b, pos, &rt, inv);
                bad = 0;
                for (int i = 0; i < rows * nv * df; i++) bad += memcmp(&a[i], &b[i], 4) != 0;
                CHECKF(!bad, "rope (d_rope %d, inverse %d): %d values differ from the reference", dr, inv, bad);
            }
        }
        /* Hadamard of widths 8 to 256; a NaN with every payload bit set (the bf16 rounding
         * must not carry it into the sign or to zero) */
        for (int hd = 8; hd <= 256; hd *= 2) {
            int rows = (n * ld) / hd < 4 ? (n * ld) / hd : 4;
            for (int i = 0; i < rows * hd; i++) a[i] = b[i] = dsv4_round_bf16(test_rand_f32(&seed) * 2);
            uint32_t ones = 0xffffffffu;
            memcpy(&a[hd + 3], &ones, 4);
            memcpy(&b[hd + 3], &ones, 4);
            fast.ops->hadamard(&fast, rows, hd, a);
            ref.ops->hadamard(&ref, rows, hd, b);
            bad = 0;
            for (int i = 0; i < rows * hd; i++) bad += memcmp(&a[i], &b[i], 4) != 0;
            CHECKF(!bad, "hadamard (d %d): %d values differ from the reference", hd, bad);
        }
        for (int i = 0; i < n * ld; i++) a[i] = b[i] = dsv4_round_bf16(test_rand_f32(&seed) * (float)(1 + i % 7));
        fast.ops->head_rms(&fast, 3, 5, 68, a, 1e-6);
        ref.ops->head_rms(&ref, 3, 5, 68, b, 1e-6);
        bad = 0;
        for (int i = 0; i < 3 * 5 * 68; i++) bad += memcmp(&a[i], &b[i], 4) != 0;
        CHECKF(!bad, "head_rms: %d values differ from the reference", bad);
        free(a);
        free(b);
    }

    /* awkward sizes of the same row ops (tails below the vector widths, the largest
     * Hadamard), with infinities, NaNs and bf16 ties where the op keeps them apart */
    {
        size_t cap = 4 * 4096;
        float *a = malloc(sizeof(float) * cap), *b = malloc(sizeof(float) * cap), *y1 = malloc(sizeof(float) * cap),
              *y2 = malloc(sizeof(float) * cap);
        uint16_t w[515];
        for (int i = 0; i < 515; i++) w[i] = dsv4_bf16_from_f32(0.5f + test_rand_f32(&seed));
        static const int rms_d[] = { 1, 7, 9, 17, 163, 515 };
        for (size_t di = 0; di < sizeof(rms_d) / sizeof(rms_d[0]); di++) {
            int d = rms_d[di], n = 5, bad = 0;
            for (int i = 0; i < n * d; i++) a[i] = test_rand_f32(&seed) * ldexpf(1.0f, (int)(test_rand_u64(&seed) % 30) - 15);
            a[d - 1] = INFINITY; /* row 0: an infinite sum of squares (every output NaN or 0) */
            fast.ops->rmsnorm(&fast, n, d, a, d, w, 1e-6, y1, d);
            ref.ops->rmsnorm(&ref, n, d, a, d, w, 1e-6, y2, d);
            for (int i = 0; i < n * d; i++) bad += memcmp(&y1[i], &y2[i], 4) != 0;
            CHECKF(!bad, "rmsnorm d %d: %d values differ from the reference", d, bad);
        }
        static const int hr_d[] = { 3, 12, 33, 128, 512 };
        for (size_t di = 0; di < sizeof(hr_d) / sizeof(hr_d[0]); di++) {
            int d = hr_d[di], nh = 3, bad = 0;
            for (int i = 0; i < 2 * nh * d; i++) a[i] = b[i] = dsv4_round_bf16(test_rand_f32(&seed) * (float)(1 + i % 5));
            fast.ops->head_rms(&fast, 2, nh, d, a, 1e-6);
            ref.ops->head_rms(&ref, 2, nh, d, b, 1e-6);
            for (int i = 0; i < 2 * nh * d; i++) bad += memcmp(&a[i], &b[i], 4) != 0;
            CHECKF(!bad, "head_rms d_head %d: %d values differ from the reference", d, bad);
        }
        for (int dr = 2; dr <= 14; dr += 4) { /* 1, 3, 5, 7 pairs: all tail below 4 doubles but the last */
            float                  freq[8];
            int                    pos[3] = { 1, 999, 65537 }, df = dr + 6, bad = 0;
            for (int i = 0; i < dr / 2; i++) freq[i] = powf(10000.0f, -2.0f * (float)i / (float)dr);
            struct dsv4_rope_table rt = { dr, freq };
            for (int i = 0; i < 3 * 2 * df; i++) a[i] = b[i] = dsv4_round_bf16(test_rand_f32(&seed) * 5);
            fast.ops->rope(&fast, 3, 2, df, a, pos, &rt, false);
            ref.ops->rope(&ref, 3, 2, df, b, pos, &rt, false);
            for (int i = 0; i < 3 * 2 * df; i++) bad += memcmp(&a[i], &b[i], 4) != 0;
            CHECKF(!bad, "rope d_rope %d: %d values differ from the reference", dr, bad);
        }
        for (int hd = 512; hd <= 4096; hd *= 2) {
            int rows = (int)(cap / (size_t)hd) < 3 ? (int)(cap / (size_t)hd) : 3, bad = 0;
            for (int i = 0; i < rows * hd; i++) a[i] = b[i] = dsv4_round_bf16(test_rand_f32(&seed) * 2);
            a[5] = b[5] = -INFINITY;
            fast.ops->hadamard(&fast, rows, hd, a);
            ref.ops->hadamard(&ref, rows, hd, b);
            for (int i = 0; i < rows * hd; i++) bad += memcmp(&a[i], &b[i], 4) != 0;
            CHECKF(!bad, "hadamard (d %d): %d values differ from the reference", hd, bad);
        }
        /* FP8 simulation in blocks of 16 (two vectors of 8) and FP4 rows whose blocks hold
         * only e2m1 ties, zeros, tiny values (the scale floor) or one infinity */
        {
            int n = 4, d = 96, bad = 0;
            for (int i = 0; i < n * d; i++) a[i] = test_rand_f32(&seed) * ldexpf(1.0f, (int)(test_rand_u64(&seed) % 40) - 20);
            a[3] = NAN;
            a[d + 17] = -INFINITY;
            memcpy(b, a, sizeof(float) * (size_t)(n * d));
            fast.ops->fp8_sim(&fast, n, d, d, a, 16);
            ref.ops->fp8_sim(&ref, n, d, d, b, 16);
            for (int i = 0; i < n * d; i++) bad += memcmp(&a[i], &b[i], 4) != 0;
            CHECKF(!bad, "fp8_sim (block 16): %d values differ from the reference", bad);
            for (int i = 0; i < n * d; i++) {
                int blk = i / 32;
                a[i]    = blk == 0 ? (float)((int)(test_rand_u64(&seed) % 49) - 24) * 0.125f
                        : blk == 1 ? 0.0f
                        : blk == 2 ? test_rand_f32(&seed) * 0x1p-130f
                        : blk == 3 ? (i == 100 ? INFINITY : test_rand_f32(&seed))
                                   : test_rand_f32(&seed) * 1e30f;
            }
            memcpy(b, a, sizeof(float) * (size_t)(n * d));
            fast.ops->fp4_sim(&fast, n, d, d, a, 32, false);
            ref.ops->fp4_sim(&ref, n, d, d, b, 32, false);
            bad = 0;
            for (int i = 0; i < n * d; i++) bad += memcmp(&a[i], &b[i], 4) != 0;
            CHECKF(!bad, "fp4_sim (ties, zeros, tiny, inf): %d values differ from the reference", bad);
        }
        free(a);
        free(b);
        free(y1);
        free(y2);
    }

    /* the data ops whose arithmetic the fast table runs on kernels (embed, scale, add_streams,
     * moe_combine) against ops_data.c's plain C through the reference table: widths with
     * tails, bf16 ties, NaN and infinities, sums whose exponents lie far apart (an f32 sum
     * would round twice) */
    {
        static const int dd[] = { 1, 5, 8, 13, 16, 35, 67 };
        for (size_t di = 0; di < sizeof(dd) / sizeof(dd[0]); di++) {
            int       d = dd[di], n = 7, hc = 3, bad = 0;
            size_t    N = (size_t)n * (size_t)hc * (size_t)d;
            uint16_t *tab = malloc(2 * (size_t)(10 * d));
            float    *x1 = malloc(sizeof(float) * N), *x2 = malloc(sizeof(float) * N), *e = malloc(sizeof(float) * N);
            int       tok[7] = { 3, 0, 9, 3, 1, 8, 2 };
            for (int i = 0; i < 10 * d; i++) tab[i] = (uint16_t)test_rand_u64(&seed);
            fast.ops->embed(&fast, n, tok, tab, d, hc, x1);
            ref.ops->embed(&ref, n, tok, tab, d, hc, x2);
            CHECKF(memcmp(x1, x2, sizeof(float) * N) == 0, "embed d %d differs from the reference", d);
            for (size_t i = 0; i < N; i++) {
                float v = test_rand_f32(&seed) * ldexpf(1.0f, (int)(test_rand_u64(&seed) % 60) - 30);
                x1[i] = x2[i] = i % 11 == 3 ? dsv4_round_bf16(v) + ldexpf(dsv4_round_bf16(v), -8) /* a bf16 tie */
                              : i % 17 == 5 ? (i % 2 ? NAN : -INFINITY)
                                            : v;
                /* (no sum of two NaNs: which payload survives is the C compiler's choice of
                 * operand order, free for a commutative addition) */
                e[i] = i % 3 ? test_rand_f32(&seed) * ldexpf(1.0f, (int)(test_rand_u64(&seed) % 80) - 40)
                     : isnan(x1[i]) ? 1.0f : -x1[i];
            }
            fast.ops->scale(&fast, N, x1, 1.0 / 3.0);
            ref.ops->scale(&ref, N, x2, 1.0 / 3.0);
            for (size_t i = 0; i < N; i++) bad += memcmp(&x1[i], &x2[i], 4) != 0;
            CHECKF(!bad, "scale (%zu values): %d differ from the reference", N, bad);
            fast.ops->add_streams(&fast, n, hc, d, e, x1);
            ref.ops->add_streams(&ref, n, hc, d, e, x2);
            bad = 0;
            for (size_t i = 0; i < N; i++) bad += memcmp(&x1[i], &x2[i], 4) != 0;
            CHECKF(!bad, "add_streams d %d: %d values differ from the reference", d, bad);
            /* combine: n rows of k = 3 pairs each in a scrambled pair order */
            int   k = hc, pair_of[21];
            float f1[7 * 67], f2[7 * 67];
            for (int i = 0; i < n * k; i++) pair_of[i] = (i * 8 + 5) % (n * k);
            for (size_t i = 0; i < (size_t)(n * k * d); i++) { /* expert outputs: bf16, one NaN, one inf */
                x1[i] = dsv4_round_bf16(test_rand_f32(&seed) * ldexpf(1.0f, (int)(test_rand_u64(&seed) % 50) - 25));
                e[i]  = isnan(e[i]) ? 0.5f : e[i];
            }
            x1[(size_t)(2 * d)] = NAN;
            x1[(size_t)(4 * d + d / 2)] = -INFINITY;
            fast.ops->moe_combine(&fast, n, k, d, pair_of, x1, e, f1);
            ref.ops->moe_combine(&ref, n, k, d, pair_of, x1, e, f2);
            CHECKF(memcmp(f1, f2, sizeof(float) * (size_t)(n * d)) == 0, "moe_combine d %d differs from the reference", d);
            free(tab);
            free(x1);
            free(x2);
            free(e);
        }
    }

    /* the grouped experts' SwiGLU (AVX2, AVX-512) against the reference expression in double
     * (ref_moe.c), with and without the clamp, gates far out in both tails; n not a multiple
     * of the vector width, so the scalar tail runs too */
    if (cpu->k->swiglu_bf16) {
        int    n = 200003; /* the final bf16 rounding hides most f32-level slips: many values */
        float *g = malloc(sizeof(float) * n), *v = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
        for (int lim = 0; lim < 2; lim++) {
            double limit = lim ? 7.0 : 0.0;
            float  w     = dsv4_round_bf16(0.37f + test_rand_f32(&seed) * 0.1f);
            for (int i = 0; i < n; i++) {
                g[i] = test_rand_f32(&seed) * (i % 10 == 0 ? 200.0f : 12.0f);
                if (i < 4) g[i] = (float[]){ INFINITY, -INFINITY, -3e20f, 3e20f }[i]; /* the tails of exp */
                v[i] = test_rand_f32(&seed) * 10.0f;
                double gg = g[i], vv = v[i];
                if (limit > 0) {
                    vv = fmin(fmax(vv, -limit), limit);
                    gg = fmin(gg, limit);
                }
                double h = rf32(rf32(gg * (1.0 / (1.0 + exp(-gg)))) * vv);
                want[i]  = rbf16(rf32((double)w * h));
            }
            cpu->k->swiglu_bf16(g, v, n, w, limit);
            int bad = 0;
            for (int i = 0; i < n; i++) bad += memcmp(&g[i], &want[i], 4) != 0;
            CHECKF(!bad, "swiglu (limit %g): %d of %d values differ from the reference expression", limit, bad, n);
        }
        free(g);
        free(v);
        free(want);
    }

    /* hyper-connection pre / post / head */
    {
        int    n = 3, hc = 4, d = 96, mix = (2 + hc) * hc;
        float *X = malloc(sizeof(float) * n * hc * d), *fn = malloc(sizeof(float) * mix * hc * d);
        float  scale[3] = { 0.8f, 1.1f, 0.9f }, base[24], u1[3 * 96], u2[3 * 96], p1[12], p2[12], c1[48], c2[48];
        float *Y1 = malloc(sizeof(float) * n * hc * d), *Y2 = malloc(sizeof(float) * n * hc * d);
        for (int i = 0; i < n * hc * d; i++) X[i] = dsv4_round_bf16(test_rand_f32(&seed) * 2);
        for (int i = 0; i < mix * hc * d; i++) fn[i] = test_rand_f32(&seed) * 0.05f;
        for (int i = 0; i < mix; i++) base[i] = test_rand_f32(&seed) * 0.5f;
        fast.ops->hc_pre(&fast, n, hc, d, X, fn, scale, base, 20, 1e-6, 1e-6, NULL, u1, p1, c1);
        ref.ops->hc_pre(&ref, n, hc, d, X, fn, scale, base, 20, 1e-6, 1e-6, NULL, u2, p2, c2);
        for (int i = 0; i < n * d; i++) CHECKF(fabsf(u1[i] - u2[i]) <= 0.0079f * fabsf(u2[i]) + 1e-6f, "hc_pre u %d", i);
        for (int i = 0; i < n * hc; i++) CHECKF(fabsf(p1[i] - p2[i]) <= 1e-5f, "hc_pre post %d", i);
        for (int i = 0; i < n * hc * hc; i++) CHECKF(fabsf(c1[i] - c2[i]) <= 1e-5f, "hc_pre comb %d: %g %g", i, c1[i], c2[i]);
        /* V4.1's lagged mode, on the reference: with a one-hot lag the collapse is stream 0
         * itself and the lag comes back as the row's own pre mix; collapsing with that alone
         * (fn NULL) gives V4's u above, bit for bit, and post / comb are V4's */
        {
            float lag[12] = { 0 }, u3[3 * 96], u4[3 * 96], p3[12], c3[48];
            for (int r = 0; r < n; r++) lag[r * hc] = 1.0f;
            ref.ops->hc_pre(&ref, n, hc, d, X, fn, scale, base, 20, 1e-6, 1e-6, lag, u3, p3, c3);
            for (int r = 0; r < n; r++)
                CHECKF(!memcmp(u3 + r * d, X + r * hc * d, sizeof(float) * d), "lagged one-hot: row %d is not stream 0", r);
            CHECK(!memcmp(p3, p2, sizeof(p3)) && !memcmp(c3, c2, sizeof(c3)));
            ref.ops->hc_pre(&ref, n, hc, d, X, NULL, NULL, NULL, 20, 1e-6, 1e-6, lag, u4, NULL, NULL);
            CHECK(!memcmp(u4, u2, sizeof(u4)));
        }
        fast.ops->hc_post(&fast, n, hc, d, u2, X, p2, c2, Y1);
        ref.ops->hc_post(&ref, n, hc, d, u2, X, p2, c2, Y2);
        for (int i = 0; i < n * hc * d; i++) CHECKF(fabsf(Y1[i] - Y2[i]) <= 0.0079f * fabsf(Y2[i]) + 1e-6f, "hc_post %d", i);
        fast.ops->hc_head(&fast, n, hc, d, X, fn, scale, base, 1e-6, 1e-6, u1);
        ref.ops->hc_head(&ref, n, hc, d, X, fn, scale, base, 1e-6, 1e-6, u2);
        for (int i = 0; i < n * d; i++) CHECKF(fabsf(u1[i] - u2[i]) <= 0.0079f * fabsf(u2[i]) + 1e-6f, "hc_head %d", i);
        free(X);
        free(fn);
        free(Y1);
        free(Y2);
    }

    /* linear with FP8 activations and bf16 output, several row counts */
    {
        struct rand_lin r;
        make_lin(&r, DSV4_WFMT_FP8, 96, 256, false, 9);
        float *x = malloc(sizeof(float) * 40 * 256), *y1 = malloc(sizeof(float) * 40 * 96), *y2 = malloc(sizeof(float) * 40 * 96);
        for (int i = 0; i < 40 * 256; i++) x[i] = dsv4_round_bf16(test_rand_f32(&seed) * 3);
        for (int nt = 1; nt <= 40; nt += nt < 5 ? 2 : 17) { /* 1, 3, 5 (GEMV) and 22, 39 (GEMM) */
            fast.ops->linear(&fast, &r.l, nt, x, 256, y1, 96, DSV4_ACT_FP8, DSV4_OUT_BF16);
            ref.ops->linear(&ref, &r.l, nt, x, 256, y2, 96, DSV4_ACT_FP8, DSV4_OUT_BF16);
            for (int i = 0; i < nt * 96; i++) CHECKF(fabsf(y1[i] - y2[i]) <= 0.0079f * fabsf(y2[i]) + 1e-6f, "linear %d", i);
        }
        free(x);
        free(y1);
        free(y2);
        free_lin(&r);
    }
    /* grouped experts: FP4 and FP8 experts, groups of 1, 3 and 9 rows (GEMV and GEMM paths) */
    for (int fmt = 0; fmt < 2; fmt++) {
        int                  d = 256, f = 128, n_exp = 3, off[4] = { 0, 1, 4, 13 }, ids[3] = { 2, 0, 1 };
        struct rand_lin      L[9];
        struct dsv4_expert_w ex[3];
        for (int e = 0; e < n_exp; e++) {
            enum dsv4_wfmt wf = fmt ? DSV4_WFMT_FP8 : DSV4_WFMT_FP4;
            make_lin(&L[3 * e], wf, f, d, false, 100 + (unsigned)e);
            make_lin(&L[3 * e + 1], wf, f, d, false, 200 + (unsigned)e);
            make_lin(&L[3 * e + 2], wf, d, f, false, 300 + (unsigned)e);
            ex[e] = (struct dsv4_expert_w){ L[3 * e].l, L[3 * e + 1].l, L[3 * e + 2].l };
        }
        float *x = malloc(sizeof(float) * 13 * d), *rw = malloc(sizeof(float) * 13);
        float *y1 = malloc(sizeof(float) * 13 * d), *y2 = malloc(sizeof(float) * 13 * d);
        float *es = malloc(sizeof(float) * 2 * 13 * f);
        for (int i = 0; i < 13 * d; i++) x[i] = dsv4_round_bf16(test_rand_f32(&seed) * 4);
        for (int i = 0; i < 13; i++) rw[i] = 0.2f + 0.5f * fabsf(test_rand_f32(&seed));
        int grp[2 * 3 + 2] = { 3, ids[0], ids[1], ids[2], off[0], off[1], off[2], off[3] }; /* count, ids, offs */
        for (int lim = 0; lim < 2; lim++) {
            fast.ops->experts(&fast, ex, n_exp, 13, grp, x, rw, lim ? 0.5 : 0.0, y1, es);
            ref.ops->experts(&ref, ex, n_exp, 13, grp, x, rw, lim ? 0.5 : 0.0, y2, es);
            int bad = 0;
            for (int i = 0; i < 13 * d; i++) bad += !(fabsf(y1[i] - y2[i]) <= 0.02f * fabsf(y2[i]) + 1e-4f);
            /* f32 vs double sums may flip a bf16 / e4m3 rounding of an intermediate: allow a few */
            CHECKF(bad <= 13 * d / 100, "grouped experts (fmt %d, limit %d): %d of %d outputs differ", fmt, lim, bad, 13 * d);
            /* one expert over all 13 rows without routing weights (the shared expert) */
            fast.ops->expert(&fast, &ex[1], 13, x, d, NULL, lim ? 0.5 : 0.0, y1, es);
            ref.ops->expert(&ref, &ex[1], 13, x, d, NULL, lim ? 0.5 : 0.0, y2, es);
            bad = 0;
            for (int i = 0; i < 13 * d; i++) bad += !(fabsf(y1[i] - y2[i]) <= 0.02f * fabsf(y2[i]) + 1e-4f);
            CHECKF(bad <= 13 * d / 100, "shared expert (fmt %d, limit %d): %d of %d outputs differ", fmt, lim, bad, 13 * d);
        }
        for (int i = 0; i < 9; i++) free_lin(&L[i]);
        free(x);
        free(rw);
        free(y1);
        free(y2);
        free(es);
    }
    free(scratch);
    dsv4_cpu_free(cpu);
}

/* ... at every level this CPU has (the levels above it are noted as not run here). */
static void test_fast_ops_vs_ref(struct test_ctx *t)
{
    enum dsv4_cpu_level top = dsv4_cpu_detect();
    for (int lvl = DSV4_CPU_SCALAR; lvl <= (int)top; lvl++) {
        int before = t->failures;
        fast_ops_vs_ref_at(t, (enum dsv4_cpu_level)lvl);
        if (t->failures > before)
            test_fail(t, __FILE__, __LINE__, "(the failures above are at level %s)",
                      dsv4_cpu_level_name((enum dsv4_cpu_level)lvl));
    }
    test_levels_not_here(t, top, DSV4_CPU_AVX512BF16);
}

/* Interleaved 16-row tiles (repack.c) and their kernels: the layout element by element, the
 * eligibility rules, GEMV and GEMM against the exact sums on awkward shapes (partial groups,
 * a view at a row offset, every token count up to 6 and 31 for the GEMM), and GEMM == GEMV
 * bit for bit. */
static void i16_kernels_at(struct test_ctx *t, enum dsv4_cpu_level level)
{
    const struct dsv4_kernels *k = dsv4_cpu_kernels_bf16(level);
    /* block: FP8 blocks of 32 (V4.1) where set, else 128 */
    struct { enum dsv4_wfmt fmt; int n_out, n_in, block; } shapes[] = {
        { DSV4_WFMT_FP8, 5, 384 },  { DSV4_WFMT_FP8, 260, 1024 }, { DSV4_WFMT_FP8, 48, 128 },
        { DSV4_WFMT_FP8, 5, 96, 32 }, { DSV4_WFMT_FP8, 100, 352, 32 },
        { DSV4_WFMT_FP4, 66, 512 }, { DSV4_WFMT_FP4, 16, 32 },    { DSV4_WFMT_FP4, 130, 2048 },
        { DSV4_WFMT_BF16, 64, 1024 }, { DSV4_WFMT_BF16, 9, 224 },
    };
    unsigned long long seed = 5;
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        struct rand_lin r;
        make_lin_b(&r, shapes[si].fmt, shapes[si].n_out, shapes[si].n_in, false, seed++,
                   shapes[si].block ? shapes[si].block : 128);
        int K = r.l.n_in, O = r.l.n_out, G = dsv4_i16_groups(&r.l), P = K / 2;
        CHECKF(dsv4_i16_eligible(&r.l), "%s %dx%d should be eligible", dsv4_wfmt_name(r.l.fmt), O, K);
        size_t wb, sb;
        dsv4_i16_sizes(&r.l, &wb, &sb);
        uint8_t *wi = malloc(wb), *sci = sb ? malloc(sb) : NULL;
        dsv4_i16_pack(&r.l, 0, G / 2, wi, sci); /* in two parts, as threads do */
        dsv4_i16_pack(&r.l, G / 2, G, wi, sci);
        /* the layout: every element where repack.c's header says */
        int bad = 0;
        for (int g = 0; g < G && !bad; g++)
            for (int p = 0; p < P && !bad; p++)
                for (int lane = 0; lane < 16 && !bad; lane++) {
                    int row = 16 * g + lane;
                    for (int j = 0; j < 2 && !bad; j++) {
                        int k_in = 2 * p + j;
                        double want = row < O ? wval(&r.l, row, k_in) : 0, got;
                        if (r.l.fmt == DSV4_WFMT_FP8) {
                            uint8_t c = wi[((size_t)g * P + p) * 32 + lane * 2 + j];
                            int     B = r.l.block, n_kb = (K + B - 1) / B;
                            got = dsv4_f32_from_e4m3(c) * (row < O ? dsv4_f32_from_e8m0(r.s[(row / B) * n_kb + k_in / B]) : 1);
                        } else if (r.l.fmt == DSV4_WFMT_FP4) {
                            uint8_t c = wi[((size_t)g * P + p) * 16 + lane];
                            got = dsv4_f32_from_e2m1(j ? c >> 4 : c & 15) *
                                  dsv4_f32_from_e8m0(sci[((size_t)g * (K / 32) + k_in / 32) * 16 + lane]);
                        } else {
                            uint16_t h;
                            memcpy(&h, wi + (((size_t)g * P + p) * 16 + lane) * 4 + j * 2, 2);
                            got = dsv4_f32_from_bf16(h);
                        }
                        bad = got != want;
                        CHECKF(!bad, "%s %dx%d: tile element (g %d, p %d, lane %d, %d) is %g, want %g",
                               dsv4_wfmt_name(r.l.fmt), O, K, g, p, lane, j, got, want);
                    }
                }
        struct dsv4_cpu_tiles tl = { wi, sci }; /* as the CPU's prepare_weights makes them */
        r.l.prep                 = &tl;
        int       ntg = 53; /* the AMX kernels: blocks of 16 and 32 tokens, a panel above 32 */
        float    *x = malloc(sizeof(float) * (size_t)ntg * K), *y = malloc(sizeof(float) * (size_t)ntg * O);
        float    *yv = malloc(sizeof(float) * (size_t)ntg * O);
        uint16_t *xb = malloc(2 * (size_t)ntg * K), *panel = malloc(2 * DSV4_GEMM_PANEL * (size_t)K);
        for (int i = 0; i < ntg * K; i++) {
            x[i]  = dsv4_round_bf16(test_rand_f32(&seed) * 3.0f);
            xb[i] = dsv4_bf16_from_f32(x[i]);
        }
        memset(y, 0, sizeof(float) * (size_t)ntg * O);
        k->gemmb_i16(&r.l, 0, O, ntg, xb, K, y, O, panel);
        /* the GEMV's tilings: 4 groups x up to 4 tokens, 2 groups x up to 12, passes of 12;
         * AMX: one block of up to 16 tokens, two up to 32, passes of 32 */
        static const int nts[] = { 1, 2, 3, 4, 5, 7, 8, 11, 12, 13, 16, 17, 25, 32, 33, 48 };
        for (size_t i = 0; i < sizeof(nts) / sizeof(nts[0]); i++) {
            int nt = nts[i];
            memset(yv, 0, sizeof(float) * (size_t)ntg * O);
            k->dotb_i16(&r.l, 0, O, nt, xb, K, yv, O);
            check_dot(t, "dotb_i16", &r.l, 0, O, nt, x, yv);
            CHECKF(memcmp(y, yv, sizeof(float) * (size_t)nt * O) == 0, "%s %dx%d: i16 GEMV of %d tokens and GEMM differ in bits",
                   dsv4_wfmt_name(r.l.fmt), O, K, nt);
        }
        check_dot(t, "gemmb_i16", &r.l, 0, O, ntg, x, y);
        memset(yv, 0, sizeof(float) * (size_t)ntg * O);
        k->dotb_i16(&r.l, 0, O, ntg, xb, K, yv, O);
        CHECKF(memcmp(y, yv, sizeof(float) * (size_t)ntg * O) == 0, "%s %dx%d: i16 GEMM and GEMV differ in bits",
               dsv4_wfmt_name(r.l.fmt), O, K);
        if (O > 32) { /* a view starting at row 16 (grouped wo_a), rows from 16 of it */
            struct dsv4_linear view = r.l;
            view.row_off = 16;
            view.n_out   = O - 16;
            memset(y, 0, sizeof(float) * (size_t)ntg * O);
            k->dotb_i16(&view, 16, view.n_out, 3, xb, K, y, view.n_out);
            check_dot(t, "dotb_i16 view", &view, 16, view.n_out, 3, x, y);
            memset(y, 0, sizeof(float) * (size_t)ntg * O);
            k->dotb_i16(&view, 16, view.n_out, 9, xb, K, y, view.n_out);
            check_dot(t, "dotb_i16 view", &view, 16, view.n_out, 9, x, y);
            memset(y, 0, sizeof(float) * (size_t)ntg * O);
            k->gemmb_i16(&view, 0, view.n_out, ntg, xb, K, y, view.n_out, panel);
            check_dot(t, "gemmb_i16 view", &view, 0, view.n_out, ntg, x, y);
        }
        free(x);
        free(y);
        free(yv);
        free(xb);
        free(panel);
        free(wi);
        free(sci);
        free_lin(&r);
    }
    /* not eligible: F32 scales, a scale outside the folding range, inputs not a multiple of 32, a view */
    struct rand_lin r;
    make_lin(&r, DSV4_WFMT_FP8, 16, 128, true, 1);
    CHECK(!dsv4_i16_eligible(&r.l));
    free_lin(&r);
    make_lin(&r, DSV4_WFMT_FP4, 16, 64, false, 2);
    r.s[3] = 250;
    CHECK(!dsv4_i16_eligible(&r.l));
    free_lin(&r);
    make_lin(&r, DSV4_WFMT_BF16, 16, 40, false, 3);
    CHECK(!dsv4_i16_eligible(&r.l));
    r.l.n_in = 32;
    r.l.row_off = 16;
    CHECK(!dsv4_i16_eligible(&r.l));
    free_lin(&r);
}

/* ... at avx512bf16 (VDPBF16PS) and amx (TDPBF16PS: other bits, the same invariance). */
static void test_i16_kernels(struct test_ctx *t)
{
    enum dsv4_cpu_level top = dsv4_cpu_detect();
    if (top < DSV4_CPU_AVX512BF16) {
        test_skip(t, TEST_SKIP_MACHINE, "the tile kernels need AVX512-BF16, which %s",
                  dsv4_cpu_level_built(DSV4_CPU_AVX512BF16) ? "this CPU lacks" : "is not built for this architecture");
        return;
    }
    for (int lvl = DSV4_CPU_AVX512BF16; lvl <= (int)top; lvl++) {
        int before = t->failures;
        i16_kernels_at(t, (enum dsv4_cpu_level)lvl);
        if (t->failures > before)
            test_fail(t, __FILE__, __LINE__, "(the failures above are at level %s)",
                      dsv4_cpu_level_name((enum dsv4_cpu_level)lvl));
    }
    test_levels_not_here(t, top, DSV4_CPU_AMX);
}

/* The activation quantiser of every level against the exact codec (dsv4_e4m3_from_f32,
 * tested exhaustively): through fast linear on a 128 x 128 FP8 identity (y = the quantised
 * x exactly, several rows at once so the rows are quantised in parallel), and the bf16
 * levels' row quantiser directly on awkward lengths (partial last blocks). */
static void fill_quant_input(unsigned long long *seed, float *x, int n)
{
    float mag = ldexpf(1.0f, (int)(test_rand_u64(seed) % 40) - 25);
    for (int i = 0; i < n; i++) x[i] = dsv4_round_bf16(test_rand_f32(seed) * mag * (i % 9 == 0 ? 1e-3f : 1.0f));
    /* exact ties of the rounding rule and the edges of the code range */
    if (n > 3) {
        float s = dsv4_act_scale(fabsf(x[0]) > 1e-30f ? fabsf(x[0]) : 1, 448.0f, 1e-4f);
        x[1] = 1.0625f * s; /* halfway between e4m3 1.0 and 1.125 */
        x[2] = -0x1.8p-9f * s; /* halfway between the two smallest subnormals */
        x[3] = 460.0f * s;
    }
}

/* The f32 levels' quantiser against the plain-C rule in groups of B. */
static void check_quant_f32(struct test_ctx *t, const struct dsv4_kernels *k, int B, unsigned long long *seed)
{
    static const int lens[] = { 1, 3, 7, 8, 9, 31, 32, 33, 100, 127, 128, 129, 255, 300, 1024 };
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        int    n  = lens[li];
        float *xa = malloc(sizeof(float) * (size_t)n), *qa = malloc(sizeof(float) * (size_t)n);
        float *qb = malloc(sizeof(float) * (size_t)(n + 1));
        fill_quant_input(seed, xa, n);
        if (n > 5) xa[5] = -INFINITY; /* saturates its block (scale 1), as the codec */
        test_quant_e4m3_row(xa, n, B, qa);
        qb[n] = 12345.0f;
        k->quant_f32(xa, n, B, qb);
        int diff = -1;
        for (int i = 0; i < n && diff < 0; i++)
            if (memcmp(&qa[i], &qb[i], 4)) diff = i;
        CHECKF(diff < 0, "%s quant_f32 n=%d B=%d: element %d is %g, codec gives %g", k->name, n, B, diff,
               diff < 0 ? 0 : qb[diff], diff < 0 ? 0 : qa[diff]);
        CHECKF(qb[n] == 12345.0f, "quant_f32 n=%d wrote past the row", n);
        free(xa);
        free(qa);
        free(qb);
    }
}

/* The bf16 level's quantiser against the plain-C rule in groups of B. */
static void check_quant_bf16(struct test_ctx *t, const struct dsv4_kernels *kb, int B, unsigned long long *seed)
{
    static const int lens[] = { 1, 3, 15, 16, 17, 31, 32, 33, 100, 127, 128, 129, 255, 300, 1024 };
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        int       n  = lens[li];
        float    *xa = malloc(sizeof(float) * (size_t)n), *qa = malloc(sizeof(float) * (size_t)n);
        uint16_t *b  = malloc(2 * (size_t)n + 64);
        fill_quant_input(seed, xa, n);
        if (n > 5) xa[5] = NAN; /* a NaN neither sets the scale nor crashes (448 like the codec path) */
        test_quant_e4m3_row(xa, n, B, qa);
        b[n] = 0xbeef;
        kb->quant_bf16(xa, n, B, b);
        int diff = -1;
        for (int i = 0; i < n && diff < 0; i++)
            if (i != 5 && dsv4_bf16_from_f32(qa[i]) != b[i]) diff = i;
        CHECKF(diff < 0, "%s quant_bf16 n=%d B=%d: element %d is 0x%04x, codec gives 0x%04x", kb->name, n, B, diff,
               diff < 0 ? 0 : b[diff], diff < 0 ? 0 : dsv4_bf16_from_f32(qa[diff]));
        CHECKF(b[n] == 0xbeef, "quant_bf16 n=%d wrote past the row", n);
        free(xa);
        free(qa);
        free(b);
    }
}

static void test_fast_quantiser(struct test_ctx *t)
{
    enum { NT = 5 };
    unsigned long long seed = 31;
    for (int lvl = DSV4_CPU_SCALAR; lvl <= (int)dsv4_cpu_detect(); lvl++) {
        struct dsv4_err  err;
        struct dsv4_cpu *cpu;
        if (dsv4_cpu_create_at(&cpu, (enum dsv4_cpu_level)lvl, false, 2, &err)) {
            CHECKF(0, "%s", err.msg);
            return;
        }
        size_t              sc      = 1 << 16;
        float              *scratch = malloc(sizeof(float) * sc), x[NT * 128], y[NT * 128], q[NT * 128];
        struct dsv4_backend fast    = { .ops = &dsv4_cpu_fast_ops, .impl = cpu, .scratch = scratch, .scratch_len = sc };
        /* through the linear op on an identity FP8 weight, then the quantisers directly on
         * awkward lengths, in groups of 128 (V4) and 32 (V4.1) */
        for (int B = 128; B >= 32; B /= 4) {
            struct rand_lin r;
            make_lin_b(&r, DSV4_WFMT_FP8, 128, 128, false, 3, B);
            memset(r.w, 0, 128 * 128);
            for (int i = 0; i < 128; i++) r.w[i * 128 + i] = 0x38; /* e4m3 1.0 */
            memset(r.s, 127, n_scales(&r.l));
            int bad = 0;
            for (int it = 0; it < 400 && !bad; it++) {
                for (int row = 0; row < NT; row++) fill_quant_input(&seed, x + row * 128, 128);
                fast.ops->linear(&fast, &r.l, NT, x, 128, y, 128, DSV4_ACT_FP8, DSV4_OUT_F32);
                for (int row = 0; row < NT; row++) test_quant_e4m3_row(x + row * 128, 128, B, q + row * 128);
                for (int i = 0; i < NT * 128; i++) bad |= y[i] != q[i]; /* the sum turns -0 into +0 */
                CHECKF(!bad, "%s block %d: quantised activations differ (iteration %d)",
                       dsv4_cpu_level_name(cpu->level), B, it);
            }
            free_lin(&r);
            if (cpu->k->quant_f32) check_quant_f32(t, cpu->k, B, &seed);
            if (cpu->kb) check_quant_bf16(t, cpu->kb, B, &seed);
        }
        free(scratch);
        dsv4_cpu_free(cpu);
    }
    test_levels_not_here(t, (int)dsv4_cpu_detect(), DSV4_CPU_AVX512BF16);
}

struct cover {
    _Atomic int hits[1000];
    _Atomic int bad;
    int64_t     align;
};

static void cover_fn(void *ctx, int64_t i0, int64_t i1, int tid)
{
    struct cover *c = ctx;
    if (tid < 0 || tid > 64 || (i0 % c->align) != 0) c->bad++;
    for (int64_t i = i0; i < i1; i++) c->hits[i]++;
}

/* moe_dispatch's group table (backend.h): the count in grp[0], the used experts ascending,
 * their first pairs, and the fixed capacity's empty groups (-1, the pair count) after them;
 * the pairs in expert order, rows then slots within an expert. */
static void test_moe_group_table(struct test_ctx *t)
{
    enum { N = 2, K = 2, N_EXP = 5, D = 3 };
    const int   ids[N * K] = { 3, 1, 1, 4 }; /* row 0: experts 3, 1; row 1: experts 1, 4 */
    const float w[N * K]   = { 0.25f, 0.5f, 0.75f, 1.0f };
    const float x[N * D]   = { 1, 2, 3, 4, 5, 6 };
    float       xe[N * K * D], row_w[N * K];
    int         pair_of[N * K], grp[2 * N_EXP + 2];
    for (int i = 0; i < 2 * N_EXP + 2; i++) grp[i] = 12345; /* stale: every entry must be written */
    dsv4_cpu_moe_dispatch(NULL, N, K, N_EXP, ids, w, x, D, xe, row_w, pair_of, grp);
    const int want_grp[2 * N_EXP + 2] = { 3, 1, 3, 4, -1, -1, 0, 2, 3, 4, 4, 4 };
    for (int i = 0; i < 2 * N_EXP + 2; i++)
        CHECKF(grp[i] == want_grp[i], "grp[%d] = %d, want %d", i, grp[i], want_grp[i]);
    const int   want_pair[N * K] = { 2, 0, 1, 3 };
    const float want_w[N * K]    = { 0.5f, 0.75f, 0.25f, 1.0f };
    const int   want_row[N * K]  = { 0, 1, 0, 1 }; /* the row each pair gathers */
    for (int i = 0; i < N * K; i++) {
        CHECKF(pair_of[i] == want_pair[i], "pair_of[%d] = %d, want %d", i, pair_of[i], want_pair[i]);
        CHECKF(row_w[i] == want_w[i], "row_w[%d] = %g, want %g", i, (double)row_w[i], (double)want_w[i]);
        CHECKF(!memcmp(xe + i * D, x + want_row[i] * D, sizeof(float) * D), "pair %d gathers the wrong row", i);
    }
}

/* The GEMM crossover spec (--gemm-min, DSV4_GEMM_MIN): three counts or a clear error. */
static void test_gemm_min_spec(struct test_ctx *t)
{
    int             m[4];
    struct dsv4_err err;
    CHECK(dsv4_cpu_gemm_min(DSV4_CPU_SCALAR, "3,17,64", m, &err) == DSV4_OK);
    CHECK(m[0] == 3 && m[1] == 17 && m[2] == 64 && m[3] == DSV4_F32_GEMM_MIN_TOKENS);
    CHECK(dsv4_cpu_gemm_min(DSV4_CPU_SCALAR, NULL, m, &err) == DSV4_OK);
    CHECK(m[0] == DSV4_F32_GEMM_MIN_TOKENS && m[3] == DSV4_F32_GEMM_MIN_TOKENS);
    static const char *const bad[] = { "5,17", "0,1,1", "5,17,17,3", "a,b,c", "65,1,1", "5,17,17x", ",,", "5,,5", " " };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECKF(dsv4_cpu_gemm_min(DSV4_CPU_SCALAR, bad[i], m, &err) == DSV4_EINVAL, "'%s' accepted", bad[i]);
        CHECKF(strstr(err.msg, "FP8,FP4,BF16") != NULL, "'%s': %s", bad[i], err.msg);
    }
}

static void test_pool(struct test_ctx *t)
{
    struct dsv4_pool *p = NULL;
    struct dsv4_err   err;
    if (dsv4_pool_create(&p, 3, &err)) { /* no pool to run on */
        CHECKF(0, "pool: %s", err.msg);
        return;
    }
    CHECK(dsv4_pool_threads(p) == 3);
    int sizes[] = { 1, 2, 3, 7, 64, 999, 1000 };
    for (int round = 0; round < 50; round++)
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            struct cover c;
            memset(&c, 0, sizeof(c));
            c.align = (round % 3) ? 4 : 1;
            dsv4_pool_for(p, sizes[s], c.align, round % 2 ? 16 : 1, cover_fn, &c);
            bool once = true;
            for (int i = 0; i < 1000; i++) once &= c.hits[i] == (i < sizes[s] ? 1 : 0);
            CHECKF(once && !c.bad, "pool n=%d align=%lld: ranges do not cover once", sizes[s], (long long)c.align);
        }
    dsv4_pool_free(p);
}

/* Level names: every level this build holds is accepted (capped at the CPU's best); a level
 * it does not hold (the x86 ones off x86_64) is an error that says so, never scalar quietly,
 * and dsv4_cpu_create_at refuses it the same way. */
static void test_level_pick(struct test_ctx *t)
{
    enum dsv4_cpu_level top = dsv4_cpu_detect();
    CHECK(dsv4_cpu_level_built(DSV4_CPU_SCALAR) && dsv4_cpu_level_built(top));
    CHECK(dsv4_cpu_kernels(DSV4_CPU_SCALAR) == &dsv4_kernels_scalar && !dsv4_cpu_kernels_bf16(DSV4_CPU_SCALAR));
    for (int l = 0; l < DSV4_CPU_LEVELS; l++) {
        struct dsv4_err     err;
        enum dsv4_cpu_level got;
        bool                ref, fp4x;
        const char         *name = dsv4_cpu_level_name((enum dsv4_cpu_level)l);
        int                 rc   = dsv4_cpu_pick(name, &got, &ref, &fp4x, &err);
        if (dsv4_cpu_level_built((enum dsv4_cpu_level)l)) {
            CHECKF(rc == DSV4_OK && !ref && !fp4x && (int)got == (l < (int)top ? l : (int)top), "pick %s: rc %d level %d",
                   name, rc, (int)got);
            continue;
        }
        CHECKF(rc == DSV4_EUNSUPPORTED && strstr(err.msg, "not built for this architecture"), "pick %s: rc %d", name, rc);
        struct dsv4_cpu *cpu = NULL;
        rc                   = dsv4_cpu_create_at(&cpu, (enum dsv4_cpu_level)l, false, 1, &err);
        CHECKF(rc == DSV4_EUNSUPPORTED && !cpu && strstr(err.msg, "not built"), "create_at %s: rc %d", name, rc);
    }
    /* the avx2-int sub-level: the avx2 level with its own FP4 table, x86 and AVX2 only */
    {
        struct dsv4_err     err;
        enum dsv4_cpu_level got;
        bool                ref, fp4x;
        int                 rc = dsv4_cpu_pick(DSV4_CPU_FP4X_NAME, &got, &ref, &fp4x, &err);
        if (DSV4_HAVE_X86 && top >= DSV4_CPU_AVX2) {
            CHECKF(rc == DSV4_OK && got == DSV4_CPU_AVX2 && fp4x && !ref, "pick avx2-int: rc %d", rc);
            struct dsv4_cpu *cpu = NULL;
            CHECK(dsv4_cpu_create_fp4x(&cpu, 1, &err) == DSV4_OK && cpu && cpu->k->quant_fp4x &&
                  cpu->k->dot_fp4 != dsv4_cpu_kernels(DSV4_CPU_AVX2)->dot_fp4 && !strcmp(dsv4_cpu_name(cpu), "avx2-int"));
            dsv4_cpu_free(cpu);
        } else CHECKF(rc == DSV4_EUNSUPPORTED, "pick avx2-int here: rc %d", rc);
        CHECK(dsv4_cpu_pick("avx2-intx", &got, &ref, &fp4x, &err) == DSV4_EINVAL && strstr(err.msg, "avx2-int"));
        rc = dsv4_cpu_pick(DSV4_CPU_FP4X512_NAME, &got, &ref, &fp4x, &err);
        /* capped to avx2-int (the same FP4 bits) without AVX-512, as the levels are capped */
        CHECKF(DSV4_HAVE_X86 && top >= DSV4_CPU_AVX2
                   ? rc == DSV4_OK && fp4x && got == (top >= DSV4_CPU_AVX512 ? DSV4_CPU_AVX512 : DSV4_CPU_AVX2)
                   : rc == DSV4_EUNSUPPORTED,
               "pick avx512-int: rc %d", rc);
    }
    CHECK(DSV4_HAVE_X86 + DSV4_HAVE_NEON == dsv4_cpu_level_built(DSV4_CPU_AVX2));
    CHECK(DSV4_HAVE_X86 == dsv4_cpu_level_built(DSV4_CPU_AVX512));
    CHECK(!strcmp(dsv4_cpu_level_name(DSV4_CPU_AVX2), DSV4_HAVE_NEON ? "neon" : "avx2"));
#if DSV4_HAVE_NEON
    CHECK(dsv4_cpu_kernels(DSV4_CPU_NEON) == &dsv4_kernels_neon && top == DSV4_CPU_NEON);
#endif
}

const struct test_case test_group_kernels[] = {
    { "projection_kernels_all_levels", test_projection_kernels },
    { "reference_linear_is_the_dot_product", test_reference_linear },
    { "fp8_all_codes_all_levels", test_fp8_all_codes },
    { "fast_ops_vs_reference", test_fast_ops_vs_ref },
    { "fast_activation_quantiser", test_fast_quantiser },
    { "i16_tiles_and_kernels", test_i16_kernels },
    { "moe_group_table", test_moe_group_table },
    { "gemm_crossover_spec", test_gemm_min_spec },
    { "pool_parallel_for", test_pool },
    { "level_names_and_builds", test_level_pick },
    { NULL, NULL },
};
