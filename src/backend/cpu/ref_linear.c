/*
 * ref_linear.c - the scalar reference projection for every weight format of the release.
 *
 * Numerics follow the demo's fp8_gemm / fp4_gemm: with FP8 activations each group of B
 * inputs of a row (B = w->block: 128 for V4, 32 for V4.1) becomes e4m3 codes times a
 * power-of-two scale s_x; per block the products of codes are summed, then scaled by
 * s_x * s_w (FP8 weights: one s_w per BxB block; FP4 weights: per 32-wide sub-block s_w,
 * then s_x per B). Without activation
 * quantisation (wo_a, compressor, router, head) the input is used as it is against the
 * dequantised weight. The reference accumulates in double (exact for these products up to
 * double rounding); the output is rounded to f32, or to bf16 through f32.
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "backend/cpu/ref.h"
#include "backend/cpu/ref_num.h"

static float           e4m3_lut[256], e2m1_lut[16], e8m0_lut[256];
static pthread_once_t  lut_once = PTHREAD_ONCE_INIT;

static void lut_init(void)
{
    for (int i = 0; i < 256; i++) {
        e4m3_lut[i] = dsv4_f32_from_e4m3((uint8_t)i);
        e8m0_lut[i] = dsv4_f32_from_e8m0((uint8_t)i);
    }
    for (int i = 0; i < 16; i++) e2m1_lut[i] = dsv4_f32_from_e2m1((uint8_t)i);
}

static double scale_at(const struct dsv4_linear *w, size_t idx)
{
    if (w->scale_f32) {
        float s;
        memcpy(&s, (const uint8_t *)w->scale + idx * 4, 4);
        return s;
    }
    return e8m0_lut[((const uint8_t *)w->scale)[idx]];
}

/* Quantises one row of n_in values in groups of B: q[k] = value of the e4m3 code, s[g] =
 * group g's scale. */
static void quant_row(const float *x, int n_in, int B, float *q, float *s)
{
    for (int b = 0; b < n_in; b += B) {
        int   e    = b + B < n_in ? b + B : n_in;
        float amax = 0;
        for (int k = b; k < e; k++) amax = fmaxf(amax, fabsf(x[k]));
        float sc = dsv4_act_scale(amax, 448.0f, 1e-4f);
        s[b / B] = sc;
        for (int k = b; k < e; k++) q[k] = e4m3_lut[dsv4_e4m3_from_f32(x[k] / sc)];
    }
}

static double dot_fp8(const struct dsv4_linear *w, int o, const float *q, const float *s)
{
    o += w->row_off;
    const uint8_t *wr    = (const uint8_t *)w->w + (size_t)o * (size_t)w->n_in;
    int            B     = w->block;
    double         acc   = 0;
    for (int b = 0; b < w->n_in; b += B) {
        int    e    = b + B < w->n_in ? b + B : w->n_in;
        double part = 0;
        for (int k = b; k < e; k++) part += (double)q[k] * e4m3_lut[wr[k]];
        acc += part * (s ? s[b / B] : 1.0f) * scale_at(w, dsv4_fp8_scale_index(w, o, b));
    }
    return acc;
}

static double dot_fp4(const struct dsv4_linear *w, int o, const float *q, const float *s)
{
    o += w->row_off;
    const uint8_t *wr  = (const uint8_t *)w->w + (size_t)o * (size_t)(w->n_in / 2);
    size_t         srow = (size_t)o * (size_t)(w->n_in / 32);
    double         acc  = 0;
    int            B    = w->block;
    for (int b = 0; b < w->n_in; b += B) {
        int    e    = b + B < w->n_in ? b + B : w->n_in;
        double pg   = 0;
        for (int sb = b; sb < e; sb += 32) {
            double p32 = 0;
            for (int k = sb; k < sb + 32; k++) {
                uint8_t byte = wr[k / 2];
                p32 += (double)q[k] * e2m1_lut[k % 2 ? byte >> 4 : byte & 15];
            }
            pg += p32 * scale_at(w, srow + (size_t)(sb / 32));
        }
        acc += pg * (s ? s[b / B] : 1.0f);
    }
    return acc;
}

static double dot_dense(const struct dsv4_linear *w, int o, const float *x)
{
    double acc = 0;
    o += w->row_off;
    if (w->fmt == DSV4_WFMT_BF16) {
        const uint16_t *wr = (const uint16_t *)w->w + (size_t)o * (size_t)w->n_in;
        for (int k = 0; k < w->n_in; k++) acc += (double)x[k] * dsv4_f32_from_bf16(wr[k]);
    } else {
        const float *wr = (const float *)w->w + (size_t)o * (size_t)w->n_in;
        for (int k = 0; k < w->n_in; k++) acc += (double)x[k] * wr[k];
    }
    return acc;
}

void dsv4_ref_linear(struct dsv4_backend *be, const struct dsv4_linear *w, int n_tok, const float *x, int ldx,
                     float *y, int ldy, enum dsv4_act act, enum dsv4_out out)
{
    pthread_once(&lut_once, lut_init);
    DSV4_ASSERT(w->block > 0 || (w->fmt != DSV4_WFMT_FP8 && act == DSV4_ACT_NONE));
    DSV4_ASSERT(be->scratch_len >= (size_t)w->n_in + (size_t)(w->n_in / 32 + 1));
    float *q = be->scratch;
    float *s = q + w->n_in;
    for (int r = 0; r < n_tok; r++) {
        const float *xr = x + (size_t)r * (size_t)ldx;
        float       *yr = y + (size_t)r * (size_t)ldy;
        const float *qx = xr, *sx = NULL;
        if (act == DSV4_ACT_FP8) {
            quant_row(xr, w->n_in, w->block, q, s);
            qx = q;
            sx = s;
        }
        for (int o = 0; o < w->n_out; o++) {
            double v;
            switch (w->fmt) {
            case DSV4_WFMT_FP8: v = dot_fp8(w, o, qx, sx); break;
            case DSV4_WFMT_FP4: v = dot_fp4(w, o, qx, sx); break;
            default:
                DSV4_ASSERT(act == DSV4_ACT_NONE);
                v = dot_dense(w, o, qx);
                break;
            }
            yr[o] = out == DSV4_OUT_BF16 ? rbf16(v) : (float)v;
        }
    }
}
