/*
 * ref_quant.c - the FP8 and FP4 activation simulation of the reference ops (scalar); the
 * compact cache-row codecs they share with every backend are in backend/row_codec.c.
 *
 * Scales are powers of two, 2^ceil(log2(max(amax, floor) * f32(1/qmax))) (docs/MODEL.md §R5.3,
 * §11.4), so x / s is exact and the only rounding is the cast to e4m3 / e2m1. A row that
 * went through the FP8 (or FP4) simulation is therefore exactly code * scale, and storing
 * codes and scales is lossless: re-deriving the scale from the simulated values gives either
 * the same power of two or half of it, and both represent every value exactly (argued in
 * docs/MODEL.md, checked by tests).
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/ref.h"

static float block_amax(const float *x, int n)
{
    float m = 0;
    for (int i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

void dsv4_ref_fp8_sim(struct dsv4_backend *be, int n, int d, int ld, float *x, int block)
{
    (void)be;
    for (int r = 0; r < n; r++) {
        float *row = x + (size_t)r * (size_t)ld;
        for (int b = 0; b < d; b += block) {
            float s = dsv4_act_scale(block_amax(row + b, block), 448.0f, 1e-4f);
            for (int i = b; i < b + block; i++)
                row[i] = dsv4_round_bf16(dsv4_f32_from_e4m3(dsv4_e4m3_from_f32(row[i] / s)) * s);
        }
    }
}

/* The e4m3 scale of a V4.1 compressed-KV group: e4m3(max(amax, 6 * 2^-9) / 6), not a power
 * of two, so x / s rounds (the official kernel divides in f32 too). */
static float e4m3_group_scale(float amax)
{
    float a = amax > 6.0f * 0x1p-9f ? amax : 6.0f * 0x1p-9f;
    return dsv4_f32_from_e4m3(dsv4_e4m3_from_f32(a / 6.0f));
}

void dsv4_ref_fp4_sim(struct dsv4_backend *be, int n, int d, int ld, float *x, int block, bool e4m3_scale)
{
    (void)be;
    for (int r = 0; r < n; r++) {
        float *row = x + (size_t)r * (size_t)ld;
        for (int b = 0; b < d; b += block) {
            float amax = block_amax(row + b, block);
            float s    = e4m3_scale ? e4m3_group_scale(amax) : dsv4_act_scale(amax, 6.0f, 6.0f * 0x1p-126f);
            for (int i = b; i < b + block; i++)
                row[i] = dsv4_round_bf16(dsv4_f32_from_e2m1(dsv4_e2m1_from_f32(row[i] / s)) * s);
        }
    }
}



