/*
 * ref_num.h - the rounding vocabulary of the scalar reference.
 *
 * The reference computes in double between the demo's dtype boundaries and rounds exactly
 * where the demo holds a tensor in f32 or bf16 (always bf16 via f32, as the demo's bf16
 * values come from f32 accumulators). Sums are taken in double, so the results do not
 * depend on summation order beyond double precision; tools/ref/ follows the same rules,
 * which is why the two agree nearly bit for bit.
 */
#ifndef DSV4_REF_NUM_H
#define DSV4_REF_NUM_H

#include "core/core.h"

static inline double rf32(double x)
{
    return (double)(float)x;
}

static inline float rbf16(double x)
{
    return dsv4_round_bf16((float)x);
}

#endif
