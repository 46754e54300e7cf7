/*
 * stub_worker.c - the srv_worker_* interface of src/server/server.h without an engine, for
 * the HTTP fuzz harness (tests/fuzz/fuzz_server.c), which links it in place of
 * src/server/worker.c so that a request runs the whole HTTP and API path of the server in
 * microseconds and without a model.
 *
 * The stub loads only the tokenizer (MODEL_DIR/tokenizer.json, srv_params.model_dir; the
 * harness points it at models/kjv-v4-tiny) and is READY as soon as srv_worker_start
 * returns. A submitted job is answered inside srv_worker_submit: one token (the prompt's
 * last id, so the output varies with the request), then, if max_tokens allows and EOS is
 * not ignored, the EOS id and the finish EOS, else the finish LENGTH. Log-probabilities,
 * when asked for, are made up but well formed (the chosen token first, descending). A
 * prompt that does not leave room for one token is DSV4_ERANGE, as the scheduler answers.
 * Nothing is ever queued, so cancel has nothing to stop and stats report an idle server.
 */
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

struct srv_worker {
    struct srv_worker_params p;
    dsv4_tokenizer          *tok;
    enum srv_state           state;
    struct dsv4_err          load_err;
    int                      ctx;
    int32_t                  eos;
};

int srv_worker_start(struct srv_worker **out, const struct srv_worker_params *p, struct dsv4_err *err)
{
    *out = NULL;
    if (srv_worker_params_check(p, err)) return DSV4_EINVAL;
    struct srv_worker *w = calloc(1, sizeof(*w));
    if (!w) return srv_err(err, DSV4_ENOMEM, "out of memory for the worker");
    w->p     = *p;
    w->ctx   = p->ctx;
    w->state = SRV_STATE_READY;
    /* as the real worker, a model that cannot load is a FAILED server, not a failed start */
    if (dsv4_tokenizer_load(&w->tok, p->model_dir, &w->load_err)) w->state = SRV_STATE_FAILED;
    else w->eos = dsv4_tokenizer_eos(w->tok);
    *out = w;
    return DSV4_OK;
}

enum srv_state srv_worker_state(struct srv_worker *w, struct dsv4_err *err)
{
    if (w->state == SRV_STATE_FAILED && err) *err = w->load_err;
    return w->state;
}

const dsv4_tokenizer *srv_worker_tokenizer(struct srv_worker *w)
{
    return w->tok;
}

void srv_worker_info(struct srv_worker *w, struct dsv4_model_info *info, int *ctx)
{
    memset(info, 0, sizeof(*info));
    info->vocab_size = w->tok ? dsv4_tokenizer_n_vocab(w->tok) : 2;
    info->max_ctx    = w->ctx;
    info->bos_id     = w->tok ? dsv4_tokenizer_bos(w->tok) : 0;
    info->eos_id     = w->eos;
    if (ctx) *ctx = w->ctx;
}

int srv_worker_tier(const struct srv_worker *w, int n_prompt)
{
    return n_prompt <= w->p.tier_tokens[0] ? 0 : n_prompt <= w->p.tier_tokens[1] ? 1 : 2;
}

static void push(struct srv_job *j, int32_t id)
{
    struct srv_token t = { .id = id, .logprob = -0.5f };
    if (j->logprobs) {
        t.n_top = j->top_logprobs < SRV_MAX_TOP_LOGPROBS ? j->top_logprobs : SRV_MAX_TOP_LOGPROBS;
        for (int k = 0; k < t.n_top; k++) {
            t.top_id[k] = k == 0 ? id : k;
            t.top_lp[k] = -0.5f - (float)k;
        }
    }
    srv_job_push(j, &t);
}

int srv_worker_submit(struct srv_worker *w, struct srv_job *j, struct dsv4_err *err)
{
    if (w->state != SRV_STATE_READY) return srv_err(err, DSV4_ECANCELED, "the model is not ready");
    if (j->n_prompt < 1 || j->n_prompt >= w->ctx)
        return srv_err(err, DSV4_ERANGE, "a prompt of %d tokens leaves no room in a context of %d", j->n_prompt,
                       w->ctx);
    j->worker = w;
    j->tier   = srv_worker_tier(w, j->n_prompt);
    push(j, j->prompt[j->n_prompt - 1]);
    if (j->max_tokens >= 2 && !j->ignore_eos) {
        push(j, w->eos);
        srv_job_finish(j, SRV_FINISH_EOS, NULL);
    } else {
        srv_job_finish(j, SRV_FINISH_LENGTH, NULL);
    }
    return DSV4_OK;
}

void srv_worker_cancel(struct srv_worker *w, struct srv_job *j)
{
    (void)w;
    atomic_store(&j->cancel, true); /* every job is already finished: nothing else to stop */
}

void srv_worker_cancel_all(struct srv_worker *w)
{
    (void)w;
}

void srv_worker_stats(struct srv_worker *w, struct srv_worker_stats *st)
{
    memset(st, 0, sizeof(*st));
    st->state       = w->state;
    st->max_seqs    = w->p.max_seqs;
    st->ctx         = w->ctx;
    st->max_queue   = w->p.max_queue;
    st->page_tokens = 256;
}

void srv_worker_stop(struct srv_worker *w)
{
    if (!w) return;
    dsv4_tokenizer_free(w->tok);
    free(w);
}
