// moe_math.glsl - exp and log1p in double for the router's softplus and the experts' SiLU,
// which the reference computes in double (GLSL has these functions in float only). exp:
// x = k ln2 + r, |r| <= ln2 / 2, a Taylor polynomial to r^14 (error below 1e-17 relative);
// log(1 + y): a series for tiny y, else 1 + y = m 2^e and 2 atanh((m - 1) / (m + 1)). Both
// are far more accurate than the f32 rounding their results meet.
const double LN2_HI = 0.693147180369123816490LF, LN2_LO = 1.90821492927058770002e-10LF;
const double LN2    = 0.6931471805599453094172LF;

double dexp(double x)
{
    if (x > 709.0LF) return 1.0LF / 0.0LF;
    if (x < -745.0LF) return 0.0LF;
    double k = floor(x / LN2 + 0.5LF);
    double r = (x - k * LN2_HI) - k * LN2_LO, s = 1.0LF;
    for (int i = 14; i >= 1; i--) s = 1.0LF + s * r / double(i);
    int ki = int(k);
    // two steps: 2^k alone may not be a normal double near the ends of the range
    return ldexp(ldexp(s, ki / 2), ki - ki / 2);
}

double dlog1p(double y)
{
    if (abs(y) < 1e-5LF) return y * (1.0LF - y * (0.5LF - y * (1.0LF / 3.0LF - 0.25LF * y)));
    int    e;
    double m = frexp(1.0LF + y, e);
    if (m < 0.70710678118654752440LF) {
        m *= 2.0LF;
        e -= 1;
    }
    double s = (m - 1.0LF) / (m + 1.0LF), s2 = s * s, t = 0.0LF;
    for (int i = 25; i >= 3; i -= 2) t = (t + 1.0LF / double(i)) * s2;
    return double(e) * LN2 + 2.0LF * s * (1.0LF + t);
}
