// store_rows.comp - the op store_rows (backend.h): rows of x encoded (rowenc.glsl) to where
// dst says, one workgroup per row: mode 0 the step's staging rows, 1 each sequence's window
// ring (its last min(n, window) rows), 2 the rows of the blocks each sequence completes
// (packed as compress writes them) to its pages. Bit-exact with row_codec.c.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"
#include "step.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(push_constant) uniform P {
    uint64_t step, dst; // the staging rows' address (mode 0), else the offset in a slot / page
    uint x0, ldx, mode, fmt, d, dr, row_bytes, window, ring_rows, ratio, n;
} p;

shared uint rb[2048];
shared float rscale[64];
#define XV(i) x[i]
#include "rowenc.glsl"

// Where packed row i goes (mode 2); 0 when it is not a block's.
uint64_t block_dst(StepRef st, uint i)
{
    int b0 = 0, r = int(p.ratio);
    for (int s = 0; s < st.n_seqs; s++) {
        Seq q = st.seq[s];
        int nb = (q.p0 + q.n) / r - q.p0 / r;
        if (int(i) < b0 + nb)
            return page_row(p.step, q, st.page_bytes, p.dst, st.page_tokens / r, int(p.row_bytes), q.p0 / r + int(i) - b0);
        b0 += nb;
    }
    return 0ul;
}

// Where step row i goes (mode 1); 0 when it is not among its sequence's last window rows.
uint64_t ring_dst(StepRef st, uint i)
{
    Seq q = st.seq[step_int(p.step, st.rowseq + i)];
    int t = int(i) - q.row0, from = q.n > int(p.window) ? q.n - int(p.window) : 0;
    if (t < from) return 0ul;
    return q.slot + p.dst + uint64_t((q.p0 + t) % int(p.ring_rows)) * uint64_t(p.row_bytes);
}

void main()
{
    StepRef st = StepRef(p.step);
    for (uint i = gl_WorkGroupID.x; i < p.n; i += gl_NumWorkGroups.x) {
        uint64_t a = p.mode == 0u ? p.dst + uint64_t(i) * uint64_t(p.row_bytes)
                   : p.mode == 1u ? ring_dst(st, i) : block_dst(st, i);
        if (a == 0ul) continue;
        encode_row(p.x0 + i * p.ldx, p.fmt, p.d, p.dr);
        barrier();
        write_bytes(a, p.row_bytes);
        barrier();
    }
}
