// idx_scores.comp - the indexer's scores (backend.h indexer_scores; docs/MODEL.md §R3.7),
// one workgroup per (key, query): the key decoded into shared memory, a dot per head in
// double in order (one invocation each), bf16 at the reference's points (ref_attn.c), the
// heads summed in order by one invocation. Mode 0: one query over a paged set of keys (page
// table bound); mode 1: the rows r0 .. r0 + nr of a step, each over its sequence's completed
// keys (the descriptor's pages), scores of row r0 + y at o0 + y * stride; a row that keeps
// every key (indexer_topk needs no scores) is skipped.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"
#include "step.glsl"
#include "rowfmt.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 1) readonly buffer W { float w[]; };
layout(std430, set = 0, binding = 2) readonly buffer PG { int pg[]; };
layout(std430, set = 0, binding = 3) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint64_t step, keys, page_bytes; // keys: mode 0 the pool's address plus the rows' offset, mode 1 keys_off
    uint mode, q0, w0, pg0, o0, n_head, d, page_rows, key_bytes, n_keys, r0, nr, topk; // n_keys: mode 1 the stride
    uint ratio; // mode 1: positions per key
} p;

shared float sk[1024];
shared double sh[256];

void main()
{
    StepRef st = StepRef(p.step);
    uint    lid = gl_LocalInvocationID.x, y = gl_WorkGroupID.y, r = p.r0 + y, n = p.n_keys, qr = p.q0, wr = p.w0;
    Seq     sq;
    if (p.mode == 1u) {
        sq = st.seq[step_int(p.step, st.rowseq + r)];
        n  = uint(sq.p0 + int(r) - sq.row0 + 1) / p.ratio;
        if (n <= p.topk) return;
        qr += r * p.n_head * p.d, wr += r * p.n_head;
    }
    for (uint j = gl_WorkGroupID.x; j < n; j += gl_NumWorkGroups.x) {
        uint64_t a = p.mode == 1u
            ? page_row(p.step, sq, st.page_bytes, p.keys, st.page_tokens / int(p.ratio), int(p.key_bytes), int(j))
            : p.keys + uint64_t(pg[p.pg0 + j / p.page_rows]) * p.page_bytes +
                  uint64_t(j % p.page_rows) * uint64_t(p.key_bytes);
        for (uint i = lid; i < p.d; i += 64u) sk[i] = row_elem(a, FMT_IDX_FP4, p.d, 0u, i);
        barrier();
        for (uint h = lid; h < p.n_head; h += 64u) {
            precise double dot = 0.0LF;
            for (uint i = 0u; i < p.d; i++) dot += double(q[qr + h * p.d + i]) * double(sk[i]);
            precise double sd = double(round_bf16(float(dot)));
            if (sd < 0.0LF) sd = 0.0LF;
            precise double t = sd * double(w[wr + h]);
            sh[h] = double(round_bf16(float(t)));
        }
        barrier();
        if (lid == 0u) {
            precise double sum = 0.0LF;
            for (uint h = 0u; h < p.n_head; h++) sum += sh[h];
            o[p.o0 + (p.mode == 1u ? y * p.n_keys : 0u) + j] = round_bf16(float(sum));
        }
        barrier();
    }
}
