// dmath.glsl - exp, sin and cos in double for the shaders that follow the reference's libm
// calls (rope: cos/sin; the hyper-connections: exp in sigmoid and Sinkhorn). GLSL has these in
// float only and without a rounding guarantee; here they are Taylor series on a reduced
// argument, a few double ulps from the true value, so the f32 (or later) roundings the
// reference applies give its bits except when the true value lies within those ulps of a
// rounding boundary. `precise` keeps the reductions from being refactored.

// 1/n! for n = 0..20, alternating signs folded in by the callers
const double INV_FACT[21] = double[](1.0LF, 1.0LF, 0.5LF, 0.16666666666666666LF, 0.041666666666666664LF,
    0.008333333333333333LF, 0.001388888888888889LF, 0.0001984126984126984LF, 2.48015873015873e-05LF,
    2.7557319223985893e-06LF, 2.755731922398589e-07LF, 2.505210838544172e-08LF, 2.08767569878681e-09LF,
    1.6059043836821613e-10LF, 1.1470745597729725e-11LF, 7.647163731819816e-13LF, 4.779477332387385e-14LF,
    2.8114572543455206e-15LF, 1.5619206968586225e-16LF, 8.22063524662433e-18LF, 4.110317623312165e-19LF);

double dmath_inf()
{
    return packDouble2x32(uvec2(0u, 0x7ff00000u));
}

// e^x: x = k ln2 + r with |r| <= ln2/2 (ln2 in two parts, the first with 21 zero bits so
// k ln2_hi is exact), then the series to r^13 (the next term is below 2^-57 of the result).
double dexp(double x)
{
    if (isnan(x)) return x;
    if (x > 709.8LF) return dmath_inf();
    if (x < -745.2LF) return 0.0LF;
    double k = roundEven(x * 1.4426950408889634LF);
    precise double r = (x - k * 0.6931471803691238LF) - k * 1.9082149292705877e-10LF;
    precise double p = INV_FACT[13];
    for (int n = 12; n >= 0; n--) p = p * r + INV_FACT[n];
    // two steps: the first exact, so a subnormal result is rounded once
    int ki = int(k), k1 = ki / 2;
    return ldexp(ldexp(p, k1), ki - k1);
}

// sin and cos of a finite x: x = k pi/2 + r, pi/2 in three doubles (the products by k
// exact or negligible for |x| < 2^31: the RoPE angles), then the series on |r| <= pi/4 to
// r^19 and r^18 (the next terms below 2^-70).
void dsincos(double x, out double s, out double c)
{
    double k = roundEven(x * 0.6366197723675814LF);
    precise double p  = k * 1.5707963267948966LF;
    precise double pe = fma(k, 1.5707963267948966LF, -p);
    precise double r  = (((x - p) - pe) - k * 6.123233995736766e-17LF) - k * -1.4973849048591698e-33LF;
    precise double z = r * r, qs = INV_FACT[19], qc = INV_FACT[18];
    for (int n = 17; n >= 3; n -= 2) qs = INV_FACT[n] - z * qs;
    for (int n = 16; n >= 2; n -= 2) qc = INV_FACT[n] - z * qc;
    precise double sr = r - (r * z) * qs, cr = 1.0LF - z * qc;
    int q = int(k - 4.0LF * floor(k * 0.25LF));
    s = q == 0 ? sr : q == 1 ? cr : q == 2 ? -sr : -cr;
    c = q == 0 ? cr : q == 1 ? -sr : q == 2 ? -cr : sr;
}
