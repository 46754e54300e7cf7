// attention.comp - the op attention (backend.h): sink attention of every row of the step, one
// workgroup per (row, head), in the reference's arithmetic (ref_attn.c): each score a dot in
// double taken in order by one invocation, rounded to f32 and scaled; the maximum; the
// exponentials (dmath.glsl, rounded to f32) summed in order by one invocation; then each
// output dim by one invocation over the rows in order, the probabilities rounded to bf16.
// Fixed orders, no atomics: a row's result does not depend on the batch. Rows are decoded
// where they lie (rowfmt.glsl): the window from the ring or the step's staging rows, then
// the compressed rows (the selection, or every completed one) through the page table. A draft
// block (block != 0) reads, for every query, the window of its chunk's last row, n rows wider.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"
#include "step.glsl"
#include "rowfmt.glsl"
#include "dmath.glsl"

const uint MAXS = 6144u; // rows a query reads (the host checks)
layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 1) readonly buffer S { float sink[]; };
layout(std430, set = 0, binding = 2) readonly buffer SL { int sel[]; };
layout(std430, set = 0, binding = 3) readonly buffer NS { int n_sel[]; };
layout(std430, set = 0, binding = 4) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint64_t step, chunk, ring_off, comp_off;
    uint q0, sink0, sel0, nsel0, o0, has_sel, sel_stride, n_head, d, dr, window, ratio, ring_rows, row_bytes, fmt, block;
    float scale;
} p;

shared float sp[MAXS];      // scores, then their exponentials
shared uint64_t sa[64];     // the addresses of a chunk of rows
shared float smax[64];
shared double sden;

// The address of row k of what step row r (sequence q, position pos) reads; nwin of them
// are the window's.
uint64_t row_addr(StepRef st, Seq sq, uint r, int pos, int nwin, uint k)
{
    uint64_t rb = uint64_t(p.row_bytes);
    if (int(k) < nwin) {
        int j = pos - nwin + 1 + int(k);
        if (j < sq.p0) return sq.slot + p.ring_off + uint64_t(j % int(p.ring_rows)) * rb;
        return p.chunk + uint64_t(sq.row0 + j - sq.p0) * rb;
    }
    int c = int(k) - nwin, id = p.has_sel != 0u ? sel[p.sel0 + r * p.sel_stride + uint(c)] : c;
    return page_row(p.step, sq, st.page_bytes, p.comp_off, st.page_tokens / int(p.ratio), int(p.row_bytes), id);
}

float fmaxf(float a, float b)
{
    return isnan(a) ? b : isnan(b) ? a : max(a, b);
}

// Scores into sp[0 .. n) and their maximum.
float scores(StepRef st, Seq sq, uint r, int pos, int nwin, uint n, uint qh)
{
    uint lid = gl_LocalInvocationID.x;
    float m = uintBitsToFloat(0x7fc00000u);
    for (uint k = lid; k < n; k += 64u) {
        uint64_t a = row_addr(st, sq, r, pos, nwin, k);
        precise double acc = 0.0LF;
        for (uint i = 0u; i < p.d; i++) acc += double(q[qh + i]) * double(row_elem(a, p.fmt, p.d, p.dr, i));
        precise double sc = double(float(acc)) * double(p.scale);
        sp[k] = float(sc);
        m = fmaxf(m, sp[k]);
    }
    smax[lid] = m;
    barrier();
    m = smax[0];
    for (uint i = 1u; i < 64u; i++) m = fmaxf(m, smax[i]);
    return m;
}

// The exponentials into sp[] and the denominator (sum in order, plus the sink's) into sden.
void exps(uint n, float m, float sk)
{
    for (uint k = gl_LocalInvocationID.x; k < n; k += 64u) sp[k] = float(dexp(double(sp[k]) - double(m)));
    barrier();
    if (gl_LocalInvocationID.x == 0u) {
        precise double sum = 0.0LF;
        for (uint k = 0u; k < n; k++) sum += double(sp[k]);
        precise double den = double(float(sum)) + double(float(dexp(double(sk) - double(m))));
        sden = den;
    }
    barrier();
}

void main()
{
    StepRef st = StepRef(p.step);
    uint    h = gl_WorkGroupID.y, lid = gl_LocalInvocationID.x;
    for (uint r = gl_WorkGroupID.x; r < uint(st.n_rows); r += gl_NumWorkGroups.x) {
        Seq  sq = st.seq[step_int(p.step, st.rowseq + r)];
        int  pos = p.block != 0u ? sq.p0 + sq.n - 1 : sq.p0 + int(r) - sq.row0; // the window's position
        int  nwin = min(pos + 1, int(p.window) + (p.block != 0u ? sq.n : 0));
        int  ncomp = p.has_sel != 0u ? n_sel[p.nsel0 + r] : p.ratio != 0u ? (pos + 1) / int(p.ratio) : 0;
        uint n = min(uint(nwin + ncomp), MAXS), qh = p.q0 + (r * p.n_head + h) * p.d;
        float m = scores(st, sq, r, pos, nwin, n, qh);
        exps(n, m, sink[p.sink0 + h]);
        double den = sden;
        for (uint i0 = 0u; i0 < p.d; i0 += 64u) {
            uint i = i0 + lid;
            precise double acc = 0.0LF;
            for (uint k0 = 0u; k0 < n; k0 += 64u) {
                if (k0 + lid < n) sa[lid] = row_addr(st, sq, r, pos, nwin, k0 + lid);
                barrier();
                for (uint k = k0; k < min(k0 + 64u, n) && i < p.d; k++) {
                    float pk = round_bf16(sp[k]);
                    if (pk != 0.0) acc += double(pk) * double(row_elem(sa[k - k0], p.fmt, p.d, p.dr, i));
                }
                barrier();
            }
            precise double v = double(float(acc)) / den;
            if (i < p.d) o[p.o0 + (r * p.n_head + h) * p.d + i] = round_bf16(float(v));
        }
        barrier();
    }
}
