// linear1.comp - linear.comp for tiles of one token row (a decode step's projections): the same
// sums, the same bits; 32 output rows a workgroup, so a dispatch has an eighth of the
// workgroups and of the barriers (each barrier costs a switch between invocation groups on
// lavapipe, which made linear most of a decode step there).
#version 450
#extension GL_GOOGLE_include_directive : require

const uint ROWS = 32u, TT = 1u;
#include "lin_gemm.glsl"
