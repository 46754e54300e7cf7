// router.comp - the router's selection (backend.h router; src/backend/cpu/ref_moe.c) after
// the gate projection wrote the logits [n, n_exp]: scores sqrt(softplus(logit)) in double
// with the reference's f32 roundings (written back over the logits; V4.1 divides them by
// gate_temp first), the experts (tid2eid's
// row when given, else the n_used best of score + bias, ties to the lower index) and their
// weights, renormalised in double and scaled. One invocation per row.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "lin.glsl"
#include "moe_math.glsl"

layout(local_size_x = 64) in;
layout(push_constant) uniform P {
    double   route_scale, gate_temp; // gate_temp: f32's value, 1 for V4
    uint64_t logits, bias, tid2eid, tokens, ids, weights; // bias, tid2eid: 0 when none
    uint n, n_exp, n_used;
} p;

float score_of(float logit)
{
    // V4.1's logit / gate_temp in f32: the double quotient rounded once is the f32 quotient
    // (division: double rounding is innocuous from 53 to 24 bits)
    double x  = p.gate_temp == 1.0LF ? double(logit) : double(float(double(logit) / p.gate_temp));
    double sp = x > 20.0LF ? x : dlog1p(dexp(x));
    return float(sqrt(double(float(sp))));
}

bool taken(OutInts ids, uint base, uint k, int e)
{
    for (uint j = 0u; j < k; j++)
        if (ids.v[base + j] == e) return true;
    return false;
}

// The n_used best of score + bias into ids[base ..].
void top_k(OutFloats s, uint row, OutInts ids, uint base)
{
    for (uint k = 0u; k < p.n_used; k++) {
        int   best = -1;
        float bv   = 0.0;
        for (uint e = 0u; e < p.n_exp; e++) {
            float sel = s.v[row + e] + (p.bias != 0ul ? Floats(p.bias).v[e] : 0.0);
            if (isinf(sel) && sel < 0.0 || taken(ids, base, k, int(e))) continue;
            if (best < 0 || sel > bv) best = int(e), bv = sel;
        }
        ids.v[base + k] = best;
    }
}

void main()
{
    uint r = gl_GlobalInvocationID.x;
    if (r >= p.n) return;
    OutFloats s   = OutFloats(p.logits);
    OutInts   ids = OutInts(p.ids);
    uint      row = r * p.n_exp, base = r * p.n_used;
    for (uint e = 0u; e < p.n_exp; e++) s.v[row + e] = score_of(s.v[row + e]);
    if (p.tid2eid != 0ul) {
        uint t = uint(Ints(p.tokens).v[r]);
        for (uint k = 0u; k < p.n_used; k++) ids.v[base + k] = int(Words(p.tid2eid).v[2u * (t * p.n_used + k)]);
    } else {
        top_k(s, row, ids, base);
    }
    double sum = 0.0LF;
    for (uint k = 0u; k < p.n_used; k++) sum += double(s.v[row + uint(ids.v[base + k])]);
    double    fsum = double(float(sum));
    OutFloats w    = OutFloats(p.weights);
    for (uint k = 0u; k < p.n_used; k++) {
        float rw         = float(double(s.v[row + uint(ids.v[base + k])]) / fsum);
        w.v[base + k] = float(double(rw) * p.route_scale);
    }
}
