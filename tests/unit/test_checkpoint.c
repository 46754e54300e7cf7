/*
 * test_checkpoint.c - config validation, sharded checkpoints, weight binding against
 * corrupted checkpoints (missing/extra tensor, wrong shape/dtype, missing shard), and
 * `dsv4 inspect` end to end on the generated tiny checkpoints.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "support/gen.h"
#include "model/model.h"
#include "test_bound.h"
#include "test_cases.h"

static void gen_dir(struct test_ctx *t, const struct gen_opts *o, const char *name, char *dir, size_t n)
{
    snprintf(dir, n, "%s/%s", t->tmpdir, name);
    struct dsv4_err err;
    struct gen_opts q = *o;
    q.quiet           = true;
    int rc            = gen_checkpoint(&q, dir, &err);
    CHECKF(rc == DSV4_OK, "gen %s: %s", name, err.msg);
}

/* Marks the checkpoint tensors the weight iterators reach (prepare_weights' view). */
struct reach {
    const struct dsv4_checkpoint *ck;
    bool                         *seen;
    int                           bad;
    char                          what[200];
};

static void reach_mark(struct reach *r, const void *data, size_t bytes)
{
    for (size_t i = 0; i < r->ck->n_tensors; i++)
        if (r->ck->tensors[i].data == data) {
            r->seen[i] = true;
            if (bytes && r->ck->tensors[i].nbytes != bytes && !r->bad++)
                snprintf(r->what, sizeof(r->what), "%s: %llu bytes, iterator says %zu", r->ck->tensors[i].name,
                         (unsigned long long)r->ck->tensors[i].nbytes, bytes);
            return;
        }
    if (!r->bad++) snprintf(r->what, sizeof(r->what), "a tensor of %zu bytes outside the checkpoint", bytes);
}

static void reach_tensor(const void **tp, size_t bytes, void *ud)
{
    reach_mark(ud, *tp, bytes);
}

static void reach_linear(struct dsv4_linear *l, void *ud)
{
    if (l->wt) reach_mark(ud, l->wt->data, 0);
    if (l->st) reach_mark(ud, l->st->data, 0);
}

/* Every tensor of the checkpoint is reached exactly as bound: the projections through
 * each_linear, everything else through each_tensor with its true size. */
static void check_reach(struct test_ctx *t, struct bound *b, const char *name)
{
    struct reach r = { .ck = &b->ck, .seen = calloc(b->ck.n_tensors, sizeof(bool)) };
    dsv4_weights_each_linear(&b->w, &b->cfg, reach_linear, &r);
    dsv4_weights_each_tensor(&b->w, &b->cfg, reach_tensor, &r);
    CHECKF(!r.bad, "%s: %s", name, r.what);
    size_t missed = 0, first = 0;
    for (size_t i = 0; i < b->ck.n_tensors; i++)
        if (!r.seen[i] && !missed++) first = i;
    CHECKF(!missed, "%s: %zu tensors reached by neither iterator (first %s)", name, missed,
           missed ? b->ck.tensors[first].name : "");
    free(r.seen);
}

static void test_presets_bind(struct test_ctx *t)
{
    const char *presets[] = { "tiny-a", "tiny-b" };
    for (int i = 0; i < 2; i++) {
        struct gen_opts o;
        gen_opts_default(&o);
        o.preset = presets[i];
        char dir[512];
        gen_dir(t, &o, presets[i], dir, sizeof(dir));
        struct bound    b;
        struct dsv4_err err;
        int             rc = bound_open(&b, dir, &err);
        CHECKF(rc == DSV4_OK, "%s: %s", presets[i], err.msg);
        CHECK(b.rep.n_problems == 0);
        CHECK(b.w.has_mtp);
        if (rc == DSV4_OK) check_reach(t, &b, presets[i]);
        bound_close(&b);
    }
    /* variants the release also has: no MTP, FP8 experts, F32 scales, single file */
    struct gen_opts o;
    gen_opts_default(&o);
    o.no_mtp      = true;
    o.fp8_experts = true;
    o.f32_scales  = true;
    o.single_file = true;
    char dir[512];
    gen_dir(t, &o, "variant", dir, sizeof(dir));
    struct bound    b;
    struct dsv4_err err;
    CHECKF(bound_open(&b, dir, &err) == DSV4_OK, "%s", err.msg);
    CHECK(!b.w.has_mtp && b.rep.mtp_absent);
    CHECK(b.w.layers && b.w.layers[0].experts[0].w1.fmt == DSV4_WFMT_FP8 && b.w.layers[0].experts[0].w1.scale_f32);
    bound_close(&b);
}

static void test_corrupted(struct test_ctx *t)
{
    struct {
        const char *name;
        const char *drop, *shape, *dtype, *extra;
        const char *want1, *want2;
    } cases[] = {
        { "missing", "layers.1.attn.indexer.wq_b.scale", NULL, NULL, NULL, "layers.1.attn.indexer.wq_b.scale", "missing" },
        { "shape", NULL, "layers.2.attn.compressor.ape", NULL, NULL, "layers.2.attn.compressor.ape", "shape [17, 128], expected [16, 128]" },
        { "dtype", NULL, NULL, "layers.3.ffn.experts.5.w2.weight", NULL, "layers.3.ffn.experts.5.w2.weight", "dtype BOOL" },
        { "dtype2", NULL, NULL, "embed.weight", NULL, "embed.weight", "dtype F16, expected BF16" },
        { "extra", NULL, NULL, NULL, "layers.0.attn.bogus", "layers.0.attn.bogus", "unexpected" },
        { "mtp_partial", "mtp.0.e_proj.weight", NULL, NULL, NULL, "mtp.0.e_proj.weight", "missing" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct gen_opts o;
        gen_opts_default(&o);
        o.drop_tensor  = cases[i].drop;
        o.bad_shape    = cases[i].shape;
        o.bad_dtype    = cases[i].dtype;
        o.extra_tensor = cases[i].extra;
        char dir[512];
        gen_dir(t, &o, cases[i].name, dir, sizeof(dir));
        struct bound    b;
        struct dsv4_err err;
        int             rc = bound_open(&b, dir, &err);
        CHECKF(rc == DSV4_ECHECKPOINT, "%s: rc %d (%s)", cases[i].name, rc, err.msg);
        CHECKF(report_has(&b.rep, cases[i].want1, cases[i].want2), "%s: no problem naming '%s' / '%s' (first: %s)",
               cases[i].name, cases[i].want1, cases[i].want2, b.rep.n_problems ? b.rep.problems[0].text : "-");
        CHECKF(strstr(err.msg, "problem") != NULL, "%s: %s", cases[i].name, err.msg);
        bound_close(&b);
    }
    /* several problems at once are all reported */
    struct gen_opts o;
    gen_opts_default(&o);
    o.drop_tensor  = "norm.weight";
    o.bad_shape    = "layers.0.attn.attn_sink";
    o.extra_tensor = "zzz";
    char dir[512];
    gen_dir(t, &o, "multi", dir, sizeof(dir));
    struct bound    b;
    struct dsv4_err err;
    CHECK(bound_open(&b, dir, &err) == DSV4_ECHECKPOINT);
    CHECK(b.rep.n_problems == 3 && b.rep.n_missing == 1 && b.rep.n_shape == 1 && b.rep.n_unexpected == 1);
    bound_close(&b);
}

static void test_shards(struct test_ctx *t)
{
    struct gen_opts o;
    gen_opts_default(&o);
    char dir[256], path[400], cmd[4096];
    gen_dir(t, &o, "shards", dir, sizeof(dir));
    struct dsv4_checkpoint ck;
    struct dsv4_err        err;
    CHECKF(dsv4_checkpoint_open(&ck, dir, &err) == DSV4_OK, "%s", err.msg);
    CHECK(ck.n_files == 6 && ck.n_tensors == 427);
    dsv4_checkpoint_close(&ck);
    /* a shard listed in the index is missing */
    snprintf(path, sizeof(path), "%s/model-00003-of-00006.safetensors", dir);
    snprintf(cmd, sizeof(cmd), "mv '%s' '%s.moved'", path, path);
    CHECK(system(cmd) == 0);
    CHECK(dsv4_checkpoint_open(&ck, dir, &err) == DSV4_EIO);
    CHECKF(strstr(err.msg, "model-00003-of-00006.safetensors") && strstr(err.msg, "index"), "%s", err.msg);
    snprintf(cmd, sizeof(cmd), "mv '%s.moved' '%s'", path, path);
    CHECK(system(cmd) == 0);
    /* a truncated shard */
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s.bak' && truncate -s 100000 '%s'", path, path, path);
    CHECK(system(cmd) == 0);
    CHECK(dsv4_checkpoint_open(&ck, dir, &err) == DSV4_EFORMAT);
    CHECKF(strstr(err.msg, "model-00003") && strstr(err.msg, "byte "), "%s", err.msg);
    snprintf(cmd, sizeof(cmd), "mv '%s.bak' '%s'", path, path);
    CHECK(system(cmd) == 0);
    /* index pointing a tensor at the wrong shard, and a path escaping the directory */
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s.bak' && sed -i 's|\"embed.weight\": \"model-00001|\"embed.weight\": \"model-00002|' '%s'",
             path, path, path);
    CHECK(system(cmd) == 0);
    CHECK(dsv4_checkpoint_open(&ck, dir, &err) == DSV4_EFORMAT);
    CHECKF(strstr(err.msg, "embed.weight") != NULL, "%s", err.msg);
    snprintf(cmd, sizeof(cmd), "cp '%s.bak' '%s' && sed -i 's|\"embed.weight\": \"model-00001|\"embed.weight\": \"../model-00001|' '%s'",
             path, path, path);
    CHECK(system(cmd) == 0);
    CHECK(dsv4_checkpoint_open(&ck, dir, &err) == DSV4_EFORMAT);
    CHECKF(strstr(err.msg, "same directory") != NULL, "%s", err.msg);
    snprintf(cmd, sizeof(cmd), "mv '%s.bak' '%s'", path, path);
    CHECK(system(cmd) == 0);
}

/* Counts the lines of out holding both a and b. */
static int count_lines(const char *out, const char *a, const char *b)
{
    int n = 0;
    for (const char *l = out; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t      len = e ? (size_t)(e - l) : strlen(l);
        char        line[1024];
        snprintf(line, sizeof(line), "%.*s", (int)(len < sizeof(line) ? len : sizeof(line) - 1), l);
        n += strstr(line, a) && strstr(line, b);
        l = e ? e + 1 : NULL;
    }
    return n;
}

/* dsv4 inspect on a checkpoint with a refused shard: the byte-offset error, and every tensor
 * the model therefore lacks, by name; from the index (sharded) or from the shard's own
 * header (one file, no index). */
static void test_refused_shard_inspect(struct test_ctx *t)
{
    const char *bin = getenv("DSV4_BIN");
    CHECKF(bin != NULL, "DSV4_BIN not set (run through make test)");
    if (!bin) return;
    char dir[256], path[400], cmd[4096], *out = NULL;
    snprintf(dir, sizeof(dir), "%s/shards", t->tmpdir); /* made by shards_index_missing_truncated */
    snprintf(path, sizeof(path), "%s/model-00003-of-00006.safetensors", dir);
    struct dsv4_checkpoint ck;
    struct dsv4_err        err;
    CHECKF(dsv4_checkpoint_open(&ck, path, &err) == DSV4_OK, "%s", err.msg);
    size_t in_shard = ck.n_tensors;
    char   first[256];
    snprintf(first, sizeof(first), "%s", in_shard ? ck.tensors[0].name : "?");
    dsv4_checkpoint_close(&ck);
    CHECK(in_shard > 0);
    /* a truncated data area, then a header length past the end of the file */
    for (int d = 0; d < 2; d++) {
        char dmg[1024];
        if (d == 0) snprintf(dmg, sizeof(dmg), "truncate -s -1000 '%s'", path);
        else snprintf(dmg, sizeof(dmg), "printf '\\377\\377\\377' | dd of='%s' conv=notrunc status=none", path);
        snprintf(cmd, sizeof(cmd), "cp '%s' '%s.bak' && %s", path, path, dmg);
        CHECK(system(cmd) == 0);
        snprintf(cmd, sizeof(cmd), "%s inspect -m '%s'", bin, dir);
        CHECK(test_run(cmd, &out) == 1);
        CHECKF(strstr(out, "refused      shard model-00003-of-00006.safetensors") && strstr(out, "byte "), "%s", out);
        int named = count_lines(out, "was refused", "missing");
        CHECKF((size_t)named == in_shard, "damage %d: %d tensors named as lacking, shard holds %zu:\n%s", d, named,
               in_shard, out);
        CHECKF(count_lines(out, first, "its shard model-00003-of-00006.safetensors was refused") == 1, "%s", out);
        free(out);
        snprintf(cmd, sizeof(cmd), "%s inspect -m '%s' --json", bin, dir);
        CHECK(test_run(cmd, &out) == 1);
        json_t *j   = json_loads(out, 0, NULL);
        json_t *ref = json_object_get(j, "refused_shards");
        CHECKF(json_array_size(ref) == 1 &&
                   json_array_size(json_object_get(json_array_get(ref, 0), "tensors")) == in_shard,
               "%s", out);
        json_decref(j);
        free(out);
        snprintf(cmd, sizeof(cmd), "mv '%s.bak' '%s'", path, path);
        CHECK(system(cmd) == 0);
    }
    /* one file, no index: the names come from the truncated file's header */
    struct gen_opts o;
    gen_opts_default(&o);
    o.single_file = true;
    gen_dir(t, &o, "one", dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    CHECKF(dsv4_checkpoint_open(&ck, path, &err) == DSV4_OK, "%s", err.msg);
    size_t all = 0;
    for (size_t i = 0; i < ck.n_tensors; i++) all += strncmp(ck.tensors[i].name, "__pad.", 6) != 0;
    dsv4_checkpoint_close(&ck);
    snprintf(cmd, sizeof(cmd), "truncate -s -1000 '%s'", path);
    CHECK(system(cmd) == 0);
    CHECK(dsv4_checkpoint_open(&ck, dir, &err) == DSV4_EFORMAT && strstr(err.msg, "byte "));
    snprintf(cmd, sizeof(cmd), "%s inspect -m '%s'", bin, dir);
    CHECK(test_run(cmd, &out) == 1);
    int named = count_lines(out, "was refused", "missing");
    /* every tensor of the file is named; those the config expects are each listed as missing */
    char want[64];
    snprintf(want, sizeof(want), "lacks its %zu tensors", all);
    CHECKF(strstr(out, want) && named > 0 && (size_t)named <= all, "%d of %zu named:\n%s", named, all, out);
    free(out);
}

static void expect_config_error(struct test_ctx *t, const char *field, json_t *value, const char *want)
{
    char   path[512];
    snprintf(path, sizeof(path), "%s/tiny-a/config.json", t->tmpdir);
    json_error_t je;
    json_t      *c = json_load_file(path, 0, &je);
    CHECK(c != NULL);
    if (!c) return;
    if (value) json_object_set_new(c, field, value);
    else json_object_del(c, field);
    char *s = json_dumps(c, 0);
    struct dsv4_config cfg;
    struct dsv4_err    err;
    int                rc = dsv4_config_parse(&cfg, s, strlen(s), "config.json", &err);
    CHECKF(rc == DSV4_EFORMAT, "%s: accepted", field);
    CHECKF(rc != DSV4_EFORMAT || (strstr(err.msg, field) && strstr(err.msg, want)), "%s: message '%s'", field, err.msg);
    free(s);
    json_decref(c);
}

static void test_config_errors(struct test_ctx *t)
{
    expect_config_error(t, "hidden_size", NULL, "missing");
    expect_config_error(t, "hidden_size", json_string("256"), "integer");
    expect_config_error(t, "hidden_size", json_integer(200), "multiple of 128");
    expect_config_error(t, "compress_ratios", json_pack("[i,i,i,i,i]", 0, 3, 16, 4, 0), "power of two");
    expect_config_error(t, "compress_ratios", json_pack("[i,i,i]", 0, 4, 16), "entries");
    expect_config_error(t, "compress_ratios", json_pack("[i,i,i,i,i]", 0, 4, 16, 4, 4), "MTP");
    expect_config_error(t, "head_dim", json_integer(100), "multiple of 64");
    expect_config_error(t, "index_head_dim", json_integer(96), "power of two");
    expect_config_error(t, "o_groups", json_integer(3), "divide");
    expect_config_error(t, "num_experts_per_tok", json_integer(9), "n_routed_experts");
    expect_config_error(t, "scoring_func", json_string("softmax"), "sqrtsoftplus");
    expect_config_error(t, "model_type", json_string("llama"), "deepseek_v4");
    expect_config_error(t, "rope_scaling", json_pack("{s:s}", "type", "linear"), "yarn");
    struct dsv4_config cfg;
    struct dsv4_err    err;
    CHECK(dsv4_config_parse(&cfg, "{\"a\":", 5, "c.json", &err) == DSV4_EFORMAT && strstr(err.msg, "byte"));
    CHECK(dsv4_config_parse(&cfg, "[]", 2, "c.json", &err) == DSV4_EFORMAT);
}

/* One layer's kind against what its letter in `want` says: W window only, C CSA (overlapping
 * compressor, indexer keeping topk, its own kv and index source), H HCA (its own kv source,
 * no overlap, no indexer), M the MTP block (window only); hash_routed for il < n_hash. */
static void expect_kind(struct test_ctx *t, const struct dsv4_config *c, int il, char want, int n_hash, int topk)
{
    const struct dsv4_layer_kind *k = &c->kind[il];
    bool csa = want == 'C', comp = want == 'C' || want == 'H';
    CHECKF(k->ratio == c->ratio[il], "layer %d: ratio %d, compress_ratios says %d", il, k->ratio, c->ratio[il]);
    CHECKF((k->ratio != 0) == comp, "layer %d (%c): ratio %d", il, want, k->ratio);
    CHECKF(k->overlap == csa && k->indexer == csa, "layer %d (%c): overlap %d indexer %d", il, want, k->overlap,
           k->indexer);
    CHECKF(k->idx_topk == (csa ? topk : 0), "layer %d (%c): idx_topk %d", il, want, k->idx_topk);
    CHECKF(k->kv_source == (comp ? il : -1) && k->index_source == (csa ? il : -1),
           "layer %d (%c): kv source %d, index source %d", il, want, k->kv_source, k->index_source);
    CHECKF(k->window == c->window && !k->engram, "layer %d: window %d engram %d", il, k->window, k->engram);
    CHECKF(k->mtp == (want == 'M') && k->hash_routed == (want != 'M' && il < n_hash),
           "layer %d (%c): mtp %d hash_routed %d", il, want, k->mtp, k->hash_routed);
    CHECK(dsv4_kind_coff(k) == (csa ? 2 : 1));
}

/* The layer kinds the config builds (model/layer_kind.h) on the tiny presets and the
 * official V4-Flash config: every layer's description follows its compress ratio, and the
 * KV layer's copy (cfg.kv) is the same. */
static void test_layer_kinds(struct test_ctx *t)
{
    struct {
        const char *preset, *want; /* a letter per layer, expect_kind */
        int         window, topk;
    } cases[] = { { "tiny-a", "WCHCM", 16, 4 }, { "tiny-b", "WCHCM", 128, 16 } };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct gen_opts o;
        gen_opts_default(&o);
        o.preset = cases[i].preset;
        char dir[512], name[64];
        snprintf(name, sizeof(name), "kinds-%s", cases[i].preset);
        gen_dir(t, &o, name, dir, sizeof(dir));
        struct dsv4_config c;
        struct dsv4_err    err;
        CHECKF(dsv4_config_load(&c, dir, &err) == DSV4_OK, "%s: %s", dir, err.msg);
        CHECK(c.n_layer + c.n_mtp == (int)strlen(cases[i].want) && c.window == cases[i].window);
        for (int il = 0; il < c.n_layer + c.n_mtp; il++)
            expect_kind(t, &c, il, cases[i].want[il], c.n_hash_layer, cases[i].topk);
        CHECK(c.ratio[2] == (i ? 128 : 16) && !memcmp(c.kv.kind, c.kind, sizeof(c.kind)));
    }
    /* V4-Flash (docs/MODEL.md §R1.3): 0, 0, then 4 / 128 alternating to layer 42, MTP 0 */
    struct dsv4_config c;
    struct dsv4_err    err;
    CHECKF(dsv4_config_load_file(&c, "models/configs/v4-flash.json", &err) == DSV4_OK, "%s", err.msg);
    CHECK(c.n_layer == 43 && c.n_mtp == 1 && c.n_hash_layer == 3);
    for (int il = 0; il < c.n_layer + c.n_mtp; il++) {
        char want = il == c.n_layer ? 'M' : il < 2 ? 'W' : il % 2 == 0 ? 'C' : 'H';
        expect_kind(t, &c, il, want, c.n_hash_layer, c.idx_topk);
    }
}

static void test_inspect_cli(struct test_ctx *t)
{
    const char *bin = getenv("DSV4_BIN");
    CHECKF(bin != NULL, "DSV4_BIN not set (run through make test)");
    if (!bin) return;
    char  cmd[1200], *out = NULL;
    const char *ok_dirs[] = { "tiny-a", "tiny-b" };
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof(cmd), "%s inspect -m %s/%s", bin, t->tmpdir, ok_dirs[i]);
        int rc = test_run(cmd, &out);
        CHECKF(rc == 0, "inspect %s exit %d:\n%s", ok_dirs[i], rc, out);
        CHECK(strstr(out, "ok: every tensor present") != NULL);
        CHECK(strstr(out, "per token") && strstr(out, "kv state") && strstr(out, "memory"));
        free(out);
    }
    snprintf(cmd, sizeof(cmd), "%s inspect -m %s/shape --json", bin, t->tmpdir);
    int rc = test_run(cmd, &out);
    CHECK(rc == 1);
    json_error_t je;
    json_t      *j = json_loads(out, 0, &je);
    CHECKF(j && json_is_false(json_object_get(j, "ok")), "inspect --json output:\n%s", out);
    json_decref(j);
    free(out);
    snprintf(cmd, sizeof(cmd), "%s inspect -m %s/multi", bin, t->tmpdir);
    CHECK(test_run(cmd, &out) == 1);
    CHECK(strstr(out, "3 problems") && strstr(out, "norm.weight: missing") && strstr(out, "zzz: unexpected"));
    free(out);
    snprintf(cmd, sizeof(cmd), "%s inspect -m %s/does-not-exist", bin, t->tmpdir);
    CHECK(test_run(cmd, &out) == 1);
    free(out);
    snprintf(cmd, sizeof(cmd), "%s inspect", bin);
    CHECK(test_run(cmd, &out) == 2);
    free(out);
}

/* `dsv4 bench --cpu-level A,B`: exactly the listed levels, in the backend's order, and one
 * summary line each; a list with an unknown or repeated level is refused before any runs. */
static void test_bench_level_list(struct test_ctx *t)
{
    const char *bin = getenv("DSV4_BIN");
    CHECKF(bin != NULL, "DSV4_BIN not set (run through make test)");
    if (!bin) return;
    const char *lv[8], *name;
    int         n = 0;
    bool        here;
    for (int l = 0; (name = dsv4_cpu_level_at(l, &here)) && n < 8; l++)
        if (here) lv[n++] = name;
    if (n < 3) {
        test_skip(t, TEST_SKIP_MACHINE, "this machine runs fewer than three CPU levels");
        return;
    }
    char cmd[1400], *out = NULL;
    /* the last and the first level this machine runs, listed in reverse: the middle one must not run */
    snprintf(cmd, sizeof(cmd), "%s bench -m %s/tiny-a --ctx-list 16 --batch-list 1 --decode-steps 1 --threads 2 "
                               "--cpu-level %s,%s", bin, t->tmpdir, lv[n - 1], lv[0]);
    int rc = test_run(cmd, &out);
    CHECKF(rc == 0, "bench exit %d:\n%s", rc, out);
    char first[64], last[64], middle[64];
    snprintf(first, sizeof(first), "=== level %s ===", lv[0]);
    snprintf(last, sizeof(last), "=== level %s ===", lv[n - 1]);
    snprintf(middle, sizeof(middle), "=== level %s ===", lv[1]);
    const char *a = out ? strstr(out, first) : NULL, *b = out ? strstr(out, last) : NULL;
    CHECKF(a && b && a < b, "blocks for %s then %s expected:\n%s", lv[0], lv[n - 1], out);
    CHECKF(out && !strstr(out, middle), "level %s ran but was not listed", lv[1]);
    const char *sum = out ? strstr(out, "summary at ctx 16") : NULL;
    CHECKF(sum != NULL, "no summary table:\n%s", out);
    free(out);
    const char *bad[] = { "nosuch", "dup" };
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof(cmd), "%s bench -m %s/tiny-a --ctx-list 16 --batch-list 1 --decode-steps 1 --cpu-level %s,%s",
                 bin, t->tmpdir, lv[0], i ? lv[0] : bad[i]);
        rc = test_run(cmd, &out);
        CHECKF(rc != 0 && out && strstr(out, "unknown to this backend or repeated") && !strstr(out, "=== level"),
               "list with %s: exit %d\n%s", i ? "a repeated level" : "an unknown level", rc, out);
        free(out);
    }
}

/* `dsv4 bench --cpu-level all` on tiny-a: every level this machine runs gets its block, a
 * summary line and its CSV rows (the figures themselves are benchmarks, not checked). */
static void test_bench_cli(struct test_ctx *t)
{
    const char *bin = getenv("DSV4_BIN");
    CHECKF(bin != NULL, "DSV4_BIN not set (run through make test)");
    if (!bin) return;
    char  cmd[1400], csv[1100], *out = NULL;
    snprintf(csv, sizeof(csv), "%s/bench.csv", t->tmpdir);
    snprintf(cmd, sizeof(cmd), "%s bench -m %s/tiny-a --ctx-list 16 --batch-list 1,2 --decode-steps 1 --threads 2 "
                               "--cpu-level all --spec-rows 2 --csv %s", bin, t->tmpdir, csv);
    int rc = test_run(cmd, &out);
    CHECKF(rc == 0, "bench exit %d:\n%s", rc, out);
    int  n_here = 0, n_lines = 0;
    bool here;
    const char *name;
    for (int l = 0; (name = dsv4_cpu_level_at(l, &here)); l++) {
        if (!here) continue;
        n_here++;
        char head[64], line[64];
        snprintf(head, sizeof(head), "=== level %s ===", name);
        snprintf(line, sizeof(line), "\n%-11s ", name);
        CHECKF(strstr(out, head) != NULL, "no block for level %s", name);
        const char *sum = strstr(out, "summary at ctx 16");
        CHECKF(sum && strstr(sum, line), "no summary line for level %s:\n%s", name, out);
    }
    CHECK(strstr(out, "arithmetic peak, 2 threads: f32 FMA") != NULL);
    const char *sm = strstr(out, "summary at ctx 16");
    CHECKF(sm && strstr(sm, "b2  t/s  of bw  x b1"), "the summary gives batch 2 as a multiple of batch 1:\n%s", out);
    const char *sp = strstr(out, "speculative decoding at ctx 16");
    CHECKF(sp && strstr(sp, "\n       3 ") && strstr(sp, "\n   draft "), "no --spec-rows table:\n%s", out);
    free(out);
    FILE *f = fopen(csv, "r");
    CHECKF(f != NULL, "no CSV %s", csv);
    if (f) {
        char l[1024];
        while (fgets(l, sizeof(l), f)) n_lines++;
        fclose(f);
    }
    CHECKF(n_lines == 1 + 2 * n_here, "CSV: %d lines for %d levels x 2 batch sizes + header", n_lines, n_here);
    snprintf(cmd, sizeof(cmd), "%s bench -m %s/tiny-a --cpu-level nosuch", bin, t->tmpdir);
    CHECK(test_run(cmd, &out) != 0);
    free(out);
    /* the figures come through the backend table: any kind the registry has */
    snprintf(cmd, sizeof(cmd), "%s bench -m %s/tiny-a --ctx-list 16 --batch-list 1 --decode-steps 1 --threads 2 "
                               "--backend cpu-staged", bin, t->tmpdir);
    rc = test_run(cmd, &out);
    CHECKF(rc == 0 && strstr(out, "read bandwidth") && strstr(out, "arithmetic peak, 2 threads"), "cpu-staged bench exit %d:\n%s",
           rc, out);
    free(out);
    /* --gemm on a backend of its own per projection, tiled or not */
    snprintf(cmd, sizeof(cmd), "%s bench --gemm 4,256,256:4,256,256,bf16,i16 --threads 2", bin);
    rc = test_run(cmd, &out);
    const char *row = out ? strstr(out, "\n       4      256      256   fp8 ") : NULL;
    CHECKF(rc == 0 && row && strstr(row, "\n       4      256      256  bf16 "), "--gemm exit %d:\n%s", rc, out);
    free(out);
}

const struct test_case test_group_checkpoint[] = {
    { "presets_and_variants_bind", test_presets_bind },
    { "corrupted_checkpoints_named", test_corrupted },
    { "shards_index_missing_truncated", test_shards },
    { "refused_shard_named_by_inspect", test_refused_shard_inspect },
    { "config_errors_name_field", test_config_errors },
    { "layer_kinds_from_config", test_layer_kinds },
    { "inspect_cli", test_inspect_cli },
    { "bench_cli_all_levels", test_bench_cli },
    { "bench_cli_level_list", test_bench_level_list },
    { NULL, NULL },
};
