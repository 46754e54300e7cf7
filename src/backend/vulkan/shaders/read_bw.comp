// read_bw.comp - the read-bandwidth probe of `dsv4 bench` (vk_bench.c): every invocation reads
// 16-byte words of the buffer at a device address, a grid-stride loop over all of it, and
// XORs them together; one word per workgroup is written (to the first bytes of the buffer's
// last page, which the host never reads back as data) only when the XOR matches a value the
// zero-filled buffer cannot give, so the compiler keeps the loads and the buffer stays as it
// was.
#version 450
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer Words { uvec4 w[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Out { uint o[]; };
layout(push_constant) uniform P { uint64_t buf; uint64_t n_words; uint key; } p;

void main()
{
    uvec4 acc = uvec4(0u);
    uint64_t stride = uint64_t(gl_NumWorkGroups.x) * 256ul;
    // 64-bit offsets: the buffer may be larger than 32-bit indices of 16-byte words reach
    for (uint64_t i = uint64_t(gl_GlobalInvocationID.x); i < p.n_words; i += stride) acc ^= Words(p.buf + i * 16ul).w[0];
    uint x = acc.x ^ acc.y ^ acc.z ^ acc.w;
    if (x == p.key) Out(p.buf).o[gl_WorkGroupID.x] = x;
}
