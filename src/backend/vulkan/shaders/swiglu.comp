// swiglu.comp - the middle of an expert (backend.h expert; src/backend/cpu/ref_moe.c): from
// the gate and up projections g, v [rows, f] (bf16 values), h = silu(min(g, limit)) *
// clamp(v, +-limit) (no clamp when limit <= 0) in double with the reference's f32 roundings,
// times row_w[r] when given, written to g as bf16. One invocation per element.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"
#include "lin.glsl"
#include "moe_math.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform P {
    double   limit;
    uint64_t g, v, row_w; // row_w 0: none
    uint rows, f;
} p;

void main()
{
    uint      total = p.rows * p.f, stride = gl_NumWorkGroups.x * 256u;
    OutFloats g     = OutFloats(p.g);
    Floats    v     = Floats(p.v);
    for (uint i = gl_GlobalInvocationID.x; i < total; i += stride) {
        double gg = double(g.v[i]), vv = double(v.v[i]);
        if (p.limit > 0.0LF) {
            vv = min(max(vv, -p.limit), p.limit);
            gg = min(gg, p.limit);
        }
        precise double silu = gg * (1.0LF / (1.0LF + dexp(-gg)));
        precise double h    = double(float(double(float(silu)) * vv));
        if (p.row_w != 0ul) h = double(float(double(Floats(p.row_w).v[i / p.f]) * h));
        g.v[i] = round_bf16(float(h));
    }
}
