// moe_gather.comp - the rows of the op moe_dispatch: xe[pair_of[j]] = x[j / k] for every
// (row, slot) pair j, after moe_dispatch.comp placed the pairs. One invocation per element.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "lin.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform P {
    uint64_t pair_of, x, xe;
    uint n_pairs, k, d;
} p;

void main()
{
    uint total = p.n_pairs * p.d, stride = gl_NumWorkGroups.x * 256u;
    for (uint i = gl_GlobalInvocationID.x; i < total; i += stride) {
        uint j = i / p.d, c = i % p.d;
        int  at = Ints(p.pair_of).v[j];
        if (at >= 0) OutFloats(p.xe).v[uint(at) * p.d + c] = Floats(p.x).v[(j / p.k) * p.d + c];
    }
}
