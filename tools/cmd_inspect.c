/*
 * cmd_inspect.c - `dsv4 inspect`: check a checkpoint against its config and print the
 * architecture, parameter and byte counts, bytes read per decoded token, KV/state sizes and
 * a memory estimate (DeepSeek-V4.1: inspect_v41.c). Exit 0 only when the checkpoint is complete
 * and valid; otherwise every problem is listed and the exit status is 1.
 */
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "inspect_ranks.h"
#include "inspect_v41.h"
#include "model/model.h"

static double mib(double b)
{
    return b / (1024.0 * 1024.0);
}

static const char *kind_name(const struct dsv4_layer_kind *k)
{
    return k->ratio == 0 ? "SWA" : k->indexer ? "CSA" : "HCA";
}

/* The compressed layers: the ratio of the first with the indexer (CSA) and of the first
 * without (HCA), 0 when there is none. */
static void print_compression(const struct dsv4_config *c)
{
    int csa = 0, hca = 0;
    for (int il = 0; il < c->n_layer; il++) {
        const struct dsv4_layer_kind *k = &c->kind[il];
        if (k->indexer && !csa) csa = k->ratio;
        if (k->ratio && !k->indexer && !hca) hca = k->ratio;
    }
    printf("compression  ");
    if (csa)
        printf("CSA ratio %d with indexer (%d heads x %d, top-%d)", csa, c->n_idx_head, c->d_idx_head, c->idx_topk);
    else printf("no indexer layers");
    if (hca) printf(", HCA ratio %d", hca);
    printf("\n");
}

static void print_findings(const struct dsv4_checkpoint *ck, const struct dsv4_bind_report *rep, bool list_tensors);

static void print_text(const char *dir, const struct dsv4_config *c, const struct dsv4_checkpoint *ck,
                       const struct dsv4_model_stats *st, const struct dsv4_bind_report *rep, bool has_mtp,
                       long long ctx, long long seqs, bool list_tensors)
{
    printf("checkpoint   %s: %d shard%s, %zu tensors, %.1f MiB\n", dir, ck->n_files, ck->n_files == 1 ? "" : "s",
           ck->n_tensors, mib((double)st->bytes_total));
    if (st->bytes_tiles)
        printf("tiles        %.1f MiB of interleaved 16-row tiles (dsv4 convert --tiles), used instead of their tensors\n",
               mib((double)st->bytes_tiles));
    printf("model        DeepSeek-V4: %d layers + %d MTP, d_model %d, vocab %d, max context %d\n", c->n_layer,
           c->n_mtp, c->d_model, c->vocab_size, c->max_ctx);
    printf("layers       %d SWA, %d CSA, %d HCA: ", st->n_swa, st->n_csa, st->n_hca);
    for (int il = 0; il < c->n_layer + c->n_mtp; il++)
        printf("%s%s%s", il ? " " : "", il == c->n_layer ? "| MTP " : "", kind_name(&c->kind[il]));
    printf("\n");
    printf("attention    %d heads x %d (rope %d, nope %d), q_lora %d, output %d groups x %d, window %d\n",
           c->n_head, c->d_head, c->d_rope, c->d_nope, c->q_lora_rank, c->o_groups, c->o_lora_rank, c->window);
    print_compression(c);
    printf("rope         theta %g (SWA layers), %g for compressed layers", c->rope_theta, c->compress_rope_theta);
    if (c->yarn)
        printf(" with YaRN x%g (original %d, beta %g/%g)", c->rope_factor, c->original_seq_len, c->beta_fast,
               c->beta_slow);
    printf("\n");
    printf("moe          %d routed (top-%d, %s) + %d shared, d_ff %d, hash routing in layers 0..%d, "
           "route scale %g, swiglu limit %g\n",
           c->n_exp, c->n_exp_used, dsv4_wfmt_name(c->expert_wfmt), c->n_exp_shared, c->d_ff_exp,
           c->n_hash_layer - 1, c->route_scale, c->swiglu_limit);
    printf("hyper-conn   %d streams, %d Sinkhorn iterations\n", c->hc, c->hc_sinkhorn_iters);
    printf("projections  %s\n", dsv4_wfmt_name(c->wfmt));
    printf("mtp          %s\n", has_mtp ? "available" : rep->mtp_absent ? "unavailable (no mtp.* tensors)" : "unavailable");
    printf("\nby dtype     %-8s %16s %14s\n", "dtype", "elements", "MiB");
    for (int t = 0; t < DSV4_DTYPE_COUNT; t++)
        if (st->bytes_by_dtype[t])
            printf("             %-8s %16llu %14.2f\n", dsv4_dtype_name((enum dsv4_dtype)t),
                   (unsigned long long)st->params_by_dtype[t], mib((double)st->bytes_by_dtype[t]));
    printf("\nper token    %.2f MiB of weights read per decoded token (routed experts %.2f MiB), "
           "%.2fM active parameters\n",
           mib((double)st->bytes_per_token), mib((double)st->bytes_experts_per_token), (double)st->active_params / 1e6);
    struct dsv4_kv_sizes kv;
    dsv4_kv_sizes(c, has_mtp, &kv);
    printf("kv state     %.1f KiB fixed per sequence (window rings, compressor states), %.1f bytes per position\n",
           (double)kv.fixed_per_seq / 1024.0, kv.bytes_per_token);
    double kv_total = ((double)kv.fixed_per_seq + kv.bytes_per_token * (double)ctx) * (double)seqs;
    printf("memory       --ctx %lld --seqs %lld: weights %.1f MiB (mapped) + KV %.1f MiB\n", ctx, seqs,
           mib((double)st->bytes_total), mib(kv_total));
    print_findings(ck, rep, list_tensors);
}

/* What every checkpoint's report ends with: the tensor list (--tensors), the refused shards,
 * and every problem of the binding or that all is well. */
static void print_findings(const struct dsv4_checkpoint *ck, const struct dsv4_bind_report *rep, bool list_tensors)
{
    if (list_tensors) {
        printf("\ntensors\n");
        for (size_t i = 0; i < ck->n_tensors; i++) {
            const struct dsv4_tensor *t = &ck->tensors[i];
            char                      s[64];
            printf("  %-48s %-8s %-16s %s\n", t->name, dsv4_dtype_name(t->dtype),
                   dsv4_shape_str(t->ndim, t->shape, s, sizeof(s)), ck->file_names[t->file]);
        }
    }
    for (int r = 0; r < ck->n_refused; r++) {
        const struct dsv4_shard_refusal *f = &ck->refused[r];
        printf("\nrefused      shard %s: %s\n", ck->file_names[f->file], f->msg);
        if (f->n_names)
            printf("             the model therefore lacks its %zu tensor%s (each listed below as missing)\n",
                   f->n_names, f->n_names == 1 ? "" : "s");
        else
            printf("             no tensor names can be read from it (no index, header unreadable): the tensors "
                   "listed below as missing are what the model lacks\n");
    }
    if (rep->n_problems) {
        printf("\n%d problem%s (%d missing, %d wrong dtype, %d wrong shape, %d unexpected):\n", rep->n_problems,
               rep->n_problems == 1 ? "" : "s", rep->n_missing, rep->n_dtype, rep->n_shape, rep->n_unexpected);
        for (int i = 0; i < rep->n_problems; i++) printf("  %s\n", rep->problems[i].text);
    } else if (ck->n_refused) {
        printf("\nevery tensor the model needs is present, but a shard was refused (above)\n");
    } else {
        printf("\nok: every tensor present with the expected dtype and shape\n");
    }
}

/* The head of every checkpoint's JSON report: where, whether all is well, shards, tensors. */
static json_t *findings_json(const char *dir, const struct dsv4_checkpoint *ck, const struct dsv4_bind_report *rep,
                             uint64_t bytes)
{
    json_t *o = json_object();
    json_object_set_new(o, "checkpoint", json_string(dir));
    json_object_set_new(o, "ok", json_boolean(rep->n_problems == 0 && ck->n_refused == 0));
    json_t *refused = json_array();
    for (int r = 0; r < ck->n_refused; r++) {
        json_t *names = json_array();
        for (size_t k = 0; k < ck->refused[r].n_names; k++) json_array_append_new(names, json_string(ck->refused[r].names[k]));
        json_array_append_new(refused, json_pack("{s:s, s:s, s:o}", "shard", ck->file_names[ck->refused[r].file],
                                                 "error", ck->refused[r].msg, "tensors", names));
    }
    json_object_set_new(o, "refused_shards", refused);
    json_object_set_new(o, "shards", json_integer(ck->n_files));
    json_object_set_new(o, "tensors", json_integer((json_int_t)ck->n_tensors));
    json_object_set_new(o, "bytes", json_integer((json_int_t)bytes));
    return o;
}

/* The tail of every checkpoint's JSON report: the problems, the tensors (--tensors), the
 * rank plan (--ranks); prints the report and frees it. */
static void print_findings_json(json_t *o, const struct dsv4_checkpoint *ck, const struct dsv4_bind_report *rep,
                                bool list_tensors, json_t *ranks)
{
    json_t *probs = json_array();
    for (int i = 0; i < rep->n_problems; i++) json_array_append_new(probs, json_string(rep->problems[i].text));
    json_object_set_new(o, "problems", probs);
    if (list_tensors) {
        json_t *ts = json_array();
        for (size_t i = 0; i < ck->n_tensors; i++) {
            const struct dsv4_tensor *t = &ck->tensors[i];
            json_t                   *sh = json_array();
            for (int d = 0; d < t->ndim; d++) json_array_append_new(sh, json_integer(t->shape[d]));
            json_array_append_new(ts, json_pack("{s:s, s:s, s:o, s:s}", "name", t->name, "dtype",
                                                dsv4_dtype_name(t->dtype), "shape", sh, "file",
                                                ck->file_names[t->file]));
        }
        json_object_set_new(o, "tensor_list", ts);
    }
    if (ranks) json_object_set_new(o, "ranks", ranks);
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (s) puts(s);
    free(s);
    json_decref(o);
}

static void print_json(const char *dir, const struct dsv4_config *c, const struct dsv4_checkpoint *ck,
                       const struct dsv4_model_stats *st, const struct dsv4_bind_report *rep, bool has_mtp,
                       long long ctx, long long seqs, bool list_tensors, json_t *ranks)
{
    struct dsv4_kv_sizes kv;
    dsv4_kv_sizes(c, has_mtp, &kv);
    json_t *o = findings_json(dir, ck, rep, st->bytes_total);
    json_t *layers = json_array();
    for (int il = 0; il < c->n_layer + c->n_mtp; il++)
        json_array_append_new(layers, json_string(kind_name(&c->kind[il])));
    json_object_set_new(o, "layers", layers);
    json_object_set_new(o, "n_layer", json_integer(c->n_layer));
    json_object_set_new(o, "d_model", json_integer(c->d_model));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(o, "mtp_available", json_boolean(has_mtp));
    json_t *bd = json_object();
    for (int t = 0; t < DSV4_DTYPE_COUNT; t++)
        if (st->bytes_by_dtype[t])
            json_object_set_new(bd, dsv4_dtype_name((enum dsv4_dtype)t),
                                json_pack("{s:I, s:I}", "elements", (json_int_t)st->params_by_dtype[t], "bytes",
                                          (json_int_t)st->bytes_by_dtype[t]));
    json_object_set_new(o, "by_dtype", bd);
    json_object_set_new(o, "bytes_per_token", json_integer((json_int_t)st->bytes_per_token));
    json_object_set_new(o, "expert_bytes_per_token", json_integer((json_int_t)st->bytes_experts_per_token));
    json_object_set_new(o, "active_params", json_integer((json_int_t)st->active_params));
    json_object_set_new(o, "kv_fixed_bytes_per_seq", json_integer((json_int_t)kv.fixed_per_seq));
    json_object_set_new(o, "kv_bytes_per_position", json_real(kv.bytes_per_token));
    json_object_set_new(o, "memory_estimate",
                        json_pack("{s:I, s:I, s:I, s:f}", "ctx", (json_int_t)ctx, "seqs", (json_int_t)seqs,
                                  "weights_bytes", (json_int_t)st->bytes_total, "kv_bytes",
                                  ((double)kv.fixed_per_seq + kv.bytes_per_token * (double)ctx) * (double)seqs));
    print_findings_json(o, ck, rep, list_tensors, ranks);
}

static void print_error_json(const char *dir, const char *msg)
{
    json_t *o = json_pack("{s:s, s:b, s:[s]}", "checkpoint", dir, "ok", 0, "problems", msg);
    char   *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (s) puts(s);
    free(s);
    json_decref(o);
}

struct inspect_opts {
    const char *dir, *config;
    bool        tensors, as_json;
    long long   ctx, seqs;
    int         ranks, step_tokens;
};

#define IO(field) offsetof(struct inspect_opts, field)
static const struct cli_opt INSPECT_OPTS[] = {
    { "--model", "-m", "DIR", "checkpoint directory (config.json + safetensors) or a .safetensors file", CLI_STR, IO(dir),
      0, 0, NULL },
    { "--config", NULL, "FILE", "a config.json alone (no weights): the memory plan from the shapes it implies\n"
      "(models/configs/v4-flash.json, v4-pro.json, v41-flash.json)", CLI_STR, IO(config), 0, 0, NULL },
    { "--tensors", NULL, NULL, "list every tensor (name, dtype, shape, shard)", CLI_FLAG, IO(tensors), 0, 0, NULL },
    { "--json", NULL, NULL, "machine-readable output", CLI_FLAG, IO(as_json), 0, 0, NULL },
    { "--ctx", NULL, "N", "context length for the memory estimate (default 4096, or the model's limit if smaller)",
      CLI_LLONG, IO(ctx), 1, (double)(1LL << 30), NULL },
    { "--seqs", NULL, "M", "concurrent sequences for the memory estimate (default 1)", CLI_LLONG, IO(seqs), 1, 1 << 20,
      NULL },
    { "--ranks", NULL, "N", "memory per rank of expert parallelism over N ranks (docs/DISTRIBUTED.md)", CLI_INT,
      IO(ranks), 1, 1 << 20, NULL },
    { "--step-tokens", NULL, "T", "token rows per step the scratch of --ranks is sized for (default 512)", CLI_INT,
      IO(step_tokens), 1, 65536, NULL },
};
#undef IO

/* --ctx unless given: 4096, or the model's limit if smaller (as a session's default). */
static long long ctx_of(const struct inspect_opts *o, const struct dsv4_config *c)
{
    return o->ctx ? o->ctx : c->max_ctx < 4096 ? c->max_ctx : 4096;
}

static struct dsv4_rank_params rank_params(const struct inspect_opts *o, const struct dsv4_config *c)
{
    long long ctx = ctx_of(o, c);
    return (struct dsv4_rank_params){ .n_ranks = o->ranks, .ctx = (int)(ctx < (1LL << 30) ? ctx : 1LL << 30),
                                      .seqs = (int)o->seqs, .step_tokens = o->step_tokens };
}

/* --config FILE: the plan of a model from its config alone (no weights at hand). */
static int inspect_config(const struct inspect_opts *o)
{
    struct dsv4_err    err;
    struct dsv4_config cfg;
    struct rank_report rr;
    memset(&rr, 0, sizeof(rr));
    int rc = dsv4_config_load_file(&cfg, o->config, &err);
    if (rc == DSV4_OK && cfg.arch == DSV4_ARCH_V4_1) {
        if (!o->ranks) {
            inspect_v41_config(o->config, &cfg, ctx_of(o, &cfg), o->seqs, o->as_json);
            return 0;
        }
        rc = dsv4_err_set(&err, DSV4_EUNSUPPORTED, "--ranks: not available for DeepSeek-V4.1 configs yet (issue 41)");
    }
    if (rc == DSV4_OK) {
        rr.p = rank_params(o, &cfg);
        if (!rr.p.n_ranks) rr.p.n_ranks = 1;
        rc = rank_report_config(&rr, &cfg, &err);
    }
    if (rc) {
        if (o->as_json) print_error_json(o->config, err.msg);
        else fprintf(stderr, "dsv4 inspect: %s\n", err.msg);
        rank_report_free(&rr);
        return 1;
    }
    if (o->as_json) {
        json_t *j = json_pack("{s:s, s:b, s:I, s:I, s:o}", "config", o->config, "ok", 1, "tensors",
                              (json_int_t)rr.n_tensors, "bytes", (json_int_t)rr.single.weights, "ranks",
                              rank_report_json(&rr));
        char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        if (s) puts(s);
        free(s);
        json_decref(j);
    } else {
        printf("config       %s: DeepSeek-V4, %d layers + %d MTP, d_model %d, %d routed experts (%s) of d_ff %d\n",
               o->config, cfg.n_layer, cfg.n_mtp, cfg.d_model, cfg.n_exp, dsv4_wfmt_name(cfg.expert_wfmt),
               cfg.d_ff_exp);
        printf("weights      %zu tensors, %.1f MiB (%.1f GB) as the release stores them (computed from the config)\n",
               rr.n_tensors, mib((double)rr.single.weights), (double)rr.single.weights / 1e9);
        rank_report_print(&rr);
    }
    rank_report_free(&rr);
    return 0;
}

/* The checkpoint's report; with --ranks, its plan first (an impossible plan prints nothing). */
static int inspect_checkpoint(const struct inspect_opts *o, const struct dsv4_config *cfg,
                              const struct dsv4_checkpoint *ck, struct dsv4_weights *w,
                              const struct dsv4_bind_report *rep)
{
    struct dsv4_err         err;
    struct dsv4_model_stats st;
    struct rank_report      rr = { .p = rank_params(o, cfg) };
    long long               ctx = ctx_of(o, cfg);
    if (o->ranks && rank_report_checkpoint(&rr, cfg, ck, w, &err)) {
        if (o->as_json) print_error_json(o->dir, err.msg);
        else fprintf(stderr, "dsv4 inspect: %s\n", err.msg);
        rank_report_free(&rr);
        return 1;
    }
    dsv4_model_stats(cfg, ck, &st);
    if (o->as_json) {
        print_json(o->dir, cfg, ck, &st, rep, w->has_mtp, ctx, o->seqs, o->tensors,
                   o->ranks ? rank_report_json(&rr) : NULL);
    } else {
        print_text(o->dir, cfg, ck, &st, rep, w->has_mtp, ctx, o->seqs, o->tensors);
        if (o->ranks) rank_report_print(&rr);
    }
    rank_report_free(&rr);
    return 0;
}

/* A DeepSeek-V4.1 checkpoint's report: its model (inspect_v41.c), then the findings. 1 when
 * its token map is wrong or --ranks is asked for (not planned for V4.1 yet). */
static int inspect_checkpoint_v41(const struct inspect_opts *o, const struct dsv4_config *cfg,
                                  const struct dsv4_checkpoint *ck, const struct dsv4_weights *w,
                                  const struct dsv4_bind_report *rep)
{
    const char *no_ranks = "--ranks: not available for DeepSeek-V4.1 checkpoints yet (issue 41)";
    long long   ctx      = ctx_of(o, cfg);
    bool        ok;
    if (o->ranks) {
        if (o->as_json) print_error_json(o->dir, no_ranks);
        else fprintf(stderr, "dsv4 inspect: %s\n", no_ranks);
        return 1;
    }
    if (o->as_json) {
        uint64_t engram, bytes = inspect_v41_bytes(ck, &engram);
        json_t  *j = findings_json(o->dir, ck, rep, bytes);
        json_object_set_new(j, "engram_bytes", json_integer((json_int_t)engram));
        json_object_set_new(j, "vision_tensors", json_integer(rep->n_vision));
        ok = inspect_v41_checkpoint_json(j, o->dir, cfg, w->has_mtp, ctx, o->seqs);
        if (!ok) json_object_set_new(j, "ok", json_false());
        print_findings_json(j, ck, rep, o->tensors, NULL);
    } else {
        ok = inspect_v41_checkpoint_text(o->dir, cfg, ck, w->has_mtp, rep->n_vision, ctx, o->seqs);
        print_findings(ck, rep, o->tensors);
    }
    return ok ? 0 : 1;
}

int cmd_inspect(int argc, char **argv)
{
    struct inspect_opts    o     = { .ctx = 0, .seqs = 1, .step_tokens = 512 };
    const struct cli_group group = { NULL, INSPECT_OPTS, sizeof(INSPECT_OPTS) / sizeof(INSPECT_OPTS[0]), &o };
    const struct cli_spec  spec  = { "inspect", "usage: dsv4 inspect -m DIR [options]\n"
                                                "       dsv4 inspect --config FILE [--ranks N] [options]\n",
                                     &group, 1, NULL };
    int                    prc   = cli_parse(&spec, argc, argv);
    if (prc != CLI_PARSED) return prc;
    if (o.dir && o.config) return cli_usage_error(&spec, "-m DIR and --config FILE exclude each other");
    if (o.config) return inspect_config(&o);
    if (!o.dir) return cli_usage_error(&spec, "-m DIR (or --config FILE) is required");
    const char            *dir = o.dir;
    struct dsv4_err        err;
    struct dsv4_config     cfg;
    struct dsv4_checkpoint ck;
    int rc = dsv4_config_load(&cfg, dir, &err);
    if (rc == DSV4_OK) rc = dsv4_checkpoint_open_lenient(&ck, dir, &err);
    if (rc) {
        if (o.as_json) print_error_json(dir, err.msg);
        else fprintf(stderr, "dsv4 inspect: %s\n", err.msg);
        return 1;
    }
    struct dsv4_arena       arena;
    struct dsv4_weights     w;
    struct dsv4_bind_report rep;
    dsv4_arena_init(&arena, 1 << 20);
    rc = dsv4_weights_bind(&w, &cfg, &ck, &arena, &rep, &err);
    int prc2 = 1;
    if (rc == DSV4_ENOMEM) fprintf(stderr, "dsv4 inspect: %s\n", err.msg);
    else if (cfg.arch == DSV4_ARCH_V4_1) prc2 = inspect_checkpoint_v41(&o, &cfg, &ck, &w, &rep);
    else prc2 = inspect_checkpoint(&o, &cfg, &ck, &w, &rep);
    dsv4_bind_report_free(&rep);
    dsv4_arena_free(&arena);
    bool refused = ck.n_refused > 0;
    dsv4_checkpoint_close(&ck);
    return rc == DSV4_OK && !refused && prc2 == 0 ? 0 : 1;
}
