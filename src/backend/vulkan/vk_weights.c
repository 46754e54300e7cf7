/*
 * vk_weights.c - prepare_weights of the vulkan kind: every projection uploaded to device
 * memory in its release format (bf16, f32, e4m3 + e8m0/f32 128x128 block scales, packed
 * e2m1 + e8m0/f32 per-32 scales: the shaders decode them, nothing is widened to f32 here),
 * every other table the ops read (each_tensor) uploaded and repointed, and the experts'
 * tables of descriptor pointers that let one dispatch run all the experts of a layer.
 *
 * Placement: weights go into a few large allocations (chunks) rather than one each, as a
 * model has tens of thousands of projections and drivers cap the number of allocations. A
 * chunk is at most v->weight_chunk bytes (maxMemoryAllocationSize, lowered by the option
 * weight_chunk= to test the split); a projection larger than that is split by rows into
 * pieces (a multiple of 128 rows, so FP8 scale blocks split with them), each piece's
 * weight and scale rows together in one chunk (struct vk_lin_desc). Sizes are counted in a
 * first pass, so chunks are allocated no larger than what is left to place.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk.h"

enum { VKW_ALIGN = 256 };

/* An expert table made for one array of experts (keyed by its host address and checked
 * against the descriptors it was made from, as the array may be reused for others). */
struct vk_xtab {
    const struct dsv4_expert_w *experts;
    int                         n_exp;
    const void                **preps;  /* [3 * n_exp]: the prep each entry was made from */
    uint64_t                   *addrs;  /* its device pointers, the table's host copy */
    void                       *dev;    /* the table in device memory */
};

struct vk_weights {
    uint8_t           **blocks;  /* every allocation made here */
    int                 n_blocks, cap_blocks;
    uint8_t            *chunk;   /* the chunk being filled */
    size_t              chunk_len, chunk_used, left; /* left: bytes still to place */
    struct vk_lin_prep **preps;
    int                 n_preps, cap_preps;
    struct vk_xtab     *xtabs;
    int                 n_xtabs;
    const void        **look;    /* the preps of the experts being looked up (grown, kept: a
                                  * step allocates nothing once each layer's table exists) */
    size_t              cap_look;
};

static size_t align_up(size_t n)
{
    return (n + VKW_ALIGN - 1) / VKW_ALIGN * VKW_ALIGN;
}

static bool grow(void **arr, int *cap, int n, size_t elem)
{
    if (n < *cap) return true;
    int   nc = *cap ? 2 * *cap : 64;
    void *na = realloc(*arr, elem * (size_t)nc);
    if (!na) return false;
    *arr = na;
    *cap = nc;
    return true;
}

/* ------------------------------------------------------------------ sizes of a projection */

static size_t row_bytes(const struct dsv4_linear *l)
{
    switch (l->fmt) {
    case DSV4_WFMT_BF16: return 2 * (size_t)l->n_in;
    case DSV4_WFMT_F32: return 4 * (size_t)l->n_in;
    case DSV4_WFMT_FP8: return (size_t)l->n_in;
    default: return (size_t)l->n_in / 2;
    }
}

/* Scale bytes of rows [r0, r0 + n) (r0 a multiple of 128 for FP8), and where they start. */
static size_t scale_bytes(const struct dsv4_linear *l, int r0, int n, size_t *start)
{
    size_t el = l->scale_f32 ? 4 : 1, nkb = (size_t)(l->n_in + 127) / 128;
    if (l->fmt == DSV4_WFMT_FP8) {
        *start = (size_t)(r0 / 128) * nkb * el;
        return (size_t)((n + 127) / 128) * nkb * el;
    }
    if (l->fmt == DSV4_WFMT_FP4) {
        *start = (size_t)r0 * (size_t)(l->n_in / 32) * el;
        return (size_t)n * (size_t)(l->n_in / 32) * el;
    }
    *start = 0;
    return 0;
}

/* The rows prepared: a view's tensor from its first row (views normally come whole). */
static int tensor_rows(const struct dsv4_linear *l)
{
    return l->row_off + l->n_out;
}

/* Rows of one piece: all of them, or the most (a multiple of 128) that fit in a chunk. */
static int piece_rows(const struct dsv4_linear *l, size_t chunk)
{
    int    rows = tensor_rows(l);
    size_t st, all = align_up(row_bytes(l) * (size_t)rows) + align_up(scale_bytes(l, 0, rows, &st));
    if (all <= chunk) return rows;
    size_t per128 = align_up(row_bytes(l) * 128) + align_up(scale_bytes(l, 0, 128, &st));
    return (int)(chunk / (per128 + VKW_ALIGN)) * 128; /* 0 when not even 128 rows fit */
}

static size_t lin_bytes(const struct dsv4_linear *l, size_t chunk)
{
    int    rows = tensor_rows(l), pr = piece_rows(l, chunk), n = pr ? (rows + pr - 1) / pr : 0;
    size_t st, total = 0;
    for (int p = 0; p < n; p++) {
        int r = rows - p * pr < pr ? rows - p * pr : pr;
        total += align_up(row_bytes(l) * (size_t)r) + align_up(scale_bytes(l, p * pr, r, &st));
    }
    return total;
}

/* ------------------------------------------------------------------ placement */

static uint8_t *own_block(struct dsv4_vk *v, struct vk_weights *W, size_t bytes)
{
    if (!grow((void **)&W->blocks, &W->cap_blocks, W->n_blocks, sizeof(*W->blocks))) return NULL;
    uint8_t *b = dsv4_vk_alloc(v, bytes, DSV4_MEM_WEIGHTS);
    if (b) W->blocks[W->n_blocks++] = b;
    return b;
}

/* Room for `bytes` (at most a chunk) in the current chunk or a new one. */
static uint8_t *place(struct dsv4_vk *v, struct vk_weights *W, size_t bytes)
{
    bytes = align_up(bytes ? bytes : 1);
    if (!W->chunk || W->chunk_len - W->chunk_used < bytes) {
        size_t len = W->left > v->weight_chunk ? v->weight_chunk : W->left;
        if (len < bytes) len = bytes;
        W->chunk = own_block(v, W, len);
        if (!W->chunk) return NULL;
        W->chunk_len  = len;
        W->chunk_used = 0;
    }
    uint8_t *at = W->chunk + W->chunk_used;
    W->chunk_used += bytes;
    W->left = W->left > bytes ? W->left - bytes : 0;
    return at;
}

/* ------------------------------------------------------------------ projections */

struct prep_job {
    struct dsv4_vk    *v;
    struct vk_weights *W;
    size_t             bytes;   /* sizing pass: what all of it needs */
    int                rc;
    struct dsv4_err   *err;
};

static VkDeviceAddress dva_of(struct dsv4_vk *v, const void *p)
{
    pthread_mutex_lock(&v->mu);
    VkDeviceAddress a = dsv4_vk_addr(v, p, 1);
    pthread_mutex_unlock(&v->mu);
    return a;
}

/* Uploads piece p (rows r0 .. r0 + n) of l and records its addresses in d. */
static bool upload_piece(struct prep_job *J, const struct dsv4_linear *l, struct vk_lin_desc *d, int p, int r0, int n)
{
    size_t   st, sb = scale_bytes(l, r0, n, &st), wb = row_bytes(l) * (size_t)n;
    uint8_t *at = place(J->v, J->W, align_up(wb) + align_up(sb));
    if (!at) return false;
    dsv4_vk_upload(J->v, at, (const uint8_t *)l->w + row_bytes(l) * (size_t)r0, wb);
    d->w[p] = dva_of(J->v, at);
    if (sb) {
        dsv4_vk_upload(J->v, at + align_up(wb), (const uint8_t *)l->scale + st, sb);
        d->s[p] = dva_of(J->v, at + align_up(wb));
    }
    return true;
}

static int prep_fail(struct prep_job *J, int rc, const char *what, const struct dsv4_linear *l)
{
    J->rc = dsv4_err_set(J->err, rc, "vulkan: %s for a %s projection [%d x %d]", what, dsv4_wfmt_name(l->fmt),
                         tensor_rows(l), l->n_in);
    return J->rc;
}

static void prep_one(struct dsv4_linear *l, void *ud)
{
    struct prep_job *J = ud;
    size_t           chunk = J->v->weight_chunk;
    int              rows = tensor_rows(l), pr = piece_rows(l, chunk);
    if (J->rc || !l->w || l->n_out <= 0) return; /* unbound: each_linear visits those too */
    if ((l->fmt == DSV4_WFMT_FP8 || l->fmt == DSV4_WFMT_FP4) && l->block != 128) {
        /* the shaders (lin.glsl, lin_gemm.glsl, act_quant.comp) take 128x128 blocks and
         * activation groups of 128 as constants; V4.1's 32 is left to do (docs/BACKENDS.md) */
        prep_fail(J, DSV4_EUNSUPPORTED, "FP8 blocks of 32 (DeepSeek-V4.1) are not supported", l);
        return;
    }
    if (!J->W) { /* the sizing pass */
        J->bytes += lin_bytes(l, chunk) + align_up(sizeof(struct vk_lin_desc));
        return;
    }
    int n = pr ? (rows + pr - 1) / pr : 0;
    if (!pr || n > VKW_MAX_PIECES) {
        prep_fail(J, DSV4_EUNSUPPORTED, "more pieces than a weight may have (weight_chunk too small)", l);
        return;
    }
    struct vk_lin_prep *P = calloc(1, sizeof(*P));
    if (!P || !grow((void **)&J->W->preps, &J->W->cap_preps, J->W->n_preps, sizeof(*J->W->preps))) {
        free(P);
        prep_fail(J, DSV4_ENOMEM, "out of host memory", l);
        return;
    }
    J->W->preps[J->W->n_preps++] = P;
    P->d = (struct vk_lin_desc){ .piece_rows = (uint32_t)pr, .fmt = (uint32_t)l->fmt, .n_in = (uint32_t)l->n_in,
                                 .scale_f32 = l->scale_f32 };
    for (int p = 0; p < n; p++)
        if (!upload_piece(J, l, &P->d, p, p * pr, rows - p * pr < pr ? rows - p * pr : pr)) {
            prep_fail(J, DSV4_ENOMEM, "out of device memory", l);
            return;
        }
    uint8_t *d = place(J->v, J->W, sizeof(P->d));
    if (!d) {
        prep_fail(J, DSV4_ENOMEM, "out of device memory", l);
        return;
    }
    dsv4_vk_upload(J->v, d, &P->d, sizeof(P->d));
    P->desc_at = d;
    l->prep    = P;
}

/* ------------------------------------------------------------------ the other tables */

static void size_table(const void **t, size_t bytes, void *ud)
{
    struct prep_job *J = ud;
    (void)t;
    J->bytes += align_up(bytes);
}

static void place_table(const void **t, size_t bytes, void *ud)
{
    struct prep_job *J = ud;
    if (J->rc || !*t) return;
    /* a table is one span to the ops: larger than a chunk, it gets an allocation of its own */
    uint8_t *at = bytes > J->v->weight_chunk ? own_block(J->v, J->W, bytes) : place(J->v, J->W, bytes);
    if (!at) {
        J->rc = dsv4_err_set(J->err, DSV4_ENOMEM, "vulkan: no device memory for a table of %zu bytes", bytes);
        return;
    }
    dsv4_vk_upload(J->v, at, *t, bytes);
    *t = at;
}

int dsv4_vk_prepare_weights(struct dsv4_vk *v, struct dsv4_weight_set *ws, struct dsv4_err *err)
{
    if (v->weights) return dsv4_err_set(err, DSV4_EINVAL, "vulkan: weights prepared twice");
    struct prep_job J = { .v = v, .err = err };
    ws->each_linear(ws->ctx, prep_one, &J);
    ws->each_tensor(ws->ctx, size_table, &J);
    if (J.rc) return J.rc;
    J.W = calloc(1, sizeof(*J.W));
    if (!J.W) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    v->weights = J.W;
    J.W->left  = J.bytes;
    ws->each_linear(ws->ctx, prep_one, &J);
    ws->each_tensor(ws->ctx, place_table, &J);
    dsv4_vk_sync(v); /* the host arrays uploaded from may go after this */
    if (!J.rc && v->fault[0]) J.rc = dsv4_err_set(err, DSV4_EIO, "vulkan: uploading the weights: %s", v->fault);
    return J.rc;
}

void dsv4_vk_weights_free(struct dsv4_vk *v)
{
    struct vk_weights *W = v->weights;
    if (!W) return;
    for (int i = 0; i < W->n_preps; i++) free(W->preps[i]);
    for (int i = 0; i < W->n_xtabs; i++) {
        free(W->xtabs[i].preps);
        free(W->xtabs[i].addrs);
        dsv4_vk_free(v, W->xtabs[i].dev, 0);
    }
    for (int i = 0; i < W->n_blocks; i++) dsv4_vk_free(v, W->blocks[i], 0);
    free(W->xtabs);
    free(W->preps);
    free(W->look);
    free(W->blocks);
    free(W);
    v->weights = NULL;
}

/* ------------------------------------------------------------------ expert tables */

/* The prep of each of experts' matrices (NULL where one is not prepared). */
static void expert_preps(const struct dsv4_expert_w *experts, int n_exp, const void **out)
{
    for (int e = 0; e < n_exp; e++) {
        out[3 * e]     = experts[e].w1.prep;
        out[3 * e + 1] = experts[e].w3.prep;
        out[3 * e + 2] = experts[e].w2.prep;
    }
}

static struct vk_xtab *xtab_find(struct vk_weights *W, const struct dsv4_expert_w *experts, int n_exp,
                                 const void **preps)
{
    for (int i = 0; i < W->n_xtabs; i++) {
        struct vk_xtab *x = &W->xtabs[i];
        if (x->experts == experts && x->n_exp == n_exp && !memcmp(x->preps, preps, sizeof(*preps) * 3 * (size_t)n_exp))
            return x;
    }
    return NULL;
}

/* Called under v->mu (an op): allocation and upload take the lock themselves, so it is let
 * go around them. */
VkDeviceAddress dsv4_vk_expert_table(struct dsv4_vk *v, const struct dsv4_expert_w *experts, int n_exp)
{
    struct vk_weights *W = v->weights;
    size_t             n = 3 * (size_t)n_exp;
    if (W && W->cap_look < n) {
        const void **nl = realloc(W->look, n * sizeof(*nl));
        if (nl) W->look = nl, W->cap_look = n;
    }
    if (!W || W->cap_look < n) {
        dsv4_vk_fault(v, "experts: the weights are not prepared");
        return 0;
    }
    expert_preps(experts, n_exp, W->look);
    struct vk_xtab *x = xtab_find(W, experts, n_exp, W->look);
    if (x) return dsv4_vk_addr(v, x->dev, 8);
    /* the first call for this layer's experts: its table, kept for the engine's life */
    const void **preps = malloc(n * sizeof(*preps));
    uint64_t    *addrs = calloc(n, sizeof(*addrs));
    void        *nx    = realloc(W->xtabs, sizeof(*W->xtabs) * (size_t)(W->n_xtabs + 1));
    if (nx) W->xtabs = nx;
    if (preps) memcpy(preps, W->look, n * sizeof(*preps));
    for (size_t i = 0; addrs && preps && i < n; i++)
        addrs[i] = preps[i] ? dsv4_vk_addr(v, ((const struct vk_lin_prep *)preps[i])->desc_at, 8) : 0;
    pthread_mutex_unlock(&v->mu);
    void *dev = addrs && preps && nx ? dsv4_vk_alloc(v, sizeof(*addrs) * n, DSV4_MEM_WEIGHTS) : NULL;
    if (dev) dsv4_vk_upload(v, dev, addrs, sizeof(*addrs) * n);
    pthread_mutex_lock(&v->mu);
    if (!dev) {
        free(preps);
        free(addrs);
        dsv4_vk_fault(v, "experts: no memory for the table of %d experts", n_exp);
        return 0;
    }
    W->xtabs[W->n_xtabs++] = (struct vk_xtab){ experts, n_exp, preps, addrs, dev };
    return dsv4_vk_addr(v, dev, 8);
}
