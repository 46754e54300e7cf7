/*
 * vk.h - the Vulkan backend's state, shared by its files (vk_device.c: instance and device;
 * vk_mem.c: the address table; vk_cmd.c: command buffer and transfers; vk_pipe.c: the
 * pipelines; vk_ops.c: the op table; vk_backend.c: the kind). Nothing outside
 * src/backend/vulkan/ includes it: the model reaches the backend through
 * struct dsv4_backend_kind alone (vulkan.h).
 *
 * Memory is addressed, never dereferenced (docs/BACKENDS.md): alloc hands out addresses of a
 * host range reserved without access (a host read faults), one block per allocation, and the
 * block table maps any address inside a block to its VkBuffer and an offset.
 *
 * Recording (vk_cmd.c): ops and uploads append to one open command buffer, a compute
 * barrier after each dispatch, so a whole step records into one command buffer; it is
 * submitted when the host must wait (download, sync) or a per-buffer area runs out (staging,
 * metadata, descriptor sets). At most one submission is in flight: opening a command buffer
 * waits for the previous one, so the staging and metadata areas and the descriptor pool are
 * reset then. One mutex guards it all: contexts on several threads serialise here.
 *
 * Shaders reach memory two ways: storage-buffer descriptors (dsv4_vk_arg: a binding at most
 * maxStorageBufferRange long) or buffer device addresses (dsv4_vk_addr, GLSL
 * GL_EXT_buffer_reference: any byte of any block, for tables of pointers such as a layer's
 * experts and for spans longer than one binding reaches).
 */
#ifndef DSV4_VK_H
#define DSV4_VK_H

#include <pthread.h>
#include <vulkan/vulkan.h>

#include "backend/backend.h"

enum { VKB_MAX_DEVICES = 16, VKB_MAX_BINDINGS = 8, VKB_MAX_PIPES = 64, VKB_MAX_SETS = 512, VKB_MAX_POOLS = 64,
       VKB_MAX_META = 16, VKB_PC_BYTES = 128 };

/* The shaders this build embeds (vk_shaders.c, generated from shaders/ by tools/spv_embed.sh). */
struct dsv4_vk_spirv {
    const char     *name; /* the file's name without .comp: "scale" */
    const uint32_t *code;
    size_t          bytes;
};
extern const struct dsv4_vk_spirv dsv4_vk_shaders[]; /* ends with name NULL */

/* One physical device as `dsv4 ops` lists it. */
struct vk_dev_info {
    char     name[VK_MAX_PHYSICAL_DEVICE_NAME_SIZE];
    VkPhysicalDeviceType type;
    uint32_t api;
    uint32_t max_sb_range, max_wg_invocations, subgroup;
    VkDeviceSize max_alloc; /* maxMemoryAllocationSize: the largest block */
    bool     fp64, bda, int64;
    VkDeviceSize local_heap;
};

/* One allocation: a range of the reserved addresses and the device buffer behind it. */
struct vk_block {
    size_t         off, len; /* in the reserved range; len a page multiple */
    VkBuffer       buf;
    VkDeviceMemory mem;
    VkDeviceAddress dva; /* its buffer device address */
};

/* A pipeline per shader, made at its first dispatch, found by the shader's name. */
struct vk_pipe {
    const char           *shader;
    int                   n_bind;
    VkDescriptorSetLayout dsl;
    VkPipelineLayout      layout;
    VkPipeline            pipe;
};

/* A host-visible buffer mapped for the backend's life (staging, host metadata). */
struct vk_hostbuf {
    VkBuffer       buf;
    VkDeviceMemory mem;
    void          *map;
    VkDeviceSize   bytes;
    VkDeviceSize   used;  /* bump allocator, reset when a command buffer opens */
    VkDeviceAddress dva;
};

/* ---- the step descriptor on the device (vk_op_step.c) */
/* Its image in device memory, as the shaders read it (shaders/step.glsl): this header, the
 * sequences, then int arrays (page tables, pos, tok, each row's sequence) at the header's
 * element offsets from the image's start. */
struct vk_step_head {
    int32_t  n_seqs, n_rows, page_tokens, pad;
    uint64_t page_bytes;
    uint32_t pos, tok, rowseq, pad2;
};
struct vk_step_seq {
    int32_t  row0, n, p0, pg0; /* pg0: the page table's first element (ints from the image's start) */
    uint64_t slot, base;       /* device addresses (0 when the descriptor has none) */
};
struct vk_step {
    void           *buf;  /* backend memory (dsv4_vk_alloc), grown when a step needs more */
    size_t          cap;
    VkDeviceAddress dva;
    int             n_seqs, n_rows, page_tokens;
    size_t          page_bytes;
    bool            begun;
    void           *work; /* indexer_topk's scores, grown likewise */
    size_t          work_cap;
    /* the host image of a descriptor and its device-copy list, kept (grown, never shrunk) so
     * that a step allocates nothing once the largest step has been seen */
    int32_t        *img;
    size_t          img_cap;
    const int32_t **later;
    uint32_t       *at;
    size_t          later_cap;
};

struct dsv4_vk {
    pthread_mutex_t mu;
    const struct dsv4_logger *lg;
    VkInstance       inst;
    int              n_dev, chosen;
    struct vk_dev_info dev_info[VKB_MAX_DEVICES];
    VkPhysicalDevice phys;
    VkDevice         dev;
    uint32_t         qfam;
    VkQueue          queue;
    VkCommandPool    pool;
    VkCommandBuffer  cmd;
    VkFence          fence;
    bool             pending;   /* a submission has not been waited for */
    bool             recording;
    /* Descriptor pools of VKB_MAX_SETS sets each, made as a command buffer needs them and all
     * reset when one opens: a command buffer is never submitted early for want of sets (an
     * op's metadata, taken before its dispatch, must stay where it is until that runs). */
    VkDescriptorPool dpools[VKB_MAX_POOLS];
    int              n_pools, cur_pool, n_sets; /* made; in use; sets taken from it */
    struct vk_pipe   pipes[VKB_MAX_PIPES];
    int              n_pipes;
    VkPhysicalDeviceMemoryProperties memprops;
    VkDeviceSize     sb_align;  /* minStorageBufferOffsetAlignment */
    struct vk_hostbuf staging;  /* upload and download pass through it */
    /* host metadata ops read (token ids, positions, tables): areas made as a command buffer
     * needs them (the same reason as the pools), all reused when one opens */
    struct vk_hostbuf meta[VKB_MAX_META];
    int              n_meta, cur_meta;
    /* the address table */
    uint8_t         *base;      /* the reserved range (PROT_NONE) */
    size_t           reserve, page, used;
    struct vk_block *blocks;    /* sorted by off */
    int              n_blocks, cap_blocks;
    char             fault[160]; /* the first error an op or transfer met (they return nothing) */
    uint32_t         lin_nt;    /* invocations a projection's row is split over (lin_gemm.glsl) */
    struct vk_stamps *stamps;   /* GPU timestamps per shader when profiling (vk_prof.c), or NULL */
    struct vk_step   step;      /* vk_op_step.c */
    /* vk_weights.c: what prepare_weights uploaded (freed at destroy) and the largest piece
     * of one weight (maxMemoryAllocationSize, or less with the option weight_chunk=BYTES) */
    struct vk_weights *weights;
    size_t           weight_chunk;
};

/* vk_device.c */
/* One more descriptor pool (DSV4_OK, or DSV4_ENOMEM). */
int  dsv4_vk_pool_add(struct dsv4_vk *v);
int  dsv4_vk_open_device(struct dsv4_vk *v, int want, struct dsv4_err *err);
void dsv4_vk_close_device(struct dsv4_vk *v);
void dsv4_vk_devices_text(const struct dsv4_vk *v, char *buf, size_t cap);
const char *dsv4_vk_type_name(VkPhysicalDeviceType t);

/* vk_mem.c */
int   dsv4_vk_mem_init(struct dsv4_vk *v, struct dsv4_err *err);
void  dsv4_vk_mem_fini(struct dsv4_vk *v);
void *dsv4_vk_alloc(void *impl, size_t bytes, enum dsv4_mem_kind kind);
void  dsv4_vk_free(void *impl, void *p, size_t bytes);
/* The block holding address p, and p's offset in its buffer; NULL when p is not ours. Call
 * under v->mu. */
const struct vk_block *dsv4_vk_resolve(struct dsv4_vk *v, const void *p, VkDeviceSize *off);
int   dsv4_vk_memory(void *impl, size_t *avail, size_t *total);
int   dsv4_vk_hostbuf(struct dsv4_vk *v, struct vk_hostbuf *h, VkDeviceSize bytes, VkBufferUsageFlags usage);
void  dsv4_vk_hostbuf_free(struct dsv4_vk *v, struct vk_hostbuf *h);
int   dsv4_vk_find_memtype(const struct dsv4_vk *v, uint32_t bits, VkMemoryPropertyFlags want);

/* vk_cmd.c: under v->mu */
/* Opens a command buffer if none is open (waiting for the submission in flight and
 * resetting the staging, metadata and descriptor areas); false (and a fault) on failure. */
bool dsv4_vk_record(struct dsv4_vk *v);
/* Submits what is recorded (not waited for). */
void dsv4_vk_submit(struct dsv4_vk *v);
/* Waits for the submission in flight. */
void dsv4_vk_wait(struct dsv4_vk *v);
/* Submits and waits: every op recorded so far has finished. */
void dsv4_vk_finish(struct dsv4_vk *v);
/* A barrier after a dispatch or copy: its writes before any later command's reads and writes. */
void dsv4_vk_barrier(struct dsv4_vk *v);
void dsv4_vk_fault(struct dsv4_vk *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dsv4_vk_upload(void *impl, void *dst, const void *src, size_t bytes);
void dsv4_vk_download(void *impl, void *dst, const void *src, size_t bytes);
void dsv4_vk_copy(void *impl, void *dst, const void *src, size_t bytes);
void dsv4_vk_sync(void *impl);

/* vk_pipe.c: one dispatch of the shader called `shader` (shaders/NAME.comp) over gx x gy x gz
 * workgroups, its n_bind storage buffers bound in order (binding i: b[i]) and push constants
 * pc (at most VKB_PC_BYTES); recorded into the open command buffer, then a barrier. Under
 * v->mu; opens a command buffer if none is. */
struct vk_bind {
    VkBuffer     buf;
    VkDeviceSize off, range;
};
bool dsv4_vk_dispatch(struct dsv4_vk *v, const char *shader, const struct vk_bind *b, int n_bind, const void *pc,
                      uint32_t pc_bytes, uint32_t gx, uint32_t gy, uint32_t gz);
void dsv4_vk_pipes_free(struct dsv4_vk *v);

/* vk_ops.c: what every op file uses (under v->mu) */
/* Binds address p (elements of `elem` bytes, `bytes` of them read or written from p) into *b
 * and returns p's element index from the bound offset; -1 (and a fault) when p is not inside
 * one of the backend's buffers, not aligned to its element, or the span is longer than a
 * binding reaches. */
int64_t dsv4_vk_arg(struct dsv4_vk *v, const void *p, size_t elem, size_t bytes, struct vk_bind *b);
/* The buffer device address of p, whose next `bytes` must lie in one block; 0 (and a fault)
 * otherwise. */
VkDeviceAddress dsv4_vk_addr(struct dsv4_vk *v, const void *p, size_t bytes);
/* Room for `bytes` of host metadata in the open command buffer's metadata areas, aligned
 * for any binding: a host pointer to fill, its binding in *b (element index 0) and, when a
 * is given, its device address. Valid until the command buffer has run: a piece that does
 * not fit takes a new area, so the command buffer is not submitted under an op that has
 * taken pieces but not yet recorded its dispatch (only past VKB_MAX_META areas, which
 * dsv4_vk_meta_room at the op's start avoids). NULL (and a fault) when bytes exceed an area. */
void *dsv4_vk_meta(struct dsv4_vk *v, size_t bytes, struct vk_bind *b, VkDeviceAddress *a);
bool  dsv4_vk_meta_room(struct dsv4_vk *v, size_t bytes);
/* An input that may be either (docs/BACKENDS.md: host metadata stays in host arrays, such
 * as positions and token ids, while tables and activations are backend memory): bound as
 * dsv4_vk_arg when p is one of the backend's addresses, else its `bytes` copied from the host
 * into the metadata area (index 0). -1 (and a fault) on failure. */
int64_t dsv4_vk_in(struct dsv4_vk *v, const void *p, size_t elem, size_t bytes, struct vk_bind *b);
/* Whether p is one of the backend's addresses (inside its reserved range). */
bool dsv4_vk_owns(const struct dsv4_vk *v, const void *p);
/* Workgroups for items spread over per_group invocations, within the dispatch limit (the
 * shaders loop over what one grid does not cover). */
uint32_t dsv4_vk_groups(uint64_t items, uint32_t per_group);
/* Whether n elements fit the shaders' 32-bit indices (a fault naming op when not). */
bool dsv4_vk_fits_u32(struct dsv4_vk *v, uint64_t n, const char *op);

/* vk_prof.c: GPU timestamps (created with profile): a timestamp after each dispatch or
 * transfer, labelled with its shader; read when a submission has finished (dsv4_vk_wait),
 * each command's time being the gap to the timestamp before it (commands run one after the
 * other: a barrier follows each). */
struct vk_stamps;
int  dsv4_vk_stamps_init(struct dsv4_vk *v, struct dsv4_err *err);
void dsv4_vk_stamps_free(struct dsv4_vk *v);
void dsv4_vk_stamp_open(struct dsv4_vk *v);                    /* the command buffer opened */
void dsv4_vk_stamp(struct dsv4_vk *v, const char *label);      /* after a command */
void dsv4_vk_stamps_collect(struct dsv4_vk *v);                /* the submission finished */
void dsv4_vk_device_profile(void *impl, FILE *f);

/* vk_bench.c: the kind's read_bandwidth and peaks */
double dsv4_vk_read_bandwidth(void *impl, const void *buf, size_t bytes, int reps);
void   dsv4_vk_peaks(void *impl, double *f32, double *bf16);

/* The op table (vk_ops.c) and the ops of each file. */
extern const struct dsv4_backend_ops dsv4_vk_ops;
/* The shader that runs op, or NULL (`dsv4 ops`). */
const char *dsv4_vk_op_shader(enum dsv4_op op);

/* vk_op_rows.c */
void dsv4_vk_rmsnorm(struct dsv4_backend *be, int n, int d, const float *x, int ldx, const uint16_t *w, double eps,
                     float *y, int ldy);
void dsv4_vk_embed(struct dsv4_backend *be, int n, const int *tok, const uint16_t *table, int d, int copies,
                   float *X);
void dsv4_vk_scale(struct dsv4_backend *be, size_t n, float *x, double s);
void dsv4_vk_add_streams(struct dsv4_backend *be, int n, int hc, int d, const float *e, float *X);
/* vk_op_engram.c */
void dsv4_vk_engram_rows(struct dsv4_backend *be, int n, int n_cols, const int64_t *ids, int ld_ids,
                         const uint8_t *table, const uint8_t *scale, int64_t n_rows, int d, float *out);
void dsv4_vk_engram_gate(struct dsv4_backend *be, int n, int hc, int d, const float *kv, const float *w, double eps,
                         float *X);

/* vk_op_rows2.c */
void dsv4_vk_head_rms(struct dsv4_backend *be, int n, int n_head, int d_head, float *q, double eps);
void dsv4_vk_rope(struct dsv4_backend *be, int n, int n_vec, int d_full, float *x, const int *pos,
                  const struct dsv4_rope_table *t, bool inverse);
void dsv4_vk_fp8_sim(struct dsv4_backend *be, int n, int d, int ld, float *x, int block);
void dsv4_vk_fp4_sim(struct dsv4_backend *be, int n, int d, int ld, float *x, int block, bool e4m3_scale);
void dsv4_vk_hadamard(struct dsv4_backend *be, int n, int d, float *x);

/* vk_op_hc.c */
void dsv4_vk_hc_pre(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn, const float *scale,
                    const float *base, int iters, double norm_eps, double hc_eps, float *lag, float *u, float *post,
                    float *comb);
void dsv4_vk_hc_post(struct dsv4_backend *be, int n, int hc, int d, const float *f, const float *Xres,
                     const float *post, const float *comb, float *Xout);
void dsv4_vk_hc_head(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn,
                     const float *scale, const float *base, double norm_eps, double hc_eps, float *y);
/* ---- the whole-step ops: vk_op_step.c (step_begin), vk_op_kv.c (store_rows, compress),
 * vk_op_attn.c (attention), vk_op_idx.c (indexer_scores, indexer_topk) */
void dsv4_vk_step_begin(struct dsv4_backend *be, const struct dsv4_step_desc *desc);
/* Sizes the step's work space for a plan (at scratch_floats). */
void dsv4_vk_step_reserve(struct dsv4_vk *v, const struct dsv4_plan_dims *dims);
/* Frees step_begin's host arrays (at destroy). */
void dsv4_vk_step_free(struct dsv4_vk *v);
/* The device address of the descriptor step_begin took, when desc is that step's (a fault
 * otherwise, 0 returned). Under v->mu. */
VkDeviceAddress dsv4_vk_step_addr(struct dsv4_vk *v, const struct dsv4_step_desc *desc, const char *op);
/* A device buffer of at least bytes that the step's ops use as work space (backend memory,
 * kept and grown); NULL (and a fault) when it cannot be had. Not under v->mu. */
void *dsv4_vk_step_work(struct dsv4_vk *v, size_t bytes);
void  dsv4_vk_store_rows(struct dsv4_backend *be, const struct dsv4_step_desc *desc, enum dsv4_row_fmt fmt, int d,
                         int d_rope, const float *x, int ldx, const struct dsv4_store_dst *dst);
void  dsv4_vk_compress(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int ratio, bool overlap, int d,
                       const float *a, const float *g, const float *ape, size_t kv_off, size_t sc_off, float *out);
void  dsv4_vk_attention(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int n_head, int d_head, int d_rope,
                        const float *q, const struct dsv4_attn_src *src, enum dsv4_row_fmt fmt, const float *sink,
                        float scale, float *o);
void  dsv4_vk_indexer_scores(struct dsv4_backend *be, int n_head, int d, const float *q, const float *w,
                             const struct dsv4_kv_rows *keys, int n_keys, float *score);
void  dsv4_vk_indexer_topk(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int ratio, int n_head, int d,
                           const float *q, const float *w, size_t keys_off, int key_bytes, int topk, int *sel,
                           int *n_sel,
                            const struct dsv4_idx_cand *cand);
/* vk_weights.c: the uploaded weights */
enum { VKW_MAX_PIECES = 16 };
/* A projection on the device, as the shaders read it (shaders/lin.glsl, std430): its rows
 * are split into pieces of piece_rows rows (a multiple of 128, so FP8 scale blocks split
 * with them), each piece's weight and scale rows at their own device address. One piece
 * unless the tensor is larger than one allocation. */
struct vk_lin_desc {
    uint64_t w[VKW_MAX_PIECES], s[VKW_MAX_PIECES];
    uint32_t piece_rows, fmt, n_in, scale_f32;
};
/* struct dsv4_linear.prep of the vulkan kind: the descriptor's backend address (its device
 * copy, which the shaders read) and the host copy. A row_off view shares it. */
struct vk_lin_prep {
    const void        *desc_at;
    struct vk_lin_desc d;
};
int  dsv4_vk_prepare_weights(struct dsv4_vk *v, struct dsv4_weight_set *ws, struct dsv4_err *err);
void dsv4_vk_weights_free(struct dsv4_vk *v);
/* The device table of pointers to the descriptors of experts[0 .. n_exp) (w1, w3, w2 each;
 * 0 for an expert not prepared), made at the first call for this array and kept while its
 * descriptors stay the same; 0 (and a fault) without prepared weights or memory. Under
 * v->mu, which it lets go while it allocates and uploads (call it before taking metadata). */
VkDeviceAddress dsv4_vk_expert_table(struct dsv4_vk *v, const struct dsv4_expert_w *experts, int n_exp);

/* vk_op_linear.c */
/* One grouped projection: for each group g < grp[0] of the table at `grp` (moe_dispatch's
 * layout over n_exp), rows off[g] .. off[g+1] of x times the weight whose descriptor address
 * is tab[ids[g] * 3 + mat], into y. The grid covers `groups` groups: n_exp, or fewer where
 * the host knows a bound (no more groups than rows). */
struct vk_gemm {
    VkDeviceAddress tab, grp, x, y;
    uint32_t        ldx, ldy, n_exp, mat, row_off, n_out, n_in, out_bf16;
    uint32_t        max_rows; /* the most rows one group has (1: linear1.comp); not a push constant */
};
bool dsv4_vk_gemm(struct dsv4_vk *v, const struct vk_gemm *g, uint32_t groups);
/* In place or to q: rows of x quantised per 128 to e4m3 with power-of-two scales and
 * dequantised (exact in f32: the values DSV4_ACT_FP8 multiplies). */
bool dsv4_vk_act_quant(struct dsv4_vk *v, VkDeviceAddress x, uint32_t ldx, VkDeviceAddress q, uint32_t ldq,
                       uint32_t rows, uint32_t n_in);
void dsv4_vk_linear(struct dsv4_backend *be, const struct dsv4_linear *w, int n_tok, const float *x, int ldx,
                    float *y, int ldy, enum dsv4_act act, enum dsv4_out out);

/* vk_op_moe.c */
void dsv4_vk_router(struct dsv4_backend *be, int n, const float *x, const struct dsv4_linear *gate,
                    const float *bias, const int64_t *tid2eid, const int *tokens, int n_exp, int n_used,
                    double route_scale, double gate_temp, int *ids, float *weights, float *scratch);
void dsv4_vk_expert(struct dsv4_backend *be, const struct dsv4_expert_w *e, int n, const float *x, int ldx,
                    const float *row_w, double limit, float *y, float *scratch);
void dsv4_vk_experts(struct dsv4_backend *be, const struct dsv4_expert_w *experts, int n_exp, int n_pairs,
                     const int *grp, const float *x, const float *row_w, double limit, float *y, float *scratch);
void dsv4_vk_moe_dispatch(struct dsv4_backend *be, int n, int k, int n_exp, const int *ids, const float *w,
                          const float *x, int d, float *xe, float *row_w, int *pair_of, int *grp);
void dsv4_vk_moe_combine(struct dsv4_backend *be, int n, int k, int d, const int *pair_of, const float *ye,
                         const float *shared, float *f);
/* The scratch floats the ops above take from struct dsv4_backend.scratch. */
size_t dsv4_vk_linear_scratch(const struct dsv4_plan_dims *dims);

#endif /* DSV4_VK_H */
