/*
 * stats.c - sizes derived from the config and checkpoint: parameters and bytes by dtype,
 * bytes read per decoded token, and per-sequence KV/state memory. Used by `dsv4 inspect`
 * and by memory planning.
 */
#include <string.h>

#include "kv/kv.h"
#include "model/model.h"

/* Frontier state of one compressor: coff*ratio slots of coff*d_out values and gates, f32. */
static uint64_t comp_state_bytes(const struct dsv4_layer_kind *k, int d_out)
{
    uint64_t coff = (uint64_t)dsv4_kind_coff(k);
    return coff * (uint64_t)k->ratio * coff * (uint64_t)d_out * 2 * sizeof(float);
}

void dsv4_kv_sizes(const struct dsv4_config *c, bool with_mtp, struct dsv4_kv_sizes *s)
{
    memset(s, 0, sizeof(*s));
    uint64_t row  = dsv4_kv_row_bytes(c);
    int      nl   = c->n_layer + (with_mtp ? c->n_mtp : 0);
    for (int il = 0; il < nl; il++) {
        const struct dsv4_layer_kind *k = &c->kind[il];
        s->fixed_per_seq += (uint64_t)(k->window + DSV4_SPEC_MAX_DRAFT) * row;
        if (k->ratio == 0) continue;
        s->fixed_per_seq += comp_state_bytes(k, c->d_head);
        s->bytes_per_token += (double)row / k->ratio;
        if (k->indexer) {
            s->fixed_per_seq += comp_state_bytes(k, c->d_idx_head);
            s->bytes_per_token += (double)dsv4_idx_row_bytes(c) / k->ratio;
        }
    }
}

static bool is_expert_tensor(const char *name)
{
    return strstr(name, ".ffn.experts.") != NULL;
}

void dsv4_model_stats(const struct dsv4_config *c, const struct dsv4_checkpoint *ck,
                      struct dsv4_model_stats *st)
{
    memset(st, 0, sizeof(*st));
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const struct dsv4_tensor *t     = &ck->tensors[i];
        uint64_t                  numel = dsv4_tensor_numel(t);
        if (strncmp(t->name, DSV4_ST_PAD_PREFIX, strlen(DSV4_ST_PAD_PREFIX)) == 0) continue; /* alignment padding */
        size_t nl = strlen(t->name);
        if (nl > 4 && !strcmp(t->name + nl - 4, ".i16")) {
            /* tiles stored by `dsv4 convert --tiles`: read instead of their tensor, not as well */
            st->bytes_tiles += t->nbytes;
            st->bytes_total += t->nbytes;
            continue;
        }
        /* packed FP4 experts hold two parameters per I8 element */
        uint64_t params = (is_expert_tensor(t->name) && (t->dtype == DSV4_DTYPE_I8 || t->dtype == DSV4_DTYPE_U8) &&
                           c->expert_wfmt == DSV4_WFMT_FP4) ? numel * 2 : numel;
        st->params_by_dtype[t->dtype] += params;
        st->bytes_by_dtype[t->dtype] += t->nbytes;
        st->bytes_total += t->nbytes;
        if (strncmp(t->name, "mtp.", 4) == 0) continue; /* not read by plain decoding */
        uint64_t per_tok, act;
        if (!strcmp(t->name, "embed.weight")) {
            per_tok = (uint64_t)c->d_model * 2;
            act     = (uint64_t)c->d_model;
        } else if (strstr(t->name, ".tid2eid")) {
            per_tok = (uint64_t)c->n_exp_used * 8;
            act     = 0;
        } else if (is_expert_tensor(t->name)) {
            per_tok = t->nbytes * (uint64_t)c->n_exp_used / (uint64_t)c->n_exp;
            act     = params * (uint64_t)c->n_exp_used / (uint64_t)c->n_exp;
            st->bytes_experts_per_token += per_tok;
        } else {
            per_tok = t->nbytes;
            act     = params;
        }
        if (t->dtype == DSV4_DTYPE_F8_E8M0 || (t->dtype == DSV4_DTYPE_F32 && strstr(t->name, ".scale")))
            act = 0; /* scales are not parameters of the model */
        st->bytes_per_token += per_tok;
        st->active_params += act;
    }
    for (int il = 0; il < c->n_layer; il++) {
        if (c->kind[il].ratio == 0) st->n_swa++;
        else if (c->kind[il].indexer) st->n_csa++;
        else st->n_hca++;
    }
}
