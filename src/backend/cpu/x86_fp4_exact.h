/*
 * x86_fp4_exact.h - what the avx2-int / avx512-int FP4 kernels share (x86_fp4_exact.c: ymm,
 * x86_fp4_exact512.c: zmm): the nibble decode, the fixed lane sum of fp4_exact.h and the
 * software prefetch. Included only by files compiled with AVX2 or higher.
 */
#ifndef DSV4_X86_FP4_EXACT_H
#define DSV4_X86_FP4_EXACT_H

#include <immintrin.h>

#include "backend/backend.h"

#define INL static inline __attribute__((always_inline))

/* 16 bytes (32 nibbles) -> int16 256 w2 in A's word order: VBROADCASTI128 puts the bytes in
 * both lanes, the upper shifted by 4, so after the AND the lower lane holds the even nibbles
 * (inputs 0, 2, .., 30) and the upper the odd ones; the table gives w2 as int8 and the
 * unpacks with zero bytes make int16 w2 x 256 with no sign extension. w0 holds inputs
 * [0 2 .. 14 | 1 3 .. 15], w1 the same + 16. */
INL void i4_dec(const uint8_t *p, __m256i *w0, __m256i *w1)
{
    const __m256i tab = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12, 0, 1, 2, 3, 4, 6, 8,
                                         12, 0, -1, -2, -3, -4, -6, -8, -12);
    __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)p));
    __m256i n = _mm256_and_si256(_mm256_srlv_epi32(b, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(15));
    __m256i v = _mm256_shuffle_epi8(tab, n);
    *w0       = _mm256_unpacklo_epi8(_mm256_setzero_si256(), v);
    *w1       = _mm256_unpackhi_epi8(_mm256_setzero_si256(), v);
}

/* The fixed lane sum of fp4_exact.h: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)). */
INL float i4_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s        = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s        = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Software prefetch of rows ow..ow+3 (as simd_kernels.inc k_prefetch4 for FP4): one line a row
 * every 4 blocks, 1 KiB ahead, into the next four rows near a row's end. */
INL void i4_prefetch4(const struct dsv4_linear *w, int ow, int kb)
{
    if (kb % 128) return;
    int kp = kb + 2048, rp = ow;
    if (kp >= w->n_in) {
        kp -= w->n_in;
        rp += 4;
    }
    if (kp < w->n_in && rp + 4 <= w->row_off + w->n_out)
        for (int r = 0; r < 4; r++)
            __builtin_prefetch((const uint8_t *)w->w + ((size_t)(rp + r) * (size_t)w->n_in + (size_t)kp) / 2, 0, 3);
}

#endif
