/*
 * inspect_v41.c - `dsv4 inspect --config FILE` for a DeepSeek-V4.1 config: its layers and
 * their kinds (kv / index / candidate source, Engram), the parameters and bytes of its
 * tensors with the Engram tables apart, bytes read per decoded token, KV per sequence and
 * the memory for --ctx / --seqs (src/model/stats_v41.c derives each figure); and for
 * `dsv4 inspect -m DIR` the same model section of a V4.1 checkpoint, its Engram tables' bytes
 * apart and its Engram token map checked, saying whether it came from engram_token_map.json or
 * from tokenizer.json (cmd_inspect.c binds and lists the problems).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inspect_v41.h"
#include "io/io.h"
#include "model/engram_map.h"

static double gib(double b)
{
    return b / (1024.0 * 1024.0 * 1024.0);
}

/* One layer's line: its ratio, where its compressed rows and selection come from, its
 * candidate role and Engram. */
static void print_layer(const struct dsv4_config *c, int il)
{
    const struct dsv4_layer_kind *k = &c->kind[il];
    char kv[32] = "-", ix[48] = "-", cand[40] = "";
    if (k->kv_source == il) snprintf(kv, sizeof(kv), "compresses");
    else if (k->kv_source >= 0) snprintf(kv, sizeof(kv), "rows of %d", k->kv_source);
    if (k->indexer) snprintf(ix, sizeof(ix), "indexer (top-%d)", k->idx_topk);
    else if (k->index_source >= 0) snprintf(ix, sizeof(ix), "selection of %d", k->index_source);
    if (k->cand_source == il) snprintf(cand, sizeof(cand), "  picks candidate blocks");
    else if (k->cand_source >= 0) snprintf(cand, sizeof(cand), "  within candidates of %d", k->cand_source);
    char line[200];
    int  n = snprintf(line, sizeof(line), "  %-8s %3d  %-10s ratio %d  kv %-12s index %-18s%s%s",
                      k->mtp ? "dspark" : "layer", k->mtp ? il - c->n_layer : il, k->ratio ? "compressed" : "window",
                      k->ratio, kv, ix, cand, k->engram ? "  engram" : "");
    if (n >= (int)sizeof(line)) n = (int)sizeof(line) - 1; /* truncated: trim from its end */
    while (n > 0 && line[n - 1] == ' ') line[--n] = '\0'; /* no padding after the last column */
    printf("%s\n", line);
}

/* label: "config" (inspect --config) or "model" (inspect -m). */
static void print_model(const char *label, const char *path, const struct dsv4_config *c)
{
    const struct dsv4_v41_config *v = &c->v41;
    printf("%-12s %s: DeepSeek-V4.1, %d layers + %d DSpark stages, d_model %d, vocab %d, max context %d\n",
           label, path, c->n_layer, c->n_mtp, c->d_model, c->vocab_size, c->max_ctx);
    printf("attention    %d heads x %d (rope %d), q_lora %d (q norm on it only), output %d groups x %d, window %d\n",
           c->n_head, c->d_head, c->d_rope, c->q_lora_rank, c->o_groups, c->o_lora_rank, c->window);
    printf("indexer      %d heads x %d, top-%d", c->n_idx_head, c->d_idx_head, c->idx_topk);
    if (v->cand_source >= 0)
        printf("; candidate pre-filter from layer %d: %d blocks of %d rows", v->cand_source, v->cand_topk_blocks,
               v->cand_block);
    printf("\nmoe          %d routed (top-%d, %s) + %d shared, d_ff %d, no hash routing, route scale %g, gate temp %g\n",
           c->n_exp, c->n_exp_used, c->expert_wfmt == DSV4_WFMT_FP4 ? "fp4-e2m1/32" : dsv4_wfmt_name(c->expert_wfmt),
           c->n_exp_shared, c->d_ff_exp, c->route_scale, v->gate_temp);
    printf("projections  %s\n", c->fp8 ? "fp8-e4m3, e8m0 scale per 32x32 block, activations per 32" : "bf16");
    if (v->n_engram) {
        printf("engram       %d layers, n-grams 2..%d x %d heads, rows of %d fp8 (scale per 32), tables of",
               v->n_engram, v->engram_max_ngram, v->engram_n_head, v->engram_d_head);
        for (int l = 0; l < v->n_engram; l++) printf(" %lld", (long long)v->engram_rows[l]);
        printf(" rows\n");
    }
    if (c->n_mtp)
        printf("dspark       %d stages, block %d, from layers' inputs", c->n_mtp, v->dspark_block);
    for (int i = 0; c->n_mtp && i < v->n_dspark_target; i++) printf(" %d", v->dspark_target[i]);
    if (c->n_mtp)
        printf(", markov rank %d, %d experts top-%d\n", v->dspark_markov_rank, v->dspark_n_exp, v->dspark_n_exp_used);
    printf("layers\n");
    for (int il = 0; il < c->n_layer + c->n_mtp; il++) print_layer(c, il);
}

static void print_sizes(const struct dsv4_v41_sizes *s, long long ctx, long long seqs)
{
    double kv = ((double)s->kv_fixed_per_seq + s->kv_bytes_per_position * (double)ctx) * (double)seqs;
    printf("\nweights      %llu tensors, %.2f GiB (%.1f GB), %.2fB parameters, as the release stores them "
           "(computed from the config; vision tower not counted)\n",
           (unsigned long long)s->n_tensors, gib((double)s->bytes), (double)s->bytes / 1e9, (double)s->params / 1e9);
    printf("             Engram tables %.2f GiB (%.2fB parameters), DSpark stages %.2f GiB, the rest %.2f GiB\n",
           gib((double)s->engram_bytes), (double)s->engram_params / 1e9, gib((double)s->dspark_bytes),
           gib((double)(s->bytes - s->engram_bytes - s->dspark_bytes)));
    printf("per token    %.2f MiB of weights read per decoded token (routed experts %.2f MiB) + %.1f KiB of Engram "
           "rows, %.2fB active parameters\n",
           (double)s->bytes_per_token / 1048576.0, (double)s->expert_bytes_per_token / 1048576.0,
           (double)s->engram_bytes_per_token / 1024.0, (double)s->active_params / 1e9);
    printf("kv state     %.1f KiB fixed per sequence (window rings, compressor partial groups), %.1f bytes per "
           "position\n",
           (double)s->kv_fixed_per_seq / 1024.0, s->kv_bytes_per_position);
    printf("memory       --ctx %lld --seqs %lld: weights %.2f GiB (mapped; the Engram tables %.2f GiB of it, read "
           "by row) + KV %.1f MiB\n",
           ctx, seqs, gib((double)s->bytes), gib((double)s->engram_bytes), kv / 1048576.0);
}

static json_t *layers_json(const struct dsv4_config *c)
{
    json_t *a = json_array();
    for (int il = 0; il < c->n_layer + c->n_mtp; il++) {
        const struct dsv4_layer_kind *k = &c->kind[il];
        json_array_append_new(a, json_pack("{s:i, s:b, s:i, s:i, s:i, s:b, s:i, s:b}", "layer", il, "dspark", k->mtp,
                                           "ratio", k->ratio, "kv_source", k->kv_source, "index_source",
                                           k->index_source, "indexer", k->indexer, "cand_source", k->cand_source,
                                           "engram", k->engram));
    }
    return a;
}

/* The figures stats_v41.c derives from the config, with the memory for ctx and seqs. */
static json_t *sizes_json(const struct dsv4_v41_sizes *s, long long ctx, long long seqs)
{
    double  kv = ((double)s->kv_fixed_per_seq + s->kv_bytes_per_position * (double)ctx) * (double)seqs;
    json_t *o  = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "tensors", (json_int_t)s->n_tensors, "bytes",
                           (json_int_t)s->bytes, "params", (json_int_t)s->params, "engram_bytes",
                           (json_int_t)s->engram_bytes, "engram_params", (json_int_t)s->engram_params,
                           "dspark_bytes", (json_int_t)s->dspark_bytes);
    json_object_set_new(o, "bytes_per_token", json_integer((json_int_t)s->bytes_per_token));
    json_object_set_new(o, "expert_bytes_per_token", json_integer((json_int_t)s->expert_bytes_per_token));
    json_object_set_new(o, "engram_bytes_per_token", json_integer((json_int_t)s->engram_bytes_per_token));
    json_object_set_new(o, "active_params", json_integer((json_int_t)s->active_params));
    json_object_set_new(o, "kv_fixed_bytes_per_seq", json_integer((json_int_t)s->kv_fixed_per_seq));
    json_object_set_new(o, "kv_bytes_per_position", json_real(s->kv_bytes_per_position));
    json_object_set_new(o, "memory_estimate", json_pack("{s:I, s:I, s:I, s:f}", "ctx", (json_int_t)ctx, "seqs",
                                                        (json_int_t)seqs, "weights_bytes", (json_int_t)s->bytes,
                                                        "kv_bytes", kv));
    return o;
}

static void print_json(const char *path, const struct dsv4_config *c, const struct dsv4_v41_sizes *s, long long ctx,
                       long long seqs)
{
    json_t *o = json_pack("{s:s, s:b, s:s}", "config", path, "ok", 1, "arch", "deepseek_v41");
    json_t *sz = sizes_json(s, ctx, seqs);
    json_object_update(o, sz);
    json_decref(sz);
    json_object_set_new(o, "layers", layers_json(c));
    char *txt = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (txt) puts(txt);
    free(txt);
    json_decref(o);
}

void inspect_v41_config(const char *path, const struct dsv4_config *c, long long ctx, long long seqs, bool as_json)
{
    struct dsv4_v41_sizes s;
    dsv4_v41_sizes(c, &s);
    if (as_json) {
        print_json(path, c, &s, ctx, seqs);
        return;
    }
    print_model("config", path, c);
    print_sizes(&s, ctx, seqs);
}

/* ------------------------------------------------------------------ inspect -m */

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

uint64_t inspect_v41_bytes(const struct dsv4_checkpoint *ck, uint64_t *engram)
{
    uint64_t total = 0;
    *engram        = 0;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const struct dsv4_tensor *t = &ck->tensors[i];
        total += t->nbytes;
        if (ends_with(t->name, ".engram.embed.weight") || ends_with(t->name, ".engram.embed.scale"))
            *engram += t->nbytes;
    }
    return total;
}

/* The checkpoint's Engram token map (docs/ENGRAM.md, "The token map"): its
 * engram_token_map.json, else computed from its tokenizer.json, checked against the config.
 * 1 when valid, -1 (err says why) when not or when neither file is there. *n: its token ids;
 * *src: where it came from. */
static int token_map(const char *dir, const struct dsv4_config *c, int64_t *n,
                     enum dsv4_engram_map_source *src, struct dsv4_err *err)
{
    int32_t *map = NULL;
    int      rc  = dsv4_engram_map_open(dir, 0, c->v41.engram_cvocab, &map, n, src, err);
    if (rc == DSV4_OK && *n > c->vocab_size)
        rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: %lld entries, more than vocab_size %d",
                          dsv4_engram_map_source_name(*src), (long long)*n, c->vocab_size);
    free(map);
    return rc == DSV4_OK ? 1 : -1;
}

bool inspect_v41_checkpoint_text(const char *dir, const struct dsv4_config *c, const struct dsv4_checkpoint *ck,
                                 bool has_dspark, int n_vision, long long ctx, long long seqs)
{
    uint64_t engram, total = inspect_v41_bytes(ck, &engram);
    printf("checkpoint   %s: %d shard%s, %zu tensors, %.1f MiB, of which Engram tables %.1f MiB (mapped, read by "
           "row)\n", dir, ck->n_files, ck->n_files == 1 ? "" : "s", ck->n_tensors, (double)total / 1048576.0,
           (double)engram / 1048576.0);
    print_model("model", dir, c);
    if (c->n_mtp) printf("dspark       %s\n", has_dspark ? "available" : "unavailable (no complete mtp.* stages)");
    if (c->v41.vision)
        printf("vision       %d tensors of the vision tower, not checked (image input is out of scope)\n", n_vision);
    struct dsv4_err             err;
    int64_t                     n;
    enum dsv4_engram_map_source src;
    int                         m = c->v41.n_engram ? token_map(dir, c, &n, &src, &err) : 1;
    if (m > 0 && c->v41.n_engram)
        printf("token map    from %s: %lld token ids -> %d compressed ids\n", dsv4_engram_map_source_name(src),
               (long long)n, c->v41.engram_cvocab);
    else if (m < 0) printf("token map    %s\n", err.msg);
    struct dsv4_v41_sizes s;
    dsv4_v41_sizes(c, &s);
    print_sizes(&s, ctx, seqs);
    return m >= 0;
}

bool inspect_v41_checkpoint_json(json_t *o, const char *dir, const struct dsv4_config *c, bool has_dspark,
                                 long long ctx, long long seqs)
{
    struct dsv4_v41_sizes s;
    dsv4_v41_sizes(c, &s);
    json_object_set_new(o, "arch", json_string("deepseek_v41"));
    json_object_set_new(o, "layers", layers_json(c));
    json_object_set_new(o, "dspark_available", json_boolean(has_dspark));
    json_object_set_new(o, "config_sizes", sizes_json(&s, ctx, seqs));
    struct dsv4_err             err;
    int64_t                     n;
    enum dsv4_engram_map_source src;
    int                         m = c->v41.n_engram ? token_map(dir, c, &n, &src, &err) : 1;
    if (c->v41.n_engram)
        json_object_set_new(o, "token_map", m < 0 ? json_pack("{s:b, s:s}", "ok", 0, "error", err.msg)
                                                  : json_pack("{s:b, s:s, s:I}", "ok", 1, "source",
                                                              dsv4_engram_map_source_name(src), "n_ids",
                                                              (json_int_t)n));
    return m >= 0;
}
