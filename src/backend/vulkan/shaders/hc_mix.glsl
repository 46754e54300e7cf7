// hc_mix.glsl - the mixing weights of the hyper-connection ops (src/backend/cpu/ref_ops.c's
// hc_mix): over a row's hc x d values X, mix[m] = f32(f32(X . fn[m]) * rs) with
// rs = f32(1 / sqrt(f32(mean(X^2)) + eps)). The includer declares the buffers X and FN (x[],
// fn[]) and runs HC_WG invocations per workgroup, one workgroup per row.
//
// The sums are in double like the reference's, but not in its order: each invocation sums a
// stride of the row, then a tree in shared memory adds the partial sums, always the same
// tree, so a row's weights do not depend on the other rows of the call. Every product is
// exact in double; the sums differ from the reference's by a few double ulps, which the
// rounding to f32 hides except when a sum lies that close to an f32 boundary. Up to 8 sums
// (X^2 first, then the mixes) share one pass over the row and one tree.
#define HC_WG 128u
#define HC_MAX_MIX 80u // (2 + 8) x 8: hc_pre with DSV4_MAX_HC streams

shared double s_red[8][HC_WG];
shared double s_mix[HC_MAX_MIX + 1u];

// Fills s_mix[0..n_mix) for the row at x[xr] (n = hc d values, fn[fn0 + m n + i]).
void hc_mix(uint xr, uint fn0, uint n, uint n_mix, double norm_eps)
{
    uint lid = gl_LocalInvocationID.x;
    for (uint k0 = 0u; k0 <= n_mix; k0 += 8u) {
        uint   nk = min(8u, n_mix + 1u - k0);
        double acc[8] = double[](0.0LF, 0.0LF, 0.0LF, 0.0LF, 0.0LF, 0.0LF, 0.0LF, 0.0LF);
        for (uint i = lid; i < n; i += HC_WG) {
            double xi = double(x[xr + i]);
            for (uint j = 0u; j < nk; j++) {
                uint   k = k0 + j;
                double f = k == 0u ? xi : double(fn[fn0 + (k - 1u) * n + i]);
                precise double t = acc[j] + xi * f;
                acc[j] = t;
            }
        }
        for (uint j = 0u; j < nk; j++) s_red[j][lid] = acc[j];
        barrier();
        for (uint h = HC_WG / 2u; h > 0u; h /= 2u) {
            if (lid < h)
                for (uint j = 0u; j < nk; j++) {
                    precise double t = s_red[j][lid] + s_red[j][lid + h];
                    s_red[j][lid] = t;
                }
            barrier();
        }
        if (lid < nk) s_mix[k0 + lid] = s_red[lid][0];
        barrier();
    }
    // s_mix[0] is the sum of squares, s_mix[1 + m] mix m's dot product
    double ss = s_mix[0];
    precise double rs = double(float(1.0LF / sqrt(double(float(ss / double(n))) + norm_eps)));
    double dot = lid < n_mix ? s_mix[1u + lid] : 0.0LF;
    barrier();
    if (lid < n_mix) {
        precise double m = double(float(dot)) * rs;
        s_mix[lid] = double(float(m));
    }
    barrier();
}
