/*
 * op_check_store.c - the op checker's cases for the ops that write a step's sequences'
 * state: the compressor (frontiers in each slot, pooled rows packed sequence after
 * sequence), row stores (the step's staging rows, each sequence's window ring, the rows of
 * the blocks each completes into its pages) and step_begin. Each runs one sequence and
 * several of different lengths and positions in one call (op_check_step.h); the whole arena
 * of slots and pages is an output, so a byte written where it should not be fails.
 */
#include <string.h>

#include "backend/op_check_step.h"

/* ------------------------------------------------------------------ compressor */

struct comp_case {
    int  ratio;
    bool overlap;
    int  d, n_seqs;
    int  pn[CHK_STEP_MAX_SEQS][2];
};

/* Every sequence's frontier as earlier tokens left it: values bf16, gates uniform. */
static void fill_frontiers(struct chk *h, const struct chk_step *f, size_t kv_off, size_t sc_off, size_t n)
{
    for (int s = 0; s < f->desc.n_seqs; s++) {
        float *kv = (float *)(void *)(f->seq[s].slot + kv_off), *sc = (float *)(void *)(f->seq[s].slot + sc_off);
        chk_fill_bf16(h, kv, n, 2.0f);
        for (size_t i = 0; i < n; i++) sc[i] = (float)chk_uniform(h) * 3.0f;
    }
}

static void compress_case(struct chk *h, const struct comp_case *c)
{
    int ratio = c->ratio, d = c->d, coff = c->overlap ? 2 : 1, rows = coff * ratio, last = 0;
    size_t W = (size_t)(coff * d), fr = (size_t)rows * W * sizeof(float);
    size_t kv_off = 64, sc_off = 64 + ((fr + 63) & ~(size_t)63) + 32; /* garbage around both */
    struct chk_step f;
    chk_step_make(h, &f, c->n_seqs, (const int (*)[2])c->pn, sc_off + fr + 32, 64, 64);
    int nr = f.desc.n_rows, blocks = 0;
    for (int s = 0; s < c->n_seqs; s++) {
        blocks += dsv4_step_blocks(&f.desc, s, ratio);
        last = last > c->pn[s][0] + c->pn[s][1] ? last : c->pn[s][0] + c->pn[s][1];
    }
    struct dsv4_plan_dims dims = chk_dims();
    dims.max_rows = nr, dims.max_ctx = last, dims.d_head = d;
    chk_case(h, &dims, "ratio %d%s d %d, %d sequence%s, positions %d..%d%s (%d blocks)", ratio,
             c->overlap ? " overlapping" : "", d, c->n_seqs, c->n_seqs > 1 ? "s" : "", c->pn[0][0],
             c->pn[0][0] + c->pn[0][1] - 1, c->n_seqs > 1 ? ", ..." : "", blocks);
    float *a = chk_floats(h, (size_t)nr * W), *g = chk_floats(h, (size_t)nr * W), *ape = chk_floats(h, (size_t)ratio * W);
    chk_fill_bf16(h, a, (size_t)nr * W, 2.0f);
    for (size_t i = 0; i < (size_t)nr * W; i++) g[i] = (float)chk_uniform(h) * 3.0f;
    for (size_t i = 0; i < (size_t)ratio * W; i++) ape[i] = (float)chk_uniform(h) * 0.5f;
    fill_frontiers(h, &f, kv_off, sc_off, (size_t)rows * W);
    const uint8_t *arena0 = f.arena;
    for (struct dsv4_backend *be; (be = chk_next(h));) {
        chk_step_rebase(&f, chk_out_bytes(h, 0, f.bytes, arena0));
        float *out = chk_out_f32(h, 1, (size_t)(blocks > 0 ? blocks : 1) * d, CHK_EXACT, NULL, NULL);
        be->ops->step_begin(be, &f.desc);
        be->ops->compress(be, &f.desc, ratio, c->overlap, d, chk_in(h, a), chk_in(h, g), chk_in(h, ape), kv_off,
                          sc_off, out);
    }
}

void chk_run_compress(struct chk *h)
{
    const struct chk_model *M = chk_models;
    /* each layer kind's compressors (the kv rows' d_head and, with the CSA layers' overlap,
     * the indexer's keys), awkward widths and ratios, overlap at other ratios and none at
     * the CSA ratio; chunks that complete no block, one, several, or start at position 0;
     * then steps of a decode row, a chunk across block boundaries, a first chunk */
    int                    C = M[0].csa_ratio;
    const struct comp_case cases[] = {
        { C, true, 17, 1, { { 0, 11 } } },
        { 3, false, 31, 1, { { 5, 7 } } },
        { 2, true, 33, 1, { { 1, 6 } } },
        { C, false, 20, 1, { { 2, 9 } } },
        { C, true, M[0].d_head, 1, { { 0, 17 } } },
        { C, true, M[0].d_idx, 1, { { 21, 1 } } },
        { C, true, M[0].d_head, 1, { { 23, 1 } } },
        { M[0].hca_ratio, false, M[0].d_head, 1, { { 0, 40 } } },
        { M[1].hca_ratio, false, M[1].d_head, 1, { { 100, 31 } } },
        { M[2].csa_ratio, true, M[2].d_head, 1, { { 6, 3 } } },
        { M[2].hca_ratio, false, M[2].d_head, 1, { { 125, 5 } } },
        { M[2].csa_ratio, true, M[2].d_idx, 1, { { 3, 9 } } },
        { C, true, M[0].d_head, 3, { { 23, 1 }, { 6, 9 }, { 0, 3 } } },
        { M[0].hca_ratio, false, M[0].d_head, 3, { { 15, 1 }, { 30, 5 }, { 0, 17 } } },
        { M[2].csa_ratio, true, M[2].d_idx, 3, { { 2099, 1 }, { 254, 5 }, { 0, 4 } } },
    };
    for (size_t s = 0; s < sizeof(cases) / sizeof(cases[0]); s++) compress_case(h, &cases[s]);
}

/* ------------------------------------------------------------------ row stores */

struct store_case {
    enum dsv4_store_to to;
    enum dsv4_row_fmt  fmt;
    int d, dr;
    int a, b; /* RING: ring rows, window; BLOCKS: ratio, rows per page */
    int n_seqs;
    int pn[CHK_STEP_MAX_SEQS][2];
};

/* x as the model stores it (the op's contract): FP8-simulated nope parts, FP4-simulated keys. */
static void store_values(struct dsv4_backend *ref, const struct store_case *c, float *x, int n, int ldx)
{
    for (int t = 0; t < n; t++) {
        float *xr = x + (size_t)t * ldx;
        if (c->fmt == DSV4_ROW_FP8) ref->ops->fp8_sim(ref, 1, c->d - c->dr, c->d, xr, 64);
        if (c->fmt == DSV4_ROW_IDX_FP4) ref->ops->fp4_sim(ref, 1, c->d, c->d, xr, 32, false);
    }
}

static void store_case(struct chk *h, const struct store_case *c)
{
    static const char *const to[] = { "staging", "rings", "blocks" };
    int d = c->d, dr = c->dr, ldx = d + 3, rb = dsv4_row_bytes(c->fmt, d, dr);
    bool ring = c->to == DSV4_STORE_RING, blk = c->to == DSV4_STORE_BLOCKS;
    /* rings at byte `off` of a slot, rows at byte `off` of a page: 64, or 0 when the first
     * position is odd (the first layer's ring sits at offset 0 of a slot: an offset of 0 is a
     * real case) */
    size_t          off = c->pn[0][0] % 2 ? 0 : 64;
    struct chk_step f;
    chk_step_make(h, &f, c->n_seqs, (const int (*)[2])c->pn, ring ? off + (size_t)c->a * rb + 32 : 64,
                  blk ? c->a * c->b : 64, blk ? off + (size_t)c->b * rb + 32 : 64);
    int n = f.desc.n_rows;
    if (blk) {
        n = 0;
        for (int s = 0; s < c->n_seqs; s++) n += dsv4_step_blocks(&f.desc, s, c->a);
    }
    struct dsv4_store_dst dst = { .to = c->to, .off = off, .window = c->b, .ring_rows = c->a, .ratio = c->a,
                                  .row_bytes = rb };
    struct dsv4_plan_dims dims = chk_dims();
    dims.max_rows = f.desc.n_rows, dims.d_head = d, dims.d_rope = dr;
    chk_case(h, &dims, "fmt %d d %d to %s, %d sequence%s, positions %d..%d%s", (int)c->fmt, d, to[c->to], c->n_seqs,
             c->n_seqs > 1 ? "s" : "", c->pn[0][0], c->pn[0][0] + c->pn[0][1] - 1, c->n_seqs > 1 ? ", ..." : "");
    size_t   stage_bytes = (size_t)f.desc.n_rows * rb + 32;
    uint8_t *stage0      = chk_alloc(h, stage_bytes);
    memset(stage0, 0xa5, stage_bytes);
    const uint8_t *arena0 = f.arena;
    float *x = chk_floats(h, (size_t)(n > 0 ? n : 1) * ldx);
    chk_fill_bf16(h, x, (size_t)(n > 0 ? n : 1) * ldx, 2.0f);
    for (struct dsv4_backend *be; (be = chk_next(h));) {
        if (chk_is_reference(h)) store_values(be, c, x, n, ldx);
        if (c->to == DSV4_STORE_STEP) dst.rows = chk_out_bytes(h, 0, stage_bytes, stage0);
        else chk_step_rebase(&f, chk_out_bytes(h, 0, f.bytes, arena0)); /* nothing else may change */
        be->ops->step_begin(be, &f.desc);
        be->ops->store_rows(be, &f.desc, c->fmt, d, dr, chk_in(h, x), ldx, &dst);
    }
}

void chk_run_store_rows(struct chk *h)
{
    const struct chk_model *M = chk_models;
    enum dsv4_row_fmt FP8 = DSV4_ROW_FP8, BF16 = DSV4_ROW_BF16, FP4 = DSV4_ROW_IDX_FP4;
    /* rings that wrap, with chunks longer than the window; compressed rows and indexer keys
     * into pages; one row; then steps of a decode row, a chunk across a block and a page
     * boundary, a first chunk */
    const struct store_case cases[] = {
        { DSV4_STORE_STEP, FP8, M[0].d_head, M[0].d_rope, 0, 0, 3, { { 300, 1 }, { 58, 9 }, { 0, 3 } } },
        { DSV4_STORE_STEP, FP4, M[0].d_idx, 0, 0, 0, 1, { { 5, 17 } } },
        { DSV4_STORE_RING, FP8, M[0].d_head, M[0].d_rope, M[0].window, M[0].window, 1, { { 13, 5 } } },
        { DSV4_STORE_RING, BF16, M[0].d_head, M[0].d_rope, M[1].window, M[1].window - 3, 1, { { 120, 130 } } },
        { DSV4_STORE_RING, FP8, M[2].d_head, M[2].d_rope, M[2].window, M[2].window, 1, { { 126, 3 } } },
        { DSV4_STORE_RING, FP8, M[0].d_head, M[0].d_rope, M[0].window + 3, M[0].window, 3,
          { { 300, 1 }, { 58, 20 }, { 0, 3 } } },
        { DSV4_STORE_BLOCKS, FP8, M[0].d_head, M[0].d_rope, 1, 5, 1, { { 7, 17 } } },
        { DSV4_STORE_BLOCKS, FP4, M[0].d_idx, 0, 4, 16, 1, { { 8, 124 } } },
        { DSV4_STORE_BLOCKS, BF16, 96, 32, 1, 3, 1, { { 3, 1 } } },
        { DSV4_STORE_BLOCKS, FP4, M[2].d_idx, 0, 4, 64, 1, { { 2000, 36 } } },
        { DSV4_STORE_BLOCKS, FP8, M[0].d_head, M[0].d_rope, 4, 5, 3, { { 303, 1 }, { 58, 9 }, { 0, 3 } } },
        { DSV4_STORE_BLOCKS, FP4, M[0].d_idx, 0, 4, 16, 3, { { 3, 1 }, { 62, 7 }, { 0, 8 } } },
    };
    for (size_t s = 0; s < sizeof(cases) / sizeof(cases[0]); s++) store_case(h, &cases[s]);
}

/* ------------------------------------------------------------------ step_begin */

/* step_begin takes the descriptor (a device backend uploads it there) and must leave the
 * host's copy as it was; the whole-step op after it reads the descriptor it took. The
 * descriptor is host memory (the contract), so each run gets a host copy of it, compared
 * with the case's after the run; the stored rows are the run's output slot. */
struct begin_check {
    const struct chk_step *f;
    struct dsv4_step_seq  *seq; /* the run's copies */
    int                   *pos;
};

static void begin_compare(struct chk *h, void *ud)
{
    const struct begin_check *b = ud;
    chk_compare_slot(h, 0);
    size_t n = (size_t)b->f->desc.n_rows;
    if (memcmp(b->seq, b->f->seq, sizeof(b->f->seq[0]) * (size_t)b->f->desc.n_seqs) || memcmp(b->pos, b->f->pos, sizeof(int) * n))
        chk_fail(h, "step_begin changed the host's descriptor");
}

void chk_run_step_begin(struct chk *h)
{
    const struct chk_model *M  = chk_models;
    const int               pn[3][2] = { { 300, 1 }, { 58, 9 }, { 0, 3 } };
    int d = M[0].d_head, dr = M[0].d_rope, rb = dsv4_row_bytes(DSV4_ROW_BF16, d, dr);
    struct chk_step f;
    chk_step_make(h, &f, 3, pn, 64, 64, 64);
    int n = f.desc.n_rows;
    struct dsv4_plan_dims dims = chk_dims();
    dims.max_rows = n, dims.d_head = d, dims.d_rope = dr;
    chk_case(h, &dims, "3 sequences, then store_rows to staging");
    float *x = chk_floats(h, (size_t)n * d);
    chk_fill_bf16(h, x, (size_t)n * d, 2.0f);
    struct begin_check bc = { &f, chk_alloc(h, sizeof(f.seq[0]) * 3), chk_alloc(h, sizeof(int) * (size_t)n) };
    chk_custom(h, begin_compare, &bc);
    struct dsv4_store_dst dst = { .to = DSV4_STORE_STEP, .row_bytes = rb };
    for (struct dsv4_backend *be; (be = chk_next(h));) {
        struct dsv4_step_desc desc = f.desc;
        memcpy(bc.seq, f.seq, sizeof(f.seq[0]) * 3);
        memcpy(bc.pos, f.pos, sizeof(int) * (size_t)n);
        desc.seq = bc.seq, desc.pos = bc.pos;
        dst.rows = chk_out_bytes(h, 0, (size_t)n * rb, NULL);
        be->ops->step_begin(be, &desc);
        be->ops->store_rows(be, &desc, DSV4_ROW_BF16, d, dr, chk_in(h, x), d, &dst);
    }
}
