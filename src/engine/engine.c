/*
 * engine.c - the public engine and session API (include/dsv4.h) over the model runtime.
 *
 * An engine is the loaded model: immutable after dsv4_engine_open, shareable by threads.
 * A session is one sequence: its KV state (kv/kv.h) and its own step scratch, both sized
 * at creation from max_ctx and max_chunk; dsv4_session_eval splits long inputs into chunks
 * and runs them inside the allocation guard.
 */
#include <stdlib.h>
#include <string.h>

#include "dist/ep.h"
#include "engine/session.h"

int dsv4_engine_open(dsv4_engine **out, const char *dir, const struct dsv4_engine_params *params,
                     struct dsv4_err *err)
{
    *out = NULL;
    struct dsv4_engine_params def;
    if (!params) {
        dsv4_engine_params_default(&def);
        params = &def;
    }
    if (params->revision != DSV4_REVISION_CURRENT && params->revision != DSV4_REVISION_INITIAL)
        return dsv4_err_set(err, DSV4_EINVAL, "unknown revision %d", (int)params->revision);
    int ranks;
    int rc = dsv4_ep_ranks_for(params, &ranks, err);
    if (rc) return rc;
    dsv4_engine *e = calloc(1, sizeof(*e));
    if (!e) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    e->lg.fn = params->log;
    e->lg.ud = params->log_ud;
    /* under expert parallelism the other ranks load their parts while this one does */
    if (ranks > 1 && (rc = dsv4_ep_announce(dir, params, ranks, err))) {
        free(e);
        return rc;
    }
    rc = dsv4_model_load_part(&e->model, dir, params, &e->lg, 0, ranks, err);
    if (ranks > 1) {
        struct dsv4_err own = *err;
        int             all = dsv4_ep_attach(&e->model, ranks, params->ep_dispatch, rc, &own, &e->lg, err);
        if (all && rc == DSV4_OK) dsv4_model_free(&e->model);
        rc = all;
    }
    if (rc) {
        free(e);
        return rc;
    }
    *out = e;
    return DSV4_OK;
}

void dsv4_engine_close(dsv4_engine *e)
{
    if (!e) return;
    dsv4_ep_detach(&e->model, &e->lg);
    dsv4_model_free(&e->model);
    free(e);
}

void dsv4_engine_ep_stats(const dsv4_engine *e, struct dsv4_ep_stats *st)
{
    dsv4_ep_stats_of(e->model.ep, st);
}

int dsv4_engine_ep_bandwidth(const dsv4_engine *e, size_t bytes, int reps, double *gbps)
{
    return dsv4_ep_bandwidth(&e->model, bytes, reps, gbps);
}

void dsv4_engine_info(const dsv4_engine *e, struct dsv4_model_info *info)
{
    const struct dsv4_config *c = &e->model.cfg;
    memset(info, 0, sizeof(*info));
    info->vocab_size = c->vocab_size;
    info->d_model    = c->d_model;
    info->n_layer    = c->n_layer;
    info->n_head     = c->n_head;
    info->n_exp      = c->n_exp;
    info->n_exp_used = c->n_exp_used;
    info->max_ctx    = c->max_ctx;
    info->has_mtp    = e->model.w.has_mtp;
    info->dspark_block = c->arch == DSV4_ARCH_V4_1 && c->n_mtp ? c->v41.dspark_block : 0;
    info->bos_id     = c->bos_id;
    info->eos_id     = c->eos_id;
}

void dsv4_engine_settings(const dsv4_engine *e, struct dsv4_engine_settings *s)
{
    const struct dsv4_model     *m  = &e->model;
    struct dsv4_backend_settings bs = { .level = "" };
    m->backend->settings(m->backend_impl, &bs);
    *s = (struct dsv4_engine_settings){ .backend = m->backend->name, .level = bs.level, .n_threads = bs.n_threads,
                                        .gemm_min = { bs.gemm_min[0], bs.gemm_min[1], bs.gemm_min[2] },
                                        .tiles = bs.tiles, .revision = m->revision, .profiling = m->prof != NULL,
                                        .ep_ranks = m->ep_ranks > 1 ? m->ep_ranks : 1, .ep_dispatch = m->ep_dispatch };
}

const struct dsv4_model *dsv4_engine_model(const dsv4_engine *e)
{
    return &e->model;
}

const struct dsv4_logger *dsv4_engine_logger(const dsv4_engine *e)
{
    return &e->lg;
}

void dsv4_engine_compute_text(const dsv4_engine *e, char *out, size_t cap)
{
    struct dsv4_engine_settings es;
    dsv4_engine_settings(e, &es);
    snprintf(out, cap, "backend %s level %s tiles %d gemm_min %d %d %d", es.backend, es.level, (int)es.tiles,
             es.gemm_min[0], es.gemm_min[1], es.gemm_min[2]);
}

void dsv4_session_params_default(struct dsv4_session_params *p)
{
    memset(p, 0, sizeof(*p));
    p->max_ctx   = 4096;
    /* the scheduler's default step size: a 512-token chunk gives a routed expert ~12 tokens
     * (flash-shaped prefill 505 tok/s against 444 at 256; the scratch is 549 MiB there) */
    p->max_chunk = 512;
}

static int check_params(const dsv4_engine *e, const struct dsv4_session_params *p, struct dsv4_err *err)
{
    if (p->max_ctx < 1 || p->max_ctx > e->model.cfg.max_ctx)
        return dsv4_err_set(err, DSV4_EINVAL, "context length %d outside [1, %d] (max_position_embeddings)",
                            p->max_ctx, e->model.cfg.max_ctx);
    if (p->max_chunk < 1 || p->max_chunk > 65536)
        return dsv4_err_set(err, DSV4_EINVAL, "chunk size %d outside [1, 65536]", p->max_chunk);
    if (p->mtp && !e->model.w.has_mtp)
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "this checkpoint has no %s",
                            e->model.cfg.arch == DSV4_ARCH_V4_1 ? "DSpark stages" : "MTP block");
    if (p->spec_draft < 0 || p->spec_draft > DSV4_SPEC_MAX_DRAFT)
        return dsv4_err_set(err, DSV4_EINVAL, "spec_draft %d outside [0, %d]", p->spec_draft, DSV4_SPEC_MAX_DRAFT);
    if (p->spec_draft && !p->mtp)
        return dsv4_err_set(err, DSV4_EINVAL, "speculative decoding (spec_draft %d) needs the MTP block (mtp)",
                            p->spec_draft);
    return DSV4_OK;
}

/* Draft logits rows a step of the session writes: one per draft (V4's MTP block), a whole
 * block (V4.1's DSpark stages draft dspark_block rows at once, dspark.c). */
static int draft_rows(const dsv4_engine *e, const struct dsv4_session_params *p)
{
    int B = e->model.cfg.arch == DSV4_ARCH_V4_1 && p->mtp ? e->model.cfg.v41.dspark_block : 0;
    return p->spec_draft > B ? p->spec_draft : B;
}

size_t dsv4_session_memory_estimate(const dsv4_engine *e, const struct dsv4_session_params *p)
{
    int    chunk = p->max_chunk < p->max_ctx ? p->max_chunk : p->max_ctx, k = p->spec_draft, dr = draft_rows(e, p);
    size_t V     = (size_t)e->model.cfg.vocab_size;
    size_t spec  = k ? dsv4_spec_undo_bytes(&e->model.cfg, k + 1) + sizeof(float) * V * (size_t)(k + 1 + dr) : 0;
    return dsv4_seq_state_bytes(&e->model.cfg.kv, p->max_ctx, e->model.row_fmt, p->mtp) +
           dsv4_step_bytes(&e->model, (chunk > dr ? chunk : dr) + 1, p->max_ctx) + sizeof(float) * V + spec;
}

int dsv4_session_create(dsv4_engine *e, const struct dsv4_session_params *p, dsv4_session **out,
                        struct dsv4_err *err)
{
    *out = NULL;
    struct dsv4_session_params def;
    if (!p) {
        dsv4_session_params_default(&def);
        if (def.max_ctx > e->model.cfg.max_ctx) def.max_ctx = e->model.cfg.max_ctx;
        p = &def;
    }
    int rc = check_params(e, p, err);
    if (rc) return rc;
    dsv4_session *s = calloc(1, sizeof(*s));
    if (!s) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    s->engine    = e;
    s->max_chunk = p->max_chunk < p->max_ctx ? p->max_chunk : p->max_ctx;
    s->logits    = calloc((size_t)e->model.cfg.vocab_size, sizeof(float));
    if (!s->logits) {
        free(s);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    }
    struct dsv4_kv_mem kvmem = dsv4_model_kv_mem(&e->model);
    rc = dsv4_seq_state_init(&s->st, &e->model.cfg.kv, p->max_ctx, e->model.row_fmt, p->mtp, &kvmem, err);
    if (rc) goto fail;
    /* one extra row: with MTP the previous call's last position joins the chunk */
    int dr = draft_rows(e, p);
    rc     = dsv4_step_init(&s->step, &e->model, (s->max_chunk > dr ? s->max_chunk : dr) + 1, p->max_ctx, err);
    if (rc) goto fail_state;
    if (p->spec_draft) {
        size_t V = (size_t)e->model.cfg.vocab_size, k = (size_t)p->spec_draft;
        s->spec_draft    = p->spec_draft;
        s->draft_logits  = malloc(sizeof(float) * V * (size_t)dr);
        s->verify_logits = malloc(sizeof(float) * V * (k + 1));
        if (!s->draft_logits || !s->verify_logits) {
            rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory for %zu draft logits rows", k);
            goto fail_spec;
        }
        if ((rc = dsv4_spec_undo_init(&s->undo, &e->model, p->spec_draft + 1, err))) goto fail_spec;
    }
    *out = s;
    return DSV4_OK;
fail_spec:
    free(s->draft_logits);
    free(s->verify_logits);
    dsv4_step_free(&s->step);
fail_state:
    dsv4_seq_state_free(&s->st);
fail:
    free(s->logits);
    free(s);
    return rc;
}

void dsv4_session_free(dsv4_session *s)
{
    if (!s) return;
    dsv4_spec_undo_free(&s->undo);
    free(s->draft_logits);
    free(s->verify_logits);
    dsv4_step_free(&s->step);
    dsv4_seq_state_free(&s->st);
    free(s->logits);
    free(s);
}

int dsv4_session_eval(dsv4_session *s, const int32_t *tokens, int n, float *logits, float *mtp_logits, int *n_mtp,
                      struct dsv4_err *err)
{
    const struct dsv4_model *m = &s->engine->model;
    int V = m->cfg.vocab_size;
    if (n_mtp) *n_mtp = 0;
    if (n < 1 || !tokens) return dsv4_err_set(err, DSV4_EINVAL, "no tokens to evaluate");
    if (mtp_logits && !s->st.has_mtp)
        return dsv4_err_set(err, DSV4_EINVAL, "MTP logits asked of a session created without MTP");
    if (s->st.pos + n > s->st.max_ctx)
        return dsv4_err_set(err, DSV4_ERANGE, "%d more tokens would exceed the context of %d (holding %d)", n,
                            s->st.max_ctx, s->st.pos);
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= V)
            return dsv4_err_set(err, DSV4_ERANGE, "token id %d at index %d is outside the vocabulary [0, %d)",
                                tokens[t], t, V);
    int rc = DSV4_OK, done = 0, mtp_rows = 0;
    dsv4_alloc_guard_enter();
    while (done < n && rc == DSV4_OK) {
        int chunk = n - done < s->max_chunk ? n - done : s->max_chunk;
        struct dsv4_fwd_seq q = {
            .st         = &s->st,
            .tokens     = tokens + done,
            .n          = chunk,
            .n_logits   = logits ? chunk : (done + chunk == n ? 1 : 0),
            .logits     = logits ? logits + (size_t)done * (size_t)V : s->logits,
            .mtp_logits = mtp_logits ? mtp_logits + (size_t)mtp_rows * (size_t)V : NULL,
        };
        rc = dsv4_forward(m, &s->step, &q, 1, err);
        done += chunk;
        mtp_rows += q.n_mtp;
    }
    dsv4_alloc_guard_leave();
    if (rc) return rc;
    if (logits) memcpy(s->logits, logits + (size_t)(n - 1) * (size_t)V, sizeof(float) * (size_t)V);
    s->has_logits = true;
    if (n_mtp) *n_mtp = mtp_rows;
    return DSV4_OK;
}

const float *dsv4_session_logits(const dsv4_session *s)
{
    return s->has_logits ? s->logits : NULL;
}

int dsv4_session_pos(const dsv4_session *s)
{
    return s->st.pos;
}

void dsv4_session_reset(dsv4_session *s)
{
    dsv4_seq_state_reset(&s->st, &s->engine->model.cfg.kv);
    s->has_logits = false;
}

int dsv4_session_set_dump(dsv4_session *s, struct dsv4_dump_sink sink, struct dsv4_err *err)
{
    return dsv4_step_set_dump(&s->step, sink, err);
}
