/*
 * vk_ops.c - the Vulkan backend's op table and what every op file uses: addresses resolved
 * to bindings or device addresses, workgroup counts, the shader behind each op.
 *
 * A NULL entry is an op this backend does not run: the op checker reports it `missing` and
 * engine open refuses the backend, naming it (no op falls back to the CPU). The ops live in
 * files by kind: vk_op_rows.c (element-wise and per-row ops), vk_op_rows2.c (the in-place row ops
 * of attention's inputs), vk_op_hc.c (hyper-connections), ...
 *
 * Each op resolves its addresses to (buffer, offset) in the block table (vk_mem.c), binds
 * each buffer from its offset rounded down to minStorageBufferOffsetAlignment and passes the
 * rest as an element index in the push constants (or takes device addresses for tables of
 * pointers); host metadata (token ids, positions) goes through the command buffer's metadata
 * area. Then one or more dispatches, recorded in the open command buffer: sync or the next
 * download submits and waits.
 */
#include <string.h>

#include "backend/vulkan/vk.h"

enum { VKB_MAX_GROUPS = 65535 };

int64_t dsv4_vk_arg(struct dsv4_vk *v, const void *p, size_t elem, size_t bytes, struct vk_bind *b)
{
    VkDeviceSize           off;
    const struct vk_block *blk = dsv4_vk_resolve(v, p, &off);
    if (!blk || off + bytes > blk->len) {
        dsv4_vk_fault(v, "an op was given %p (%zu bytes), which is not inside one of its buffers", p, bytes);
        return -1;
    }
    VkDeviceSize base = off / v->sb_align * v->sb_align, range = blk->len - base;
    VkDeviceSize max  = v->dev_info[v->chosen].max_sb_range;
    if ((off - base) % elem) {
        dsv4_vk_fault(v, "an op was given %p, not aligned to its %zu-byte elements", p, elem);
        return -1;
    }
    if (off - base + bytes > max) {
        dsv4_vk_fault(v, "an op binds %zu bytes at %p: more than maxStorageBufferRange (%llu)", bytes, p,
                      (unsigned long long)max);
        return -1;
    }
    *b = (struct vk_bind){ blk->buf, base, range < max ? range : max / elem * elem };
    return (int64_t)((off - base) / elem);
}

VkDeviceAddress dsv4_vk_addr(struct dsv4_vk *v, const void *p, size_t bytes)
{
    VkDeviceSize           off;
    const struct vk_block *blk = dsv4_vk_resolve(v, p, &off);
    if (!blk || off + bytes > blk->len) {
        dsv4_vk_fault(v, "an op was given %p (%zu bytes), which is not inside one of its buffers", p, bytes);
        return 0;
    }
    return blk->dva + off;
}

bool dsv4_vk_owns(const struct dsv4_vk *v, const void *p)
{
    const uint8_t *a = p;
    return a >= v->base && a < v->base + v->reserve;
}

int64_t dsv4_vk_in(struct dsv4_vk *v, const void *p, size_t elem, size_t bytes, struct vk_bind *b)
{
    if (dsv4_vk_owns(v, p)) return dsv4_vk_arg(v, p, elem, bytes, b);
    void *m = dsv4_vk_meta(v, bytes, b, NULL);
    if (!m) return -1;
    if (bytes) memcpy(m, p, bytes);
    return 0;
}

uint32_t dsv4_vk_groups(uint64_t items, uint32_t per_group)
{
    uint64_t g = (items + per_group - 1) / per_group;
    return g < 1 ? 1u : g > VKB_MAX_GROUPS ? (uint32_t)VKB_MAX_GROUPS : (uint32_t)g;
}

bool dsv4_vk_fits_u32(struct dsv4_vk *v, uint64_t n, const char *op)
{
    if (n <= UINT32_MAX) return true;
    dsv4_vk_fault(v, "%s over %llu elements: more than the shader's 32-bit indices", op, (unsigned long long)n);
    return false;
}

/* The shader (or first shader) behind each op, for `dsv4 ops`. */
static const char *const OP_SHADER[DSV4_OP_COUNT] = {
    [DSV4_OP_SCALE] = "scale",
    [DSV4_OP_ADD_STREAMS] = "add_streams",
    [DSV4_OP_ENGRAM_ROWS] = "engram_rows",
    [DSV4_OP_ENGRAM_GATE] = "engram_gate",
    [DSV4_OP_EMBED] = "embed",
    [DSV4_OP_RMSNORM] = "rmsnorm",
    /* vk_op_rows2.c, vk_op_hc.c */
    [DSV4_OP_HEAD_RMS] = "head_rms",
    [DSV4_OP_ROPE] = "rope",
    [DSV4_OP_FP8_SIM] = "act_sim",
    [DSV4_OP_FP4_SIM] = "act_sim",
    [DSV4_OP_HADAMARD] = "hadamard",
    [DSV4_OP_HC_PRE] = "hc_pre",
    [DSV4_OP_HC_POST] = "hc_post",
    [DSV4_OP_HC_HEAD] = "hc_head",
    /* the whole-step ops (vk_op_step.c, vk_op_kv.c, vk_op_attn.c, vk_op_idx.c) */
    [DSV4_OP_STEP_BEGIN] = "(an upload)",
    [DSV4_OP_STORE_ROWS] = "store_rows",
    [DSV4_OP_COMPRESS] = "compress",
    [DSV4_OP_ATTENTION] = "attention",
    [DSV4_OP_INDEXER_SCORES] = "idx_scores",
    [DSV4_OP_INDEXER_TOPK] = "idx_scores",
    /* vk_op_linear.c, vk_op_moe.c */
    [DSV4_OP_LINEAR] = "linear",
    [DSV4_OP_ROUTER] = "router",
    [DSV4_OP_EXPERT] = "linear",
    [DSV4_OP_EXPERTS] = "linear",
    [DSV4_OP_MOE_DISPATCH] = "moe_dispatch",
    [DSV4_OP_MOE_COMBINE] = "moe_combine",
};

const char *dsv4_vk_op_shader(enum dsv4_op op)
{
    return (int)op >= 0 && op < DSV4_OP_COUNT ? OP_SHADER[op] : NULL;
}

const struct dsv4_backend_ops dsv4_vk_ops = {
    .name        = "vulkan",
    .rmsnorm     = dsv4_vk_rmsnorm,
    .embed       = dsv4_vk_embed,
    .scale       = dsv4_vk_scale,
    .add_streams = dsv4_vk_add_streams,
    .engram_rows = dsv4_vk_engram_rows, /* vk_op_engram.c */
    .engram_gate = dsv4_vk_engram_gate,
    /* vk_op_rows2.c, vk_op_hc.c */
    .head_rms    = dsv4_vk_head_rms,
    .rope        = dsv4_vk_rope,
    .fp8_sim     = dsv4_vk_fp8_sim,
    .fp4_sim     = dsv4_vk_fp4_sim,
    .hadamard    = dsv4_vk_hadamard,
    .hc_pre      = dsv4_vk_hc_pre,
    .hc_post     = dsv4_vk_hc_post,
    .hc_head     = dsv4_vk_hc_head,
    /* the whole-step ops */
    .step_begin = dsv4_vk_step_begin,
    .store_rows = dsv4_vk_store_rows,
    .compress   = dsv4_vk_compress,
    .attention  = dsv4_vk_attention,
    .indexer_scores = dsv4_vk_indexer_scores,
    .indexer_topk   = dsv4_vk_indexer_topk,
    /* vk_op_linear.c, vk_op_moe.c */
    .linear       = dsv4_vk_linear,
    .router       = dsv4_vk_router,
    .expert       = dsv4_vk_expert,
    .experts      = dsv4_vk_experts,
    .moe_dispatch = dsv4_vk_moe_dispatch,
    .moe_combine  = dsv4_vk_moe_combine,
};
