/*
 * x86_i16_tiles.h - reading the interleaved 16-row tiles of repack.c, shared by the kernels
 * that run on them (x86_avx512bf16_i16.c: VDPBF16PS; x86_amx_i16.c: AMX): a tile decoded to
 * 32 bf16 with its e8m0 scale folded into the exponents, the decoded panel of two groups, and
 * the store of a group's 16 outputs. Included only by files compiled with -mavx512bf16.
 */
#ifndef DSV4_X86_I16_TILES_H
#define DSV4_X86_I16_TILES_H

#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/x86_bf16_conv.h"

enum { I16_FP8, I16_FP4, I16_BF16 };

/* Software prefetch distance in each group's stream of tiles. Without prefetching the
 * decoding GEMVs keep too few misses in flight (see prefetch_next in x86_bf16_conv.h). */
enum { I16_PF = 2048 };

static inline int kind_of(const struct dsv4_linear *w)
{
    return w->fmt == DSV4_WFMT_FP8 ? I16_FP8 : w->fmt == DSV4_WFMT_FP4 ? I16_FP4 : I16_BF16;
}

/* Bytes of one (group, pair) tile. */
static inline size_t tile_bytes(int kind)
{
    return kind == I16_FP8 ? 32 : kind == I16_FP4 ? 16 : 64;
}

/*
 * Exponent adds of group g for the 32-input block b: FP8 one value (its BxB block, B =
 * w->block, 32 or 128: a group of 16 rows lies in one block), FP4
 * one per row (both words of each dword lane), BF16 none. Eligible tensors have every scale
 * in [10, 240], so folded weights stay normal bf16 (repack.c).
 */
static inline __attribute__((always_inline)) __m512i block_adds(int kind, const struct dsv4_linear *w, int g, int b)
{
    if (kind == I16_FP8) {
        int e = ((const uint8_t *)w->scale)[dsv4_fp8_scale_index(w, g * 16, b * 32)];
        return _mm512_set1_epi16((short)((e - 127) * 128));
    }
    if (kind == I16_FP4) {
        const uint8_t *s = (const uint8_t *)dsv4_i16_s(w) + ((size_t)g * (size_t)(w->n_in / 32) + (size_t)b) * 16;
        __m512i        a = _mm512_slli_epi32(_mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)s)),
                                                              _mm512_set1_epi32(127)),
                                             7);
        return _mm512_or_si512(_mm512_and_si512(a, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(a, 16));
    }
    return _mm512_setzero_si512();
}

/* Tile (g, p) as 32 bf16 with the scale folded in (adds from block_adds). */
static inline __attribute__((always_inline)) __m512i tile_bf16(int kind, const uint8_t *wi, size_t P, int g, size_t p,
                                                               __m512i adds)
{
    const uint8_t *t = wi + ((size_t)g * P + p) * tile_bytes(kind);
    if (kind == I16_BF16) return _mm512_loadu_si512(t);
    __m512i v;
    if (kind == I16_FP8) {
        v = e4m3_bf16(t);
    } else {
        __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)t));
        v         = _mm512_permutexvar_epi16(_mm512_or_si512(d, _mm512_slli_epi32(d, 12)), _mm512_loadu_si512(e2m1_twice));
    }
    return _mm512_mask_add_epi16(v, _mm512_test_epi16_mask(v, _mm512_set1_epi16(0x7fff)), v, adds);
}

/* Stores 16 outputs of group g (absolute) for rows [o0, o1) of the view. */
static inline __attribute__((always_inline)) void store_group(const struct dsv4_linear *w, int g, int o0, int o1,
                                                              float *yt, __m512 v)
{
    int o = g * 16 - w->row_off; /* view row of lane 0 (>= o0, a multiple of 16) */
    (void)o0;
    int n = o1 - o < 16 ? o1 - o : 16;
    _mm512_mask_storeu_ps(yt + o, (__mmask16)((1u << n) - 1), v);
}

/* Groups g and g + 1 (when ng == 2) as bf16 into panel[p][2][32] (only the first half of
 * each p when ng == 1), with the scales folded in: the tiles the GEMV decodes, once for all
 * tokens. */
static inline void i16_panel(int kind, const struct dsv4_linear *w, int g, int ng, uint16_t *panel)
{
    const uint8_t *wi = dsv4_i16_w(w);
    size_t         P  = (size_t)w->n_in / 2;
    for (int b = 0; b < w->n_in / 32; b++) {
        __m512i adds[2];
        for (int i = 0; i < ng; i++) adds[i] = block_adds(kind, w, g + i, b);
        for (size_t p = (size_t)b * 16; p < (size_t)b * 16 + 16; p++)
            for (int i = 0; i < ng; i++) {
                if (((p * tile_bytes(kind)) & 63) == 0)
                    _mm_prefetch((const char *)wi + ((size_t)(g + i) * P + p) * tile_bytes(kind) + I16_PF, _MM_HINT_T0);
                _mm512_storeu_si512(panel + (p * 2 + (size_t)i) * 32, tile_bf16(kind, wi, P, g + i, p, adds[i]));
            }
    }
}

#endif
