/*
 * x86_fp4_exact.c - the FP4 projections of the avx2-int sub-level (fp4_exact.h has the
 * numerics and the activation layout): AVX2 + FMA, with an AVX-VNNI and an AVX-512 VNNI (VL)
 * variant of the integer dot product where the CPU has one. Compiled with -mavx2 -mfma
 * -mf16c; only called after the CPU check (cpu.c).
 *
 * Two routes, the same bits (tested against dsv4_fp4x_dot_ref in test_kernels):
 *   - GEMV (fewer than gmin tokens): the nibbles of a 32-block become int16 256 w2 through
 *     one VPSHUFB (I4_DEC), and each lane's S = sum w2 xi is one int32 chain of four int16 dot
 *     products against the token's [H0 H1 L0 L1] (256 w2 x H = 512 w2 hi, w2 x L): one
 *     conversion and one FMA by the block scale per 32 weights and token. Vector ALU uops per
 *     32 weights and row: 7 to decode, 9 per token (AVX2: 4 VPMADDWD, 3 VPADDD, CVT, FMA) or 6
 *     (VNNI: VPMADDWD, 3 VPDPWSSD, CVT, FMA), against 22 for the avx2 level's f32 decode.
 *   - GEMM (gmin tokens or more): four rows' w2 decoded once per 256 inputs to f32 in F's lane
 *     order, then per (row, token, block) S = four exact f32 products summed exactly (|S| <
 *     2^24) and the same FMA by the block scale: 5 FP operations per 4 products where the
 *     avx2 level's GEMM spends 4.
 */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/fp4_exact.h"

#include "backend/cpu/x86_fp4_exact.h"

/* A block's decoded weights: w = 256 w2 (against H), u = w2 (against L). */
struct i4_w {
    __m256i w0, w1, u0, u1;
};

INL struct i4_w i4_load(const uint8_t *p)
{
    struct i4_w r;
    i4_dec(p, &r.w0, &r.w1);
    r.u0 = _mm256_srai_epi16(r.w0, 8);
    r.u1 = _mm256_srai_epi16(r.w1, 8);
    return r;
}

/* The lanes' S of one block against one token's [H0 H1 L0 L1]. */
INL __m256i i4_dot_avx2(const struct i4_w *w, const __m256i *h)
{
    __m256i hi = _mm256_add_epi32(_mm256_madd_epi16(w->w0, _mm256_loadu_si256(h)), _mm256_madd_epi16(w->w1, _mm256_loadu_si256(h + 1)));
    __m256i lo = _mm256_add_epi32(_mm256_madd_epi16(w->u0, _mm256_loadu_si256(h + 2)), _mm256_madd_epi16(w->u1, _mm256_loadu_si256(h + 3)));
    return _mm256_add_epi32(hi, lo);
}

__attribute__((target("avxvnni"))) INL __m256i i4_dot_vnni(const struct i4_w *w, const __m256i *h)
{
    __m256i acc = _mm256_madd_epi16(w->u0, _mm256_loadu_si256(h + 2));
    acc         = _mm256_dpwssd_avx_epi32(acc, w->u1, _mm256_loadu_si256(h + 3));
    acc         = _mm256_dpwssd_avx_epi32(acc, w->w0, _mm256_loadu_si256(h));
    return _mm256_dpwssd_avx_epi32(acc, w->w1, _mm256_loadu_si256(h + 1));
}

__attribute__((target("avx512vnni,avx512vl"))) INL __m256i i4_dot_v512(const struct i4_w *w, const __m256i *h)
{
    __m256i acc = _mm256_madd_epi16(w->u0, _mm256_loadu_si256(h + 2));
    acc         = _mm256_dpwssd_epi32(acc, w->u1, _mm256_loadu_si256(h + 3));
    acc         = _mm256_dpwssd_epi32(acc, w->w0, _mm256_loadu_si256(h));
    return _mm256_dpwssd_epi32(acc, w->w1, _mm256_loadu_si256(h + 1));
}

/* The GEMV: R (4, 2 or 1) rows from ow against NT (<= 4) tokens, y[t * ldy + o + r]; PF: prefetch
 * rows ow..ow+3 ahead. DOT is one of the i4_dot_* (R, NT, PF and DOT are compile-time constants
 * after inlining). R x NT accumulators stay live: 4 x 4 would spill AVX2's 16 registers. */
#define I4_ROWS(NAME, DOT, TGT)                                                                                    \
    TGT INL void NAME(const struct dsv4_linear *w, int R, int NT, bool PF, int ow, const float *x, int ldx, float *y, \
                      int ldy, int o)                                                                              \
    {                                                                                                              \
        int            K = w->n_in, nb = K / 32;                                                                   \
        const uint8_t *wr[4], *er[4];                                                                              \
        const __m256i *A[4];                                                                                       \
        const int32_t *E[4];                                                                                       \
        __m256         acc[4][4];                                                                                  \
        for (int r = 0; r < R; r++) {                                                                              \
            wr[r] = (const uint8_t *)w->w + (size_t)(ow + r) * (size_t)(K / 2);                                    \
            er[r] = (const uint8_t *)w->scale + (size_t)(ow + r) * (size_t)nb;                                     \
            for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();                                          \
        }                                                                                                          \
        for (int t = 0; t < NT; t++) {                                                                             \
            A[t] = (const __m256i *)(const void *)(x + (size_t)t * (size_t)ldx);                                   \
            E[t] = (const int32_t *)(const void *)(x + (size_t)t * (size_t)ldx + dsv4_fp4x_e_off(K));              \
        }                                                                                                          \
        for (int b = 0; b < nb; b++) {                                                                             \
            const float *tp[4];                                                                                    \
            if (PF) i4_prefetch4(w, ow, b * 32);                                                                   \
            for (int t = 0; t < NT; t++) tp[t] = dsv4_fp4x_sc + DSV4_FP4X_SC_OFF + E[t][b];                    \
            for (int r = 0; r < R; r++) { /* one row's decode live at a time: 4 registers, not 16 */               \
                struct i4_w wd = i4_load(wr[r] + (size_t)b * 16);                                                  \
                for (int t = 0; t < NT; t++)                                                                       \
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT(&wd, A[t] + (size_t)b * 4)),                \
                                                _mm256_broadcast_ss(tp[t] + er[r][b]), acc[r][t]);                 \
            }                                                                                                      \
        }                                                                                                          \
        for (int r = 0; r < R; r++)                                                                                \
            for (int t = 0; t < NT; t++) y[(size_t)t * (size_t)ldy + (size_t)(o + r)] = i4_hsum(acc[r][t]);        \
    }

#define TGT_PLAIN
#define TGT_VNNI __attribute__((target("avxvnni")))
#define TGT_V512 __attribute__((target("avx512vnni,avx512vl")))
I4_ROWS(i4_rows_avx2, i4_dot_avx2, TGT_PLAIN)
I4_ROWS(i4_rows_vnni, i4_dot_vnni, TGT_VNNI)
I4_ROWS(i4_rows_v512, i4_dot_v512, TGT_V512)

/* ------------------------------------------------------------------ the GEMM route */

enum { I4_KC = 256, I4_TG = 24, I4_TN = 2 };

/* w2 of rows ow..ow+3, inputs [k0, k1), as f32 in F's lane order into p[r * I4_KC + k - k0], and
 * the blocks' scale bytes into e[r * 8 + (k - k0) / 32]: vector 0 of a block is the even words
 * of w0 (inputs [0 4 8 12 | 1 5 9 13]), vector 1 its odd words, vectors 2 and 3 those of w1. */
INL void i4_decode4(const struct dsv4_linear *w, int ow, int k0, int k1, float *p, uint8_t *e)
{
    int nb = w->n_in / 32;
    for (int kb = k0; kb < k1; kb += 32) {
        i4_prefetch4(w, ow, kb);
        for (int r = 0; r < 4; r++) {
            __m256i w0, w1;
            i4_dec((const uint8_t *)w->w + ((size_t)(ow + r) * (size_t)w->n_in + (size_t)kb) / 2, &w0, &w1);
            float *q = p + r * I4_KC + (kb - k0);
            _mm256_storeu_ps(q, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(w0, 16), 24)));
            _mm256_storeu_ps(q + 8, _mm256_cvtepi32_ps(_mm256_srai_epi32(w0, 24)));
            _mm256_storeu_ps(q + 16, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(w1, 16), 24)));
            _mm256_storeu_ps(q + 24, _mm256_cvtepi32_ps(_mm256_srai_epi32(w1, 24)));
            e[r * 8 + (kb - k0) / 32] = ((const uint8_t *)w->scale)[(size_t)(ow + r) * (size_t)nb + (size_t)(kb / 32)];
        }
    }
}

/* NT (<= I4_TN) tokens against the four buffered rows, blocks [b0, b0 + n_b) of the row; the
 * tokens' rows in the layout at x (stride ldx); acc[r * I4_TG + t]. */
INL void i4_tile4(int NT, const float *p, const uint8_t *e, int b0, int n_b, int K, const float *x, int ldx,
                  __m256 *acc)
{
    __m256 a[4][I4_TN];
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < NT; t++) a[r][t] = acc[r * I4_TG + t];
    for (int i = 0; i < n_b; i++) {
        int b = b0 + i;
        for (int t = 0; t < NT; t++) {
            const float   *row = x + (size_t)t * (size_t)ldx;
            const float   *f   = row + dsv4_fp4x_f_off(K) + (size_t)b * 32;
            const int32_t *E   = (const int32_t *)(const void *)(row + dsv4_fp4x_e_off(K));
            const float   *tp  = dsv4_fp4x_sc + DSV4_FP4X_SC_OFF + E[b];
            __m256 x0 = _mm256_loadu_ps(f), x1 = _mm256_loadu_ps(f + 8), x2 = _mm256_loadu_ps(f + 16),
                   x3 = _mm256_loadu_ps(f + 24);
            for (int r = 0; r < 4; r++) {
                const float *q = p + r * I4_KC + i * 32;
                __m256       s = _mm256_mul_ps(_mm256_loadu_ps(q), x0);
                s              = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8), x1, s);
                s              = _mm256_fmadd_ps(_mm256_loadu_ps(q + 16), x2, s);
                s              = _mm256_fmadd_ps(_mm256_loadu_ps(q + 24), x3, s);
                a[r][t]        = _mm256_fmadd_ps(s, _mm256_broadcast_ss(tp + e[r * 8 + i]), a[r][t]);
            }
        }
    }
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < NT; t++) acc[r * I4_TG + t] = a[r][t];
}

/* Rows [o0, q1) (a multiple of 4) against nt tokens: four rows decoded once per I4_KC inputs
 * for up to I4_TG tokens, swept by 4 x I4_TN tiles. */
static void i4_gemm(const struct dsv4_linear *w, int o0, int q1, int nt, const float *x, int ldx, float *y, int ldy)
{
    float   p[4 * I4_KC] __attribute__((aligned(64)));
    uint8_t e[4 * 8];
    __m256  acc[4 * I4_TG];
    int     K = w->n_in;
    for (int t0 = 0; t0 < nt; t0 += I4_TG) {
        int tn = nt - t0 < I4_TG ? nt - t0 : I4_TG;
        for (int o = o0; o < q1; o += 4) {
            int ow = o + w->row_off;
            for (int i = 0; i < 4 * I4_TG; i++) acc[i] = _mm256_setzero_ps();
            for (int k0 = 0; k0 < K; k0 += I4_KC) {
                int k1 = k0 + I4_KC < K ? k0 + I4_KC : K;
                i4_decode4(w, ow, k0, k1, p, e);
                for (int t = 0; t < tn; t += I4_TN) {
                    const float *xt = x + (size_t)(t0 + t) * (size_t)ldx;
                    if (tn - t >= 2) i4_tile4(2, p, e, k0 / 32, (k1 - k0) / 32, K, xt, ldx, acc + t);
                    else i4_tile4(1, p, e, k0 / 32, (k1 - k0) / 32, K, xt, ldx, acc + t);
                }
            }
            for (int r = 0; r < 4; r++)
                for (int t = 0; t < tn; t++) y[(size_t)(t0 + t) * (size_t)ldy + (size_t)(o + r)] = i4_hsum(acc[r * I4_TG + t]);
        }
    }
}

/* ------------------------------------------------------------------ entry points */

/* NT tokens in groups of 4 against R rows from o (R a constant after inlining). */
#define I4_TOKENS(ROWS, R)                                                                                         \
    for (int t0 = 0; t0 < nt; t0 += 4) {                                                                           \
        const float *xt = x + (size_t)t0 * (size_t)ldx;                                                            \
        float       *yt = y + (size_t)t0 * (size_t)ldy;                                                            \
        int          ow = o + w->row_off;                                                                          \
        switch (nt - t0 < 4 ? nt - t0 : 4) {                                                                       \
        case 1: ROWS(w, R, 1, R == 4, ow, xt, ldx, yt, ldy, o); break;                                             \
        case 2: ROWS(w, R, 2, R == 4, ow, xt, ldx, yt, ldy, o); break;                                             \
        case 3:                                                                                                    \
            if (R == 4) { /* two pairs of rows: 6 accumulators each */                                             \
                ROWS(w, 2, 3, true, ow, xt, ldx, yt, ldy, o);                                                      \
                ROWS(w, 2, 3, false, ow + 2, xt, ldx, yt, ldy, o + 2);                                             \
            } else ROWS(w, R, 3, false, ow, xt, ldx, yt, ldy, o);                                                  \
            break;                                                                                                 \
        default:                                                                                                   \
            if (R == 4) {                                                                                          \
                ROWS(w, 2, 4, true, ow, xt, ldx, yt, ldy, o);                                                      \
                ROWS(w, 2, 4, false, ow + 2, xt, ldx, yt, ldy, o + 2);                                             \
            } else ROWS(w, R, 4, false, ow, xt, ldx, yt, ldy, o);                                                  \
            break;                                                                                                 \
        }                                                                                                          \
    }

/* The table's dot_fp4 on the layout: the GEMM from gmin tokens on (rows in fours), the GEMV
 * below it and for the last o1 - o0 mod 4 rows (the same bits either way). */
#define I4_DOT_ENTRY(NAME, ROWS, TGT)                                                                              \
    TGT void NAME(const struct dsv4_linear *w, int o0, int o1, int nt, const float *x, int ldx, float *y, int ldy,  \
                  int gmin)                                                                                        \
    {                                                                                                              \
        int o = o0, q1 = o0 + (o1 - o0) / 4 * 4;                                                                   \
        if (nt >= gmin) {                                                                                          \
            i4_gemm(w, o0, q1, nt, x, ldx, y, ldy);                                                                \
            o = q1;                                                                                                \
        }                                                                                                          \
        for (; o < q1; o += 4) I4_TOKENS(ROWS, 4)                                                                  \
        for (; o < o1; o++) I4_TOKENS(ROWS, 1)                                                                     \
    }

I4_DOT_ENTRY(dsv4_fp4x_dot_avx2, i4_rows_avx2, TGT_PLAIN)
I4_DOT_ENTRY(dsv4_fp4x_dot_vnni, i4_rows_vnni, TGT_VNNI)
I4_DOT_ENTRY(dsv4_fp4x_dot_v512, i4_rows_v512, TGT_V512)

/* ------------------------------------------------------------------ the activation layout */

/* One row of n activations quantised (the avx2 level's quant_f32: e4m3 per group of B, the reference's
 * bits) and written in the layout: the dequantised values go to F first, then each 32-block
 * is read back from F and written as A and F. */
void dsv4_fp4x_quant_avx2(const float *x, int n, int B, float *out)
{
    float   *F = out + dsv4_fp4x_f_off(n);
    int32_t *E = (int32_t *)(void *)(out + dsv4_fp4x_e_off(n));
    int16_t *A = (int16_t *)(void *)out;
    dsv4_kernels_avx2.quant_f32(x, n, B, F);
    const __m256  absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256  lim  = _mm256_set1_ps(262144.0f), fmax = _mm256_set1_ps(3.4028235e38f);
    const __m256i evod = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7), ilv = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i m511 = _mm256_set1_epi32(511);
    for (int g0 = 0; g0 < n; g0 += B) {
        int    len  = n - g0 < B ? n - g0 : B;
        __m256 amax = _mm256_setzero_ps();
        for (int k = 0; k < len; k += 8) {
            __m256 a = _mm256_and_ps(_mm256_loadu_ps(F + g0 + k), absm);
            amax     = _mm256_max_ps(_mm256_and_ps(a, _mm256_cmp_ps(a, fmax, _CMP_LE_OQ) /* finite ones */), amax);
        }
        float am[8], mx = 0;
        _mm256_storeu_ps(am, amax);
        for (int i = 0; i < 8; i++) mx = am[i] > mx ? am[i] : mx;
        int ex = 0; /* ilogb(mx) - 17, from the bits (subnormals: the mantissa's leading bit) */
        if (mx > 0) {
            uint32_t bits;
            memcpy(&bits, &mx, 4);
            int be = (int)(bits >> 23) & 255;
            ex     = (be ? be - 127 : -118 - __builtin_clz(bits)) - 17;
        }
        for (int b = g0; b < g0 + len; b += 32) E[b / 32] = ex;
        /* 2^-ex as two factors, each representable (|ex| <= 166); both products exact */
        int    h1 = -ex / 2, h2 = -ex - h1;
        __m256 m1 = _mm256_set1_ps(0), m2 = m1;
        {
            uint32_t u1 = (uint32_t)(h1 + 127) << 23, u2 = (uint32_t)(h2 + 127) << 23;
            float    f1, f2;
            memcpy(&f1, &u1, 4);
            memcpy(&f2, &u2, 4);
            m1 = _mm256_set1_ps(f1);
            m2 = _mm256_set1_ps(f2);
        }
        for (int b = g0; b < g0 + len; b += 32) {
            __m256i xi[4];
            __m256  g[4];
            for (int j = 0; j < 4; j++) {
                __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(F + b + 8 * j), m1), m2);
                __m256 ok = _mm256_cmp_ps(_mm256_and_ps(v, absm), lim, _CMP_LT_OQ); /* finite, in range */
                xi[j]     = _mm256_cvtps_epi32(_mm256_and_ps(v, ok));
                g[j]      = _mm256_cvtepi32_ps(xi[j]); /* +0 for -0, as the plain C writes it */
            }
            int16_t *blk = A + (size_t)b * 2;
            for (int h = 0; h < 2; h++) { /* inputs 0..15 -> H0, L0; 16..31 -> H1, L1 */
                __m256i p0 = _mm256_permutevar8x32_epi32(xi[2 * h], evod), p1 = _mm256_permutevar8x32_epi32(xi[2 * h + 1], evod);
                __m256i hi = _mm256_packs_epi32(_mm256_slli_epi32(_mm256_srai_epi32(p0, 9), 1),
                                                _mm256_slli_epi32(_mm256_srai_epi32(p1, 9), 1));
                __m256i lo = _mm256_packs_epi32(_mm256_and_si256(p0, m511), _mm256_and_si256(p1, m511));
                _mm256_storeu_si256((__m256i *)(void *)(blk + 16 * h), hi);
                _mm256_storeu_si256((__m256i *)(void *)(blk + 32 + 16 * h), lo);
            }
            for (int h = 0; h < 2; h++) { /* F: vectors 2h, 2h + 1 from inputs 16h..16h+15 */
                __m256 lo = _mm256_unpacklo_ps(g[2 * h], g[2 * h + 1]), hi = _mm256_unpackhi_ps(g[2 * h], g[2 * h + 1]);
                _mm256_storeu_ps(F + b + 16 * h, _mm256_permutevar8x32_ps(lo, ilv));
                _mm256_storeu_ps(F + b + 16 * h + 8, _mm256_permutevar8x32_ps(hi, ilv));
            }
        }
    }
}
