// moe_math.glsl - exp and log1p in double for the router's softplus and the experts' SiLU,
// which the reference computes in double (GLSL has these functions in float only). exp is
// dmath.glsl's (shared with rope, the hyper-connections, attention and the compressor);
// log(1 + y): a series for tiny y, else 1 + y = m 2^e and 2 atanh((m - 1) / (m + 1)), far
// more accurate than the f32 rounding its result meets.
#include "dmath.glsl"

const double LN2 = 0.6931471805599453094172LF;

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
