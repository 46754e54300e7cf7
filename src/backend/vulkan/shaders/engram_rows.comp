// engram_rows.comp - the op engram_rows (backend.h): out[k] = bf16(e4m3 code k times the e8m0
// scale of its 32), decoded on the bits as the reference (lin.glsl). The host gathers the codes
// and scales of the rows a step names into host metadata (vk_op_engram.c: the tables stay in
// host memory, read by row); every row is a multiple of 32 wide, so element k's scale is k / 32.
// One invocation per output element.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"
#include "lin.glsl"

layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Out { float o[]; };
layout(push_constant) uniform P { uint64_t codes, scales; uint o0, total; } p;

void main()
{
    uint  stride = gl_NumWorkGroups.x * 256u;
    Words c = Words(p.codes), s = Words(p.scales);
    for (uint k = gl_GlobalInvocationID.x; k < p.total; k += stride)
        o[p.o0 + k] = round_bf16(e4m3_value(byte_at(c, k)) * e8m0_value(byte_at(s, k / 32u)));
}
