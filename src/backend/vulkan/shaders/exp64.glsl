// exp64.glsl - exp in double, which GLSL lacks: the reference's softmaxes take exp in double
// (compress) or round it to f32 (attention), so an f32 exp would not follow them. x = k ln2 +
// r with ln2 in two parts (k ln2_hi exact for |k| < 2^11), |r| <= ln2 / 2, then exp(r) - 1 by
// the Taylor series to r^17 / 17! (below 2^-60 relative) in Horner form, one added last, and
// 2^k by ldexp. Within about 1 ulp of the correctly rounded value: the f32 (and bf16) results
// the ops keep come out as the reference's unless a value lies that close to a rounding
// boundary of theirs.
double exp64(double x)
{
    if (x < -746.0LF) return 0.0LF;
    if (x > 710.0LF) return 1.0LF / 0.0LF;
    const double LN2_HI = 6.93147180369123816490e-01LF, LN2_LO = 1.90821492927058770002e-10LF;
    precise double k = floor(x * 1.44269504088896338700e+00LF + 0.5LF);
    precise double r = (x - k * LN2_HI) - k * LN2_LO;
    precise double t = 1.0LF;
    for (int n = 17; n >= 2; n--) t = 1.0LF + t * r / double(n);
    precise double e = 1.0LF + t * r;
    return ldexp(e, int(k));
}
