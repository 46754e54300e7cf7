// engram_gate.comp - the op engram_gate (backend.h): per row r and stream c, the gate
// g = sigmoid(sign(dot) sqrt(max(|dot|, 1e-6))) of dot = (sum h w k) rstd / sqrt(d), then
// X[r, c] = bf16(h + g value). One workgroup per (row, stream): its first invocation takes the
// three sums in double in the reference's order (src/backend/cpu/ops_engram.c), so dot is the
// reference's bit for bit; the sigmoid's exp is the device's f32 one (GLSL has no double
// exp), which is why the op's tolerance is one bf16 rounding rather than bit-exact.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "bf16.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer KV { float kv[]; };
layout(std430, set = 0, binding = 1) readonly buffer W { float w[]; };
layout(std430, set = 0, binding = 2) buffer X { float x[]; };
layout(push_constant) uniform P { double eps; uint kv0, w0, x0, n, hc, d; float dscale; } p; // dscale: f32(d^-0.5)

shared float s_gate;

// mean(v^2) over the d values from a, in double, rounded to f32 (the reference's mean_square).
float mean_square(uint a, bool in_x)
{
    precise double s = 0.0LF;
    for (uint i = 0u; i < p.d; i++) {
        double v = double(in_x ? x[a + i] : kv[a + i]);
        s += v * v;
    }
    return float(s / double(p.d));
}

// rsqrt(mean + eps) at the official f32 boundaries (the reference's rstd_of).
float rstd_of(uint a, bool in_x)
{
    precise double t = double(float(double(mean_square(a, in_x)) + p.eps));
    return float(1.0LF / sqrt(t));
}

float gate_of(uint xa, uint ka, uint wa)
{
    precise float  rstd = float(double(rstd_of(xa, true)) * double(rstd_of(ka, false)));
    precise double s = 0.0LF;
    for (uint i = 0u; i < p.d; i++) s += double(x[xa + i]) * double(w[wa + i]) * double(kv[ka + i]);
    precise float  dot = float(double(float(double(float(s)) * double(rstd))) * double(p.dscale));
    precise float  m   = max(abs(dot), 1e-6);
    precise float  mag = float(sqrt(double(m)));
    precise float  sg  = dot < 0.0 ? -mag : mag;
    return 1.0 / (1.0 + exp(-sg));
}

void main()
{
    uint lid = gl_LocalInvocationID.x;
    for (uint g = gl_WorkGroupID.x; g < p.n * p.hc; g += gl_NumWorkGroups.x) {
        uint r = g / p.hc, c = g % p.hc;
        uint xa = p.x0 + g * p.d, ka = p.kv0 + r * (p.hc + 1u) * p.d + c * p.d, va = p.kv0 + (r * (p.hc + 1u) + p.hc) * p.d;
        if (lid == 0u) s_gate = gate_of(xa, ka, p.w0 + c * p.d);
        barrier();
        double gate = double(s_gate);
        for (uint i = lid; i < p.d; i += 64u) {
            precise double v = double(x[xa + i]) + gate * double(kv[va + i]);
            x[xa + i] = round_bf16(float(v));
        }
        barrier();
    }
}
