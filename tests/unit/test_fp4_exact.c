/*
 * test_fp4_exact.c - the avx2-int sub-level's FP4 numerics (src/backend/cpu/fp4_exact.h):
 * the activation layout's SIMD writer against the plain-C one, the kernels (GEMV on each
 * integer dot product this CPU has, and the f32 GEMM) bit for bit against the plain-C
 * reference at every token count and crossover, on awkward sizes, and that reference against
 * exact arithmetic.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/fp4_exact.h"
#include "test_cases.h"
#if DSV4_HAVE_X86
#include <cpuid.h>
#endif

/* Activations as the FP8/FP4 projections get them: e4m3 per group of B (128 V4, 32 V4.1)
 * with a power-of-two scale, dequantised (the quantiser's plain-C rule), over magnitudes
 * from 2^-25 to 2^14, with exact zeros, subnormal e4m3 codes and a block of zeros. */
static void quantised_row(unsigned long long *seed, float *x, int n, int B)
{
    float mag = ldexpf(1.0f, (int)(test_rand_u64(seed) % 40) - 25);
    for (int i = 0; i < n; i++) x[i] = test_rand_f32(seed) * mag * (i % 9 == 0 ? 1e-3f : 1.0f) * (i % 31 == 5 ? 0 : 1);
    if (n >= 256)
        for (int i = 128; i < 256; i++) x[i] = 0;
    test_quant_e4m3_row(x, n, B, x);
}

/* A random FP4 projection: codes of every kind, e8m0 scales 2^-12 .. 2^-4. */
struct fp4_lin {
    struct dsv4_linear l;
    uint8_t           *w, *s;
};

static void make_fp4(struct fp4_lin *r, int n_rows, int n_in, int row_off, unsigned long long seed)
{
    size_t nw = (size_t)n_rows * (size_t)n_in / 2, ns = (size_t)n_rows * (size_t)(n_in / 32);
    r->w      = malloc(nw);
    r->s      = malloc(ns);
    for (size_t i = 0; i < nw; i++) r->w[i] = (uint8_t)test_rand_u64(&seed);
    for (size_t i = 0; i < ns; i++) r->s[i] = (uint8_t)(115 + test_rand_u64(&seed) % 9);
    r->l = (struct dsv4_linear){ .fmt = DSV4_WFMT_FP4, .n_out = n_rows - row_off, .n_in = n_in, .row_off = row_off,
                                 .w = r->w, .scale = r->s, .block = 128 };
}

static void test_layout(struct test_ctx *t)
{
#if DSV4_HAVE_X86
    if (dsv4_cpu_detect() < DSV4_CPU_AVX2) {
        test_skip(t, TEST_SKIP_MACHINE, "no AVX2 on this CPU");
        return;
    }
    unsigned long long seed = 5;
    static const int   ns[] = { 32, 96, 160, 256, 4096, 4128 };
    for (size_t c = 0; c < sizeof(ns) / sizeof(ns[0]); c++) {
        int    n  = ns[c];
        size_t nf = dsv4_fp4x_floats(n);
        float *x = malloc(sizeof(float) * (size_t)n), *q = malloc(sizeof(float) * (size_t)n);
        float *a = calloc(nf, sizeof(float)), *b = calloc(nf, sizeof(float));
        for (int it = 0; it < 8; it++) {
            int B = it % 2 ? 32 : 128; /* activation groups of V4 and V4.1 */
            quantised_row(&seed, q, n, B);
            /* the writer quantises itself: feed it values that quantise to q (q itself) */
            memcpy(x, q, sizeof(float) * (size_t)n);
            dsv4_fp4x_quant_avx2(x, n, B, a);
            dsv4_fp4x_layout_ref(q, n, B, b);
            CHECKF(memcmp(a, b, sizeof(float) * nf) == 0, "n %d B %d: the AVX2 layout differs from the plain-C one", n,
                   B);
            /* the layout holds the values: 256 H + L = xi and xi 2^ex = x, F = xi */
            const int16_t *A = (const int16_t *)(const void *)b;
            const int32_t *E = (const int32_t *)(const void *)(b + dsv4_fp4x_e_off(n));
            int            bad = 0;
            for (int k = 0; k < n; k++) {
                int     blk = k / 32, i = k % 32, hi = i >= 16, j = i & 15, p = (j & 1) * 8 + j / 2;
                int32_t xi  = 256 * A[blk * 64 + hi * 16 + p] + A[blk * 64 + 32 + hi * 16 + p];
                bad += ldexp(xi, E[k / 32]) != (double)q[k] || abs(xi) >= 1 << 18;
            }
            CHECKF(bad == 0, "n %d: %d inputs do not come back from the layout", n, bad);
        }
        free(x);
        free(q);
        free(a);
        free(b);
    }
#else
    test_skip(t, TEST_SKIP_MACHINE, "the avx2-int sub-level is x86 only");
#endif
}

#if DSV4_HAVE_X86
typedef void (*dot_fn)(const struct dsv4_linear *, int, int, int, const float *, int, float *, int, int);

/* The kernels this CPU runs: plain AVX2 always, the VNNI variants and the zmm ones (two rows a
 * vector, avx512-int) where they exist. */
static int dot_variants(dot_fn *fn, const char **name)
{
    int n = 0;
    fn[n] = dsv4_fp4x_dot_avx2, name[n++] = "avx2";
    unsigned a = 0, b = 0, c = 0, d = 0;
    __builtin_cpu_init();
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1u)) fn[n] = dsv4_fp4x_dot_vnni, name[n++] = "avx-vnni";
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl"))
        fn[n] = dsv4_fp4x_dot_v512, name[n++] = "avx512-vnni";
    if (dsv4_cpu_detect() >= DSV4_CPU_AVX512) fn[n] = dsv4_fp4x_dot_z512, name[n++] = "zmm avx512bw";
    if (dsv4_cpu_detect() >= DSV4_CPU_AVX512 && __builtin_cpu_supports("avx512vnni"))
        fn[n] = dsv4_fp4x_dot_z512v, name[n++] = "zmm avx512-vnni";
    return n;
}
#endif

static void test_kernels_same_bits(struct test_ctx *t)
{
#if DSV4_HAVE_X86
    if (dsv4_cpu_detect() < DSV4_CPU_AVX2) {
        test_skip(t, TEST_SKIP_MACHINE, "no AVX2 on this CPU");
        return;
    }
    dsv4_fp4x_init();
    dot_fn      fn[5];
    const char *name[5];
    int         n_fn = dot_variants(fn, name);
    if (n_fn < 5) test_not_here(t, "a VNNI or zmm variant");
    static const struct {
        int rows, n_in, row_off, o0, o1;
    } shapes[] = { { 1, 32, 0, 0, 1 }, { 7, 96, 0, 0, 7 }, { 13, 288, 4, 1, 9 }, { 37, 256, 0, 0, 37 },
                   { 9, 4128, 0, 2, 9 }, { 20, 2048, 0, 0, 20 } };
    static const int nts[] = { 1, 2, 3, 4, 5, 7, 13, 29 }, gmins[] = { 1, 5, 64 };
    unsigned long long seed = 17;
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        struct fp4_lin L;
        make_fp4(&L, shapes[s].rows, shapes[s].n_in, shapes[s].row_off, seed + s);
        int    K = shapes[s].n_in, ld = (int)dsv4_fp4x_floats(K) + 3, maxt = 29;
        float *q = malloc(sizeof(float) * (size_t)K), *x = calloc((size_t)maxt * (size_t)ld, sizeof(float));
        for (int tk = 0; tk < maxt; tk++) { /* groups of 128 (V4) and of 32 (V4.1) in turn */
            quantised_row(&seed, q, K, tk % 2 ? 32 : 128);
            dsv4_fp4x_layout_ref(q, K, tk % 2 ? 32 : 128, x + (size_t)tk * (size_t)ld);
        }
        int    ldy = L.l.n_out + 1;
        float *want = calloc((size_t)maxt * (size_t)ldy, sizeof(float)), *got = calloc((size_t)maxt * (size_t)ldy, sizeof(float));
        dsv4_fp4x_dot_ref(&L.l, shapes[s].o0, shapes[s].o1, maxt, x, ld, want, ldy);
        for (int f = 0; f < n_fn; f++)
            for (size_t ni = 0; ni < sizeof(nts) / sizeof(nts[0]); ni++)
                for (size_t gi = 0; gi < sizeof(gmins) / sizeof(gmins[0]); gi++) {
                    int nt = nts[ni];
                    memset(got, 0xff, sizeof(float) * (size_t)maxt * (size_t)ldy);
                    fn[f](&L.l, shapes[s].o0, shapes[s].o1, nt, x, ld, got, ldy, gmins[gi]);
                    int bad = 0;
                    for (int tk = 0; tk < nt; tk++)
                        for (int o = shapes[s].o0; o < shapes[s].o1; o++)
                            bad += memcmp(&got[(size_t)tk * (size_t)ldy + (size_t)o], &want[(size_t)tk * (size_t)ldy + (size_t)o], 4) != 0;
                    CHECKF(bad == 0, "%s, %d x %d rows [%d, %d), %d tokens, gmin %d: %d outputs differ from the reference",
                           name[f], shapes[s].rows, K, shapes[s].o0, shapes[s].o1, nt, gmins[gi], bad);
                }
        free(q);
        free(x);
        free(want);
        free(got);
        free(L.w);
        free(L.s);
    }
#else
    test_skip(t, TEST_SKIP_MACHINE, "the avx2-int sub-level is x86 only");
#endif
}

/* The reference is the dot product: within its roundings (one per block and lane, seven in
 * the lane tree) of the exact sum, computed in double from the codes and scales. */
static void test_reference_is_exact_sum(struct test_ctx *t)
{
    unsigned long long seed = 23;
    static const int   Ks[] = { 32, 128, 4096, 96, 4128 };
    for (size_t c = 0; c < 2 * sizeof(Ks) / sizeof(Ks[0]); c++) {
        int            K = Ks[c / 2], B = c % 2 ? 32 : 128, rows = 16, ld = (int)dsv4_fp4x_floats(K);
        struct fp4_lin L;
        make_fp4(&L, rows, K, 0, seed + c);
        float *q = malloc(sizeof(float) * (size_t)K), *x = calloc((size_t)ld, sizeof(float)), y[16];
        quantised_row(&seed, q, K, B);
        dsv4_fp4x_layout_ref(q, K, B, x);
        dsv4_fp4x_dot_ref(&L.l, 0, rows, 1, x, ld, y, 1);
        int bad = 0;
        for (int o = 0; o < rows; o++) {
            double exact = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                uint8_t code = (uint8_t)((L.w[(size_t)o * (size_t)K / 2 + (size_t)k / 2] >> (k % 2 * 4)) & 15);
                double  v    = (double)dsv4_f32_from_e2m1(code) * ldexp(1.0, L.s[(size_t)o * (size_t)(K / 32) + (size_t)k / 32] - 127) * q[k];
                exact += v;
                mag += fabs(v);
            }
            /* one rounding per block and lane, then the seven of the lane tree, each at most
             * 2^-24 of a partial sum no larger than the sum of magnitudes */
            bad += fabs((double)y[o] - exact) > (double)(K / 32 * 8 + 7) * 0x1p-24 * mag;
        }
        CHECKF(bad == 0, "K %d B %d: %d of %d outputs are not the dot product", K, B, bad, rows);
        free(q);
        free(x);
        free(L.w);
        free(L.s);
    }
}

/* The plumbing of ops_fast.c: the backend's linear op at avx2-int on an FP4 projection with
 * FP8 activations (quantised, written in the layout, rows over two threads, GEMV and GEMM)
 * gives the reference's bits for every token, and not the avx2 level's. */
static void test_linear_op(struct test_ctx *t)
{
    struct dsv4_err  err;
    struct dsv4_cpu *cpu = NULL, *plain = NULL;
    if (dsv4_cpu_create_fp4x(&cpu, 2, &err)) {
        test_skip(t, TEST_SKIP_MACHINE, "%s", err.msg);
        return;
    }
    if (dsv4_cpu_create_at(&plain, DSV4_CPU_AVX2, false, 2, &err)) {
        CHECKF(0, "%s", err.msg);
        dsv4_cpu_free(cpu);
        return;
    }
    enum { K = 4096, N = 70, MAXT = 40 };
    size_t              sc      = 1 << 22;
    float              *scratch = malloc(sizeof(float) * sc);
    struct dsv4_backend fast    = { .ops = &dsv4_cpu_fast_ops, .impl = cpu, .scratch = scratch, .scratch_len = sc };
    struct dsv4_backend avx2    = { .ops = &dsv4_cpu_fast_ops, .impl = plain, .scratch = scratch, .scratch_len = sc };
    unsigned long long  seed    = 41;
    struct fp4_lin      L;
    make_fp4(&L, N, K, 0, 3);
    int    ld  = (int)dsv4_fp4x_floats(K);
    float *x = malloc(sizeof(float) * MAXT * K), *q = malloc(sizeof(float) * K), *lay = malloc(sizeof(float) * MAXT * (size_t)ld);
    float *y = malloc(sizeof(float) * MAXT * N), *want = malloc(sizeof(float) * MAXT * N), *y2 = malloc(sizeof(float) * MAXT * N);
    for (int i = 0; i < MAXT * K; i++) x[i] = test_rand_f32(&seed) * (i % 13 == 0 ? 8.0f : 1.0f);
    for (int B = 128; B >= 32; B /= 4) { /* activation groups of V4, then of V4.1 */
        L.l.block = B;
        for (int tk = 0; tk < MAXT; tk++) {
            memcpy(q, x + (size_t)tk * K, sizeof(float) * K);
            test_quant_e4m3_row(q, K, B, q);
            dsv4_fp4x_layout_ref(q, K, B, lay + (size_t)tk * (size_t)ld);
        }
        dsv4_fp4x_dot_ref(&L.l, 0, N, MAXT, lay, ld, want, N);
        static const int nts[] = { 1, 3, 7, 40 };
        for (size_t i = 0; i < sizeof(nts) / sizeof(nts[0]); i++) {
            int nt = nts[i];
            fast.ops->linear(&fast, &L.l, nt, x, K, y, N, DSV4_ACT_FP8, DSV4_OUT_F32);
            CHECKF(memcmp(y, want, sizeof(float) * (size_t)nt * N) == 0,
                   "linear op, block %d, %d tokens: not the reference's bits", B, nt);
            avx2.ops->linear(&avx2, &L.l, nt, x, K, y2, N, DSV4_ACT_FP8, DSV4_OUT_F32);
            CHECKF(memcmp(y, y2, sizeof(float) * (size_t)nt * N) != 0, "linear op, block %d, %d tokens: the avx2 level's bits",
                   B, nt);
        }
    }
    free(x);
    free(q);
    free(lay);
    free(y);
    free(y2);
    free(want);
    free(scratch);
    free(L.w);
    free(L.s);
    dsv4_cpu_free(cpu);
    dsv4_cpu_free(plain);
}

const struct test_case test_group_fp4x[] = {
    { "linear_op_plumbing", test_linear_op },
    { "layout_avx2_vs_plain_c", test_layout },
    { "kernels_same_bits_every_route", test_kernels_same_bits },
    { "reference_is_the_dot_product", test_reference_is_exact_sum },
    { NULL, NULL },
};
