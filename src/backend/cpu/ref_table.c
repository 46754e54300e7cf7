/* ref_table.c - the op table of the scalar reference CPU backend. */
#include "backend/cpu/ops_data.h"
#include "backend/cpu/ref.h"

const struct dsv4_backend_ops dsv4_cpu_ref_ops = {
    .name           = "cpu-ref",
    .linear         = dsv4_ref_linear,
    .rmsnorm        = dsv4_ref_rmsnorm,
    .head_rms       = dsv4_ref_head_rms,
    .rope           = dsv4_ref_rope,
    .fp8_sim        = dsv4_ref_fp8_sim,
    .fp4_sim        = dsv4_ref_fp4_sim,
    .hadamard       = dsv4_ref_hadamard,
    .hc_pre         = dsv4_ref_hc_pre,
    .hc_post        = dsv4_ref_hc_post,
    .hc_head        = dsv4_ref_hc_head,
    .step_begin     = dsv4_cpu_step_begin,
    .attention      = dsv4_ref_attention,
    .indexer_scores = dsv4_ref_indexer_scores,
    .router         = dsv4_ref_router,
    .expert         = dsv4_ref_expert,
    .experts        = dsv4_ref_experts,
    .indexer_topk   = dsv4_cpu_indexer_topk,
    .compress       = dsv4_cpu_compress,
    .store_rows     = dsv4_cpu_store_rows,
    .embed          = dsv4_cpu_embed,
    .scale          = dsv4_cpu_scale,
    .add_streams    = dsv4_cpu_add_streams,
    .engram_rows    = dsv4_cpu_engram_rows,
    .engram_gate    = dsv4_cpu_engram_gate,
    .moe_dispatch   = dsv4_cpu_moe_dispatch,
    .moe_combine    = dsv4_cpu_moe_combine,
};
