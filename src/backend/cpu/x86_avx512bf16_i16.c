/*
 * x86_avx512bf16_i16.c - projections on interleaved 16-row tiles (repack.c) with VDPBF16PS.
 *
 * A tile register holds input pair p of 16 consecutive rows as bf16 (codes decoded exactly,
 * the e8m0 scale folded into the exponent as in x86_avx512bf16.c); the token's pair of
 * activations is broadcast, and one VDPBF16PS adds both products into 16 per-row sums. Every
 * output is thus one f32 lane summed over p in order, from zero, in both kernels:
 *   GEMV (a few tokens): up to 4 groups (64 rows) x 4 tokens, weights decoded once per step;
 *   GEMM (many tokens):  32 rows decoded once into a bf16 panel (BF16 tiles are read in
 *                        place), then 2 x 14 register tiles (2 weight loads and 14
 *                        broadcasts per 28 VDPBF16PS).
 * Same weights, same order: a row's result has the same bits at any token count, so the
 * forward pass stays chunk- and batch-invariant. No horizontal sums, and the outputs of a
 * group are 16 consecutive floats.
 *
 * Shapes as in cpu.h; o0 and w->row_off are multiples of 16 (the caller aligns row ranges).
 */
#include "backend/cpu/x86_i16_tiles.h"

/* The activation pair p of a token row, broadcast to every lane. */
static inline __attribute__((always_inline)) __m512bh pair_bcast(const uint16_t *xt, size_t p)
{
    int32_t v;
    memcpy(&v, xt + 2 * p, 4);
    return (__m512bh)_mm512_set1_epi32(v);
}

/* GB groups from g0 against NT tokens. */
static inline __attribute__((always_inline)) void gemv_tile(int kind, int GB, int NT, const struct dsv4_linear *w,
                                                            int g0, const uint16_t *x, int ldx, float *y, int ldy,
                                                            int o0, int o1)
{
    const uint8_t *wi = dsv4_i16_w(w);
    size_t         P = (size_t)w->n_in / 2;
    __m512         acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) acc[i][t] = _mm512_setzero_ps();
    for (int b = 0; b < w->n_in / 32; b++) {
        __m512i adds[4];
#pragma GCC unroll 4
        for (int i = 0; i < GB; i++) adds[i] = block_adds(kind, w, g0 + i, b);
        for (size_t p = (size_t)b * 16; p < (size_t)b * 16 + 16; p++) {
            __m512i wv[4];
            /* each group is its own sequential stream: every line, I16_PF bytes ahead */
            if (((p * tile_bytes(kind)) & 63) == 0)
#pragma GCC unroll 4
                for (int i = 0; i < GB; i++)
                    _mm_prefetch((const char *)wi + ((size_t)(g0 + i) * P + p) * tile_bytes(kind) + I16_PF, _MM_HINT_T0);
#pragma GCC unroll 4
            for (int i = 0; i < GB; i++) wv[i] = tile_bf16(kind, wi, P, g0 + i, p, adds[i]);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                __m512bh xb = pair_bcast(x + (size_t)t * (size_t)ldx, p);
#pragma GCC unroll 4
                for (int i = 0; i < GB; i++) acc[i][t] = _mm512_dpbf16_ps(acc[i][t], (__m512bh)wv[i], xb);
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
        for (int i = 0; i < GB; i++) store_group(w, g0 + i, o0, o1, y + (size_t)t * (size_t)ldy, acc[i][t]);
}

#define GEMV_NT(kind, GB, nt_)                                                                                   \
    switch (nt_) {                                                                                                \
    case 1: gemv_tile(kind, GB, 1, w, g, xt, ldx, yt, ldy, o0, o1); break;                                        \
    case 2: gemv_tile(kind, GB, 2, w, g, xt, ldx, yt, ldy, o0, o1); break;                                        \
    case 3: gemv_tile(kind, GB, 3, w, g, xt, ldx, yt, ldy, o0, o1); break;                                        \
    default: gemv_tile(kind, GB, 4, w, g, xt, ldx, yt, ldy, o0, o1); break;                                       \
    }

/* NG (1 or 2) groups from g0 against NT (<= WIDE_NT) tokens: each tile decoded once for up to
 * 12 tokens (the 4 x 4 tile decodes it once per 4), the same sums in the same order. */
enum { WIDE_NT = 12 };
static inline __attribute__((always_inline)) void gemv_wide(int kind, int NG, int NT, const struct dsv4_linear *w,
                                                            int g0, const uint16_t *x, int ldx, float *y, int ldy,
                                                            int o0, int o1)
{
    const uint8_t *wi = dsv4_i16_w(w);
    size_t         P  = (size_t)w->n_in / 2;
    __m512         acc[2][WIDE_NT];
#pragma GCC unroll 12
    for (int t = 0; t < WIDE_NT; t++) acc[0][t] = acc[1][t] = _mm512_setzero_ps();
    for (int b = 0; b < w->n_in / 32; b++) {
        __m512i a0 = block_adds(kind, w, g0, b), a1 = NG == 2 ? block_adds(kind, w, g0 + 1, b) : a0;
        for (size_t p = (size_t)b * 16; p < (size_t)b * 16 + 16; p++) {
            if (((p * tile_bytes(kind)) & 63) == 0)
#pragma GCC unroll 2
                for (int i = 0; i < NG; i++)
                    _mm_prefetch((const char *)wi + ((size_t)(g0 + i) * P + p) * tile_bytes(kind) + I16_PF, _MM_HINT_T0);
            __m512bh w0 = (__m512bh)tile_bf16(kind, wi, P, g0, p, a0);
            __m512bh w1 = NG == 2 ? (__m512bh)tile_bf16(kind, wi, P, g0 + 1, p, a1) : w0;
#pragma GCC unroll 12
            for (int t = 0; t < NT; t++) {
                __m512bh xb = pair_bcast(x + (size_t)t * (size_t)ldx, p);
                acc[0][t]   = _mm512_dpbf16_ps(acc[0][t], w0, xb);
                if (NG == 2) acc[1][t] = _mm512_dpbf16_ps(acc[1][t], w1, xb);
            }
        }
    }
#pragma GCC unroll 12
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 2
        for (int i = 0; i < NG; i++) store_group(w, g0 + i, o0, o1, y + (size_t)t * (size_t)ldy, acc[i][t]);
}

#define GEMV_WIDE(kind, NG)                                                                                   \
    switch (n) {                                                                                              \
    case 1: gemv_wide(kind, NG, 1, w, g, xt, ldx, yt, ldy, o0, o1); break;                                    \
    case 2: gemv_wide(kind, NG, 2, w, g, xt, ldx, yt, ldy, o0, o1); break;                                    \
    case 3: gemv_wide(kind, NG, 3, w, g, xt, ldx, yt, ldy, o0, o1); break;                                    \
    case 4: gemv_wide(kind, NG, 4, w, g, xt, ldx, yt, ldy, o0, o1); break;                                    \
    case 5: gemv_wide(kind, NG, 5, w, g, xt, ldx, yt, ldy, o0, o1); break;                                    \
    case 6: gemv_wide(kind, NG, 6, w, g, xt, ldx, yt, ldy, o0, o1); break;                                    \
    case 7: gemv_wide(kind, NG, 7, w, g, xt, ldx, yt, ldy, o0, o1); break;                                    \
    case 8: gemv_wide(kind, NG, 8, w, g, xt, ldx, yt, ldy, o0, o1); break;                                    \
    case 9: gemv_wide(kind, NG, 9, w, g, xt, ldx, yt, ldy, o0, o1); break;                                    \
    case 10: gemv_wide(kind, NG, 10, w, g, xt, ldx, yt, ldy, o0, o1); break;                                  \
    case 11: gemv_wide(kind, NG, 11, w, g, xt, ldx, yt, ldy, o0, o1); break;                                  \
    default: gemv_wide(kind, NG, 12, w, g, xt, ldx, yt, ldy, o0, o1); break;                                  \
    }

static inline __attribute__((always_inline)) void gemv(int kind, const struct dsv4_linear *w, int o0, int o1, int nt,
                                                       const uint16_t *x, int ldx, float *y, int ldy)
{
    int g_end = (o1 + w->row_off + 15) / 16;
    if (nt > 4) {
        /* two groups x up to 12 tokens per pass: fewer decodes of each tile; the tokens split
         * evenly over the passes (16 as 8 + 8, not 12 + 4) */
        int passes = (nt + WIDE_NT - 1) / WIDE_NT, per = (nt + passes - 1) / passes;
        for (int g = (o0 + w->row_off) / 16; g < g_end; g += 2)
            for (int t0 = 0; t0 < nt; t0 += per) {
                const uint16_t *xt = x + (size_t)t0 * (size_t)ldx;
                float          *yt = y + (size_t)t0 * (size_t)ldy;
                int             n  = nt - t0 < per ? nt - t0 : per;
                if (g_end - g >= 2) {
                    GEMV_WIDE(kind, 2)
                } else {
                    GEMV_WIDE(kind, 1)
                }
            }
        return;
    }
    for (int g = (o0 + w->row_off) / 16; g < g_end;) {
        /* up to 4 groups at once: independent sums hide VDPBF16PS latency */
        int gb = g_end - g >= 4 ? 4 : g_end - g;
        for (int t0 = 0; t0 < nt; t0 += 4) {
            const uint16_t *xt = x + (size_t)t0 * (size_t)ldx;
            float          *yt = y + (size_t)t0 * (size_t)ldy;
            int             n  = nt - t0 < 4 ? nt - t0 : 4;
            switch (gb) {
            case 1: GEMV_NT(kind, 1, n) break;
            case 2: GEMV_NT(kind, 2, n) break;
            case 3: GEMV_NT(kind, 3, n) break;
            default: GEMV_NT(kind, 4, n) break;
            }
        }
        g += gb;
    }
}

void dsv4_avx512bf16_dotb_i16(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y,
                              int ldy)
{
    switch (kind_of(w)) {
    case I16_FP8: gemv(I16_FP8, w, o0, o1, nt, x, ldx, y, ldy); break;
    case I16_FP4: gemv(I16_FP4, w, o0, o1, nt, x, ldx, y, ldy); break;
    default: gemv(I16_BF16, w, o0, o1, nt, x, ldx, y, ldy); break;
    }
}

/* ------------------------------------------------------------------ GEMM */

/* NG (1 or 2) x 16 rows x NT (<= 14) tokens over the panel: up to 28 accumulators. */
static inline __attribute__((always_inline)) void gemm_tile(int NG, int NT, const uint16_t *w0p, const uint16_t *w1p,
                                                            size_t stride, size_t P, const uint16_t *x, int ldx,
                                                            __m512 acc[2][14])
{
#pragma GCC unroll 14
    for (int t = 0; t < 14; t++) acc[0][t] = acc[1][t] = _mm512_setzero_ps();
    for (size_t p = 0; p < P; p++) {
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(w0p + p * stride);
        __m512bh w1 = NG == 2 ? (__m512bh)_mm512_loadu_si512(w1p + p * stride) : w0;
#pragma GCC unroll 14
        for (int t = 0; t < NT; t++) {
            __m512bh xb = pair_bcast(x + (size_t)t * (size_t)ldx, p);
            acc[0][t]   = _mm512_dpbf16_ps(acc[0][t], w0, xb);
            if (NG == 2) acc[1][t] = _mm512_dpbf16_ps(acc[1][t], w1, xb);
        }
    }
}

#define GEMM_NT(NG)                                                                                          \
    switch (n) {                                                                                             \
    case 1: gemm_tile(NG, 1, w0p, w1p, stride, P, xt, ldx, acc); break;                                                 \
    case 2: gemm_tile(NG, 2, w0p, w1p, stride, P, xt, ldx, acc); break;                                                 \
    case 3: gemm_tile(NG, 3, w0p, w1p, stride, P, xt, ldx, acc); break;                                                 \
    case 4: gemm_tile(NG, 4, w0p, w1p, stride, P, xt, ldx, acc); break;                                                 \
    case 5: gemm_tile(NG, 5, w0p, w1p, stride, P, xt, ldx, acc); break;                                                 \
    case 6: gemm_tile(NG, 6, w0p, w1p, stride, P, xt, ldx, acc); break;                                                 \
    case 7: gemm_tile(NG, 7, w0p, w1p, stride, P, xt, ldx, acc); break;                                                 \
    case 8: gemm_tile(NG, 8, w0p, w1p, stride, P, xt, ldx, acc); break;                                                 \
    case 9: gemm_tile(NG, 9, w0p, w1p, stride, P, xt, ldx, acc); break;                                                 \
    case 10: gemm_tile(NG, 10, w0p, w1p, stride, P, xt, ldx, acc); break;                                               \
    case 11: gemm_tile(NG, 11, w0p, w1p, stride, P, xt, ldx, acc); break;                                               \
    case 12: gemm_tile(NG, 12, w0p, w1p, stride, P, xt, ldx, acc); break;                                               \
    case 13: gemm_tile(NG, 13, w0p, w1p, stride, P, xt, ldx, acc); break;                                               \
    default: gemm_tile(NG, 14, w0p, w1p, stride, P, xt, ldx, acc); break;                                               \
    }

enum { GEMM_TT = 14 };

void dsv4_avx512bf16_gemmb_i16(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y,
                               int ldy, uint16_t *panel)
{
    int    kind = kind_of(w), g_end = (o1 + w->row_off + 15) / 16;
    size_t P    = (size_t)w->n_in / 2;
    for (int g = (o0 + w->row_off) / 16; g < g_end; g += 2) {
        int ng = g_end - g >= 2 ? 2 : 1;
        /* BF16 tiles are read where they are; FP8/FP4 are decoded once into the panel */
        const uint16_t *w0p = panel, *w1p = panel + 32;
        size_t          stride = 64;
        if (kind == I16_FP8) i16_panel(I16_FP8, w, g, ng, panel);
        else if (kind == I16_FP4) i16_panel(I16_FP4, w, g, ng, panel);
        else {
            w0p    = (const uint16_t *)dsv4_i16_w(w) + (size_t)g * P * 32;
            w1p    = w0p + P * 32;
            stride = 32;
        }
        for (int t0 = 0; t0 < nt; t0 += GEMM_TT) {
            __m512          acc[2][14];
            const uint16_t *xt = x + (size_t)t0 * (size_t)ldx;
            int             n  = nt - t0 < GEMM_TT ? nt - t0 : GEMM_TT;
            if (ng == 2) {
                GEMM_NT(2)
            } else {
                GEMM_NT(1)
            }
            for (int t = 0; t < n; t++)
                for (int i = 0; i < ng; i++)
                    store_group(w, g + i, o0, o1, y + (size_t)(t0 + t) * (size_t)ldy, acc[i][t]);
        }
    }
}
