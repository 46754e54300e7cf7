// hc_post.comp - the op hc_post (backend.h): Xout[r, k, i] = bf16(post[r, k] f[r, i] +
// sum_j comb[r, j, k] Xres[r, j, i]), the sum over j in double in the reference's order, then
// the product added (src/backend/cpu/ref_ops.c). One invocation per element of Xout.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"

layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) readonly buffer F { float f[]; };
layout(std430, set = 0, binding = 1) readonly buffer Xres { float xres[]; };
layout(std430, set = 0, binding = 2) readonly buffer Post { float post[]; };
layout(std430, set = 0, binding = 3) readonly buffer Comb { float comb[]; };
layout(std430, set = 0, binding = 4) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint f0, x0, p0, c0, y0, n, hc, d; } p;

void main()
{
    uint hc = p.hc, d = p.d, total = p.n * hc * d, stride = gl_NumWorkGroups.x * 256u;
    for (uint e = gl_GlobalInvocationID.x; e < total; e += stride) {
        uint r = e / (hc * d), k = (e / d) % hc, i = e % d;
        uint xr = p.x0 + r * hc * d, cr = p.c0 + r * hc * hc;
        precise double acc = 0.0LF;
        for (uint j = 0u; j < hc; j++) acc += double(comb[cr + j * hc + k]) * double(xres[xr + j * d + i]);
        precise double v = double(post[p.p0 + r * hc + k]) * double(f[p.f0 + r * d + i]) + acc;
        y[p.y0 + e] = round_bf16(float(v));
    }
}
