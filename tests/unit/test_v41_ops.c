/*
 * test_v41_ops.c - the reference ops DeepSeek-V4.1 adds, against values worked out here from
 * the official code's formulas: the Engram ops (src/backend/cpu/ops_engram.c, backend.h
 * engram_rows / engram_gate; docs/ENGRAM.md "The ops"): hand-picked codes and scales for the
 * row decode, streams whose normalised dot is known in closed form for the gate; and fp4_sim
 * with e4m3 group scales (the compressed KV's fp4_act_quant). `dsv4 test-ops` then holds every
 * level and the Vulkan shaders to these functions.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops_data.h"
#include "backend/cpu/ref.h"
#include "test_cases.h"

/* Rows decode to code x 2^(scale - 127) per 32, in order; ids outside the table give zeros. */
static void test_rows_decode(struct test_ctx *t)
{
    enum { D = 64, ROWS = 3 };
    uint8_t table[ROWS * D], scale[ROWS * D / 32];
    for (int i = 0; i < ROWS * D; i++) table[i] = (uint8_t)(0x38 + (i % 8)); /* 1, 1.125, .. 1.875 */
    for (int i = 0; i < ROWS * D / 32; i++) scale[i] = (uint8_t)(127 - 3 + i);
    table[D + 5] = 0xB8; /* -1 */
    int64_t             ids[2 * 3] = { 2, 1, -1, 0, 3, 1 }; /* ld 3, two columns used */
    float               out[2 * 2 * D];
    struct dsv4_backend be = { 0 };
    dsv4_cpu_engram_rows(&be, 2, 2, ids, 3, table, scale, ROWS, D, out);
    int bad = 0;
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 2; j++)
            for (int i = 0; i < D; i++) {
                int64_t id   = ids[r * 3 + j];
                double  want = 0;
                if (id >= 0 && id < ROWS) {
                    int    code = table[id * D + i];
                    double mag  = 1.0 + (double)(code & 7) / 8.0;
                    want = ldexp(code & 0x80 ? -mag : mag, scale[id * 2 + i / 32] - 127);
                }
                bad += out[(r * 2 + j) * D + i] != (float)want;
            }
    CHECKF(bad == 0, "%d decoded values differ", bad);
    CHECK(out[(0 * 2 + 1) * D + 5] == -0.5f); /* row 1, element 5: -1 x 2^(126 - 127) */
}

/* One stream's expected output, from the formula in double. */
static double expect(double h, double dot, double v)
{
    double m = fabs(dot) < 1e-6 ? 1e-6 : fabs(dot);
    double g = 1.0 / (1.0 + exp(-copysign(sqrt(m), dot)));
    return h + g * v;
}

/* Streams of constant h against keys of constant k: mean squares h^2 and k^2, so
 * dot = d h w k / (|h| |k| sqrt(d)) = sign(h k) w sqrt(d); a zero key gives dot 0 (the clamp). */
static void test_gate_closed_form(struct test_ctx *t)
{
    enum { HC = 3, D = 16 };
    const double h[HC] = { 1.0, -2.0, 0.5 }, k[HC] = { 3.0, 1.5, 0.0 }, w = 0.75, v = 0.375;
    float        X[HC * D], kv[(HC + 1) * D], W[HC * D];
    for (int c = 0; c < HC; c++)
        for (int i = 0; i < D; i++) X[c * D + i] = (float)h[c], kv[c * D + i] = (float)k[c], W[c * D + i] = (float)w;
    for (int i = 0; i < D; i++) kv[HC * D + i] = (float)v;
    struct dsv4_backend be = { 0 };
    dsv4_cpu_engram_gate(&be, 1, HC, D, kv, W, 1e-20, X);
    for (int c = 0; c < HC; c++) {
        double dot  = k[c] == 0 ? 0 : copysign(w * sqrt((double)D), h[c] * k[c]);
        double want = expect(h[c], dot, v);
        CHECKF(fabs(X[c * D] - want) <= fabs(want) * 0x1p-8, "stream %d: %g, want %g", c, X[c * D], want);
        CHECKF(X[c * D + D - 1] == X[c * D], "stream %d is not uniform", c);
        CHECKF(X[c * D] == dsv4_round_bf16(X[c * D]), "stream %d is not bf16", c);
    }
}

/* fp4_sim with e4m3 scales, groups of 16: s = e4m3(amax / 6), then e2m1 of x / s. A group of
 * amax 3 has s = 0.5 (exact); one of amax 1 has s = e4m3(1/6) = 0.171875 (1.375 x 2^-3, not a
 * power of two), so 1 becomes 6 s = 1.03125; a zero group keeps zeros (floor 6 x 2^-9). */
static void test_fp4_e4m3_groups(struct test_ctx *t)
{
    float x[48] = { 0 }, want[48] = { 0 };
    x[0] = 3.0f, want[0] = 3.0f;        /* 6 s */
    x[1] = -1.3f, want[1] = -1.5f;      /* -2.6 -> -3 */
    x[2] = 0.26f, want[2] = 0.25f;      /* 0.52 -> 0.5 */
    x[3] = 0.125f, want[3] = 0.0f;      /* 0.25: the tie goes to the even code, 0 */
    x[16] = 1.0f, want[16] = 1.03125f;  /* 5.82 -> 6 */
    x[17] = 0.5f, want[17] = 0.515625f; /* 2.91 -> 3 */
    x[18] = -0.30078125f, want[18] = -0.34375f; /* -1.75 exactly -> -2 (tie to even) */
    x[19] = -0.3f, want[19] = -0.2578125f;      /* -1.745 -> -1.5 */
    struct dsv4_backend be = { 0 };
    dsv4_ref_fp4_sim(&be, 1, 48, 48, x, 16, true);
    for (int i = 0; i < 48; i++) CHECKF(x[i] == want[i], "element %d: %.9g, want %.9g", i, x[i], want[i]);
}

/* The official f32 steps of one gate (Engram.forward), written out from the formula. */
static float gate_f32(const float *h, const float *k, const float *w, int d, double eps, bool divide)
{
    double sh = 0, sk = 0, s = 0;
    for (int i = 0; i < d; i++) sh += (double)h[i] * h[i], sk += (double)k[i] * k[i], s += (double)h[i] * w[i] * k[i];
    float rh = (float)(1.0 / sqrt((double)(float)((double)(float)(sh / d) + eps)));
    float rk = (float)(1.0 / sqrt((double)(float)((double)(float)(sk / d) + eps)));
    float rs = rh * rk, dot = (float)s * rs;
    dot = divide ? (float)((double)dot / sqrt((double)d)) : dot * (float)pow(d, -0.5);
    float m = fabsf(dot) > 1e-6f ? fabsf(dot) : 1e-6f, sg = copysignf(sqrtf(m), dot);
    return (float)(1.0 / (1.0 + exp(-(double)sg)));
}

/* The gate at the official f32 boundaries at widths where they matter (d not a power of 4, so
 * f32(d^-0.5) is not exact: V4.1-Flash's 5120): each gate is the formula's bit for bit (and
 * dividing by sqrt(d) instead would move some), and the op adds g value to the stream. */
static void test_gate_f32_boundaries(struct test_ctx *t)
{
    enum { N = 64, HC = 2 };
    static const int widths[] = { 320, 5120 };
    for (size_t wi = 0; wi < 2; wi++) {
        int    d = widths[wi], bad = 0, moved = 0;
        float *X = malloc(sizeof(float) * N * HC * d), *X0 = malloc(sizeof(float) * N * HC * d);
        float *kv = malloc(sizeof(float) * N * (HC + 1) * d), *W = malloc(sizeof(float) * HC * d);
        unsigned long long seed = 7 + wi;
        for (int i = 0; i < N * HC * d; i++) X0[i] = X[i] = dsv4_round_bf16(test_rand_f32(&seed) * 2);
        for (int i = 0; i < N * (HC + 1) * d; i++) kv[i] = dsv4_round_bf16(test_rand_f32(&seed) * 2);
        for (int i = 0; i < HC * d; i++) W[i] = 1.0f + 0.25f * test_rand_f32(&seed);
        struct dsv4_backend be = { 0 };
        dsv4_cpu_engram_gate(&be, N, HC, d, kv, W, 1e-20, X);
        for (int r = 0; r < N; r++)
            for (int c = 0; c < HC; c++) {
                const float *h = X0 + ((size_t)r * HC + c) * d, *k = kv + (size_t)r * (HC + 1) * d + (size_t)c * d;
                const float *v = kv + (size_t)r * (HC + 1) * d + (size_t)HC * d;
                float g = gate_f32(h, k, W + (size_t)c * d, d, 1e-20, false);
                moved += g != gate_f32(h, k, W + (size_t)c * d, d, 1e-20, true);
                bad += dsv4_cpu_engram_gate_of(h, k, W + (size_t)c * d, (size_t)d, 1e-20) != g;
                for (int i = 0; i < d; i++)
                    bad += X[((size_t)r * HC + c) * d + i] != dsv4_round_bf16((float)((double)h[i] + (double)g * v[i]));
            }
        CHECKF(bad == 0, "d %d: %d gates or outputs differ from the f32 formula's", d, bad);
        CHECKF(moved > 0, "d %d: no gate depends on f32(d^-0.5) (the test would not see a division)", d);
        free(X), free(X0), free(kv), free(W);
    }
}

const struct test_case test_group_v41_ops[] = {
    { "gate_f32_boundaries", test_gate_f32_boundaries },
    { "rows_decode", test_rows_decode },
    { "gate_closed_form", test_gate_closed_form },
    { "fp4_e4m3_groups", test_fp4_e4m3_groups },
    { NULL, NULL },
};
