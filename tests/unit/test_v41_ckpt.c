/*
 * test_v41_ckpt.c - the tiny DeepSeek-V4.1 checkpoint (`dsv4 gen --preset tiny-v41`, issue 41):
 * it binds with every tensor where V4.1 puts it (the Engram tables mapped in place, no
 * compressor gate at ratio 1, index keys only on kv sources, the DSpark heads), its tensor
 * count and bytes are those src/model/stats_v41.c derives from the config, `dsv4 inspect -m`
 * validates it, corrupted copies are refused with the tensor named, and `dsv4 logits` refuses
 * it plainly (the forward is not implemented yet).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/runtime.h"
#include "support/gen.h"
#include "test_bound.h"
#include "test_cases.h"
#include "test_v41.h"

/* Writes the tiny-v41 checkpoint (with o's corruptions) into tmpdir/name. */
static bool gen_v41(struct test_ctx *t, struct gen_opts *o, const char *name, char *dir, size_t n)
{
    snprintf(dir, n, "%s/%s", t->tmpdir, name);
    o->preset = "tiny-v41";
    o->quiet  = true;
    struct dsv4_err err;
    int             rc = gen_checkpoint(o, dir, &err);
    CHECKF(rc == DSV4_OK, "gen tiny-v41 %s: %s", name, err.msg);
    return rc == DSV4_OK;
}

static bool is_prime(int64_t x)
{
    if (x < 2) return false;
    for (int64_t f = 2; f * f <= x; f++)
        if (x % f == 0) return false;
    return true;
}

/* The Engram tables: each layer's (n-gram size, head) buckets take the next primes from
 * engram_vocab_size (1000), 2 sizes x 2 heads = 4 a layer, so the rows are sums of 4 primes. */
static void check_engram(struct test_ctx *t, const struct bound *b)
{
    int64_t p = 1000, want[2] = { 0, 0 };
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 4; k++, p++) {
            while (!is_prime(p)) p++;
            want[l] += p;
        }
    CHECKF(want[0] == 4062 && want[1] == 4152, "primes %lld %lld", (long long)want[0], (long long)want[1]);
    for (int l = 0; l < 2; l++) {
        int                         il = l == 0 ? 1 : 5;
        const struct dsv4_engram_w *e  = &b->w.layers[il].engram;
        char                        n[64];
        snprintf(n, sizeof(n), "layers.%d.engram.embed.weight", il);
        const struct dsv4_tensor *tt = dsv4_checkpoint_find(&b->ck, n);
        CHECKF(e->rows == want[l] && tt && tt->shape[0] == want[l] && tt->shape[1] == 64, "layer %d: %lld rows", il,
               (long long)e->rows);
        CHECKF(tt && e->table == tt->data, "layer %d: the table is not read in place from the map", il);
        CHECK(e->scale && e->wkv.n_out == 5 * 256 && e->wkv.n_in == 4 * 64 && e->q_weight && e->k_weight);
    }
    CHECK(b->w.layers[0].engram.table == NULL && b->w.layers[2].engram.table == NULL);
}

/* The tiny-v41 checkpoint written into tmpdir/name and bound into b (false, b closed, when
 * either fails). */
static bool gen_bound(struct test_ctx *t, const char *name, struct bound *b)
{
    struct gen_opts o;
    char            dir[512];
    struct dsv4_err err;
    gen_opts_default(&o);
    memset(b, 0, sizeof(*b));
    if (!gen_v41(t, &o, name, dir, sizeof(dir))) return false;
    int rc = bound_open(b, dir, &err);
    CHECKF(rc == DSV4_OK, "bind %s: %s", name, err.msg);
    if (rc) bound_close(b);
    return rc == DSV4_OK;
}

void test_v41_gen_binds(struct test_ctx *t)
{
    struct bound b;
    if (!gen_bound(t, "v41-ok", &b)) return;
    const struct dsv4_layer_w *L = b.w.layers;
    CHECK(b.cfg.arch == DSV4_ARCH_V4_1 && b.w.has_mtp && b.w.dspark && !b.rep.mtp_absent);
    /* FP8 scales per 32x32 block: wq_a [128, 256] has [4, 8] */
    CHECK(L[0].wq_a.st && L[0].wq_a.st->shape[0] == 4 && L[0].wq_a.st->shape[1] == 8);
    /* compressors on kv sources 2 (ratio 2: gated) and 4 (ratio 1: no gate), none on 3 */
    CHECK(L[2].comp.wkv.n_out == 64 && L[2].comp.wgate.n_out == 64 && L[2].comp.norm && !L[2].comp.ape);
    CHECK(L[4].comp.wkv.n_out == 64 && L[4].comp.wgate.n_out == 0 && L[3].comp.wkv.n_out == 0);
    /* indexers on 2, 4, 5; their own keys only on the kv sources 2 and 4 */
    CHECK(L[2].idx.wk.n_out == 64 && L[2].idx.k_norm && L[4].idx.wk.n_in == 64 && L[5].idx.wq_b.n_out == 4 * 64);
    CHECK(L[5].idx.wk.n_out == 0 && !L[5].idx.k_norm && L[6].idx.wq_b.n_out == 0);
    check_engram(t, &b);
    /* DSpark: 4 experts each; stage 0 main_proj over 3 target layers; the last one's heads */
    const struct dsv4_layer_w *S = b.w.dspark;
    CHECK(S[0].n_exp == 4 && S[1].n_exp == 4 && L[0].n_exp == 8 && S[0].main_proj.n_in == 3 * 256 && S[0].main_norm);
    CHECK(S[1].main_proj.n_out == 0 && S[1].mtp_norm && S[1].markov_embed && S[1].markov_head.n_out == 2048);
    CHECK(S[1].confidence.n_out == 1 && S[1].confidence.n_in == 256 + 32 && !S[0].markov_embed);
    bound_close(&b);
}

/* The checkpoint gen writes has exactly the tensors and bytes stats_v41.c counts from the
 * config (two independent walks of the same model.py shapes). */
void test_v41_gen_sizes(struct test_ctx *t)
{
    struct bound b;
    if (!gen_bound(t, "v41-sizes", &b)) return;
    struct dsv4_v41_sizes s;
    dsv4_v41_sizes(&b.cfg, &s);
    uint64_t bytes = 0, engram = 0, dspark = 0;
    for (size_t i = 0; i < b.ck.n_tensors; i++) {
        const struct dsv4_tensor *tt = &b.ck.tensors[i];
        bytes += tt->nbytes;
        if (strstr(tt->name, ".engram.embed.")) engram += tt->nbytes;
        if (!strncmp(tt->name, "mtp.", 4)) dspark += tt->nbytes;
    }
    CHECKF(b.ck.n_tensors == s.n_tensors && bytes == s.bytes, "gen: %zu tensors %llu bytes, stats: %llu %llu",
           b.ck.n_tensors, (unsigned long long)bytes, (unsigned long long)s.n_tensors, (unsigned long long)s.bytes);
    CHECKF(engram == s.engram_bytes && engram == (4062 + 4152) * (64 + 2), "engram %llu, stats %llu",
           (unsigned long long)engram, (unsigned long long)s.engram_bytes);
    CHECKF(dspark == s.dspark_bytes, "dspark %llu, stats %llu", (unsigned long long)dspark,
           (unsigned long long)s.dspark_bytes);
    bound_close(&b);
}

/* The dsv4 binary to run, with the tiny-v41 checkpoint written into tmpdir/name; NULL when
 * either is missing. */
static const char *gen_for_cli(struct test_ctx *t, const char *name, char *dir, size_t n)
{
    const char *bin = getenv("DSV4_BIN");
    CHECKF(bin != NULL, "DSV4_BIN not set (run through make test)");
    struct gen_opts o;
    gen_opts_default(&o);
    return bin && gen_v41(t, &o, name, dir, n) ? bin : NULL;
}

/* Runs `dsv4 inspect -m dir` after shell, expecting a non-zero exit and want in the output. */
static void inspect_fails_with(struct test_ctx *t, const char *bin, const char *dir, const char *shell,
                               const char *want)
{
    char cmd[3000], *out = NULL;
    snprintf(cmd, sizeof(cmd), "%s && %s inspect -m %s", shell, bin, dir);
    int rc = test_run(cmd, &out);
    CHECKF(rc != 0 && out && strstr(out, want), "%s: exit %d (want \"%s\"):\n%s", shell, rc, want, out);
    free(out);
}

/* Without engram_token_map.json the map is computed from tokenizer.json (here the test
 * checkpoint's, whose compressed vocab is not this config's, so the count is refused, the
 * source named); with neither file, inspect says so. Leaves dir without either. */
static void test_v41_inspect_map_sources(struct test_ctx *t, const char *bin, const char *dir)
{
    char shell[1400];
    snprintf(shell, sizeof(shell), "rm %s/engram_token_map.json && cp models/kjv-v4-tiny/tokenizer.json %s/",
             dir, dir);
    inspect_fails_with(t, bin, dir, shell, "the tokenizer gives 3578 compressed ids, the config's "
                       "engram_compressed_vocab_size is 1536");
    snprintf(shell, sizeof(shell), "rm %s/tokenizer.json", dir);
    inspect_fails_with(t, bin, dir, shell, "no engram_token_map.json and no tokenizer.json");
}

/* `dsv4 inspect -m` validates the checkpoint and describes it, the Engram tables apart. */
void test_v41_inspect(struct test_ctx *t)
{
    char        dir[512], cmd[1024], *out = NULL;
    const char *bin = gen_for_cli(t, "v41-inspect", dir, sizeof(dir));
    if (!bin) return;
    snprintf(cmd, sizeof(cmd), "%s inspect -m %s", bin, dir);
    int rc = test_run(cmd, &out);
    CHECKF(rc == 0 && strstr(out, "DeepSeek-V4.1, 8 layers + 2 DSpark stages") && strstr(out, "Engram tables 0.5 MiB") &&
               strstr(out, "from engram_token_map.json: 2048 token ids -> 1536 compressed ids") &&
               strstr(out, "ok: every tensor present"),
           "inspect -m exit %d:\n%s", rc, out);
    free(out);
    snprintf(cmd, sizeof(cmd), "%s inspect -m %s --json", bin, dir);
    rc = test_run(cmd, &out);
    json_error_t je;
    json_t      *j = rc == 0 ? json_loads(out, 0, &je) : NULL;
    CHECKF(j != NULL, "inspect -m --json exit %d:\n%s", rc, out);
    free(out);
    if (!j) return;
    json_t *sz = json_object_get(j, "config_sizes");
    CHECK(json_is_true(json_object_get(j, "ok")) && json_is_true(json_object_get(j, "dspark_available")));
    CHECK(json_integer_value(json_object_get(j, "bytes")) == json_integer_value(json_object_get(sz, "bytes")));
    CHECK(json_integer_value(json_object_get(j, "engram_bytes")) == (4062 + 4152) * 66);
    CHECK(json_array_size(json_object_get(j, "problems")) == 0 && json_array_size(json_object_get(j, "layers")) == 10);
    const char *src = json_string_value(json_object_get(json_object_get(j, "token_map"), "source"));
    CHECK(src && !strcmp(src, "engram_token_map.json"));
    json_decref(j);
    test_v41_inspect_map_sources(t, bin, dir);
}

/* Each corruption is refused by the binder and by `dsv4 inspect -m`, the tensor named. */
void test_v41_corrupted(struct test_ctx *t)
{
    const char *bin = getenv("DSV4_BIN");
    struct {
        const char *name, *drop, *shape, *dtype, *extra, *want;
    } cases[] = {
        { "v41-no-engram-scale", "layers.5.engram.embed.scale", NULL, NULL, NULL, "missing" },
        { "v41-scale-shape", NULL, "layers.2.attn.wq_a.scale", NULL, NULL, "shape [5, 8], expected [4, 8]" },
        { "v41-head-dtype", NULL, NULL, "mtp.1.markov_head.head.weight", NULL, "dtype F16, expected BF16" },
        { "v41-extra", NULL, NULL, NULL, "layers.3.attn.compressor.wkv.weight", "unexpected" },
        { "v41-no-wgate-at-1", NULL, NULL, NULL, "layers.4.attn.compressor.wgate.weight", "unexpected" },
        { "v41-dspark-partial", "mtp.0.main_proj.scale", NULL, NULL, NULL, "missing" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char     *named = cases[i].drop ? cases[i].drop : cases[i].shape ? cases[i].shape
                              : cases[i].dtype ? cases[i].dtype : cases[i].extra;
        struct gen_opts o;
        char            dir[512];
        gen_opts_default(&o);
        o.drop_tensor  = cases[i].drop;
        o.bad_shape    = cases[i].shape;
        o.bad_dtype    = cases[i].dtype;
        o.extra_tensor = cases[i].extra;
        if (!gen_v41(t, &o, cases[i].name, dir, sizeof(dir))) continue;
        struct bound    b;
        struct dsv4_err err;
        int             rc = bound_open(&b, dir, &err);
        CHECKF(rc == DSV4_ECHECKPOINT && b.rep.n_problems == 1 && report_has(&b.rep, named, cases[i].want),
               "%s: rc %d, %d problems (first: %s)", cases[i].name, rc, b.rep.n_problems,
               b.rep.n_problems ? b.rep.problems[0].text : err.msg);
        CHECK(!b.w.has_mtp == (i == 2 || i == 5));
        bound_close(&b);
        char cmd[1024], *out = NULL;
        snprintf(cmd, sizeof(cmd), "%s inspect -m %s", bin ? bin : "false", dir);
        rc = test_run(cmd, &out);
        CHECKF(rc == 1 && strstr(out, named) && strstr(out, cases[i].want) && strstr(out, "1 problem"),
               "%s: inspect exit %d:\n%s", cases[i].name, rc, out);
        free(out);
    }
}

/* A VL release (config with a vision_config): the routers' bias_vl and the image delimiters
 * are expected, the vision tower's tensors accepted by name; without one they are unexpected. */
void test_v41_vision(struct test_ctx *t)
{
    struct gen_opts o;
    char            dir[512];
    gen_opts_default(&o);
    o.extra_tensor = "vision.patch_embed.weight";
    if (!gen_v41(t, &o, "v41-vision", dir, sizeof(dir))) return;
    struct bound    b;
    struct dsv4_err err;
    CHECK(bound_open(&b, dir, &err) == DSV4_ECHECKPOINT && b.rep.n_problems == 1 && b.rep.n_unexpected == 1 &&
          report_has(&b.rep, "vision.patch_embed.weight", "unexpected"));
    bound_close(&b);
    char path[600];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    json_error_t je;
    json_t      *c = json_load_file(path, 0, &je);
    CHECK(c != NULL);
    if (!c) return;
    json_object_set_new(c, "vision_config", json_pack("{s:i}", "num_hidden_layers", 1));
    CHECK(json_dump_file(c, path, 0) == 0);
    json_decref(c);
    int rc = bound_open(&b, dir, &err);
    CHECKF(rc == DSV4_ECHECKPOINT && b.rep.n_vision == 1 && b.rep.n_unexpected == 0 && b.rep.n_missing == 13 &&
               report_has(&b.rep, "layers.0.ffn.gate.bias_vl", "missing") &&
               report_has(&b.rep, "mtp.1.ffn.gate.bias_vl", "missing") && report_has(&b.rep, "image_newline", "missing"),
           "rc %d, %d problems, %d vision (first: %s)", rc, b.rep.n_problems, b.rep.n_vision,
           b.rep.n_problems ? b.rep.problems[0].text : err.msg);
    bound_close(&b);
}

/* `logits --dspark-out` writes [T-1, B, vocab + 1] floats and `--mtp-out` (V4's MTP rows) is
 * refused with the reason; `dsv4 convert` is refused before any shard is read (no crash). */
void test_v41_cli_dspark(struct test_ctx *t)
{
    char        dir[512], cmd[2400], path[600], *out = NULL;
    const char *bin = gen_for_cli(t, "v41-logits", dir, sizeof(dir));
    if (!bin) return;
    snprintf(cmd, sizeof(cmd), "%s logits -m %s --tokens 1,2,3,4 --out %s/l.bin --dspark-out %s/d.bin", bin, dir, dir,
             dir);
    int rc = test_run(cmd, &out);
    CHECKF(rc == 0, "logits --dspark-out exit %d:\n%s", rc, out);
    free(out);
    snprintf(path, sizeof(path), "%s/d.bin", dir);
    FILE *f = fopen(path, "rb");
    long  n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (f) fclose(f);
    CHECKF(n == (long)sizeof(float) * 3 * 3 * (2048 + 1), "--dspark-out wrote %ld bytes (3 rows of 3 x 2049 floats)", n);
    snprintf(cmd, sizeof(cmd), "%s logits -m %s --tokens 1,2,3 --out %s/l.bin --mtp-out %s/m.bin", bin, dir, dir, dir);
    rc = test_run(cmd, &out);
    CHECKF(rc != 0 && rc < 128 && strstr(out, "DeepSeek-V4.1 has no MTP rows"), "logits --mtp-out exit %d:\n%s", rc,
           out);
    free(out);
    snprintf(cmd, sizeof(cmd), "%s convert -m %s -o %s-converted", bin, dir, dir);
    rc = test_run(cmd, &out);
    CHECKF(rc != 0 && rc < 128 && strstr(out, "`dsv4 convert` is not implemented yet"), "convert exit %d:\n%s", rc,
           out);
    free(out);
    /* the revisions are the first V4 demo's: a V4.1 checkpoint refuses them */
    snprintf(cmd, sizeof(cmd), "%s logits -m %s --tokens 1,2,3 --out %s/l.bin --revision initial", bin, dir, dir);
    rc = test_run(cmd, &out);
    CHECKF(rc != 0 && rc < 128 && strstr(out, "DeepSeek-V4.1 checkpoint has only its own code"), "revision exit %d:\n%s",
           rc, out);
    free(out);
}

bool test_v41_refused_here(struct test_ctx *t, struct dsv4_engine *e)
{
    const struct dsv4_model *m = dsv4_engine_model(e);
    if (m->cfg.arch != DSV4_ARCH_V4_1 || m->backend->host_visible) return false;
    dsv4_session   *s  = NULL;
    struct dsv4_err err;
    int32_t         tok = 1;
    int             rc  = dsv4_session_create(e, NULL, &s, &err);
    if (rc == DSV4_OK) rc = dsv4_session_eval(s, &tok, 1, NULL, NULL, NULL, &err);
    CHECKF(rc == DSV4_EUNSUPPORTED && strstr(err.msg, "CPU backend only"), "V4.1 on %s: rc %d (%s)", m->backend->name,
           rc, rc ? err.msg : "ran");
    dsv4_session_free(s);
    return true;
}
