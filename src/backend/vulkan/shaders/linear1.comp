// linear1.comp - linear.comp for tiles of one token row (a decode step's projections): the same
// sums, the same bits, a 32nd of the partial sums held per invocation.
#version 450
#extension GL_GOOGLE_include_directive : require

const uint TT = 1u;
#include "lin_gemm.glsl"
