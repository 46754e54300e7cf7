/*
 * model.c - loading a model for inference: config, checkpoint mapping, weight binding (every
 * problem logged), RoPE frequency tables and the revision switches.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "model/runtime.h"

void dsv4_rope_freqs(float *freq, int d_rope, float base, bool yarn, float factor, int orig_len, float beta_fast,
                     float beta_slow)
{
    /* f32 values computed as the demo does: 1 / base^(2i/d), then the YaRN ramp */
    int half = d_rope / 2;
    for (int i = 0; i < half; i++) {
        double ex = (float)((double)(2 * i) / d_rope);
        freq[i]   = (float)(1.0 / (double)(float)pow((double)base, ex));
    }
    if (!yarn || orig_len <= 0) return;
    /* YaRN (docs/MODEL.md §R3.3): interpolate the low frequencies by 1/factor with a linear ramp
     * between the dims that rotate beta_fast and beta_slow times over the original length */
    double lnb  = log((double)base);
    double lo_f = d_rope * log(orig_len / (beta_fast * 2 * M_PI)) / (2 * lnb);
    double hi_f = d_rope * log(orig_len / (beta_slow * 2 * M_PI)) / (2 * lnb);
    double lo   = floor(lo_f), hi = ceil(hi_f);
    if (lo < 0) lo = 0;
    if (hi > d_rope - 1) hi = d_rope - 1;
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < half; i++) {
        double ramp = (i - lo) / (hi - lo);
        ramp        = (float)(ramp < 0 ? 0 : ramp > 1 ? 1 : ramp);
        double smooth = 1.0 - ramp;
        double f      = freq[i];
        freq[i] = (float)((double)(float)((double)(float)(f / factor) * (double)(float)(1.0 - smooth)) +
                          (double)(float)(f * smooth));
    }
}

/*
 * wo_a with F32 weight scales (base checkpoints): the demo stores wo_a as a bf16 parameter
 * (convert.py dequantises it) and runs a bf16 einsum, so the dequantised weight is rounded to
 * bf16. With e8m0 scales code * scale is already a bf16 value and nothing changes; with F32
 * scales it is not, so those wo_a are converted here, once, into bf16 copies.
 */
static int round_wo_a(struct dsv4_model *m, struct dsv4_layer_w *L, struct dsv4_err *err)
{
    struct dsv4_linear *w = &L->wo_a;
    if (w->fmt != DSV4_WFMT_FP8 || !w->scale_f32) return DSV4_OK;
    uint16_t *copy = dsv4_arena_alloc(&m->arena, sizeof(uint16_t) * (size_t)w->n_out * (size_t)w->n_in, 64);
    if (!copy) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for a bf16 copy of layer %d's wo_a", L->il);
    int n_kb = (w->n_in + 127) / 128;
    for (int o = 0; o < w->n_out; o++)
        for (int k = 0; k < w->n_in; k++) {
            float s;
            memcpy(&s, (const uint8_t *)w->scale + ((size_t)(o / 128) * (size_t)n_kb + (size_t)(k / 128)) * 4, 4);
            float v = dsv4_f32_from_e4m3(((const uint8_t *)w->w)[(size_t)o * (size_t)w->n_in + (size_t)k]) * s;
            copy[(size_t)o * (size_t)w->n_in + (size_t)k] = dsv4_bf16_from_f32(v);
        }
    w->fmt       = DSV4_WFMT_BF16;
    w->w         = copy;
    w->scale     = NULL;
    w->scale_f32 = false;
    return DSV4_OK;
}

struct tiles_plan {
    const struct dsv4_checkpoint *ck;
    bool              *gone;    /* [n_tensors]: tensors the tiles stand in for (never read) */
    size_t             bytes, n, n_stored, replaced;
    uint8_t           *at;      /* packing: next free byte */
    struct dsv4_pool  *pool;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* The tiles `dsv4 convert --tiles` stored for tensor t ("NAME.i16", docs/FORMAT.md), when
 * present with the expected size; NULL otherwise. */
static const void *stored_tiles(const struct dsv4_checkpoint *ck, const struct dsv4_tensor *t, size_t bytes)
{
    char name[300];
    if (!t || snprintf(name, sizeof(name), "%s.i16", t->name) >= (int)sizeof(name)) return NULL;
    const struct dsv4_tensor *s = dsv4_checkpoint_find(ck, name);
    return s && s->dtype == DSV4_DTYPE_U8 && s->ndim == 1 && s->nbytes == bytes ? s->data : NULL;
}

static void plan_tiles(struct dsv4_linear *l, void *ud)
{
    struct tiles_plan *P = ud;
    if (!dsv4_i16_eligible(l)) return;
    size_t wb, sb;
    dsv4_i16_sizes(l, &wb, &sb);
    const void *wi = stored_tiles(P->ck, l->wt, wb), *si = sb ? stored_tiles(P->ck, l->st, sb) : NULL;
    P->replaced += (l->wt ? (size_t)l->wt->nbytes : 0) + (l->st ? (size_t)l->st->nbytes : 0);
    if (l->wt) P->gone[l->wt - P->ck->tensors] = true;
    if (l->st) P->gone[l->st - P->ck->tensors] = true;
    if (wi && (si || !sb)) { /* stored by dsv4 convert --tiles: used where they are mapped */
        l->wi = wi;
        l->si = si;
        P->n_stored++;
        return;
    }
    P->bytes += align64(wb) + align64(sb);
    P->n++;
}

struct pack_job {
    const struct dsv4_linear *l;
    void                     *wi, *si;
};

static void pack_groups(void *ctx, int64_t g0, int64_t g1, int tid)
{
    (void)tid;
    const struct pack_job *J = ctx;
    dsv4_i16_pack(J->l, (int)g0, (int)g1, J->wi, J->si);
}

/* madvise over the whole pages inside [p, p + n), so that advice never reaches a
 * neighbouring tensor's bytes; advice the kernel does not know is ignored. */
static void advise_inside(const void *p, size_t n, int advice)
{
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + pg - 1) & ~(pg - 1), b = ((uintptr_t)p + n) & ~(pg - 1);
    if (b > a) (void)madvise((void *)a, b - a, advice);
}

static void pack_tiles(struct dsv4_linear *l, void *ud)
{
    struct tiles_plan *P = ud;
    if (l->wi || !dsv4_i16_eligible(l)) return; /* stored tiles, or none */
    size_t wb, sb;
    dsv4_i16_sizes(l, &wb, &sb);
    struct pack_job J = { .l = l, .wi = P->at, .si = sb ? P->at + align64(wb) : NULL };
    dsv4_pool_for(P->pool, dsv4_i16_groups(l), 1, 4, pack_groups, &J);
    l->wi = J.wi;
    l->si = J.si;
    P->at += align64(wb) + align64(sb);
#ifdef MADV_PAGEOUT
    /* the source pages are not read again: give them back now, or the page cache, full of
     * them, pushes out the tensors that are read in place (the embedding, a 1 GB table of
     * which each token touches one row) */
    if (l->wt) advise_inside(l->wt->data, l->wt->nbytes, MADV_PAGEOUT);
    if (l->st) advise_inside(l->st->data, l->st->nbytes, MADV_PAGEOUT);
#endif
}

/* Asks the kernel to read ahead every tensor that will be read in place (not the ones the
 * tiles replaced, nor stored tiles that are not used), so that the first requests do not
 * fault them in from disk row by row. gone: as in struct tiles_plan, or NULL. */
static void prefetch_in_place(const struct dsv4_model *m, const bool *gone, bool tiles_used,
                              const struct dsv4_logger *lg)
{
    const struct dsv4_checkpoint *ck = &m->ck;
    size_t bytes = 0;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const struct dsv4_tensor *t = &ck->tensors[i];
        size_t nl = strlen(t->name);
        if ((gone && gone[i]) || (!tiles_used && nl > 4 && !strcmp(t->name + nl - 4, ".i16"))) continue;
        advise_inside(t->data, t->nbytes, MADV_WILLNEED);
        bytes += t->nbytes;
    }
    dsv4_log(lg, DSV4_LOG_INFO, "read-ahead asked for %.2f GB of weights read in place", (double)bytes / 1e9);
}

/*
 * On the levels with VDPBF16PS, the projections are copied once into interleaved 16-row
 * tiles (backend/cpu/repack.c), the layout of the kernels that give the same bits at any
 * batch size and run the prefill GEMM near the machine's peak. The copy is anonymous memory
 * (transparent huge pages asked for); the checkpoint's pages are no longer touched by the
 * kernels, so the page cache may drop them. tiles == 0 (engine params) keeps the release
 * layout.
 */
static int make_tiles(struct dsv4_model *m, struct dsv4_cpu *cpu, bool tiles, const struct dsv4_logger *lg,
                      struct dsv4_err *err)
{
    if (cpu->ref || !cpu->kb || !cpu->kb->dotb_i16 || !tiles) {
        prefetch_in_place(m, NULL, false, lg);
        return DSV4_OK;
    }
    struct tiles_plan P = { .pool = cpu->pool, .ck = &m->ck, .gone = calloc(m->ck.n_tensors + 1, sizeof(bool)) };
    if (!P.gone) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    dsv4_weights_each_linear(&m->w, &m->cfg, plan_tiles, &P);
    m->tiles_replaced = P.replaced;
    if (P.n_stored) dsv4_log(lg, DSV4_LOG_INFO, "%zu projections use the tiles stored in the checkpoint", P.n_stored);
    if (P.bytes) {
        double t0  = now_s();
        void  *mem = mmap(NULL, P.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mem == MAP_FAILED) {
            free(P.gone);
            return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for the %.2f GB of interleaved weight tiles "
                                "(tiles off: --no-tiles or DSV4_TILES=0, runs on the checkpoint's own layout)", (double)P.bytes / 1e9);
        }
        madvise(mem, P.bytes, MADV_HUGEPAGE);
        m->tiles       = mem;
        m->tiles_bytes = P.bytes;
        P.at           = mem;
        dsv4_log(lg, DSV4_LOG_INFO, "repacking %zu projections (%.2f GB) into 16-row tiles", P.n, (double)P.bytes / 1e9);
        dsv4_weights_each_linear(&m->w, &m->cfg, pack_tiles, &P);
        dsv4_log(lg, DSV4_LOG_INFO, "repacked in %.2f s", now_s() - t0);
    }
    prefetch_in_place(m, P.gone, true, lg);
    free(P.gone);
    return DSV4_OK;
}

int dsv4_model_load(struct dsv4_model *m, const char *dir, const struct dsv4_engine_params *params,
                    const struct dsv4_logger *lg, struct dsv4_err *err)
{
    enum dsv4_revision rev = params->revision;
    memset(m, 0, sizeof(*m));
    dsv4_arena_init(&m->arena, 1 << 20);
    int rc = dsv4_config_load(&m->cfg, dir, err);
    if (rc) goto fail_cfg;
    rc = dsv4_checkpoint_open(&m->ck, dir, err);
    if (rc) goto fail_cfg;
    struct dsv4_bind_report rep;
    rc = dsv4_weights_bind(&m->w, &m->cfg, &m->ck, &m->arena, &rep, err);
    for (int i = 0; i < rep.n_problems; i++) dsv4_log(lg, DSV4_LOG_ERROR, "%s", rep.problems[i].text);
    if (rc == DSV4_OK && m->cfg.n_mtp > 0 && !m->w.has_mtp)
        dsv4_log(lg, DSV4_LOG_WARN, "checkpoint has no MTP block: multi-token prediction unavailable");
    dsv4_bind_report_free(&rep);
    if (rc) goto fail_ck;
    const struct dsv4_config *c = &m->cfg;
    for (int il = 0; il < c->n_layer && rc == DSV4_OK; il++) rc = round_wo_a(m, &m->w.layers[il], err);
    if (rc == DSV4_OK && m->w.has_mtp) rc = round_wo_a(m, &m->w.mtp, err);
    if (rc) goto fail_ck;
    int half     = c->d_rope / 2;
    m->freq_swa  = dsv4_arena_alloc(&m->arena, sizeof(float) * (size_t)half, 64);
    m->freq_comp = dsv4_arena_alloc(&m->arena, sizeof(float) * (size_t)half, 64);
    if (!m->freq_swa || !m->freq_comp) {
        rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        goto fail_ck;
    }
    dsv4_rope_freqs(m->freq_swa, c->d_rope, c->rope_theta, false, 1, 0, 0, 0);
    dsv4_rope_freqs(m->freq_comp, c->d_rope, c->compress_rope_theta, c->yarn, c->rope_factor, c->original_seq_len,
                    c->beta_fast, c->beta_slow);
    m->rope_swa     = (struct dsv4_rope_table){ c->d_rope, m->freq_swa };
    m->rope_comp    = (struct dsv4_rope_table){ c->d_rope, m->freq_comp };
    m->revision     = rev;
    m->row_fmt      = rev == DSV4_REVISION_CURRENT ? DSV4_ROW_FP8 : DSV4_ROW_BF16;
    m->shared_limit = rev == DSV4_REVISION_CURRENT ? c->swiglu_limit : 0.0f;
    struct dsv4_cpu *cpu;
    rc = dsv4_cpu_create(&cpu, params->cpu_level, params->n_threads, err);
    if (rc) goto fail_ck;
    m->backend_impl = cpu;
    m->ops          = cpu->ref ? &dsv4_cpu_ref_ops : &dsv4_cpu_fast_ops;
    const char *prof = params->profile_path;
    if (prof && *prof) {
        m->prof = dsv4_prof_create(prof, m->ops, (size_t)1 << 22);
        if (m->prof) m->ops = &dsv4_prof_ops;
        else dsv4_log(lg, DSV4_LOG_WARN, "profile %s: out of memory, profiling off", prof);
    }
    dsv4_log(lg, DSV4_LOG_INFO, "cpu backend: %s, %d threads", cpu->ref ? "ref" : dsv4_cpu_level_name(cpu->level),
             cpu->n_threads);
    rc = make_tiles(m, cpu, params->tiles != 0, lg, err);
    if (rc) {
        dsv4_model_free(m);
        return rc;
    }
    return DSV4_OK;
fail_ck:
    dsv4_checkpoint_close(&m->ck);
fail_cfg:
    dsv4_arena_free(&m->arena);
    return rc;
}

void dsv4_model_free(struct dsv4_model *m)
{
    if (m->tiles) munmap(m->tiles, m->tiles_bytes);
    dsv4_prof_finish(m->prof, stderr);
    dsv4_cpu_free(m->backend_impl);
    dsv4_checkpoint_close(&m->ck);
    dsv4_arena_free(&m->arena);
    memset(m, 0, sizeof(*m));
}
