/*
 * x86_bf16_conv.h - weight decoding shared by the AVX512-BF16 kernel files (included only by
 * files compiled with -mavx512bf16): release codes to bf16 bit patterns, exactly, and the
 * prefetch helper of the GEMV kernels.
 */
#ifndef DSV4_X86_BF16_CONV_H
#define DSV4_X86_BF16_CONV_H

#include <immintrin.h>
#include <stdint.h>

/* 32 e4m3 bytes -> 32 bf16 of the same values (normal numbers). */
static inline __m512i e4m3_bf16(const uint8_t *p)
{
    /* bf16 of m * 2^-9 for the subnormal codes m = 0..7 */
    static const uint16_t subtab[32] = { 0, 0x3b00, 0x3b80, 0x3bc0, 0x3c00, 0x3c20, 0x3c40, 0x3c60 };
    const __m512i         sub        = _mm512_loadu_si512(subtab);
    __m512i   c   = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p));
    __m512i   mag = _mm512_and_si512(c, _mm512_set1_epi16(0x7f));
    /* normal: exponent e - 7 + 127 = e + 120, mantissa m << 4 */
    __m512i   v   = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), _mm512_set1_epi16(120 << 7));
    __mmask32 s   = _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8));
    v             = _mm512_mask_permutexvar_epi16(v, s, mag, sub);
    /* sign: bit 7 of the byte -> bit 15 (ternary logic: v | (c << 8 & 0x8000)) */
    return _mm512_ternarylogic_epi32(v, _mm512_slli_epi16(c, 8), _mm512_set1_epi16((short)0x8000), 0xf8);
}

/* 16 bytes of packed e2m1 -> 32 bf16 in order (low nibble first). */
static inline __m512i e2m1_bf16(const uint8_t *p)
{
    static const uint16_t e2m1tab[32] = { 0,      0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0,
                                          0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0 };
    const __m512i         tab         = _mm512_loadu_si512(e2m1tab);
    __m512i b  = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    /* dword k = low nibble | high nibble << 16: words 2k, 2k+1 in element order */
    __m512i ix = _mm512_or_si512(_mm512_and_si512(b, _mm512_set1_epi32(15)),
                                 _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0xf0)), 12));
    return _mm512_permutexvar_epi16(ix, tab);
}

/* The e2m1 -> bf16 table stored twice (see fp4_table in x86_avx512bf16.c): vpermw reads the
 * low 5 bits of each index, so an index needs no masking of the high nibble's bit 0. */
static const uint16_t e2m1_twice[32] = { 0,      0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0,
                                         0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0,
                                         0,      0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0,
                                         0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0 };
enum { E2M1_NONZERO = 0xfefefefe }; /* entries 0, 8, 16, 24 are +-0 and stay so */

static inline __m512bh as_bh(__m512i v)
{
    return (__m512bh)v;
}

/*
 * Software prefetch of the next group of four rows while the current one is read: rows are
 * contiguous, so the next group is the next 4 * row_bytes, and each step prefetches as many
 * bytes of it as it consumes of the current group. Measured without it (dsv4 bench --gemm
 * 1,65536,4096,fp8|fp4, weights far larger than the caches, one thread): about 10 GB/s for
 * FP8/FP4 rows against 26 GB/s for BF16 rows: decoding costs enough instructions per byte
 * that the out-of-order window keeps too few misses in flight, and the hardware prefetchers
 * restart at every 4 KiB page, which is one FP8 row of V4's 4096-wide inputs.
 */
static inline __attribute__((always_inline)) void prefetch_next(const uint8_t *next_group, size_t off, int lines)
{
    for (int i = 0; i < lines; i++) _mm_prefetch((const char *)next_group + off + 64 * (size_t)i, _MM_HINT_T0);
}

#endif
