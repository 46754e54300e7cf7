// scale.comp - the op scale (backend.h): x[i] = bf16(f32(x[i] * s)), the product in double as
// the reference (src/backend/cpu/ops_data.c). One invocation per element, grid-stride.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"

layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer X { float x[]; };
layout(push_constant) uniform P { double s; uint x0, n; } p;

void main()
{
    uint stride = gl_NumWorkGroups.x * 256u;
    for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
        precise double v = double(x[p.x0 + i]) * p.s;
        x[p.x0 + i] = round_bf16(float(v));
    }
}
