// step.glsl - the step descriptor as step_begin uploads it (vk.h: struct vk_step_head, then
// struct vk_step_seq per sequence, then int arrays at element offsets from the start), read
// through its device address, and byte access to backend memory by device address (rows
// are byte-packed: a row need not start on a word).
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

struct Seq {
    int row0, n, p0, pg0;
    uint64_t slot, base;
};
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer StepRef {
    int n_seqs, n_rows, page_tokens, pad;
    uint64_t page_bytes;
    uint pos, tok, rowseq, pad2;
    Seq seq[];
};
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer IntRef { int v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer WordRef { uint w[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer FloatRef { float f[]; };

int step_int(uint64_t step, uint e)
{
    return IntRef(step).v[e];
}

// Row j of sequence q's paged set at `off` in a page, rpp rows a page of row_bytes.
uint64_t page_row(uint64_t step, Seq q, uint64_t page_bytes, uint64_t off, int rpp, int row_bytes, int j)
{
    int page = step_int(step, uint(q.pg0 + j / rpp));
    return q.base + uint64_t(page) * page_bytes + off + uint64_t(j % rpp) * uint64_t(row_bytes);
}

uint rd8(uint64_t a)
{
    uint w = WordRef(a & ~uint64_t(3)).w[0];
    return (w >> (uint(a & uint64_t(3)) * 8u)) & 0xffu;
}

uint rd16(uint64_t a)
{
    return rd8(a) | (rd8(a + 1) << 8);
}
