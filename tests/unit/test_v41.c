/*
 * test_v41.c - DeepSeek-V4.1 configs (issue 41, step 2): the official V4.1-Flash config
 * (models/configs/v41-flash.json) parses, each layer's kind follows the config's source
 * lists (and the KV layout its sources), malformed fields are named, `dsv4 inspect --config` gives figures an independent
 * computation here agrees with, and running a V4.1 checkpoint is refused with a clear error.
 * The tiny-v41 checkpoint (gen, binding, inspect -m, corruptions): test_v41_ckpt.c.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kv/kv.h"
#include "model/model.h"
#include "test_cases.h"
#include "test_v41.h"

#define FLASH "models/configs/v41-flash.json"

static void test_flash_parses(struct test_ctx *t)
{
    struct dsv4_config c;
    struct dsv4_err    err;
    CHECKF(dsv4_config_load_file(&c, FLASH, &err) == DSV4_OK, "%s", err.msg);
    const struct dsv4_v41_config *v = &c.v41;
    CHECK(c.arch == DSV4_ARCH_V4_1 && c.fp8 && c.fp8_block == 32 && c.expert_wfmt == DSV4_WFMT_FP4);
    CHECK(c.n_layer == 40 && c.n_mtp == 3 && c.n_hash_layer == 0 && c.d_model == 5120 && c.vocab_size == 129280);
    CHECK(c.norm_eps == 1e-20 && c.n_exp == 384 && c.n_exp_used == 6 && c.d_idx_head == 128 && c.n_idx_head == 32);
    CHECK(c.bos_id == 0 && c.eos_id == 1 && c.yarn && c.original_seq_len == 65536 && c.rope_factor == 16);
    CHECK(v->n_kv_src == 4 && v->kv_src[3] == 20 && v->n_idx_src == 8 && v->idx_src[7] == 36);
    CHECK(v->cand_source == 20 && v->cand_topk_blocks == 2048 && v->cand_block == 8 && v->gate_temp == 1.0);
    CHECK(v->n_engram == 2 && v->engram_layer[0] == 1 && v->engram_layer[1] == 14);
    CHECK(v->engram_rows[0] == 384006168 && v->engram_rows[1] == 384016682 && v->engram_d_head == 256);
    CHECK(v->engram_max_ngram == 4 && v->engram_n_head == 8 && v->engram_pad_id == 2 && v->engram_cvocab == 99092);
    CHECK(v->dspark_block == 5 && v->dspark_noise_id == 128799 && v->n_dspark_target == 3 && v->dspark_target[0] == 37);
    CHECK(v->dspark_markov_rank == 256 && v->dspark_n_exp == 128 && v->dspark_n_exp_used == 3);
    CHECK(!memcmp(c.kv.kind, c.kind, sizeof(c.kind)));
}

/* V4.1-Flash's layers, written out from its config: 0-1 window only; 2-19 ratio 2 reading
 * the rows of kv sources 2, 8, 14; 20-39 ratio 1 reading layer 20's; index sources 2, 8, 14,
 * 20 and every 4th after; the candidate source 20, whose blocks the later index sources keep;
 * Engram on 1 and 14; three window-only DSpark stages. */
static void test_flash_kinds(struct test_ctx *t)
{
    struct dsv4_config c;
    struct dsv4_err    err;
    CHECKF(dsv4_config_load_file(&c, FLASH, &err) == DSV4_OK, "%s", err.msg);
    for (int il = 0; il < 43; il++) {
        const struct dsv4_layer_kind *k = &c.kind[il];
        bool main = il < 40, comp = il >= 2 && main;
        int  ratio = !comp ? 0 : il < 20 ? 2 : 1;
        int  kvs   = !comp ? -1 : il < 8 ? 2 : il < 14 ? 8 : il < 20 ? 14 : 20;
        int  ixs   = !comp ? -1 : il < 20 ? kvs : il / 4 * 4;
        int  cand  = ixs == il && il >= 20 ? 20 : -1;
        CHECKF(k->ratio == ratio && k->kv_source == kvs && k->index_source == ixs,
               "layer %d: ratio %d kv %d index %d, want %d %d %d", il, k->ratio, k->kv_source, k->index_source, ratio,
               kvs, ixs);
        CHECKF(k->indexer == (ixs == il) && k->idx_topk == (comp ? 512 : 0) && k->cand_source == cand,
               "layer %d: indexer %d topk %d cand %d", il, k->indexer, k->idx_topk, k->cand_source);
        CHECKF(k->engram == (il == 1 || il == 14) && !k->overlap && !k->hash_routed && k->mtp == !main &&
                   k->window == 128,
               "layer %d: engram %d overlap %d hash %d mtp %d", il, k->engram, k->overlap, k->hash_routed, k->mtp);
    }    /* the index keys: an index source scores its kv source's (from that layer's latent); only
     * kv sources store keys, none pools them with an indexer compressor of its own */
    for (int il = 0; il < 43; il++) {
        const struct dsv4_layer_kind *k = &c.kind[il];
        CHECKF(k->keys_source == (k->indexer ? k->kv_source : -1) && k->owns_keys == (k->kv_source == il) &&
                   !k->idx_compress,
               "layer %d: keys of %d, owns %d, own compressor %d", il, k->keys_source, k->owns_keys, k->idx_compress);
    }
    /* the KV pages: per kv source its compressed rows and keys, one per `ratio` positions;
     * the other compressed layers read those and keep none */
    size_t rb = (size_t)dsv4_row_bytes(DSV4_ROW_BF16, c.d_head, c.d_rope), ib = (size_t)dsv4_idx_key_bytes(c.d_idx_head);
    size_t want = 0;
    for (int i = 0; i < c.v41.n_kv_src; i++) {
        size_t n = (size_t)(256 / c.ratio[c.v41.kv_src[i]]);
        want += (n * rb + 63) / 64 * 64 + (n * ib + 63) / 64 * 64;
    }
    CHECKF(dsv4_kv_page_bytes(&c.kv, DSV4_ROW_BF16, 256) == want, "page bytes %zu, want %zu",
           dsv4_kv_page_bytes(&c.kv, DSV4_ROW_BF16, 256), want);
}

/* Parses the Flash config with text_config.field set to value (NULL: removed; top: the field
 * of the file itself); the parser's code, err its message. */
static int parse_modified(struct test_ctx *t, bool top, const char *field, json_t *value, struct dsv4_err *err)
{
    json_error_t je;
    json_t      *root = json_load_file(FLASH, 0, &je);
    CHECK(root != NULL);
    if (!root) {
        json_decref(value);
        return -1;
    }
    json_t *obj = top ? root : json_object_get(root, "text_config");
    if (value) json_object_set_new(obj, field, value);
    else json_object_del(obj, field);
    char              *s = json_dumps(root, 0);
    struct dsv4_config c;
    int                rc = dsv4_config_parse(&c, s, strlen(s), "config.json", err);
    free(s);
    json_decref(root);
    return rc;
}

/* Expects a format error naming field and saying want. */
static void expect_error(struct test_ctx *t, bool top, const char *field, json_t *value, const char *want)
{
    struct dsv4_err err;
    int             rc = parse_modified(t, top, field, value, &err);
    CHECKF(rc == DSV4_EFORMAT, "%s: accepted", field);
    CHECKF(rc != DSV4_EFORMAT || (strstr(err.msg, field) && strstr(err.msg, want)), "%s: message '%s'", field,
           err.msg);
}

static void test_config_errors(struct test_ctx *t)
{
    json_t *cr = json_array();
    for (int i = 0; i < 43; i++) json_array_append_new(cr, json_integer(i == 5 ? 4 : i >= 2 && i < 20 ? 2 : 0));
    expect_error(t, false, "compress_ratios", cr, "0, 1 or 2");
    expect_error(t, false, "compress_ratios", json_pack("[i,i,i]", 0, 0, 2), "must have 43");
    expect_error(t, false, "kv_source_layer_ids", json_pack("[i,i,i]", 2, 8, 14), "layer 20");
    expect_error(t, false, "kv_source_layer_ids", json_pack("[i,i,i,i]", 2, 2, 14, 20), "strictly increasing");
    expect_error(t, false, "kv_source_layer_ids", json_pack("[i,i,i,i]", 2, 8, 14, 40), "[0, 40)");
    expect_error(t, false, "kv_source_layer_ids", json_pack("[i,i,i,i]", 3, 8, 14, 20), "index_source_layer_ids");
    expect_error(t, false, "index_source_layer_ids", json_pack("[i,i,i,i,i]", 0, 2, 8, 14, 20), "ratio is 0");
    expect_error(t, false, "candidate_source_layer_id", json_integer(21), "index_source_layer_ids");
    expect_error(t, false, "candidate_topk_blocks", NULL, "missing");
    expect_error(t, false, "engram_num_embeddings", json_pack("[i,i]", 384006168, 384016681), "sum to 384016682");
    expect_error(t, false, "engram_num_embeddings", json_pack("[i]", 384006168), "one row count per");
    /* a table larger than its bucket primes need is accepted (the extra rows are never hashed to) */
    struct dsv4_err err;
    int rc = parse_modified(t, false, "engram_num_embeddings", json_pack("[i,i]", 384006168, 384016683), &err);
    CHECKF(rc == DSV4_OK, "a larger Engram table refused: %s", err.msg);
    expect_error(t, false, "engram_head_dim", json_integer(100), "multiple of 32");
    expect_error(t, false, "engram_max_ngram_size", json_integer(1), "[2, 8]");
    expect_error(t, false, "num_hash_layers", json_integer(3), "no hash-routed");
    expect_error(t, false, "dspark_block_size", NULL, "missing");
    expect_error(t, false, "num_hidden_layers", json_integer(254), "is 257, at most 256");
    expect_error(t, false, "dspark_target_layer_ids", json_array(), "must list");
    expect_error(t, false, "head_dim", json_integer(520), "multiple of 32");
    expect_error(t, false, "hidden_size", json_integer(5000), "multiple of 32");
    expect_error(t, true, "text_config", NULL, "missing");
    expect_error(t, true, "model_type", json_string("deepseek_v5"), "deepseek_v41");
    json_t *q = json_pack("{s:s, s:[i,i]}", "quant_method", "fp8", "weight_block_size", 128, 128);
    expect_error(t, true, "quantization_config", q, "[32, 32]");
}

static uint64_t fp8(uint64_t in, uint64_t out)
{
    return in * out + (out + 31) / 32 * ((in + 31) / 32);
}

/* Bytes read per decoded token, summed here by role from the config's numbers (not by tensor
 * as stats_v41.c does): every main-model weight once, one embedding row, 6 of the 384 experts
 * of each layer, the Engram rows apart. */
static double flash_bytes_per_token(void)
{
    const uint64_t dm = 5120, dh = 512, di = 128, ff = 2304, V = 129280, H = 64;
    uint64_t expert = 3 * (dm * ff / 2 + dm * ff / 32);
    uint64_t attn   = 64 * 4 + fp8(dm, 1280) + 1280 * 2 + fp8(1280, H * dh) + fp8(dm, dh) + dh * 2 +
                    fp8(H * dh / 8, 8 * 1024) + fp8(8 * 1024, dm);
    uint64_t moe    = 384 * dm * 2 + 384 * 4 + 6 * expert + 2 * fp8(dm, ff) + fp8(ff, dm);
    uint64_t hcon   = 2 * (dm * 2 + 24 * 4 * dm * 4 + 24 * 4 + 3 * 4);
    uint64_t total  = 40 * (attn + moe + hcon);
    total += 3 * (2 * dm * dh * 2 + dh * 2) + (dm * dh * 2 + dh * 2);   /* compressors: 3 of ratio 2, 1 of ratio 1 */
    total += 8 * (fp8(1280, 32 * di) + dm * 32 * 2) + 4 * (dh * di * 2 + di * 2); /* indexers; wk on kv sources */
    total += 2 * (fp8(24 * 256, dm * 5) + 2 * 4 * dm * 2);               /* Engram wkv, q/k weights */
    return (double)(total + dm * 2 + dm * 2 + V * dm * 2);                /* embed row, norm, head */
}

static void test_inspect_flash(struct test_ctx *t)
{
    const char *bin = getenv("DSV4_BIN");
    CHECKF(bin != NULL, "DSV4_BIN not set (run through make test)");
    if (!bin) return;
    char  cmd[1024], *out = NULL;
    snprintf(cmd, sizeof(cmd), "%s inspect --config %s --json --ctx 65536", bin, FLASH);
    int          rc = test_run(cmd, &out);
    json_error_t je;
    json_t      *o = rc == 0 ? json_loads(out, 0, &je) : NULL;
    CHECKF(o != NULL, "inspect --json exit %d:\n%s", rc, out);
    free(out);
    if (!o) return;
    /* each table: rows x (256 e4m3 + 8 e8m0) bytes; a token reads 2 layers x 24 rows */
    double tables = (384006168.0 + 384016682.0) * 264;
    CHECKF(json_integer_value(json_object_get(o, "engram_bytes")) == 202758032400LL && tables == 202758032400.0,
           "engram bytes %lld", (long long)json_integer_value(json_object_get(o, "engram_bytes")));
    CHECK(json_integer_value(json_object_get(o, "engram_bytes_per_token")) == 2 * 24 * 264);
    /* kv sources 2, 8, 14 (ratio 2) and 20 (ratio 1): a row of (256 + 32) + (64 + 4) bytes */
    double kvpos = 3 * (288.0 + 68.0) / 2 + (288.0 + 68.0);
    CHECKF(fabs(json_real_value(json_object_get(o, "kv_bytes_per_position")) - kvpos) < 1e-9, "kv per position %g",
           json_real_value(json_object_get(o, "kv_bytes_per_position")));
    /* 40 window rings of 128 x (512 + 16) bytes, and 3 partial groups of 2 x 2 x 512 f32 */
    CHECK(json_integer_value(json_object_get(o, "kv_fixed_bytes_per_seq")) == 40 * 128 * 528 + 3 * 2 * 2 * 512 * 4);
    double bpt = (double)json_integer_value(json_object_get(o, "bytes_per_token"));
    CHECKF(bpt == flash_bytes_per_token(), "bytes per token %.0f, computed here %.0f", bpt, flash_bytes_per_token());
    json_t *layers = json_object_get(o, "layers");
    CHECK(json_array_size(layers) == 43);
    json_t *l24 = json_array_get(layers, 24);
    CHECK(json_integer_value(json_object_get(l24, "kv_source")) == 20 &&
          json_integer_value(json_object_get(l24, "cand_source")) == 20 && json_is_true(json_object_get(l24, "indexer")));
    json_decref(o);
    snprintf(cmd, sizeof(cmd), "%s inspect --config %s", bin, FLASH);
    rc = test_run(cmd, &out);
    CHECKF(rc == 0 && strstr(out, "DeepSeek-V4.1, 40 layers + 3 DSpark stages") && strstr(out, "picks candidate blocks") &&
               strstr(out, "engram") && strstr(out, "Engram tables 188.83 GiB"),
           "inspect --config exit %d:\n%s", rc, out);
    free(out);
    snprintf(cmd, sizeof(cmd), "%s inspect --config %s --ranks 2", bin, FLASH);
    rc = test_run(cmd, &out);
    CHECKF(rc != 0 && strstr(out, "DeepSeek-V4.1"), "--ranks exit %d:\n%s", rc, out);
    free(out);
}

/* A directory with the V4.1 config and a tokenizer (no weights needed: `dsv4 convert` refuses
 * before any shard is opened). The forward runs: test_v41_fwd.c. */
static void test_convert_refused(struct test_ctx *t)
{
    const char *bin = getenv("DSV4_BIN");
    CHECKF(bin != NULL, "DSV4_BIN not set (run through make test)");
    if (!bin) return;
    char dir[512], cmd[2048], *out = NULL;
    snprintf(dir, sizeof(dir), "%s/v41-refused", t->tmpdir);
    mkdir(dir, 0755);
    snprintf(cmd, sizeof(cmd), "cp %s %s/config.json && cp models/kjv-v4-tiny/tokenizer.json %s/", FLASH, dir, dir);
    CHECK(test_run(cmd, NULL) == 0);
    snprintf(cmd, sizeof(cmd), "%s convert -m %s -o %s/out", bin, dir, dir);
    int rc = test_run(cmd, &out);
    CHECKF(rc != 0 && rc < 128 && strstr(out, "DeepSeek-V4.1 checkpoints: `dsv4 convert` is not implemented yet"),
           "%s: exit %d:\n%s", cmd, rc, out);
    free(out);
}

const struct test_case test_group_v41[] = {
    { "flash_config_parses", test_flash_parses },
    { "flash_layer_kinds", test_flash_kinds },
    { "config_errors_name_field", test_config_errors },
    { "inspect_config_figures", test_inspect_flash },
    { "convert_refused", test_convert_refused },
    { "gen_tiny_binds", test_v41_gen_binds },
    { "gen_bytes_match_stats", test_v41_gen_sizes },
    { "inspect_checkpoint", test_v41_inspect },
    { "corrupted_named", test_v41_corrupted },
    { "vision_tower_accepted", test_v41_vision },
    { "cli_dspark_and_refusals", test_v41_cli_dspark },
    { NULL, NULL },
};
