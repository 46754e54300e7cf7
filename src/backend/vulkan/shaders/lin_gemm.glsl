// lin_gemm.glsl - the body of linear.comp and linear1.comp (see linear.comp): ROWS output rows
// by TT token rows a tile; the two differ in ROWS and TT alone, and a row's sums depend on
// neither (the same k split, the same blocks, the same tree), so they give the same bits.
#include "bf16.glsl"
#include "lin.glsl"

// NT invocations share a row's k (a specialization constant, vk_pipe.c: 64 on a GPU, 8 on a
// CPU device such as lavapipe, where each group of 8 more costs a switch at every barrier).
// It fixes the order of a row's sums on a device; it is the same for every batch size there.
layout(constant_id = 0) const uint NT = 64u;
layout(local_size_x_id = 0) in;
layout(push_constant) uniform P {
    uint64_t tab, grp, x, y;
    uint ldx, ldy, n_exp, mat, row_off, n_out, n_in, out_bf16;
} p;

// ROWS, TT: the including shader's
shared double red[ROWS * TT * NT];

// The ROWS x TT partial sums of this invocation over its k: per 128-block of k its two
// products (exact in f32 for bf16 and e4m3 operands) summed in f32, the blocks in double,
// so that long rows keep the reference's accuracy.
void partial_sums(LinDesc d, uint fmt, uint o0, uint t0, uint t1, out double acc[ROWS * TT])
{
    Floats x  = Floats(p.x);
    uint   sf = d.scale_f32;
    WRow   wr[ROWS];
    for (uint r = 0u; r < ROWS; r++) wr[r] = weight_row(d, fmt, p.n_in, min(o0 + r, p.n_out - 1u) + p.row_off);
    for (uint j = 0u; j < ROWS * TT; j++) acc[j] = 0.0LF;
    for (uint b = 0u; b < p.n_in; b += 128u) {
        float part[ROWS * TT];
        for (uint j = 0u; j < ROWS * TT; j++) part[j] = 0.0;
        for (uint k = b + gl_LocalInvocationID.x; k < min(b + 128u, p.n_in); k += NT) {
            float xv[TT];
            for (uint t = 0u; t < TT; t++) xv[t] = t0 + t < t1 ? x.v[(t0 + t) * p.ldx + k] : 0.0;
            for (uint r = 0u; r < ROWS; r++) {
                if (o0 + r >= p.n_out) break;
                float w = weight_el(wr[r], fmt, sf, k);
                for (uint t = 0u; t < TT; t++) {
                    if (t0 + t >= t1) break; // uniform: a short last tile (decode) does no more
                    precise float a = fma(xv[t], w, part[r * TT + t]);
                    part[r * TT + t] = a;
                }
            }
        }
        for (uint j = 0u; j < ROWS * TT; j++) acc[j] += double(part[j]);
    }
}

// The fixed-order tree over the invocations' partial sums, then the writes.
void reduce_store(double acc[ROWS * TT], uint o0, uint t0, uint t1)
{
    // only the tile's nt token rows are reduced (a decode step's one row: an eighth of the
    // work); each sum's tree is the same whatever nt is, so the bits do not depend on it
    uint lid = gl_LocalInvocationID.x, nt = t1 - t0;
    for (uint r = 0u; r < ROWS; r++)
        for (uint t = 0u; t < nt; t++) red[(r * TT + t) * NT + lid] = acc[r * TT + t];
    barrier();
    for (uint s = NT / 2u; s > 0u; s >>= 1) {
        if (lid < s)
            for (uint r = 0u; r < ROWS; r++)
                for (uint t = 0u; t < nt; t++) {
                    uint j = r * TT + t;
                    precise double a = red[j * NT + lid] + red[j * NT + lid + s];
                    red[j * NT + lid] = a;
                }
        barrier();
    }
    for (uint j = lid; j < ROWS * TT; j += NT) {
        uint r = j / TT, t = j % TT;
        if (o0 + r < p.n_out && t0 + t < t1) {
            float v = float(red[j * NT]);
            OutFloats(p.y).v[(t0 + t) * p.ldy + o0 + r] = p.out_bf16 != 0u ? round_bf16(v) : v;
        }
    }
    barrier();
}

void main()
{
    Ints grp = Ints(p.grp);
    uint g   = gl_WorkGroupID.y;
    if (int(g) >= grp.v[0]) return;
    uint    e  = uint(grp.v[1u + g]);
    uint    r0 = uint(grp.v[1u + p.n_exp + g]), r1 = uint(grp.v[2u + p.n_exp + g]);
    LinDesc d  = LinDesc(Addrs(p.tab).a[e * 3u + p.mat]);
    uint  fmt  = d.fmt;
    uint  nb   = (p.n_out + ROWS - 1u) / ROWS;
    for (uint ob = gl_WorkGroupID.x; ob < nb; ob += gl_NumWorkGroups.x)
        for (uint t0 = r0; t0 < r1; t0 += TT) {
            double acc[ROWS * TT];
            partial_sums(d, fmt, ob * ROWS, t0, min(t0 + TT, r1), acc);
            reduce_store(acc, ob * ROWS, t0, min(t0 + TT, r1));
        }
}
