// linear.comp - the op linear (backend.h), and the experts' projections: for each group g
// of a group table (moe_dispatch's layout; a plain linear passes a table of one group), rows
// off[g] .. off[g+1] of x times the weight of expert ids[g] (descriptor tab[ids[g] * 3 + mat]),
// y = x . W^T, rounded to bf16 when out_bf16. x is the activation as used (DSV4_ACT_FP8 is
// applied before, by act_quant.comp, as exact dequantised values).
//
// A workgroup takes ROWS output rows of one group over the group's rows TT at a time: each
// weight element is decoded once per TT token rows (a batched GEMV; the tile of x stays in
// cache). Each invocation sums the products of k = lid, lid + 64, ... in order (below), then a
// tree in shared memory adds the 64 partial sums in a fixed order: a row's result is the same bits
// whatever rows share its batch or group (no float atomics). Groups past grp[0] exit at once.
#version 450
#extension GL_GOOGLE_include_directive : require

const uint ROWS = 4u, TT = 8u;
#include "lin_gemm.glsl"
