/*
 * test_numfmt.c - number formats, checked exhaustively where the domain is small, and
 * encoders checked against a brute-force nearest-value search (ties to the even code).
 */
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "test_cases.h"

typedef float (*decode_fn)(uint8_t);
typedef uint8_t (*encode_fn)(float);

/* Brute force: the finite code of the same sign nearest to x, ties to the even code,
 * saturating to the largest finite magnitude (e4m3 and e2m1 semantics). */
static uint8_t nearest_code(float x, decode_fn dec, int ncodes, uint8_t sign_bit)
{
    double   a = fabs((double)x);
    int      best = -1;
    double   bestd = INFINITY;
    for (int c = 0; c < ncodes; c++) {
        if (c & sign_bit) continue;
        float v = dec((uint8_t)c);
        if (isnan(v) || isinf(v)) continue;
        double d = fabs(a - (double)v);
        if (d < bestd || (d == bestd && (c & 1) == 0)) {
            best  = c;
            bestd = d;
        }
    }
    return (uint8_t)(best | (signbit(x) ? sign_bit : 0));
}

static void check_format(struct test_ctx *t, const char *name, decode_fn dec, encode_fn enc,
                         int ncodes, uint8_t sign_bit, float maxv, float range)
{
    /* every code decodes, and every non-NaN code round-trips exactly */
    for (int c = 0; c < ncodes; c++) {
        float v = dec((uint8_t)c);
        if (isnan(v)) continue;
        CHECKF(enc(v) == c, "%s: code 0x%02x (%g) re-encodes as 0x%02x", name, c, v, enc(v));
        CHECKF(fabsf(v) <= maxv || isinf(v), "%s: code 0x%02x decodes to %g > max", name, c, v);
    }
    /* random values against the brute-force search */
    unsigned long long s = 42;
    for (int i = 0; i < 20000; i++) {
        float x = test_rand_f32(&s) * range;
        if (i % 4 == 0) x *= 0.01f;
        if (i % 8 == 1) x = ldexpf(test_rand_f32(&s), -(int)(test_rand_u64(&s) % 12));
        uint8_t got = enc(x), want = nearest_code(x, dec, ncodes, sign_bit);
        CHECKF(got == want, "%s: encode(%.9g) = 0x%02x, nearest is 0x%02x", name, x, got, want);
    }
    /* exact midpoints between neighbouring codes go to the even code */
    for (int c = 0; c + 1 < ncodes; c++) {
        if ((c & sign_bit) != ((c + 1) & sign_bit)) continue;
        float a = dec((uint8_t)c), b = dec((uint8_t)(c + 1));
        if (isnan(a) || isnan(b) || isinf(a) || isinf(b)) continue;
        float mid = (float)(((double)a + (double)b) / 2);
        if ((double)mid != ((double)a + (double)b) / 2) continue;
        uint8_t want = (c & 1) ? (uint8_t)(c + 1) : (uint8_t)c;
        CHECKF(enc(mid) == want, "%s: midpoint %g encodes 0x%02x, want 0x%02x", name, mid,
               enc(mid), want);
    }
}

static void test_e4m3(struct test_ctx *t)
{
    check_format(t, "e4m3", dsv4_f32_from_e4m3, dsv4_e4m3_from_f32, 256, 0x80, 448, 500);
    int nans = 0;
    for (int c = 0; c < 256; c++) nans += isnan(dsv4_f32_from_e4m3((uint8_t)c));
    CHECK(nans == 2);
    CHECK(isnan(dsv4_f32_from_e4m3(0x7f)) && isnan(dsv4_f32_from_e4m3(0xff)));
    CHECK(dsv4_f32_from_e4m3(0x7e) == 448.0f);
    CHECK(dsv4_f32_from_e4m3(0x01) == ldexpf(1, -9)); /* smallest subnormal */
    CHECK(dsv4_f32_from_e4m3(0x08) == ldexpf(1, -6)); /* smallest normal */
    CHECK(dsv4_e4m3_from_f32(1e9f) == 0x7e);
    CHECK(dsv4_e4m3_from_f32(-1e9f) == 0xfe);
    CHECK(dsv4_e4m3_from_f32(INFINITY) == 0x7e);
    CHECK(dsv4_e4m3_from_f32(NAN) == 0x7f);
    CHECK(dsv4_e4m3_from_f32(-0.0f) == 0x80);
    CHECK(dsv4_e4m3_from_f32(ldexpf(1, -11)) == 0x00); /* below half the smallest subnormal */
}

static void test_e5m2(struct test_ctx *t)
{
    check_format(t, "e5m2", dsv4_f32_from_e5m2, dsv4_e5m2_from_f32, 256, 0x80, INFINITY, 50000);
    CHECK(dsv4_f32_from_e5m2(0x7b) == 57344.0f);
    CHECK(isinf(dsv4_f32_from_e5m2(0x7c)) && isnan(dsv4_f32_from_e5m2(0x7d)));
    CHECK(dsv4_e5m2_from_f32(1e9f) == 0x7c);
    CHECK(dsv4_e5m2_from_f32(60000.0f) == 0x7b);
    CHECK(dsv4_f32_from_e5m2(0x01) == ldexpf(1, -16));
}

static void test_e2m1(struct test_ctx *t)
{
    check_format(t, "e2m1", dsv4_f32_from_e2m1, dsv4_e2m1_from_f32, 16, 0x8, 6, 7);
    static const float want[16] = { 0, .5, 1, 1.5, 2, 3, 4, 6, -0.0f, -.5, -1, -1.5, -2, -3, -4, -6 };
    for (int c = 0; c < 16; c++) {
        CHECK(dsv4_f32_from_e2m1((uint8_t)c) == want[c]);
        CHECK(signbit(dsv4_f32_from_e2m1((uint8_t)c)) == signbit(want[c]));
    }
    CHECK(dsv4_e2m1_from_f32(0.25f) == 0);  /* tie 0 / 0.5 -> even code 0 */
    CHECK(dsv4_e2m1_from_f32(0.75f) == 2);  /* tie 0.5 / 1 -> code 2 (1.0) */
    CHECK(dsv4_e2m1_from_f32(2.5f) == 4);   /* tie 2 / 3 -> code 4 (2.0) */
    CHECK(dsv4_e2m1_from_f32(5.0f) == 6);   /* tie 4 / 6 -> code 6 (4.0) */
    CHECK(dsv4_e2m1_from_f32(100.f) == 7);
    CHECK(dsv4_e2m1_from_f32(-100.f) == 15);
}

static void test_e8m0(struct test_ctx *t)
{
    for (int e = 0; e < 255; e++) {
        float v = dsv4_f32_from_e8m0((uint8_t)e);
        CHECKF(v == ldexpf(1.0f, e - 127), "e8m0 %d", e);
        CHECKF(dsv4_e8m0_from_f32(v) == e, "e8m0 round trip %d", e);
        if (e > 0 && e < 254) {
            /* anything strictly between two powers rounds up (ue8m0 rule) */
            CHECK(dsv4_e8m0_from_f32(v * 1.5f) == e + 1);
            CHECK(dsv4_e8m0_from_f32(nextafterf(v, INFINITY)) == e + 1);
        }
    }
    CHECK(isnan(dsv4_f32_from_e8m0(255)));
    CHECK(dsv4_e8m0_from_f32(0.0f) == 255);
    CHECK(dsv4_e8m0_from_f32(-1.0f) == 255);
    CHECK(dsv4_e8m0_from_f32(NAN) == 255);
    CHECK(dsv4_pow2_ceil(448.0f) == 512.0f);
    CHECK(dsv4_pow2_ceil(512.0f) == 512.0f);
    CHECK(dsv4_pow2_ceil(1e-4f / 448.0f) == ldexpf(1, -22));
}

static void test_bf16(struct test_ctx *t)
{
    /* all 65536 codes: decode/encode round trip (NaNs stay NaN) */
    for (uint32_t c = 0; c < 65536; c++) {
        float v = dsv4_f32_from_bf16((uint16_t)c);
        if (isnan(v)) {
            CHECK(isnan(dsv4_f32_from_bf16(dsv4_bf16_from_f32(v))));
            continue;
        }
        CHECKF(dsv4_bf16_from_f32(v) == c, "bf16 0x%04x", c);
    }
    /* random floats: result is nearest, ties to even, checked against the neighbours */
    unsigned long long s = 7;
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)test_rand_u64(&s);
        if ((u & 0x7f800000u) == 0x7f800000u) continue;
        if (i % 3 == 0) u = (u & 0xffff0000u) | 0x8000u; /* exact tie */
        float x;
        memcpy(&x, &u, 4);
        uint16_t c  = dsv4_bf16_from_f32(x);
        double   v  = dsv4_f32_from_bf16(c);
        double   lo = dsv4_f32_from_bf16((uint16_t)(c - 1)), hi = dsv4_f32_from_bf16((uint16_t)(c + 1));
        double   d  = fabs((double)x - v);
        bool     ok = (isnan(lo) || d <= fabs((double)x - lo)) && (isnan(hi) || isinf(hi) || d <= fabs((double)x - hi));
        if (ok && (d == fabs((double)x - lo) || d == fabs((double)x - hi)) && d != 0) ok = (c & 1) == 0;
        CHECKF(ok, "bf16 rounding of %a gave 0x%04x", x, c);
    }
    CHECK(dsv4_bf16_from_f32(INFINITY) == 0x7f80);
    CHECK(dsv4_bf16_from_f32(3.4e38f) == 0x7f80); /* rounds past max bf16 to inf */
    CHECK(dsv4_round_bf16(1.00390625f) == 1.0f);  /* tie, even */
}

static void test_f16(struct test_ctx *t)
{
    for (uint32_t c = 0; c < 65536; c++) {
        float v = dsv4_f32_from_f16((uint16_t)c);
        if (isnan(v)) continue;
        CHECKF(dsv4_f16_from_f32(v) == c, "f16 0x%04x", c);
    }
    unsigned long long s = 9;
    for (int i = 0; i < 200000; i++) {
        float x = ldexpf(test_rand_f32(&s), (int)(test_rand_u64(&s) % 44) - 28);
        uint16_t c = dsv4_f16_from_f32(x);
        double   v = dsv4_f32_from_f16(c);
        if (isinf(v)) {
            CHECK(fabsf(x) >= 65520.0f);
            continue;
        }
        uint16_t mag = c & 0x7fff;
        double lo = mag ? dsv4_f32_from_f16((uint16_t)((c & 0x8000) | (mag - 1))) : v;
        double hi = dsv4_f32_from_f16((uint16_t)(c + 1));
        double d = fabs((double)x - v);
        bool   ok = d <= fabs((double)x - lo) && (isinf(hi) || d <= fabs((double)x - hi));
        if (ok && d != 0 && (d == fabs((double)x - lo) || d == fabs((double)x - hi))) ok = (c & 1) == 0;
        CHECKF(ok, "f16 rounding of %a gave 0x%04x", x, c);
    }
    CHECK(dsv4_f16_from_f32(65504.0f) == 0x7bff);
    CHECK(dsv4_f16_from_f32(65520.0f) == 0x7c00);
    CHECK(dsv4_f16_from_f32(ldexpf(1, -24)) == 0x0001);
}

const struct test_case test_group_numfmt[] = {
    { "e4m3_all_codes_and_rounding", test_e4m3 },
    { "e5m2_all_codes_and_rounding", test_e5m2 },
    { "e2m1_all_codes_and_rounding", test_e2m1 },
    { "e8m0_all_codes", test_e8m0 },
    { "bf16_exhaustive", test_bf16 },
    { "f16_exhaustive", test_f16 },
    { NULL, NULL },
};
