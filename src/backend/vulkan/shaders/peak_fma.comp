// peak_fma.comp - the f32 multiply-add peak of `dsv4 bench` (vk_bench.c): each invocation runs
// 8 independent chains of `iters` FMAs (enough in flight to hide the latency) and writes the
// sum only when it equals a value the chains cannot reach, so nothing is optimised away.
#version 450
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Out { float o[]; };
layout(push_constant) uniform P { uint64_t out_addr; uint iters; float a, b; } p;

void main()
{
    float x[8];
    for (int k = 0; k < 8; k++) x[k] = float(gl_LocalInvocationID.x + uint(k)) * 1e-3;
    for (uint i = 0u; i < p.iters; i++)
        for (int k = 0; k < 8; k++) x[k] = fma(x[k], p.a, p.b);
    float s = x[0] + x[1] + x[2] + x[3] + x[4] + x[5] + x[6] + x[7];
    if (s == -1.0) Out(p.out_addr).o[gl_WorkGroupID.x] = s;
}
