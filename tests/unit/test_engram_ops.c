/*
 * test_engram_ops.c - the CPU's Engram ops (src/backend/cpu/ops_engram.c, backend.h
 * engram_rows / engram_gate) against values worked out here from the official Engram.forward's
 * formulas (docs/ENGRAM.md "The ops"): hand-picked codes and scales for the row decode, and
 * streams whose normalised dot is known in closed form for the gate. `dsv4 test-ops` then
 * holds every level and the Vulkan shaders to these functions.
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/ops_data.h"
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

const struct test_case test_group_engram_ops[] = {
    { "rows_decode", test_rows_decode },
    { "gate_closed_form", test_gate_closed_form },
    { NULL, NULL },
};
