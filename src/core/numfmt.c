/*
 * numfmt.c - the number formats of the DeepSeek-V4 release, encode and decode.
 *
 * Encoders round to nearest, ties to even, on exact arithmetic: a float is widened to
 * double, scaled by powers of two (exact) and rounded with rint() under the default
 * rounding mode (ties-to-even). Saturation follows the reference: e4m3 and e2m1 values are
 * clamped to their largest finite magnitude before the cast (docs/MODEL.md §R5.3), e5m2 and
 * f16 overflow to infinity as IEEE casts do.
 */
#include <math.h>
#include <string.h>

#include "core/core.h"

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}


/* ------------------------------------------------------------------ bf16 */




/* ------------------------------------------------------------------ generic minifloat */

/*
 * Rounds |a| (finite, >= 0) to a format with `mbits` mantissa bits, minimum normal exponent
 * emin (unbiased) and returns the integer significand q and exponent e such that the value is
 * q * 2^(e - mbits), with q in [2^mbits, 2^(mbits+1)) for normals or q < 2^mbits for
 * subnormals (then e == emin).
 */
static void round_minifloat(double a, int mbits, int emin, long *q_out, int *e_out)
{
    int e;
    if (a == 0.0) {
        *q_out = 0;
        *e_out = emin;
        return;
    }
    frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) -> floor(log2 a) = e - 1 */
    e -= 1;
    if (e < emin) e = emin;
    double q = rint(ldexp(a, mbits - e));
    if (q >= ldexp(1.0, mbits + 1)) { /* rounded up to the next binade */
        q /= 2;
        e += 1;
    }
    *q_out = (long)q;
    *e_out = e;
}

/* ------------------------------------------------------------------ f16 */

uint16_t dsv4_f16_from_f32(float x)
{
    uint16_t sign = (uint16_t)((f32_bits(x) >> 16) & 0x8000u);
    if (isnan(x)) return (uint16_t)(sign | 0x7e00u);
    double a = fabs((double)x);
    if (isinf(x) || a >= 65520.0) return (uint16_t)(sign | 0x7c00u); /* >= max + half ulp */
    long q;
    int  e;
    round_minifloat(a, 10, -14, &q, &e);
    if (q < 1024) return (uint16_t)(sign | (uint16_t)q); /* subnormal (or zero) */
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)(q - 1024));
}

float dsv4_f32_from_f16(uint16_t h)
{
    int    sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
    double v;
    if (exp == 31) v = man ? NAN : INFINITY;
    else if (exp == 0) v = ldexp(man, -24);
    else v = ldexp(1024 + man, exp - 25);
    return (float)(sign ? -v : v);
}

/* ------------------------------------------------------------------ e4m3fn */

uint8_t dsv4_e4m3_from_f32(float x)
{
    if (isnan(x)) return 0x7f;
    uint8_t sign = (f32_bits(x) >> 31) ? 0x80 : 0x00;
    double  a    = fabs((double)x);
    if (a > 448.0) a = 448.0; /* saturate, as clamp(-448, 448) before the cast */
    long q;
    int  e;
    round_minifloat(a, 3, -6, &q, &e);
    if (q < 8) return (uint8_t)(sign | q);
    return (uint8_t)(sign | ((e + 7) << 3) | (q - 8));
}


/* ------------------------------------------------------------------ e5m2 */

uint8_t dsv4_e5m2_from_f32(float x)
{
    uint8_t sign = (f32_bits(x) >> 31) ? 0x80 : 0x00;
    if (isnan(x)) return (uint8_t)(sign | 0x7f);
    double a = fabs((double)x);
    if (isinf(x) || a >= 61440.0) return (uint8_t)(sign | 0x7c); /* >= max + half ulp */
    long q;
    int  e;
    round_minifloat(a, 2, -14, &q, &e);
    if (q < 4) return (uint8_t)(sign | q);
    return (uint8_t)(sign | ((e + 15) << 2) | (q - 4));
}

float dsv4_f32_from_e5m2(uint8_t c)
{
    int    sign = c >> 7, exp = (c >> 2) & 31, man = c & 3;
    double v;
    if (exp == 31) v = man ? NAN : INFINITY;
    else if (exp == 0) v = ldexp(man, -16);
    else v = ldexp(4 + man, exp - 17);
    return (float)(sign ? -v : v);
}

/* ------------------------------------------------------------------ e8m0 */

float dsv4_pow2_ceil(float x)
{
    /* frexpf leaves the exponent of an infinity unspecified (glibc: 0); say it: an infinite
     * block maximum gives the scale 1, so the block saturates instead of turning into NaN */
    if (isinf(x)) return 1.0f;
    int   e;
    float m = frexpf(x, &e); /* x = m * 2^e, m in [0.5, 1) */
    if (m == 0.5f) return x;
    return ldexpf(1.0f, e);
}

uint8_t dsv4_e8m0_from_f32(float x)
{
    if (!(x > 0.0f) || isinf(x)) return 255;
    int   e;
    float m = frexpf(x, &e); /* x = m * 2^e */
    int   k = (m == 0.5f) ? e - 1 : e; /* ceil(log2 x) */
    if (k < -127) k = -127;
    if (k > 127) return 255;
    return (uint8_t)(k + 127);
}


/* ------------------------------------------------------------------ e2m1 */


uint8_t dsv4_e2m1_from_f32(float x)
{
    if (isnan(x)) return 0;
    uint8_t sign = (f32_bits(x) >> 31) ? 0x8 : 0x0;
    double  a    = fabs((double)x);
    if (a > 6.0) a = 6.0;
    long q;
    int  e;
    round_minifloat(a, 1, 0, &q, &e); /* one mantissa bit, min normal exponent 0 (value 1) */
    if (q < 2) return (uint8_t)(sign | q); /* 0 or 0.5 */
    return (uint8_t)(sign | ((e + 1) << 1) | (q - 2));
}

