// moe_combine.comp - the op moe_combine (backend.h; src/backend/cpu/ops_data.c): f[r, c] =
// bf16(f32(sum of ye[i, c] over row r's pairs in ascending pair order, in double, +
// shared[r, c])). One invocation per element; each sorts its row's k pairs (k is small).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"
#include "lin.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform P {
    uint64_t pair_of, ye, shared_, f;
    uint n, k, d;
} p;

void main()
{
    uint total = p.n * p.d, stride = gl_NumWorkGroups.x * 256u;
    for (uint i = gl_GlobalInvocationID.x; i < total; i += stride) {
        uint r = i / p.d, c = i % p.d;
        int  pr[64];
        for (uint s = 0u; s < p.k; s++) { // insertion sort, as dsv4_cpu_moe_pairs
            int  val = Ints(p.pair_of).v[r * p.k + s];
            uint j   = s;
            for (; j > 0u && pr[j - 1u] > val; j--) pr[j] = pr[j - 1u];
            pr[j] = val;
        }
        precise double acc = 0.0LF;
        for (uint s = 0u; s < p.k; s++) acc += double(Floats(p.ye).v[uint(pr[s]) * p.d + c]);
        precise double t = acc + double(Floats(p.shared_).v[i]);
        OutFloats(p.f).v[i] = round_bf16(float(t));
    }
}
