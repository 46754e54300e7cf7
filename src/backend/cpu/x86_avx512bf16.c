/*
 * x86_avx512bf16.c - projection kernels on VDPBF16PS (AVX512-BF16): 32 products per
 * instruction, f32 accumulation.
 *
 * Exactness: every weight value of the release (e4m3, e2m1, bf16) is exactly a bf16, and so
 * is every activation that reaches a projection (quantised activations are e4m3 values times
 * a power of two; the others are bf16 tensors). The weights are converted to bf16 bit
 * patterns with integer operations and kept normal (VDPBF16PS treats denormal inputs as
 * zero): e4m3 subnormals (7 codes per sign) go through a small table. Block scales multiply
 * the per-block partial sums, as in the reference.
 *
 * Shapes as in cpu.h, except that x is bf16 ([nt, ldx] uint16).
 */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/x86_avx512_e4m3.h"
#include "backend/cpu/x86_bf16_conv.h"

static inline float scale_at(const struct dsv4_linear *w, size_t idx)
{
    if (w->scale_f32) {
        float s;
        memcpy(&s, (const uint8_t *)w->scale + idx * 4, 4);
        return s;
    }
    uint8_t e = ((const uint8_t *)w->scale)[idx];
    if (e == 0) return 0x1p-127f;
    uint32_t bits = (uint32_t)e << 23;
    float    f;
    memcpy(&f, &bits, 4);
    return f;
}

/*
 * FP4 with its per-32 scale folded into the lookup table: vpermw reads the low 5 bits of each
 * index, so the 16-entry e2m1 table is stored twice (entries 16-31 repeat 0-15) and the index
 * needs no masking: dword i of (b | b << 12), b = byte i, has the low nibble in its low word
 * (bit 4, from the high nibble, picks the copy) and the high nibble in its high word. The
 * scale 2^(e-127) is added to the exponent field of the table's non-zero entries (exact while
 * the results stay normal; see foldable/odd below), once per 32 weights instead of once per
 * weight.
 */
/* The table of block j (0..15) of a chunk whose exponent adds (e - 127) << 7 are the words of adds. */
static inline __attribute__((always_inline)) __m512i fp4_table(__m512i base, __m512i adds, int j)
{
    __m512i add = _mm512_permutexvar_epi16(_mm512_set1_epi16((short)j), adds);
    return _mm512_mask_add_epi16(base, (__mmask32)E2M1_NONZERO, base, add);
}

/* 16 packed bytes -> 32 bf16 (low nibble first) through the (scaled) table tab. */
static inline __attribute__((always_inline)) __m512i e2m1_lut(const uint8_t *p, __m512i tab)
{
    __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm512_permutexvar_epi16(_mm512_or_si512(d, _mm512_slli_epi32(d, 12)), tab);
}

/* Exponent adds of up to 16 consecutive scale bytes (words 0..n-1), and whether any of them
 * is outside the folding range [10, 240] (such a chunk takes the partial-sum path). */
static inline __attribute__((always_inline)) __m512i fp4_adds(const uint8_t *sc, int n, bool *odd)
{
    __m512i e = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8((__mmask32)((1u << n) - 1), sc));
    __mmask32 live = (__mmask32)((1u << n) - 1);
    *odd = _mm512_mask_cmpgt_epu16_mask(live, _mm512_sub_epi16(e, _mm512_set1_epi16(10)), _mm512_set1_epi16(230)) != 0;
    return _mm512_slli_epi16(_mm512_sub_epi16(e, _mm512_set1_epi16(127)), 7);
}

/* kind: 0 fp8, 1 fp4, 2 bf16 */
static inline __attribute__((always_inline)) __m512i load_w(const struct dsv4_linear *w, int kind, int ow, int k)
{
    if (kind == 0) return e4m3_bf16((const uint8_t *)w->w + (size_t)ow * (size_t)w->n_in + (size_t)k);
    if (kind == 1) return e2m1_bf16((const uint8_t *)w->w + (size_t)ow * (size_t)(w->n_in / 2) + (size_t)(k / 2));
    return _mm512_loadu_si512((const uint16_t *)w->w + (size_t)ow * (size_t)w->n_in + (size_t)k);
}

static inline __attribute__((always_inline)) float bscale(const struct dsv4_linear *w, int kind, int ow, int kb)
{
    if (kind == 0) return scale_at(w, dsv4_fp8_scale_index(w, ow, kb));
    return scale_at(w, (size_t)ow * (size_t)(w->n_in / 32) + (size_t)(kb / 32));
}

static float tail(const struct dsv4_linear *w, int ow, int k0, const uint16_t *x)
{
    float acc = 0;
    for (int k = k0; k < w->n_in; k++)
        acc += dsv4_f32_from_bf16(((const uint16_t *)w->w)[(size_t)ow * (size_t)w->n_in + (size_t)k]) * dsv4_f32_from_bf16(x[k]);
    return acc;
}

/* Four rows against NT tokens; block partial sums scaled into the totals. */
static inline __attribute__((always_inline)) void rows4(const struct dsv4_linear *w, int kind, int NT, int ow,
                                                        const uint16_t *x, int ldx, float *y, int ldy, int o)
{
    int    kmax = w->n_in / 32 * 32, bk = kind == 0 ? w->block : kind == 1 ? 32 : kmax;
    __m512 tot[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) tot[r][t] = _mm512_setzero_ps();
    for (int kb = 0; kb < kmax; kb += bk) {
        __m512 blk[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) blk[r][t] = _mm512_setzero_ps();
        for (int k = kb; k < kb + bk; k += 32) {
            __m512i wv[4];
            if (kind == 2) /* BF16 rows: 4 x 64 bytes a step (see prefetch_next) */
                prefetch_next((const uint8_t *)w->w + (size_t)(ow + 4) * (size_t)w->n_in * 2, 8 * (size_t)k, 4);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) wv[r] = load_w(w, kind, ow + r, k);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                __m512i xv = _mm512_loadu_si512(x + (size_t)t * (size_t)ldx + (size_t)k);
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) blk[r][t] = _mm512_dpbf16_ps(blk[r][t], as_bh(wv[r]), as_bh(xv));
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            __m512 s = kind <= 1 ? _mm512_set1_ps(bscale(w, kind, ow + r, kb)) : _mm512_set1_ps(1.0f);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) tot[r][t] = _mm512_fmadd_ps(blk[r][t], s, tot[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            float v = _mm512_reduce_add_ps(tot[r][t]);
            if (kmax < w->n_in) v += tail(w, ow + r, kmax, x + (size_t)t * (size_t)ldx);
            y[(size_t)t * (size_t)ldy + (size_t)(o + r)] = v;
        }
}

static void row1(const struct dsv4_linear *w, int kind, int ow, int nt, const uint16_t *x, int ldx, float *y, int ldy,
                 int o)
{
    int kmax = w->n_in / 32 * 32, bk = kind == 0 ? w->block : kind == 1 ? 32 : kmax;
    for (int t = 0; t < nt; t++) {
        const uint16_t *xt  = x + (size_t)t * (size_t)ldx;
        __m512          tot = _mm512_setzero_ps();
        for (int kb = 0; kb < kmax; kb += bk) {
            __m512 blk = _mm512_setzero_ps();
            for (int k = kb; k < kb + bk; k += 32)
                blk = _mm512_dpbf16_ps(blk, as_bh(load_w(w, kind, ow, k)), as_bh(_mm512_loadu_si512(xt + k)));
            float s = kind <= 1 ? bscale(w, kind, ow, kb) : 1.0f;
            tot     = _mm512_fmadd_ps(blk, _mm512_set1_ps(s), tot);
        }
        float v = _mm512_reduce_add_ps(tot);
        if (kmax < w->n_in) v += tail(w, ow, kmax, xt);
        y[(size_t)t * (size_t)ldy + (size_t)o] = v;
    }
}

/*
 * FP8 and FP4 with e8m0 scales: the block scale (BxB for FP8, B = w->block, 1x32 for FP4) is applied to
 * the decoded bf16 weights by adding to their exponent field (exact for power-of-two scales),
 * so every 32 weights are one VDPBF16PS straight into the totals, with no per-block partial
 * sum. This is also exactly what the GEMM path computes from its dequantised panels (same
 * bf16 weights, same order of VDPBF16PS per output lane, same final reduction), so a row's
 * result does not depend on how many tokens share the call: the forward pass stays chunk-
 * and batch-invariant (docs/SERVING.md). Exponents outside [10, 240] (never in real
 * checkpoints) would leave the bf16 normal range: such a block takes the partial-sum path.
 */
static inline __attribute__((always_inline)) unsigned fold_exp(const struct dsv4_linear *w, int kind, int row, int kb)
{
    if (kind == 0) return ((const uint8_t *)w->scale)[dsv4_fp8_scale_index(w, row, kb)];
    return ((const uint8_t *)w->scale)[(size_t)row * (size_t)(w->n_in / 32) + (size_t)(kb / 32)];
}

static inline __attribute__((always_inline)) __m512i fold_w(const struct dsv4_linear *w, int kind, int row, int k,
                                                            unsigned e)
{
    __m512i   v  = load_w(w, kind, row, k);
    __mmask32 nz = _mm512_test_epi16_mask(v, _mm512_set1_epi16(0x7fff));
    return _mm512_mask_add_epi16(v, nz, v, _mm512_set1_epi16((short)(((int)e - 127) * 128)));
}

/* True when a projection takes the folded path: e8m0 scales, K a multiple of the block. */
static inline bool foldable(const struct dsv4_linear *w, int kind)
{
    return kind <= 1 && !w->scale_f32 && w->n_in % (kind == 0 ? w->block : 32) == 0;
}

static inline __attribute__((always_inline)) void rows4_fold(const struct dsv4_linear *w, int kind, int NT, int ow,
                                                             const uint16_t *x, int ldx, float *y, int ldy, int o)
{
    int    K = w->n_in, bk = kind == 0 ? w->block : 32;
    __m512 tot[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) tot[r][t] = _mm512_setzero_ps();
    for (int kb = 0; kb < K; kb += bk) {
        unsigned e[4];
        bool     odd = false;
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            e[r] = fold_exp(w, kind, ow + r, kb);
            odd |= e[r] - 10u > 230u;
        }
        if (__builtin_expect(odd, 0)) {
            /* scale outside the safe exponent range: unscaled block sums times the scale */
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                __m512 s = _mm512_set1_ps(bscale(w, kind, ow + r, kb));
                for (int t = 0; t < NT; t++) {
                    __m512 blk = _mm512_setzero_ps();
                    for (int k = kb; k < kb + bk; k += 32)
                        blk = _mm512_dpbf16_ps(blk, as_bh(load_w(w, kind, ow + r, k)),
                                               as_bh(_mm512_loadu_si512(x + (size_t)t * (size_t)ldx + (size_t)k)));
                    tot[r][t] = _mm512_fmadd_ps(blk, s, tot[r][t]);
                }
            }
            continue;
        }
        for (int k = kb; k < kb + bk; k += 32) {
            __m512i wv[4];
            /* 4 rows x 32 codes (FP8) or x 16 bytes (FP4) a step */
            if (kind == 0) prefetch_next((const uint8_t *)w->w + (size_t)(ow + 4) * (size_t)K, 4 * (size_t)k, 2);
            else if ((k & 32) == 0) prefetch_next((const uint8_t *)w->w + (size_t)(ow + 4) * (size_t)(K / 2), 2 * (size_t)k, 2);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) wv[r] = fold_w(w, kind, ow + r, k, e[r]);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                __m512i xv = _mm512_loadu_si512(x + (size_t)t * (size_t)ldx + (size_t)k);
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) tot[r][t] = _mm512_dpbf16_ps(tot[r][t], as_bh(wv[r]), as_bh(xv));
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) y[(size_t)t * (size_t)ldy + (size_t)(o + r)] = _mm512_reduce_add_ps(tot[r][t]);
}

/* One row of the folded path (leftover rows). */
static void row1_fold(const struct dsv4_linear *w, int kind, int ow, int nt, const uint16_t *x, int ldx, float *y,
                      int ldy, int o)
{
    int K = w->n_in, bk = kind == 0 ? w->block : 32;
    for (int t = 0; t < nt; t++) {
        const uint16_t *xt  = x + (size_t)t * (size_t)ldx;
        __m512          tot = _mm512_setzero_ps();
        for (int kb = 0; kb < K; kb += bk) {
            unsigned e = fold_exp(w, kind, ow, kb);
            if (__builtin_expect(e - 10u > 230u, 0)) {
                __m512 blk = _mm512_setzero_ps();
                for (int k = kb; k < kb + bk; k += 32)
                    blk = _mm512_dpbf16_ps(blk, as_bh(load_w(w, kind, ow, k)), as_bh(_mm512_loadu_si512(xt + k)));
                tot = _mm512_fmadd_ps(blk, _mm512_set1_ps(bscale(w, kind, ow, kb)), tot);
                continue;
            }
            for (int k = kb; k < kb + bk; k += 32)
                tot = _mm512_dpbf16_ps(tot, as_bh(fold_w(w, kind, ow, k, e)), as_bh(_mm512_loadu_si512(xt + k)));
        }
        y[(size_t)t * (size_t)ldy + (size_t)o] = _mm512_reduce_add_ps(tot);
    }
}

/*
 * R (1 or 4) FP4 rows against NT (<= 4) tokens, scales folded through the table: per 32
 * weights one table fold and one lookup per row, one VDPBF16PS per row and token, straight
 * into the totals in k order (the same bf16 weights and the same order as rows4_fold and the
 * GEMM panels, so the same bits). A block whose exponent is outside [10, 240] is summed
 * unscaled and its scale multiplied in, decided per row and block as row1_fold does.
 */
static inline __attribute__((always_inline)) void rows_fp4(int R, int NT, const struct dsv4_linear *w, int ow,
                                                           const uint16_t *x, int ldx, float *y, int ldy, int o)
{
    int            K = w->n_in, nb = K / 32;
    const uint8_t *wq = w->w, *sc = w->scale;
    const __m512i  base = _mm512_loadu_si512(e2m1_twice);
    __m512         tot[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) tot[r][t] = _mm512_setzero_ps();
    /* the next group's scales (4 rows x nb bytes) are needed at once when it starts */
    if (R == 4) prefetch_next(sc + (size_t)(ow + 4) * (size_t)nb, 0, (4 * nb + 63) / 64);
    for (int b0 = 0; b0 < nb; b0 += 16) {
        int     n = nb - b0 < 16 ? nb - b0 : 16;
        __m512i adds[4];
        bool    odd = false;
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            bool od;
            adds[r] = fp4_adds(sc + (size_t)(ow + r) * (size_t)nb + (size_t)b0, n, &od);
            odd |= od;
        }
        if (__builtin_expect(odd, 0)) {
            for (int r = 0; r < R; r++)
                for (int j = 0; j < n; j++) {
                    int            k  = (b0 + j) * 32;
                    unsigned       e  = sc[(size_t)(ow + r) * (size_t)nb + (size_t)(b0 + j)];
                    const uint8_t *wp = wq + (size_t)(ow + r) * (size_t)(K / 2) + (size_t)(k / 2);
                    for (int t = 0; t < NT; t++) {
                        __m512i xv = _mm512_loadu_si512(x + (size_t)t * (size_t)ldx + (size_t)k);
                        if (e - 10u > 230u) {
                            __m512 blk = _mm512_dpbf16_ps(_mm512_setzero_ps(), as_bh(e2m1_lut(wp, base)), as_bh(xv));
                            tot[r][t]  = _mm512_fmadd_ps(blk, _mm512_set1_ps(scale_at(w, (size_t)(ow + r) * (size_t)nb + (size_t)(b0 + j))), tot[r][t]);
                        } else {
                            tot[r][t] = _mm512_dpbf16_ps(tot[r][t], as_bh(e2m1_lut(wp, fp4_table(base, adds[r], j))), as_bh(xv));
                        }
                    }
                }
            continue;
        }
        for (int j = 0; j < n; j++) {
            int     k = (b0 + j) * 32;
            __m512i wv[4];
            if (R == 4) prefetch_next(wq + (size_t)(ow + 4) * (size_t)(K / 2), 2 * (size_t)k, 1); /* 64 bytes a step */
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                wv[r] = e2m1_lut(wq + (size_t)(ow + r) * (size_t)(K / 2) + (size_t)(k / 2), fp4_table(base, adds[r], j));
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                __m512i xv = _mm512_loadu_si512(x + (size_t)t * (size_t)ldx + (size_t)k);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) tot[r][t] = _mm512_dpbf16_ps(tot[r][t], as_bh(wv[r]), as_bh(xv));
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) y[(size_t)t * (size_t)ldy + (size_t)(o + r)] = _mm512_reduce_add_ps(tot[r][t]);
}

/* FP4 rows [o0, o1) of the folded path: four rows at a time, four tokens at a time. */
static void dot_fp4_folded(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y,
                           int ldy)
{
    int o = o0;
    for (; o + 4 <= o1; o += 4)
        for (int t0 = 0; t0 < nt; t0 += 4) {
            const uint16_t *xt = x + (size_t)t0 * (size_t)ldx;
            float          *yt = y + (size_t)t0 * (size_t)ldy;
            int             ow = o + w->row_off;
            switch (nt - t0 < 4 ? nt - t0 : 4) {
            case 1: rows_fp4(4, 1, w, ow, xt, ldx, yt, ldy, o); break;
            case 2: rows_fp4(4, 2, w, ow, xt, ldx, yt, ldy, o); break;
            case 3: rows_fp4(4, 3, w, ow, xt, ldx, yt, ldy, o); break;
            default: rows_fp4(4, 4, w, ow, xt, ldx, yt, ldy, o); break;
            }
        }
    for (; o < o1; o++)
        for (int t = 0; t < nt; t++)
            rows_fp4(1, 1, w, o + w->row_off, x + (size_t)t * (size_t)ldx, ldx, y + (size_t)t * (size_t)ldy, ldy, o);
}

static inline __attribute__((always_inline)) void dot(int kind, const struct dsv4_linear *w, int o0, int o1, int nt,
                                                      const uint16_t *x, int ldx, float *y, int ldy)
{
    int o = o0;
    for (; o + 4 <= o1; o += 4) {
        int ow = o + w->row_off;
        for (int t0 = 0; t0 < nt; t0 += 4) {
            const uint16_t *xt = x + (size_t)t0 * (size_t)ldx;
            float          *yt = y + (size_t)t0 * (size_t)ldy;
            if (foldable(w, kind)) {
                switch (nt - t0 < 4 ? nt - t0 : 4) {
                case 1: rows4_fold(w, kind, 1, ow, xt, ldx, yt, ldy, o); break;
                case 2: rows4_fold(w, kind, 2, ow, xt, ldx, yt, ldy, o); break;
                case 3: rows4_fold(w, kind, 3, ow, xt, ldx, yt, ldy, o); break;
                default: rows4_fold(w, kind, 4, ow, xt, ldx, yt, ldy, o); break;
                }
                continue;
            }
            switch (nt - t0 < 4 ? nt - t0 : 4) {
            case 1: rows4(w, kind, 1, ow, xt, ldx, yt, ldy, o); break;
            case 2: rows4(w, kind, 2, ow, xt, ldx, yt, ldy, o); break;
            case 3: rows4(w, kind, 3, ow, xt, ldx, yt, ldy, o); break;
            default: rows4(w, kind, 4, ow, xt, ldx, yt, ldy, o); break;
            }
        }
    }
    for (; o < o1; o++) {
        if (foldable(w, kind)) row1_fold(w, kind, o + w->row_off, nt, x, ldx, y, ldy, o);
        else row1(w, kind, o + w->row_off, nt, x, ldx, y, ldy, o);
    }
}

static void dotb_fp8(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y, int ldy)
{
    dot(0, w, o0, o1, nt, x, ldx, y, ldy);
}

static void dotb_fp4(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y, int ldy)
{
    if (foldable(w, 1)) dot_fp4_folded(w, o0, o1, nt, x, ldx, y, ldy);
    else dot(1, w, o0, o1, nt, x, ldx, y, ldy);
}

static void dotb_bf16(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y, int ldy)
{
    dot(2, w, o0, o1, nt, x, ldx, y, ldy);
}

/* ------------------------------------------------------------------ prefill GEMM */

/* Rows [ow, ow + n) of an FP8 or FP4 W as bf16 values with their block scales folded in
 * (exact: scales are powers of two, so only e8m0 scales take this path) into panel[n, n_in].
 * False, leaving the panel partial, when a block's exponent is outside the folding range
 * [10, 240]: the caller then takes the GEMV kernels for these rows, which give such blocks
 * the partial-sum treatment (never seen in real checkpoints; kept for exactness). */
static bool dequant_panel(const struct dsv4_linear *w, int ow, int n, uint16_t *panel)
{
    int            K = w->n_in, B = w->block;
    const uint8_t *sc = w->scale;
    const __m512i  base = _mm512_loadu_si512(e2m1_twice);
    for (int r = 0; r < n; r++) {
        uint16_t *dst = panel + (size_t)r * (size_t)K;
        int       row = ow + r;
        if (w->fmt == DSV4_WFMT_FP4) {
            const uint8_t *wr = (const uint8_t *)w->w + (size_t)row * (size_t)(K / 2);
            for (int b0 = 0; b0 < K / 32; b0 += 16) {
                int     nb = K / 32 - b0 < 16 ? K / 32 - b0 : 16;
                bool    odd;
                __m512i adds = fp4_adds(sc + (size_t)row * (size_t)(K / 32) + (size_t)b0, nb, &odd);
                if (odd) return false;
                for (int j = 0; j < nb; j++) {
                    if ((j & 3) == 0) _mm_prefetch((const char *)wr + (b0 + j) * 16 + 1024, _MM_HINT_T0);
                    _mm512_storeu_si512(dst + (b0 + j) * 32, e2m1_lut(wr + (b0 + j) * 16, fp4_table(base, adds, j)));
                }
            }
            continue;
        }
        for (int kb = 0; kb < K; kb += B) {
            unsigned e = sc[dsv4_fp8_scale_index(w, row, kb)];
            if (e - 10u > 230u) return false;
            /* a power-of-two scale multiplies a bf16 by adding to its exponent field */
            __m512i add = _mm512_set1_epi16((short)(((int)e - 127) * 128));
            for (int k = kb; k < kb + B && k < K; k += 32) {
                /* rows are contiguous: 1 KiB ahead runs on into the next row */
                _mm_prefetch((const char *)w->w + (size_t)row * (size_t)K + (size_t)k + 1024, _MM_HINT_T0);
                __m512i   v  = e4m3_bf16((const uint8_t *)w->w + (size_t)row * (size_t)K + (size_t)k);
                __mmask32 nz = _mm512_test_epi16_mask(v, _mm512_set1_epi16(0x7fff));
                _mm512_storeu_si512(dst + k, _mm512_mask_add_epi16(v, nz, v, add));
            }
        }
    }
    return true;
}

/* C[t, o] for 4 panel rows x NT (<= 6) tokens over K (multiple of 32): 24 accumulators,
 * 4 weight and 6 token loads per 24 VDPBF16PS. */
static inline __attribute__((always_inline)) void tile4(int NT, const uint16_t *wp, int K, const uint16_t *x, int ldx,
                                                        float *y, int ldy, int o, const uint8_t *pf)
{
    __m512 a[4][6];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 6
        for (int t = 0; t < 6; t++) a[r][t] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 32) {
        __m512i wv[4];
        if (pf) prefetch_next(pf, 8 * (size_t)k, 4); /* 4 rows x 64 bytes a step */
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) wv[r] = _mm512_loadu_si512(wp + (size_t)r * (size_t)K + (size_t)k);
#pragma GCC unroll 6
        for (int t = 0; t < NT; t++) {
            __m512i xv = _mm512_loadu_si512(x + (size_t)t * (size_t)ldx + (size_t)k);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) a[r][t] = _mm512_dpbf16_ps(a[r][t], as_bh(wv[r]), as_bh(xv));
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 6
        for (int t = 0; t < NT; t++) y[(size_t)t * (size_t)ldy + (size_t)(o + r)] = _mm512_reduce_add_ps(a[r][t]);
}

/* Tokens per block of the sweep: a block of token rows (GEMM_TB * n_in bf16, 192 KiB at
 * n_in = 4096) stays in L2 while the panel's row groups pass over it; without blocking
 * every row group streams all token rows from L3 (measured: 256 tokens at half the
 * throughput of 64). */
enum { GEMM_TB = 24 };

/*
 * Many tokens against rows [o0, o1): each panel of up to DSV4_GEMM_PANEL rows is dequantised
 * to bf16 once (per-thread scratch of DSV4_GEMM_PANEL * n_in uint16) and swept by every token, four rows by
 * six tokens at a time. Needs n_in % 32 == 0 and e8m0 scales (dot_* otherwise). Blocking
 * changes which products are computed together, never the order of one output's sum.
 */
static void gemm_rows(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y,
                      int ldy, uint16_t *panel)
{
    int K = w->n_in;
    for (int p0 = o0; p0 < o1; p0 += DSV4_GEMM_PANEL) {
        int np = o1 - p0 < DSV4_GEMM_PANEL ? o1 - p0 : DSV4_GEMM_PANEL;
        /* BF16 weights are their own panel; FP8/FP4 are dequantised (or, with out-of-range
         * scales, left to the GEMV kernels, whose bits the panels reproduce otherwise) */
        const uint16_t *pw = panel;
        if (w->fmt == DSV4_WFMT_BF16) {
            pw = (const uint16_t *)w->w + (size_t)(p0 + w->row_off) * (size_t)K;
        } else if (!dequant_panel(w, p0 + w->row_off, np, panel)) {
            if (w->fmt == DSV4_WFMT_FP4) dotb_fp4(w, p0, p0 + np, nt, x, ldx, y, ldy);
            else dotb_fp8(w, p0, p0 + np, nt, x, ldx, y, ldy);
            continue;
        }
        for (int b0 = 0; b0 < nt; b0 += GEMM_TB) {
            int b1 = b0 + GEMM_TB < nt ? b0 + GEMM_TB : nt;
            int r  = 0;
            for (; r + 4 <= np; r += 4)
                for (int t0 = b0; t0 < b1; t0 += 6) {
                    const uint16_t *xt = x + (size_t)t0 * (size_t)ldx;
                    float          *yt = y + (size_t)t0 * (size_t)ldy;
                    const uint16_t *wp = pw + (size_t)r * (size_t)K;
                    /* BF16 rows come straight from memory: the first token tile of a row
                     * group prefetches the next group (FP8/FP4 panels are in L2 already) */
                    const uint8_t *pf = w->fmt == DSV4_WFMT_BF16 && t0 == b0 ? (const uint8_t *)(wp + 4 * (size_t)K) : NULL;
                    switch (b1 - t0 < 6 ? b1 - t0 : 6) {
                    case 1: tile4(1, wp, K, xt, ldx, yt, ldy, p0 + r, pf); break;
                    case 2: tile4(2, wp, K, xt, ldx, yt, ldy, p0 + r, pf); break;
                    case 3: tile4(3, wp, K, xt, ldx, yt, ldy, p0 + r, pf); break;
                    case 4: tile4(4, wp, K, xt, ldx, yt, ldy, p0 + r, pf); break;
                    case 5: tile4(5, wp, K, xt, ldx, yt, ldy, p0 + r, pf); break;
                    default: tile4(6, wp, K, xt, ldx, yt, ldy, p0 + r, pf); break;
                    }
                }
            for (; r < np; r++)
                for (int t = b0; t < b1; t++) {
                    __m512 a = _mm512_setzero_ps();
                    for (int k = 0; k < K; k += 32)
                        a = _mm512_dpbf16_ps(a, as_bh(_mm512_loadu_si512(pw + (size_t)r * (size_t)K + (size_t)k)),
                                             as_bh(_mm512_loadu_si512(x + (size_t)t * (size_t)ldx + (size_t)k)));
                    y[(size_t)t * (size_t)ldy + (size_t)(p0 + r)] = _mm512_reduce_add_ps(a);
                }
        }
    }
}

/* f32 -> bf16 (inputs are bf16-exact: truncation is exact; NaN-free by construction) */
static void to_bf16(const float *x, int n, uint16_t *out)
{
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i v = _mm512_srli_epi32(_mm512_castps_si512(_mm512_loadu_ps(x + i)), 16);
        _mm256_storeu_si256((__m256i *)(out + i), _mm512_cvtepi32_epi16(v));
    }
    for (; i < n; i++) out[i] = dsv4_bf16_from_f32(x[i]);
}

/* 16 values of a block (scaled by inv) rounded to e4m3 and back, times s, as bf16 (exact). */
static inline __m256i quant16(__m512 xv, __m512 inv, __m512 sv)
{
    return (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(e4m3_round(_mm512_mul_ps(xv, inv)), sv));
}

/* One row quantised to e4m3 per group of B (the scalar quantiser's rule, lane by lane: ties to
 * even, multiples of 2^-9 below 2^-6, saturation at 448, NaN to 448) and written as bf16.
 * Whole vectors use plain loads: with a mask register made in every iteration (kmov, then a
 * masked load) the loop ran 4x slower on AMD Zen 4; masks are for the tail only. */
static void quant_bf16(const float *x, int n, int B, uint16_t *out)
{
    for (int b = 0; b < n; b += B) {
        int    e = b + B < n ? b + B : n, full = b + (e - b) / 16 * 16, k;
        __mmask16 tail = (__mmask16)((1u << (e - full)) - 1);
        float  s = e4m3_block_scale_of(x, b, full, tail);
        __m512 inv = _mm512_set1_ps(1.0f / s), sv = _mm512_set1_ps(s);
        for (k = b; k < full; k += 16) _mm256_storeu_si256((__m256i *)(out + k), quant16(_mm512_loadu_ps(x + k), inv, sv));
        if (tail) _mm256_mask_storeu_epi16(out + k, tail, quant16(_mm512_maskz_loadu_ps(tail, x + k), inv, sv));
    }
}

/* 12 chains of VDPBF16PS: 16 lanes x 2 products x 2 flops each (the bf16 dot peak). */
static double peak(long n)
{
    __m512 a[12];
    __m512i m = _mm512_set1_epi16(0x3f80), c = _mm512_set1_epi16(0x3a83); /* bf16 1.0, ~1e-3 */
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
    for (long j = 0; j < n; j++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm512_dpbf16_ps(a[i], as_bh(m), as_bh(c));
    __m512 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, a[i]);
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return 64.0 * 12.0 * (double)n;
}

const struct dsv4_kernels dsv4_kernels_avx512bf16 = {
    .name      = "avx512bf16",
    .dotb_fp8  = dotb_fp8,
    .dotb_fp4  = dotb_fp4,
    .dotb_bf16 = dotb_bf16,
    .to_bf16    = to_bf16,
    .quant_bf16 = quant_bf16,
    .gemmb      = gemm_rows,
    .dotb_i16   = dsv4_avx512bf16_dotb_i16,
    .gemmb_i16  = dsv4_avx512bf16_gemmb_i16,
    .attn_rows  = dsv4_avx512bf16_attn_rows,
    .attn_heads = dsv4_avx512bf16_attn_heads,
    .idx_query  = dsv4_avx512bf16_idx_query,
    .idx_keys   = dsv4_avx512bf16_idx_keys,
    .peak       = peak,
};

/* AMX-BF16: the same kernels, except the projections on interleaved tiles, which run on
 * TDPBF16PS (x86_amx_i16.c, its own bits at every token count), and the peak of those. */
const struct dsv4_kernels dsv4_kernels_amx = {
    .name       = "amx",
    .dotb_fp8   = dotb_fp8,
    .dotb_fp4   = dotb_fp4,
    .dotb_bf16  = dotb_bf16,
    .to_bf16    = to_bf16,
    .quant_bf16 = quant_bf16,
    .gemmb      = gemm_rows,
    .dotb_i16   = dsv4_amx_dotb_i16,
    .gemmb_i16  = dsv4_amx_gemmb_i16,
    .attn_rows  = dsv4_avx512bf16_attn_rows,
    .attn_heads = dsv4_avx512bf16_attn_heads,
    .idx_query  = dsv4_avx512bf16_idx_query,
    .idx_keys   = dsv4_avx512bf16_idx_keys,
    .peak       = dsv4_amx_peak,
};
