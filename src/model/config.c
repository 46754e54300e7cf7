/*
 * config.c - the HF config.json of the DeepSeek-V4 release, parsed and validated; also the
 * parts DeepSeek-V4.1 shares with it (its own fields and shapes: config_v41.c).
 *
 * Field names are Hugging Face's (hidden_size, num_hidden_layers, ...; docs/MODEL.md §R1.1).
 * Validation enforces what the forward pass and the reference rely on (docs/MODEL.md §R8):
 * every input width of an FP8/FP4 projection is a multiple of 128 (activation blocks), the
 * "nope" part of a head is a multiple of 64 (KV FP8 blocks), the indexer head is a power of
 * two and a multiple of 32 (Hadamard, FP4 blocks), ratios are 0, 4 or another power of two
 * up to 256 (so 256-position KV pages hold whole compressed blocks), and the MTP block is a
 * sliding-window layer. Each failure names the field.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/config_parse.h"

const char *dsv4_wfmt_name(enum dsv4_wfmt f)
{
    switch (f) {
    case DSV4_WFMT_BF16: return "bf16";
    case DSV4_WFMT_F32:  return "f32";
    case DSV4_WFMT_FP8:  return "fp8-e4m3/128x128";
    case DSV4_WFMT_FP4:  return "fp4-e2m1/32";
    }
    return "?";
}

int dsv4_cfg_bad(struct cfg_parse *p, const char *field, const char *why)
{
    if (p->rc == DSV4_OK)
        p->rc = dsv4_err_set(p->err, DSV4_EFORMAT, "%s: field \"%s\" %s", p->what, field, why);
    return 0;
}

int dsv4_cfg_int(struct cfg_parse *p, json_t *obj, const char *field, bool required, int def, int lo, int hi)
{
    json_t *v = json_object_get(obj, field);
    if (!v || json_is_null(v)) {
        if (required) return dsv4_cfg_bad(p, field, "is missing");
        return def;
    }
    if (!json_is_integer(v)) return dsv4_cfg_bad(p, field, "must be an integer");
    json_int_t i = json_integer_value(v);
    if (i < lo || i > hi) {
        char why[96];
        snprintf(why, sizeof(why), "is %lld, must be in [%d, %d]", (long long)i, lo, hi);
        return dsv4_cfg_bad(p, field, why);
    }
    return (int)i;
}

double dsv4_cfg_double(struct cfg_parse *p, json_t *obj, const char *field, bool required, double def, double lo,
                       double hi)
{
    json_t *v = json_object_get(obj, field);
    if (!v || json_is_null(v)) {
        if (required) return dsv4_cfg_bad(p, field, "is missing");
        return def;
    }
    if (!json_is_number(v)) return dsv4_cfg_bad(p, field, "must be a number");
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) {
        char why[96];
        snprintf(why, sizeof(why), "is %g, must be in [%g, %g]", d, lo, hi);
        return dsv4_cfg_bad(p, field, why);
    }
    return d;
}

static float get_float(struct cfg_parse *p, json_t *obj, const char *field, bool required, double def, double lo,
                       double hi)
{
    return (float)dsv4_cfg_double(p, obj, field, required, def, lo, hi);
}

const char *dsv4_cfg_str(struct cfg_parse *p, json_t *obj, const char *field, bool required)
{
    json_t *v = json_object_get(obj, field);
    if (!v || json_is_null(v)) {
        if (required) dsv4_cfg_bad(p, field, "is missing");
        return NULL;
    }
    if (!json_is_string(v)) {
        dsv4_cfg_bad(p, field, "must be a string");
        return NULL;
    }
    return json_string_value(v);
}

static bool is_pow2(int v)
{
    return v > 0 && (v & (v - 1)) == 0;
}

void dsv4_cfg_require(struct cfg_parse *p, bool ok, const char *field, const char *why)
{
    if (!ok) dsv4_cfg_bad(p, field, why);
}

/* weight_block_size: [128, 128] for V4; V4.1's FP8 has 32x32 blocks (and activation groups of
 * 32: the official inference/model.py, `fp8_block_size`). */
static void parse_block(struct cfg_parse *p, struct dsv4_config *c, json_t *q)
{
    bool    v41 = c->arch == DSV4_ARCH_V4_1;
    int     b   = c->fp8_block;
    json_t *bs  = json_object_get(q, "weight_block_size");
    if (bs) {
        if (!json_is_array(bs) || json_array_size(bs) != 2 || json_integer_value(json_array_get(bs, 0)) != b ||
            json_integer_value(json_array_get(bs, 1)) != b)
            dsv4_cfg_bad(p, "quantization_config.weight_block_size",
                         v41 ? "must be [32, 32] (DeepSeek-V4.1)" : "must be [128, 128]");
    }
}

static void parse_quant(struct cfg_parse *p, struct dsv4_config *c)
{
    json_t *q    = json_object_get(p->top, "quantization_config");
    c->fp8_block = c->arch == DSV4_ARCH_V4_1 ? 32 : 128;
    c->fp8       = false;
    c->wfmt   = DSV4_WFMT_BF16;
    if (q && !json_is_null(q)) {
        if (!json_is_object(q)) {
            dsv4_cfg_bad(p, "quantization_config", "must be an object");
            return;
        }
        const char *m = dsv4_cfg_str(p, q, "quant_method", true);
        if (m && strcmp(m, "fp8") != 0) dsv4_cfg_bad(p, "quantization_config.quant_method", "must be \"fp8\"");
        const char *f = dsv4_cfg_str(p, q, "fmt", false);
        if (f && strcmp(f, "e4m3") != 0) dsv4_cfg_bad(p, "quantization_config.fmt", "must be \"e4m3\"");
        const char *a = dsv4_cfg_str(p, q, "activation_scheme", false);
        if (a && strcmp(a, "dynamic") != 0)
            dsv4_cfg_bad(p, "quantization_config.activation_scheme", "must be \"dynamic\"");
        const char *sf = dsv4_cfg_str(p, q, "scale_fmt", false);
        if (sf && strcmp(sf, "ue8m0") != 0) dsv4_cfg_bad(p, "quantization_config.scale_fmt", "must be \"ue8m0\"");
        parse_block(p, c, q);
        c->fp8  = true;
        c->wfmt = DSV4_WFMT_FP8;
    }
    /* V4 names the experts' format beside the fields, V4.1 inside quantization_config */
    json_t     *eobj = c->arch == DSV4_ARCH_V4_1 && json_is_object(q) ? q : p->root;
    const char *ed   = dsv4_cfg_str(p, eobj, "expert_dtype", false);
    if (!ed) c->expert_wfmt = c->wfmt;
    else if (!strcmp(ed, "fp4")) c->expert_wfmt = DSV4_WFMT_FP4;
    else if (!strcmp(ed, "fp8")) c->expert_wfmt = DSV4_WFMT_FP8;
    else dsv4_cfg_bad(p, "expert_dtype", "must be \"fp4\" or \"fp8\"");
    if (ed && !c->fp8) dsv4_cfg_bad(p, "expert_dtype", "needs quantization_config (fp8 activations)");
}

/* The KV layer's copy of the widths it lays the state out by (kv/kv_dims.h). */
static void fill_kv_dims(struct dsv4_config *c)
{
    struct dsv4_kv_dims *d = &c->kv;
    d->n_layer    = c->n_layer;
    d->n_mtp      = c->n_mtp;
    d->window     = c->window;
    d->d_model    = c->d_model;
    d->hc         = c->hc;
    d->d_head     = c->d_head;
    d->d_rope     = c->d_rope;
    d->d_idx_head = c->d_idx_head;
    memcpy(d->kind, c->kind, sizeof(d->kind));
}

static void parse_rope(struct cfg_parse *p, struct dsv4_config *c)
{
    c->rope_theta          = get_float(p, p->root, "rope_theta", true, 0, 1, 1e12);
    c->compress_rope_theta = get_float(p, p->root, "compress_rope_theta", true, 0, 1, 1e12);
    json_t *rs             = json_object_get(p->root, "rope_scaling");
    c->yarn                = false;
    c->rope_factor         = 1;
    c->original_seq_len    = 0;
    c->beta_fast           = 32;
    c->beta_slow           = 1;
    if (rs && !json_is_null(rs)) {
        if (!json_is_object(rs)) {
            dsv4_cfg_bad(p, "rope_scaling", "must be an object");
            return;
        }
        const char *type = dsv4_cfg_str(p, rs, "type", false);
        if (!type) type = dsv4_cfg_str(p, rs, "rope_type", true);
        if (type && strcmp(type, "yarn") != 0) {
            dsv4_cfg_bad(p, "rope_scaling.type", "must be \"yarn\"");
            return;
        }
        c->yarn             = true;
        c->rope_factor      = get_float(p, rs, "factor", true, 1, 1, 1e6);
        c->original_seq_len = dsv4_cfg_int(p, rs, "original_max_position_embeddings", true, 0, 1, 1 << 30);
        c->beta_fast        = get_float(p, rs, "beta_fast", false, 32, 0, 1e6);
        c->beta_slow        = get_float(p, rs, "beta_slow", false, 1, 0, 1e6);
    }
}

/* The integer and real fields; *n_kv: num_key_value_heads (checked with the shapes). */
static void parse_dims(struct cfg_parse *p, struct dsv4_config *c, int *n_kv)
{
    json_t   *root = p->root;
    const int BIG  = 1 << 24;
    bool      v41  = c->arch == DSV4_ARCH_V4_1; /* DSpark stages in place of the MTP block */
    c->vocab_size   = dsv4_cfg_int(p, root, "vocab_size", true, 0, 1, 1 << 22);
    c->d_model      = dsv4_cfg_int(p, root, "hidden_size", true, 0, 1, 1 << 16);
    c->n_layer      = dsv4_cfg_int(p, root, "num_hidden_layers", true, 0, 1, DSV4_MAX_LAYERS - 2);
    c->n_head       = dsv4_cfg_int(p, root, "num_attention_heads", true, 0, 1, 1024);
    *n_kv           = dsv4_cfg_int(p, root, "num_key_value_heads", false, 1, 1, 1024);
    c->d_head       = dsv4_cfg_int(p, root, "head_dim", true, 0, 2, 4096);
    c->d_rope       = dsv4_cfg_int(p, root, "qk_rope_head_dim", true, 0, 2, 4096);
    c->q_lora_rank  = dsv4_cfg_int(p, root, "q_lora_rank", true, 0, 1, 1 << 16);
    c->o_lora_rank  = dsv4_cfg_int(p, root, "o_lora_rank", true, 0, 1, 1 << 16);
    c->o_groups     = dsv4_cfg_int(p, root, "o_groups", true, 0, 1, 1024);
    c->window       = dsv4_cfg_int(p, root, "sliding_window", true, 0, 1, 1 << 16);
    c->max_ctx      = dsv4_cfg_int(p, root, "max_position_embeddings", true, 0, 1, 1 << 30);
    c->n_idx_head   = dsv4_cfg_int(p, root, "index_n_heads", true, 0, 1, 1024);
    c->d_idx_head   = dsv4_cfg_int(p, root, "index_head_dim", true, 0, 1, 4096);
    c->idx_topk     = dsv4_cfg_int(p, root, "index_topk", true, 0, 1, BIG);
    c->n_exp        = dsv4_cfg_int(p, root, "n_routed_experts", true, 0, 1, 4096);
    c->n_exp_shared = dsv4_cfg_int(p, root, "n_shared_experts", true, 0, 1, 1);
    c->n_exp_used   = dsv4_cfg_int(p, root, "num_experts_per_tok", true, 0, 1, 64);
    c->d_ff_exp     = dsv4_cfg_int(p, root, "moe_intermediate_size", true, 0, 1, 1 << 18);
    c->n_hash_layer = dsv4_cfg_int(p, root, "num_hash_layers", false, 0, 0, DSV4_MAX_LAYERS);
    c->route_scale  = dsv4_cfg_double(p, root, "routed_scaling_factor", true, 1, 0, 1e6);
    c->swiglu_limit = dsv4_cfg_double(p, root, "swiglu_limit", false, 0, 0, 1e9);
    c->hc           = dsv4_cfg_int(p, root, "hc_mult", true, 0, 1, DSV4_MAX_HC);
    c->hc_sinkhorn_iters = dsv4_cfg_int(p, root, "hc_sinkhorn_iters", true, 0, 1, 1000);
    c->hc_eps       = dsv4_cfg_double(p, root, "hc_eps", true, 0, 0, 1);
    c->norm_eps     = dsv4_cfg_double(p, root, "rms_norm_eps", true, 0, 0, 1);
    c->n_mtp        = dsv4_cfg_int(p, root, "num_nextn_predict_layers", false, 0, 0, v41 ? 16 : 1);
    c->bos_id       = dsv4_cfg_int(p, p->top, "bos_token_id", false, 0, 0, 1 << 22);
    c->eos_id       = dsv4_cfg_int(p, p->top, "eos_token_id", false, 1, 0, 1 << 22);
}

/* The fields whose only accepted value is DeepSeek-V4's (routing, activation, no tying). */
static void check_fixed(struct cfg_parse *p)
{
    json_t     *root = p->root;
    const char *sf   = dsv4_cfg_str(p, root, "scoring_func", true);
    if (sf && strcmp(sf, "sqrtsoftplus") != 0) dsv4_cfg_bad(p, "scoring_func", "must be \"sqrtsoftplus\"");
    const char *tm = dsv4_cfg_str(p, root, "topk_method", false);
    if (tm && strcmp(tm, "noaux_tc") != 0) dsv4_cfg_bad(p, "topk_method", "must be \"noaux_tc\"");
    json_t *ntp = json_object_get(root, "norm_topk_prob");
    if (ntp && json_is_false(ntp)) dsv4_cfg_bad(p, "norm_topk_prob", "must be true");
    json_t *tie = json_object_get(root, "tie_word_embeddings");
    if (tie && json_is_true(tie)) dsv4_cfg_bad(p, "tie_word_embeddings", "must be false");
    const char *act = dsv4_cfg_str(p, root, "hidden_act", false);
    if (act && strcmp(act, "silu") != 0) dsv4_cfg_bad(p, "hidden_act", "must be \"silu\"");
    if (json_object_get(root, "n_group") && !json_is_null(json_object_get(root, "n_group")))
        if (json_integer_value(json_object_get(root, "n_group")) > 1)
            dsv4_cfg_bad(p, "n_group", "group-limited routing is not part of DeepSeek-V4");
    if (json_object_get(root, "first_k_dense_replace"))
        if (json_integer_value(json_object_get(root, "first_k_dense_replace")) > 0)
            dsv4_cfg_bad(p, "first_k_dense_replace", "dense FFN layers are not part of DeepSeek-V4");
}

/* A compress ratio the release allows: V4 0, 4 or a power of two up to 256; V4.1 0, 1 or 2
 * (`Compressor`: ratio 1 a projection, 2 a softmax over 2 tokens). */
static bool ratio_ok(const struct dsv4_config *c, int r)
{
    if (c->arch == DSV4_ARCH_V4_1) return r >= 0 && r <= 2;
    return r == 0 || (is_pow2(r) && r >= 4 && r <= 256);
}

/* compress_ratios: one entry per layer and MTP layer (V4: at least; V4.1: exactly, the DSpark
 * stages' included), each ratio_ok; MTP / DSpark layers 0 (`DSparkAttention` has no
 * compressor). */
static void parse_ratios(struct cfg_parse *p, struct dsv4_config *c)
{
    json_t *cr   = json_object_get(p->root, "compress_ratios");
    int     need = c->n_layer + c->n_mtp;
    bool    v41  = c->arch == DSV4_ARCH_V4_1;
    if (!json_is_array(cr)) {
        dsv4_cfg_bad(p, "compress_ratios", "is missing or not an array");
        return;
    }
    if (need > DSV4_MAX_LAYERS) {
        char why[160];
        snprintf(why, sizeof(why), "num_hidden_layers + num_nextn_predict_layers is %d, at most %d are supported", need,
                 DSV4_MAX_LAYERS);
        dsv4_cfg_bad(p, "num_nextn_predict_layers", why);
        return;
    }
    if (v41 && (int)json_array_size(cr) != need) {
        char why[160];
        snprintf(why, sizeof(why), "has %zu entries, must have %d: one per main layer and DSpark stage "
                 "(num_hidden_layers + num_nextn_predict_layers)", json_array_size(cr), need);
        dsv4_cfg_bad(p, "compress_ratios", why);
        return;
    }
    if ((int)json_array_size(cr) < need || json_array_size(cr) > DSV4_MAX_LAYERS) {
        char why[128];
        snprintf(why, sizeof(why), "has %zu entries, needs at least %d (layers + MTP layers)",
                 json_array_size(cr), need);
        dsv4_cfg_bad(p, "compress_ratios", why);
        return;
    }
    for (int i = 0; i < need; i++) {
        json_t *v = json_array_get(cr, (size_t)i);
        int     r = json_is_integer(v) ? (int)json_integer_value(v) : -1;
        if (!json_is_integer(v) || !ratio_ok(c, r)) {
            dsv4_cfg_bad(p, "compress_ratios", v41 ? "entries must be 0, 1 or 2 (DeepSeek-V4.1)"
                                                   : "entries must be 0, 4 or a power of two up to 256");
            return;
        }
        if (i >= c->n_layer && r != 0) {
            dsv4_cfg_bad(p, "compress_ratios", v41 ? "entries of DSpark stages must be 0 (sliding window)"
                                                   : "entries of MTP layers must be 0 (sliding window)");
            return;
        }
        c->ratio[i] = r;
    }
}

/* The widths FP8 activation groups of fp8_block (128 V4, 32 V4.1) must divide. */
static void check_fp8_widths(struct cfg_parse *p, const struct dsv4_config *c)
{
    int  b = c->fp8_block;
    char why[96];
    snprintf(why, sizeof(why), "must be a multiple of %d (FP8 activation blocks)", b);
    dsv4_cfg_require(p, c->d_model % b == 0, "hidden_size", why);
    dsv4_cfg_require(p, c->q_lora_rank % b == 0, "q_lora_rank", why);
    snprintf(why, sizeof(why), "times o_groups must be a multiple of %d (FP8 activation blocks)", b);
    dsv4_cfg_require(p, (c->o_groups * c->o_lora_rank) % b == 0, "o_lora_rank", why);
    snprintf(why, sizeof(why), "must leave num_attention_heads * head_dim / o_groups a multiple of %d", b);
    dsv4_cfg_require(p, (c->n_head * c->d_head / c->o_groups) % b == 0, "o_groups", why);
    snprintf(why, sizeof(why), "must be a multiple of %d (FP8 activation blocks)", b);
    dsv4_cfg_require(p, c->d_ff_exp % b == 0, "moe_intermediate_size", why);
}

/* The shapes the kernels and the FP8 activation blocks rely on (V4.1's own: config_v41.c). */
static void check_shapes(struct cfg_parse *p, const struct dsv4_config *c, int n_kv)
{
    bool v41 = c->arch == DSV4_ARCH_V4_1;
    dsv4_cfg_require(p, n_kv == 1, "num_key_value_heads", "must be 1 (one shared latent KV head)");
    dsv4_cfg_require(p, c->d_rope % 2 == 0 && c->d_rope < c->d_head, "qk_rope_head_dim",
                     "must be even and smaller than head_dim");
    if (!v41)
        dsv4_cfg_require(p, c->d_nope % 64 == 0, "head_dim", "minus qk_rope_head_dim must be a multiple of 64");
    dsv4_cfg_require(p, c->n_exp_used <= c->n_exp, "num_experts_per_tok", "must not exceed n_routed_experts");
    dsv4_cfg_require(p, c->n_hash_layer <= c->n_layer, "num_hash_layers", "must not exceed num_hidden_layers");
    dsv4_cfg_require(p, (c->n_head * c->d_head) % c->o_groups == 0, "o_groups",
                     "must divide num_attention_heads * head_dim");
    dsv4_cfg_require(p, c->n_head % c->o_groups == 0, "o_groups", "must divide num_attention_heads");
    if (!v41)
        dsv4_cfg_require(p, is_pow2(c->d_idx_head) && c->d_idx_head % 32 == 0 && c->d_idx_head > c->d_rope,
                         "index_head_dim",
                         "must be a power of two, a multiple of 32 and larger than qk_rope_head_dim");
    dsv4_cfg_require(p, c->vocab_size > c->bos_id && c->vocab_size > c->eos_id, "vocab_size",
                     "must exceed bos_token_id and eos_token_id");
    if (c->fp8) check_fp8_widths(p, c);
    if (v41) dsv4_cfg_v41_check_shapes(p, c);
}

/* model_type: "deepseek_v4" (or absent) is V4, its fields at the top; "deepseek_v41" is V4.1,
 * its model's fields in text_config (the vision tower's in vision_config: not read). */
static void parse_arch(struct cfg_parse *p, struct dsv4_config *c)
{
    const char *mt = dsv4_cfg_str(p, p->top, "model_type", false);
    c->arch        = DSV4_ARCH_V4;
    if (mt && !strcmp(mt, "deepseek_v41")) {
        c->arch = DSV4_ARCH_V4_1;
        p->root = json_object_get(p->top, "text_config");
        if (!json_is_object(p->root)) dsv4_cfg_bad(p, "text_config", "is missing or not an object (DeepSeek-V4.1)");
    } else if (mt && strcmp(mt, "deepseek_v4") != 0) {
        dsv4_cfg_bad(p, "model_type", "must be \"deepseek_v4\" or \"deepseek_v41\" (other models are not supported)");
    }
}

int dsv4_config_parse(struct dsv4_config *c, const char *text, size_t len, const char *what,
                      struct dsv4_err *err)
{
    memset(c, 0, sizeof(*c));
    json_error_t je;
    json_t      *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return dsv4_err_set(err, DSV4_EFORMAT, "%s: byte %d: not valid JSON: %s", what, je.position,
                            je.text);
    struct cfg_parse p = { root, root, what, err, DSV4_OK };
    if (!json_is_object(root)) {
        json_decref(root);
        return dsv4_err_set(err, DSV4_EFORMAT, "%s: not a JSON object", what);
    }
    parse_arch(&p, c);
    if (p.rc) goto out;
    int n_kv;
    parse_dims(&p, c, &n_kv);
    if (p.rc) goto out;
    check_fixed(&p);
    parse_rope(&p, c);
    parse_quant(&p, c);
    if (p.rc) goto out;
    parse_ratios(&p, c);
    if (p.rc) goto out;
    if (c->arch == DSV4_ARCH_V4_1) dsv4_cfg_v41_parse(&p, c);
    if (p.rc) goto out;
    c->d_nope = c->d_head - c->d_rope;
    check_shapes(&p, c, n_kv);
    if (p.rc == DSV4_OK) {
        dsv4_layer_kinds_build(c);
        fill_kv_dims(c);
    }
out:
    json_decref(root);
    return p.rc;
}

int dsv4_config_load_file(struct dsv4_config *cfg, const char *path, struct dsv4_err *err)
{
    char  *text;
    size_t len;
    int    rc = dsv4_read_file(path, &text, &len, 16u << 20, err);
    if (rc == DSV4_OK) {
        rc = dsv4_config_parse(cfg, text, len, path, err);
        free(text);
    }
    return rc;
}

int dsv4_config_load(struct dsv4_config *cfg, const char *dir, struct dsv4_err *err)
{
    char *path = dsv4_path_join(dir, "config.json");
    if (!path) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    int rc = dsv4_config_load_file(cfg, path, err);
    free(path);
    return rc;
}
