/*
 * config_v41.c - the fields of a DeepSeek-V4.1 config.json (its text_config) that V4 does not
 * have, and the rules between them, each checked against what the official inference code
 * does with them (inference/model.py and inference/engram.py of the release; the function
 * names below are theirs; docs/MODEL.md "DeepSeek-V4.1"). Each failure names the field.
 */
#include <stdio.h>
#include <string.h>

#include "model/config_parse.h"

/* An optional array of layer ids (absent: none): ascending, each in [0, hi), at most cap. */
static int id_list(struct cfg_parse *p, const char *field, int hi, int cap, int *out)
{
    json_t *a = json_object_get(p->root, field);
    if (!a || json_is_null(a)) return 0;
    if (!json_is_array(a)) return dsv4_cfg_bad(p, field, "must be an array of layer ids");
    if ((int)json_array_size(a) > cap) {
        char why[64];
        snprintf(why, sizeof(why), "has %zu entries, at most %d are supported", json_array_size(a), cap);
        return dsv4_cfg_bad(p, field, why);
    }
    int n = (int)json_array_size(a);
    for (int i = 0; i < n; i++) {
        json_t *v  = json_array_get(a, (size_t)i);
        int     id = json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) < hi
                         ? (int)json_integer_value(v) : -1;
        char why[96];
        snprintf(why, sizeof(why), "entry %d must be a layer id in [0, %d) (a main layer)", i, hi);
        if (id < 0) return dsv4_cfg_bad(p, field, why);
        if (i && id <= out[i - 1]) return dsv4_cfg_bad(p, field, "must be strictly increasing");
        out[i] = id;
    }
    return n;
}

static bool in_list(const int *ids, int n, int id)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

static int latest(const int *ids, int n, int il)
{
    int last = -1;
    for (int i = 0; i < n && ids[i] <= il; i++) last = ids[i];
    return last;
}

static void layer_bad(struct cfg_parse *p, const char *field, int il, const char *why)
{
    char msg[256];
    snprintf(msg, sizeof(msg), "layer %d: %s", il, why);
    dsv4_cfg_bad(p, field, msg);
}

/*
 * kv_source_layer_ids / index_source_layer_ids (`Attention.is_kv_source`, `is_index_source`):
 * a source compresses, so its ratio is not 0; a kv source runs an indexer too, since its
 * `Indexer` (`owns_k`) is what publishes the index keys the other indexers score; and every
 * compressed main layer finds a kv source of its own ratio at or before it, whose rows
 * (`shared_attn.compress_kv`) it reads - positions are counted in its own ratio.
 */
static void check_sources(struct cfg_parse *p, const struct dsv4_config *c)
{
    const struct dsv4_v41_config *v = &c->v41;
    for (int i = 0; i < v->n_kv_src; i++) {
        if (!c->ratio[v->kv_src[i]])
            layer_bad(p, "kv_source_layer_ids", v->kv_src[i], "its compress ratio is 0: a kv source compresses");
        else if (!in_list(v->idx_src, v->n_idx_src, v->kv_src[i]))
            layer_bad(p, "kv_source_layer_ids", v->kv_src[i],
                      "is not in index_source_layer_ids: a kv source's indexer publishes the index keys");
    }
    for (int i = 0; i < v->n_idx_src; i++)
        if (!c->ratio[v->idx_src[i]])
            layer_bad(p, "index_source_layer_ids", v->idx_src[i], "its compress ratio is 0: an indexer scores compressed rows");
    for (int il = 0; il < c->n_layer; il++) {
        int ks = latest(v->kv_src, v->n_kv_src, il);
        if (c->ratio[il] && (ks < 0 || c->ratio[ks] != c->ratio[il]))
            layer_bad(p, "kv_source_layer_ids", il,
                      "compresses but no kv source of its ratio is at or before it (it would read other rows)");
    }
}

/*
 * candidate_source_layer_id (-1 or absent: none; `Indexer.is_candidate_source`,
 * `uses_candidates`, `select_candidate_blocks`): an index source, which keeps the
 * candidate_topk_blocks best blocks of candidate_block_size rows; every later index source
 * masks its scores with them, so it must score the same compressed rows (the same kv source).
 */
static void parse_candidates(struct cfg_parse *p, struct dsv4_config *c)
{
    struct dsv4_v41_config *v = &c->v41;
    v->cand_source            = dsv4_cfg_int(p, p->root, "candidate_source_layer_id", false, -1, -1, c->n_layer - 1);
    if (p->rc || v->cand_source < 0) {
        v->cand_source = -1;
        return;
    }
    v->cand_topk_blocks = dsv4_cfg_int(p, p->root, "candidate_topk_blocks", true, 0, 1, 1 << 24);
    v->cand_block       = dsv4_cfg_int(p, p->root, "candidate_block_size", true, 0, 1, 1 << 16);
    if (p->rc) return;
    if (!in_list(v->idx_src, v->n_idx_src, v->cand_source)) {
        layer_bad(p, "candidate_source_layer_id", v->cand_source,
                  "is not in index_source_layer_ids: its indexer picks the candidate blocks");
        return;
    }
    int ks = latest(v->kv_src, v->n_kv_src, v->cand_source);
    for (int i = 0; i < v->n_idx_src; i++)
        if (v->idx_src[i] > v->cand_source && latest(v->kv_src, v->n_kv_src, v->idx_src[i]) != ks)
            layer_bad(p, "candidate_source_layer_id", v->idx_src[i],
                      "a later index source scores other compressed rows than the candidate source");
}

/* Whether x is prime (trial division; x stays below 2^27). */
static bool is_prime(int64_t x)
{
    if (x < 2) return false;
    if (x % 2 == 0) return x == 2;
    for (int64_t f = 3; f * f <= x; f += 2)
        if (x % f == 0) return false;
    return true;
}

/*
 * The rows of each Engram table as `EngramLayout.from_args` lays them out: every (n-gram
 * size, head) of every Engram layer, in order, owns a bucket range whose size is the next
 * prime above engram_vocab_size - 1 not yet handed out (`find_next_prime`), so a layer's
 * table must hold the sum of its (max_ngram - 1) * n_heads primes. The release's
 * engram_num_embeddings are exactly these sums. A larger table is accepted (its extra rows are
 * never hashed to, as in the official code); a smaller one is refused: hashed ids would fall
 * outside it, where the official lookup silently reads zeros. engram_hash.c checks the same.
 */
static void check_engram_rows(struct cfg_parse *p, const struct dsv4_v41_config *v)
{
    int     per  = (v->engram_max_ngram - 1) * v->engram_n_head;
    int64_t cand = v->engram_vocab;
    for (int l = 0; l < v->n_engram; l++) {
        int64_t sum = 0;
        for (int k = 0; k < per; k++, cand++) {
            while (!is_prime(cand)) cand++;
            sum += cand;
        }
        if (sum > v->engram_rows[l]) {
            char why[200];
            snprintf(why, sizeof(why), "entry %d is %lld, below the bucket primes of layer %d, which sum to %lld "
                     "(from engram_vocab_size, engram_max_ngram_size and engram_n_heads)", l,
                     (long long)v->engram_rows[l], v->engram_layer[l], (long long)sum);
            dsv4_cfg_bad(p, "engram_num_embeddings", why);
            return;
        }
    }
}

/* engram_num_embeddings: one row count per Engram layer. */
static void engram_rows(struct cfg_parse *p, struct dsv4_v41_config *v)
{
    json_t *a = json_object_get(p->root, "engram_num_embeddings");
    if (!json_is_array(a) || (int)json_array_size(a) != v->n_engram) {
        dsv4_cfg_bad(p, "engram_num_embeddings", "must be an array with one row count per engram_layer_ids entry");
        return;
    }
    for (int l = 0; l < v->n_engram; l++) {
        json_t *r = json_array_get(a, (size_t)l);
        if (!json_is_integer(r) || json_integer_value(r) < 1) {
            dsv4_cfg_bad(p, "engram_num_embeddings", "entries must be positive integers");
            return;
        }
        v->engram_rows[l] = json_integer_value(r);
    }
}

/* The Engram fields (`ModelArgs`, `Engram`, `ParallelEngramEmbedding`), required when
 * engram_layer_ids lists a layer: rows of engram_head_dim FP8 values with a scale per 32. */
static void parse_engram(struct cfg_parse *p, struct dsv4_config *c)
{
    struct dsv4_v41_config *v = &c->v41;
    json_t                 *r = p->root;
    v->n_engram = id_list(p, "engram_layer_ids", c->n_layer, DSV4_MAX_ENGRAM_LAYERS, v->engram_layer);
    if (p->rc || v->n_engram == 0) return;
    v->engram_max_ngram = dsv4_cfg_int(p, r, "engram_max_ngram_size", true, 0, 2, 8);
    v->engram_vocab     = dsv4_cfg_int(p, r, "engram_vocab_size", true, 0, 2, 1 << 26);
    v->engram_n_head    = dsv4_cfg_int(p, r, "engram_n_heads", true, 0, 1, 32);
    v->engram_d_head    = dsv4_cfg_int(p, r, "engram_head_dim", true, 0, 32, 1 << 14);
    v->engram_pad_id    = dsv4_cfg_int(p, r, "engram_pad_token_id", true, 0, 0, c->vocab_size - 1);
    v->engram_cvocab    = dsv4_cfg_int(p, r, "engram_compressed_vocab_size", true, 0, 1, c->vocab_size);
    if (p->rc) return;
    dsv4_cfg_require(p, v->engram_d_head % 32 == 0, "engram_head_dim", "must be a multiple of 32 (a scale per 32 values)");
    engram_rows(p, v);
    if (p->rc == DSV4_OK) check_engram_rows(p, v);
}

/* The DSpark stages (`DSparkBlock`, `forward_spec`): required when num_nextn_predict_layers
 * is not 0, since the official `Transformer` builds the stages only with a block size. */
static void parse_dspark(struct cfg_parse *p, struct dsv4_config *c)
{
    struct dsv4_v41_config *v = &c->v41;
    json_t                 *r = p->root;
    bool                    need = c->n_mtp > 0;
    v->dspark_block       = dsv4_cfg_int(p, r, "dspark_block_size", need, 0, need ? 1 : 0, 64);
    v->dspark_noise_id    = dsv4_cfg_int(p, r, "dspark_noise_token_id", need, 0, 0, c->vocab_size - 1);
    v->dspark_markov_rank = dsv4_cfg_int(p, r, "dspark_markov_rank", need, 0, need ? 1 : 0, 1 << 16);
    v->dspark_n_exp       = dsv4_cfg_int(p, r, "dspark_n_routed_experts", false, 0, 0, DSV4_MAX_EXPERTS);
    v->dspark_n_exp_used  = dsv4_cfg_int(p, r, "dspark_num_experts_per_tok", false, 0, 0, 64);
    if (!v->dspark_n_exp) v->dspark_n_exp = c->n_exp; /* `ModelArgs.get_moe_config` */
    if (!v->dspark_n_exp_used) v->dspark_n_exp_used = c->n_exp_used;
    v->n_dspark_target = id_list(p, "dspark_target_layer_ids", c->n_layer, DSV4_MAX_DSPARK_TARGETS, v->dspark_target);
    if (p->rc || !need) return;
    dsv4_cfg_require(p, v->n_dspark_target > 0, "dspark_target_layer_ids",
                     "must list a main layer: the first DSpark stage projects their inputs");
    dsv4_cfg_require(p, v->dspark_n_exp_used <= v->dspark_n_exp, "dspark_num_experts_per_tok",
                     "must not exceed dspark_n_routed_experts");
    /* the step's expert buffers are planned for the main model's counts */
    dsv4_cfg_require(p, v->dspark_n_exp <= c->n_exp, "dspark_n_routed_experts", "must not exceed n_routed_experts");
    dsv4_cfg_require(p, v->dspark_n_exp_used <= c->n_exp_used, "dspark_num_experts_per_tok",
                     "must not exceed num_experts_per_tok");
}

void dsv4_cfg_v41_parse(struct cfg_parse *p, struct dsv4_config *c)
{
    struct dsv4_v41_config *v = &c->v41;
    v->n_kv_src  = id_list(p, "kv_source_layer_ids", c->n_layer, DSV4_MAX_LAYERS, v->kv_src);
    v->n_idx_src = id_list(p, "index_source_layer_ids", c->n_layer, DSV4_MAX_LAYERS, v->idx_src);
    if (p->rc == DSV4_OK) check_sources(p, c);
    if (p->rc == DSV4_OK) parse_candidates(p, c);
    if (p->rc == DSV4_OK) parse_engram(p, c);
    if (p->rc == DSV4_OK) parse_dspark(p, c);
    v->gate_temp = dsv4_cfg_double(p, p->root, "gate_temp", false, 1.0, 1e-6, 1e6);
    /* `ModelArgs.vision_enabled`: the checkpoint then holds the vision tower and the routers'
     * image bias, bound but unused (image input is out of scope) */
    json_t *vc = json_object_get(p->top, "vision_config");
    v->vision  = json_is_object(vc) && dsv4_cfg_int(p, vc, "num_hidden_layers", false, 0, 0, 1 << 16) > 0;
}

/* V4.1's own widths: the window KV is FP8 in groups of 32 over the whole row, RoPE part
 * included (`Attention._window_kv`), the compressed KV FP4 in groups of 16 and the index
 * keys and queries FP4 in groups of 32 (`Indexer.forward`); no Hadamard, so the indexer head
 * need not be a power of two. */
void dsv4_cfg_v41_check_shapes(struct cfg_parse *p, const struct dsv4_config *c)
{
    dsv4_cfg_require(p, c->n_hash_layer == 0, "num_hash_layers", "must be 0: DeepSeek-V4.1 has no hash-routed layers");
    dsv4_cfg_require(p, c->d_head % 32 == 0, "head_dim", "must be a multiple of 32 (window KV in FP8 groups of 32)");
    dsv4_cfg_require(p, c->d_idx_head % 32 == 0 && c->d_idx_head > c->d_rope, "index_head_dim",
                     "must be a multiple of 32 (FP4 groups) and larger than qk_rope_head_dim");
}

int dsv4_config_check_convertible(const struct dsv4_config *c, struct dsv4_err *err)
{
    if (c->arch == DSV4_ARCH_V4_1)
        return dsv4_err_set(err, DSV4_EUNSUPPORTED,
                            "DeepSeek-V4.1 checkpoints: `dsv4 convert` is not implemented yet (issue 41); the "
                            "engine runs them as released (`dsv4 inspect -m DIR` checks the checkpoint)");
    return DSV4_OK;
}
