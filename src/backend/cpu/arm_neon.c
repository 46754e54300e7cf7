/*
 * arm_neon.c - the NEON kernels (AArch64 Advanced SIMD, every ARMv8-A core): 4 lanes of the
 * template in simd_kernels.inc and 4 f32 / 2 f64 lanes of the row ops in simd_rows.inc, the
 * `neon` level (DSV4_CPU=neon). Built for aarch64 only (Makefile ARCH).
 *
 * The decodings give the same values as the x86 levels' (each weight exactly, then times its
 * block scale), so a row's result depends only on the accumulation order, which is the
 * template's: one accumulator per (row, token) fed in the order of k, 4 lanes, and the lanes
 * summed as (l0 + l2) + (l1 + l3). GEMV and GEMM give the same bits (test_kernels).
 *
 * The row ops' vocabulary copies x86 where the two differ: MAX / MIN return the second operand
 * when either is NaN (FMAX would return the NaN, FMAXNM the number whatever its place), so
 * they are a compare and a select; the SwiGLU exp scales by two exact powers of two as the
 * avx2 level does. The row ops then compute what the x86 levels compute, lane for lane, and
 * give the reference's bits as theirs do (test_kernels, under qemu in `make cross-aarch64`).
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

/* ------------------------------------------------------------------ row ops (simd_rows.inc) */

typedef float64x2_t DVEC;
typedef uint32x4_t  VECI;
typedef uint32x4_t  VMASK; /* all-ones lanes, as the compares give them */
#define DW 2

static inline VEC   v_div(VEC a, VEC b) { return vdivq_f32(a, b); }
static inline VEC   v_max(VEC a, VEC b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
static inline VEC   v_min(VEC a, VEC b) { return vbslq_f32(vcltq_f32(a, b), a, b); }
static inline VEC   v_round(VEC a) { return vrndnq_f32(a); }
static inline float v_hmax(VEC m) { return vmaxvq_f32(m); } /* no NaN lanes: any order */
static inline VMASK v_lt(VEC a, VEC b) { return vcltq_f32(a, b); }
static inline VMASK v_isnan(VEC a) { return vmvnq_u32(vceqq_f32(a, a)); }
static inline VEC   v_sel(VMASK m, VEC t, VEC f) { return vbslq_f32(m, t, f); }
static inline VECI  v_bits(VEC a) { return vreinterpretq_u32_f32(a); }
static inline VEC   v_of_bits(VECI a) { return vreinterpretq_f32_u32(a); }
static inline VECI  vi_set1(uint32_t a) { return vdupq_n_u32(a); }
static inline VECI  vi_add(VECI a, VECI b) { return vaddq_u32(a, b); }
static inline VECI  vi_and(VECI a, VECI b) { return vandq_u32(a, b); }
static inline VECI  vi_or(VECI a, VECI b) { return vorrq_u32(a, b); }
static inline VECI  vi_srl(VECI a, int n) { return vshlq_u32(a, vdupq_n_s32(-n)); } /* USHL: n need not be constant */

static inline DVEC   d_set1(double a) { return vdupq_n_f64(a); }
static inline DVEC   d_loadu(const double *p) { return vld1q_f64(p); }
static inline DVEC   d_add(DVEC a, DVEC b) { return vaddq_f64(a, b); }
static inline DVEC   d_sub(DVEC a, DVEC b) { return vsubq_f64(a, b); }
static inline DVEC   d_mul(DVEC a, DVEC b) { return vmulq_f64(a, b); }
static inline DVEC   d_div(DVEC a, DVEC b) { return vdivq_f64(a, b); }
static inline DVEC   d_fma(DVEC a, DVEC b, DVEC c) { return vfmaq_f64(c, a, b); }
static inline DVEC   d_fnma(DVEC a, DVEC b, DVEC c) { return vfmsq_f64(c, a, b); } /* c - a * b, one rounding */
static inline DVEC   d_min(DVEC a, DVEC b) { return vbslq_f64(vcltq_f64(a, b), a, b); }
static inline DVEC   d_max(DVEC a, DVEC b) { return vbslq_f64(vcgtq_f64(a, b), a, b); }
static inline DVEC   d_round(DVEC a) { return vrndnq_f64(a); }
static inline DVEC   d_rf32(DVEC a) { return vcvt_f64_f32(vcvt_f32_f64(a)); }
static inline double d_hsum(DVEC v) { return vgetq_lane_f64(v, 0) + vgetq_lane_f64(v, 1); }
static inline DVEC   d_lo(VEC v) { return vcvt_f64_f32(vget_low_f32(v)); }
static inline DVEC   d_hi(VEC v) { return vcvt_high_f64_f32(v); }
static inline DVEC   d_cvt(const float *p) { return vcvt_f64_f32(vld1_f32(p)); }
static inline VEC    v_of_pd(DVEC lo, DVEC hi) { return vcvt_high_f32_f64(vcvt_f32_f64(lo), hi); }

/* p * 2^n as p * 2^a * 2^b with a = floor(n / 2), b = n - a (x86_avx2.c d_scalef: both powers
 * normal for |n| <= 1077, the first product exact, the second rounds once). */
static inline DVEC pow2_pd(int64x2_t n)
{
    return vreinterpretq_f64_s64(vshlq_n_s64(vaddq_s64(n, vdupq_n_s64(1023)), 52));
}

static inline DVEC d_scalef(DVEC p, DVEC n)
{
    int64x2_t ni = vcvtq_s64_f64(n), a = vshrq_n_s64(ni, 1);
    return vmulq_f64(vmulq_f64(p, pow2_pd(a)), pow2_pd(vsubq_s64(ni, a)));
}

/* DW pairs (a0 b0 a1 b1) -> a, b (LD2 splits them); and back from the results, rounded. */
static inline void d_pairs(const float *p, DVEC *a, DVEC *b)
{
    float32x2x2_t q = vld2_f32(p);
    *a              = vcvt_f64_f32(q.val[0]);
    *b              = vcvt_f64_f32(q.val[1]);
}

static inline VEC v_pairs(DVEC ya, DVEC yb)
{
    float32x2_t a = vcvt_f32_f64(ya), b = vcvt_f32_f64(yb);
    return vcombine_f32(vzip1_f32(a, b), vzip2_f32(a, b));
}

/* The Hadamard butterfly of stride 1 inside one register: (a, b) -> (a + b, a - b). */
static inline DVEC d_butterfly(DVEC v, int len)
{
    (void)len; /* DW = 2: stride 1 is the only one inside a register */
    DVEC sw = vextq_f64(v, v, 1);
    return vcopyq_laneq_f64(vaddq_f64(v, sw), 1, vsubq_f64(sw, v), 1);
}

#include "backend/cpu/simd_rows.inc"

const struct dsv4_kernels dsv4_kernels_neon = {
    .name     = "neon",
    K_KERNEL_ENTRIES,
    K_ROW_ENTRIES,
};
