/*
 * model.c - loading a model for inference: config, checkpoint mapping, weight binding (every
 * problem logged), RoPE frequency tables and the revision switches.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model/rank_plan.h"
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
    for (int o = 0; o < w->n_out; o++)
        for (int k = 0; k < w->n_in; k++) {
            float s;
            memcpy(&s, (const uint8_t *)w->scale + dsv4_fp8_scale_index(w, o, k) * 4, 4);
            float v = dsv4_f32_from_e4m3(((const uint8_t *)w->w)[(size_t)o * (size_t)w->n_in + (size_t)k]) * s;
            copy[(size_t)o * (size_t)w->n_in + (size_t)k] = dsv4_bf16_from_f32(v);
        }
    w->fmt       = DSV4_WFMT_BF16;
    w->w         = copy;
    w->scale     = NULL;
    w->scale_f32 = false;
    return DSV4_OK;
}

/* The model's projections, for the backend's prepare_weights. */
static void each_linear(void *ctx, void (*fn)(struct dsv4_linear *l, void *ud), void *ud)
{
    struct dsv4_model *m = ctx;
    dsv4_weights_each_linear_of(&m->w, &m->cfg, m->exp_lo, m->exp_hi, m->trunk, fn, ud);
}

/* The checkpoint's other tensors, then the tables the model computed at load (the RoPE
 * frequencies), which a backend places in its memory like the weights. */
static void each_tensor(void *ctx, void (*fn)(const void **t, size_t bytes, void *ud), void *ud)
{
    struct dsv4_model *m = ctx;
    if (!m->trunk) return; /* an expert rank runs no op that reads them */
    dsv4_weights_each_tensor(&m->w, &m->cfg, fn, ud);
    size_t half = sizeof(float) * (size_t)(m->cfg.d_rope / 2);
    fn((const void **)&m->rope_swa.freq, half, ud);
    fn((const void **)&m->rope_comp.freq, half, ud);
}

bool dsv4_model_holds(const struct dsv4_model *m, const struct dsv4_tensor *t)
{
    int e = dsv4_tensor_expert(t->name); /* the same rule as the memory plan (rank_plan.c) */
    return e < 0 ? m->trunk : e >= m->exp_lo && e < m->exp_hi;
}

static bool holds(void *ctx, const struct dsv4_tensor *t)
{
    return dsv4_model_holds(ctx, t);
}

int dsv4_model_load(struct dsv4_model *m, const char *dir, const struct dsv4_engine_params *params,
                    const struct dsv4_logger *lg, struct dsv4_err *err)
{
    return dsv4_model_load_part(m, dir, params, lg, 0, 1, err);
}

int dsv4_model_load_part(struct dsv4_model *m, const char *dir, const struct dsv4_engine_params *params,
                         const struct dsv4_logger *lg, int rank, int ranks, struct dsv4_err *err)
{
    enum dsv4_revision rev = params->revision;
    memset(m, 0, sizeof(*m));
    dsv4_arena_init(&m->arena, 1 << 20);
    int rc = dsv4_config_load(&m->cfg, dir, err);
    if (rc) goto fail_cfg;
    if (m->cfg.arch == DSV4_ARCH_V4_1 && rev != DSV4_REVISION_CURRENT) { /* the revisions are V4's demo's (§R0) */
        rc = dsv4_err_set(err, DSV4_EUNSUPPORTED, "--revision initial reproduces the first DeepSeek-V4 demo; a "
                                                  "DeepSeek-V4.1 checkpoint has only its own code (use current)");
        goto fail_cfg;
    }
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
    dsv4_rank_experts(rank, ranks > 1 ? ranks : 1, c->n_exp, &m->exp_lo, &m->exp_hi);
    m->trunk       = rank == 0;
    m->ep_ranks    = ranks;
    m->ep_dispatch = params->ep_dispatch;
    for (int il = 0; m->trunk && il < c->n_layer && rc == DSV4_OK; il++) rc = round_wo_a(m, &m->w.layers[il], err);
    if (rc == DSV4_OK && m->trunk && m->w.has_mtp) rc = round_wo_a(m, &m->w.mtp, err);
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
    /* V4.1: bf16 rows hold its FP8/FP4-simulated values exactly (docs/MODEL.md §6) */
    m->row_fmt      = rev == DSV4_REVISION_CURRENT && c->arch == DSV4_ARCH_V4 ? DSV4_ROW_FP8 : DSV4_ROW_BF16;
    m->shared_limit = rev == DSV4_REVISION_CURRENT ? c->swiglu_limit : 0.0f;
    rc = dsv4_model_load_v41(m, dir, err);
    if (rc) goto fail_v41;
    m->backend = dsv4_backend_find(params->backend);
    if (!m->backend) {
        char names[256];
        dsv4_backend_list(names, sizeof(names));
        rc = dsv4_err_set(err, DSV4_EUNSUPPORTED, "this build has no backend '%s' (it has: %s)", params->backend, names);
        goto fail_v41;
    }
    struct dsv4_backend_params bp = {
        .opts = params->backend_opts, .n_threads = params->n_threads, .lg = lg,
        .profile = params->profile_path && *params->profile_path,
    };
    rc = m->backend->create(&m->backend_impl, &bp, err);
    if (rc) goto fail_v41;
    m->ops = m->backend->ops(m->backend_impl);
    char missing[512];
    int  n_missing = dsv4_backend_ops_missing(m->ops, missing, sizeof(missing));
    if (n_missing) {
        /* no silent fallback: a backend runs every op or none of the model */
        rc = dsv4_err_set(err, DSV4_EUNSUPPORTED, "backend '%s' lacks %d of %d ops: %s", m->backend->name, n_missing,
                          (int)DSV4_OP_COUNT, missing);
        m->backend->destroy(m->backend_impl);
        m->backend_impl = NULL;
        m->backend      = NULL;
        goto fail_v41;
    }
    const char *prof = params->profile_path;
    if (prof && *prof) {
        m->prof = dsv4_prof_create(prof, m->ops, (size_t)1 << 22);
        if (m->prof) m->ops = &dsv4_prof_ops;
        else dsv4_log(lg, DSV4_LOG_WARN, "profile %s: out of memory, profiling off", prof);
    }
    char desc[128];
    m->backend->describe(m->backend_impl, desc, sizeof(desc));
    dsv4_log(lg, DSV4_LOG_INFO, "backend: %s", desc);
    struct dsv4_weight_set ws = { .ck = &m->ck, .each_linear = each_linear, .each_tensor = each_tensor, .holds = holds,
                                   .ctx = m };
    rc                        = m->backend->prepare_weights(m->backend_impl, &ws, &bp, err);
    if (rc) {
        dsv4_model_free(m);
        return rc;
    }
    return DSV4_OK;
fail_v41:
    dsv4_model_free_v41(m);
fail_ck:
    dsv4_checkpoint_close(&m->ck);
fail_cfg:
    dsv4_arena_free(&m->arena);
    return rc;
}

void dsv4_model_free(struct dsv4_model *m)
{
    dsv4_prof_finish(m->prof, stderr);
    if (m->prof && m->backend && m->backend->device_profile) m->backend->device_profile(m->backend_impl, stderr);
    if (m->backend) m->backend->destroy(m->backend_impl);
    dsv4_model_free_v41(m);
    dsv4_checkpoint_close(&m->ck);
    dsv4_arena_free(&m->arena);
    memset(m, 0, sizeof(*m));
}
