/*
 * ref_quant.c - activation quantisation and the compact cache-row codecs (scalar).
 *
 * Scales are powers of two, 2^ceil(log2(max(amax, floor) * f32(1/qmax))) (model-v4.md §5.3,
 * §11.4), so x / s is exact and the only rounding is the cast to e4m3 / e2m1. A row that
 * went through the FP8 (or FP4) simulation is therefore exactly code * scale, and storing
 * codes and scales is lossless: re-deriving the scale from the simulated values gives either
 * the same power of two or half of it, and both represent every value exactly (argued in
 * docs/MODEL.md, checked by tests).
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/ref.h"

float dsv4_act_scale(float amax, float qmax, float floor_)
{
    if (!(amax >= floor_)) amax = floor_; /* also catches NaN */
    return dsv4_pow2_ceil(amax * (1.0f / qmax));
}

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

void dsv4_ref_fp4_sim(struct dsv4_backend *be, int n, int d, int ld, float *x, int block)
{
    (void)be;
    for (int r = 0; r < n; r++) {
        float *row = x + (size_t)r * (size_t)ld;
        for (int b = 0; b < d; b += block) {
            float s = dsv4_act_scale(block_amax(row + b, block), 6.0f, 6.0f * 0x1p-126f);
            for (int i = b; i < b + block; i++)
                row[i] = dsv4_round_bf16(dsv4_f32_from_e2m1(dsv4_e2m1_from_f32(row[i] / s)) * s);
        }
    }
}

void dsv4_row_encode(enum dsv4_row_fmt fmt, int d_head, int d_rope, const float *x, uint8_t *row)
{
    int d_nope = d_head - d_rope;
    if (fmt == DSV4_ROW_BF16) {
        for (int i = 0; i < d_head; i++) {
            uint16_t h = dsv4_bf16_from_f32(x[i]);
            memcpy(row + 2 * i, &h, 2);
        }
        return;
    }
    uint8_t *codes = row, *scales = row + d_nope, *rope = row + d_nope + d_nope / 64;
    for (int b = 0; b < d_nope; b += 64) {
        float s = dsv4_act_scale(block_amax(x + b, 64), 448.0f, 1e-4f);
        scales[b / 64] = dsv4_e8m0_from_f32(s);
        for (int i = b; i < b + 64; i++) codes[i] = dsv4_e4m3_from_f32(x[i] / s);
    }
    for (int i = 0; i < d_rope; i++) {
        uint16_t h = dsv4_bf16_from_f32(x[d_nope + i]);
        memcpy(rope + 2 * i, &h, 2);
    }
}

void dsv4_row_decode(enum dsv4_row_fmt fmt, int d_head, int d_rope, const uint8_t *row, float *x)
{
    int d_nope = d_head - d_rope;
    if (fmt == DSV4_ROW_BF16) {
        for (int i = 0; i < d_head; i++) {
            uint16_t h;
            memcpy(&h, row + 2 * i, 2);
            x[i] = dsv4_f32_from_bf16(h);
        }
        return;
    }
    const uint8_t *codes = row, *scales = row + d_nope, *rope = row + d_nope + d_nope / 64;
    for (int i = 0; i < d_nope; i++) x[i] = dsv4_f32_from_e4m3(codes[i]) * dsv4_f32_from_e8m0(scales[i / 64]);
    for (int i = 0; i < d_rope; i++) {
        uint16_t h;
        memcpy(&h, rope + 2 * i, 2);
        x[d_nope + i] = dsv4_f32_from_bf16(h);
    }
}

void dsv4_idx_key_encode(int d, const float *x, uint8_t *row)
{
    uint8_t *scales = row + d / 2;
    memset(row, 0, (size_t)d / 2);
    for (int b = 0; b < d; b += 32) {
        float s = dsv4_act_scale(block_amax(x + b, 32), 6.0f, 6.0f * 0x1p-126f);
        scales[b / 32] = dsv4_e8m0_from_f32(s);
        for (int i = b; i < b + 32; i++) {
            uint8_t c = dsv4_e2m1_from_f32(x[i] / s);
            row[i / 2] |= (uint8_t)(i % 2 ? c << 4 : c);
        }
    }
}

void dsv4_idx_key_decode(int d, const uint8_t *row, float *x)
{
    const uint8_t *scales = row + d / 2;
    for (int i = 0; i < d; i++) {
        uint8_t c = (uint8_t)(i % 2 ? row[i / 2] >> 4 : row[i / 2] & 15);
        x[i]      = dsv4_f32_from_e2m1(c) * dsv4_f32_from_e8m0(scales[i / 32]);
    }
}
