// hc_pre.comp - the op hc_pre (backend.h, docs/MODEL.md §R3.2) whole in one dispatch: per row
// the mixing weights (hc_mix.glsl), then the first invocation computes pre, post and the
// hc x hc comb matrix and runs every Sinkhorn iteration on it (hc <= 8: a few hundred flops an
// iteration, not worth a dispatch each), in double in the reference's order
// (src/backend/cpu/ref_ops.c, exp from dmath.glsl); then u = bf16(sum_j pre[j] X[j]) over d.
// One workgroup per row. mode 1 (V4.1's lagged hyper-connections): u collapses with the row's
// lag[] (the previous sublayer's pre), which then takes this pre; mode 2 (V4.1's final
// collapse): u from lag[] alone, no mix computed (fn, scale, base, post and comb unread).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"
#include "dmath.glsl"

layout(local_size_x = 128) in;
layout(std430, set = 0, binding = 0) readonly buffer Xin { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer FN { float fn[]; };
layout(std430, set = 0, binding = 2) readonly buffer S { float scale[]; };
layout(std430, set = 0, binding = 3) readonly buffer B { float base[]; };
layout(std430, set = 0, binding = 4) writeonly buffer U { float u[]; };
layout(std430, set = 0, binding = 5) writeonly buffer Post { float post[]; };
layout(std430, set = 0, binding = 6) writeonly buffer Comb { float comb[]; };
layout(std430, set = 0, binding = 7) buffer Lag { float lag[]; };
layout(push_constant) uniform P { double norm_eps, hc_eps; uint x0, fn0, s0, b0, u0, p0, c0, n, hc, d, iters, l0, mode; } p;

#include "hc_mix.glsl"

shared double s_pre[8];

double sigmoid(double v)
{
    return 1.0LF / (1.0LF + dexp(-v));
}

// The affine map of mix m (group g: 0 pre, 1 post, 2 comb), rounded to f32.
double hc_affine(uint m, uint g)
{
    precise double t = s_mix[m] * double(scale[p.s0 + g]) + double(base[p.b0 + m]);
    return double(float(t));
}

void sinkhorn(inout double c[64], uint hc, double eps)
{
    for (uint j = 0u; j < hc; j++) {
        double mx = c[j * hc];
        for (uint k = 1u; k < hc; k++) mx = isnan(mx) || c[j * hc + k] > mx ? c[j * hc + k] : mx; // fmax
        precise double sum = 0.0LF;
        for (uint k = 0u; k < hc; k++) {
            c[j * hc + k] = dexp(c[j * hc + k] - mx);
            sum += c[j * hc + k];
        }
        for (uint k = 0u; k < hc; k++) {
            precise double t = c[j * hc + k] / sum + eps;
            c[j * hc + k] = t;
        }
    }
    for (uint it = 0u; it < p.iters; it++) {
        if (it > 0u)
            for (uint j = 0u; j < hc; j++) {
                precise double sum = 0.0LF;
                for (uint k = 0u; k < hc; k++) sum += c[j * hc + k];
                precise double den = sum + eps;
                for (uint k = 0u; k < hc; k++) c[j * hc + k] /= den;
            }
        for (uint k = 0u; k < hc; k++) {
            precise double sum = 0.0LF;
            for (uint j = 0u; j < hc; j++) sum += c[j * hc + k];
            precise double den = sum + eps;
            for (uint j = 0u; j < hc; j++) c[j * hc + k] /= den;
        }
    }
}

// The first invocation: pre (to shared memory), post and comb of row r.
void weights(uint r)
{
    uint   hc = p.hc;
    double c[64];
    for (uint j = 0u; j < hc; j++) {
        precise double pre = sigmoid(hc_affine(j, 0u)) + p.hc_eps;
        s_pre[j] = double(float(pre));
        post[p.p0 + r * hc + j] = float(2.0LF * sigmoid(hc_affine(hc + j, 1u)));
    }
    for (uint m = 0u; m < hc * hc; m++) c[m] = hc_affine(2u * hc + m, 2u);
    sinkhorn(c, hc, p.hc_eps);
    for (uint m = 0u; m < hc * hc; m++) comb[p.c0 + r * hc * hc + m] = float(c[m]);
}

void main()
{
    uint lid = gl_LocalInvocationID.x, hc = p.hc, d = p.d;
    for (uint r = gl_WorkGroupID.x; r < p.n; r += gl_NumWorkGroups.x) {
        uint xr = p.x0 + r * hc * d, lr = p.l0 + r * hc;
        if (p.mode != 2u) hc_mix(xr, p.fn0, hc * d, (2u + hc) * hc, p.norm_eps);
        if (lid == 0u) {
            double own[8];
            if (p.mode != 2u) weights(r);
            for (uint j = 0u; j < hc; j++) own[j] = s_pre[j];
            for (uint j = 0u; j < hc && p.mode != 0u; j++) s_pre[j] = double(lag[lr + j]);
            for (uint j = 0u; j < hc && p.mode == 1u; j++) lag[lr + j] = float(own[j]);
        }
        barrier();
        for (uint i = lid; i < d; i += HC_WG) {
            precise double acc = 0.0LF;
            for (uint j = 0u; j < hc; j++) acc += s_pre[j] * double(x[xr + j * d + i]);
            u[p.u0 + r * d + i] = round_bf16(float(acc));
        }
        barrier();
    }
}
