/*
 * arm_neon.c - the NEON kernels (AArch64 Advanced SIMD, every ARMv8-A core): 4 lanes of the
 * template in simd_kernels.inc, the `neon` level (DSV4_CPU=neon). Built for aarch64 only
 * (Makefile ARCH); the row ops run the reference's plain C at this level for now.
 *
 * The decodings give the same values as the x86 levels' (each weight exactly, then times its
 * block scale), so a row's result depends only on the accumulation order, which is the
 * template's: one accumulator per (row, token) fed in the order of k, 4 lanes, and the lanes
 * summed as (l0 + l2) + (l1 + l3). GEMV and GEMM give the same bits (test_kernels).
 */
#include <arm_neon.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"

typedef float32x4_t VEC;
#define VW 4

static inline VEC v_zero(void) { return vdupq_n_f32(0.0f); }
static inline VEC v_set1(float a) { return vdupq_n_f32(a); }
static inline VEC v_loadu(const float *p) { return vld1q_f32(p); }
static inline void v_storeu(float *p, VEC v) { vst1q_f32(p, v); }
static inline VEC v_fma(VEC a, VEC b, VEC c) { return vfmaq_f32(c, a, b); } /* c + a * b, one rounding */
static inline VEC v_mul(VEC a, VEC b) { return vmulq_f32(a, b); }
static inline VEC v_add(VEC a, VEC b) { return vaddq_f32(a, b); }

static inline float v_hsum(VEC v)
{
    float32x2_t s = vadd_f32(vget_low_f32(v), vget_high_f32(v));
    return vget_lane_f32(s, 0) + vget_lane_f32(s, 1);
}

/* 4 e4m3 bytes -> floats equal to value / 256, as x86_avx2.c: sign-extended to 16 bits,
 * shifted by 7 and masked to bit 15 and the seven code bits, that is the f16 with the code's
 * exponent and mantissa in place, widened by FCVTL. */
static inline VEC v_e4m3(const uint8_t *p)
{
    uint32_t u;
    memcpy(&u, p, 4);
    int16x8_t w = vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(u)));
    int16x4_t h = vand_s16(vshl_n_s16(vget_low_s16(w), 7), vdup_n_s16((int16_t)0xbf80));
    return vcvt_f32_f16(vreinterpret_f16_s16(h));
}

/* 2 bytes -> the 4 nibbles in order (low first) -> twice the e2m1 values, through a byte
 * table (TBL) widened to f32 (exact small integers). */
static inline VEC v_fp4(const uint8_t *p)
{
    static const int8_t tab[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };
    uint16_t            u;
    memcpy(&u, p, 2);
    uint8x8_t b = vreinterpret_u8_u16(vdup_n_u16(u));
    uint8x8_t n = vzip1_u8(vand_u8(b, vdup_n_u8(15)), vshr_n_u8(b, 4)); /* n0 n1 n2 n3 ... */
    int8x8_t  v = vqtbl1_s8(vld1q_s8(tab), n);
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(v))));
}

/* The block's scale (which includes the 1/2 of the doubled table) multiplies each vector:
 * twice the value times half the scale is the same exact product as the x86 levels' folded
 * table gives. */
static inline VEC v_fp4_tab(float s) { return vdupq_n_f32(s); }
static inline VEC v_fp4s(const uint8_t *p, VEC s) { return vmulq_f32(v_fp4(p), s); }

static inline VEC v_bf16(const uint16_t *p)
{
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

/* 32 registers: GEMM tiles of 4 rows x 6 tokens (24 accumulators, 6 activations, 1 weight). */
#define K_TN 6
#include "backend/cpu/simd_kernels.inc"

const struct dsv4_kernels dsv4_kernels_neon = {
    .name     = "neon",
    K_KERNEL_ENTRIES,
};
