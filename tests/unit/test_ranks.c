/*
 * test_ranks.c - the memory plan of expert parallelism (src/model/rank_plan.h) and
 * `dsv4 inspect --ranks N` / `--config FILE`: every routed expert's bytes on exactly its
 * owner rank and summing to the single process's, every other byte on rank 0, the tensors
 * a config implies equal to those a generated checkpoint of it stores, the official Flash and
 * Pro configs giving the published tensor counts and sizes, and bad input refused.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "model/rank_plan.h"
#include "model/runtime.h"
#include "support/gen.h"
#include "test_cases.h"

/* A generated tiny-a (E = 8) in the run's directory, once. */
static const char *tiny_dir(struct test_ctx *t)
{
    static char dir[512];
    if (dir[0]) return dir;
    snprintf(dir, sizeof(dir), "%s/ranks-tiny-a", t->tmpdir);
    struct gen_opts o;
    gen_opts_default(&o);
    o.quiet = true;
    struct dsv4_err err;
    CHECKF(gen_checkpoint(&o, dir, &err) == DSV4_OK, "gen: %s", err.msg);
    return dir;
}

static bool open_tiny(struct test_ctx *t, struct dsv4_config *c, struct dsv4_checkpoint *ck)
{
    struct dsv4_err err;
    const char     *dir = tiny_dir(t);
    bool            ok  = dsv4_config_load(c, dir, &err) == DSV4_OK && dsv4_checkpoint_open(ck, dir, &err) == DSV4_OK;
    CHECKF(ok, "%s", err.msg);
    return ok;
}

/* Each rank's experts [e0, e1) cover [0, E) in order; a tensor's bytes land on its expert's
 * owner; ranks 1.. hold expert bytes only; the sums are the checkpoint's. */
static void test_split(struct test_ctx *t)
{
    struct dsv4_config     c;
    struct dsv4_checkpoint ck;
    if (!open_tiny(t, &c, &ck)) return;
    uint64_t all = 0, experts = 0;
    for (size_t i = 0; i < ck.n_tensors; i++) {
        all += ck.tensors[i].nbytes;
        if (strstr(ck.tensors[i].name, ".ffn.experts.")) experts += ck.tensors[i].nbytes;
    }
    CHECK(experts > 0 && experts < all);
    for (int n = 1; n <= c.n_exp; n++) {
        struct dsv4_rank_params p = { n, 64, 1, 16 };
        struct dsv4_rank_mem    mem[64];
        dsv4_rank_mem_init(&c, &p, mem);
        for (size_t i = 0; i < ck.n_tensors; i++)
            dsv4_rank_add_tensor(&c, &p, mem, ck.tensors[i].name, ck.tensors[i].nbytes);
        uint64_t w = 0, ex = 0;
        for (int r = 0; r < n; r++) {
            CHECKF(mem[r].e0 == (r ? mem[r - 1].e1 : 0) && mem[r].e1 > mem[r].e0, "N=%d rank %d: [%d, %d)", n, r,
                   mem[r].e0, mem[r].e1);
            if (r) CHECKF(mem[r].weights == mem[r].experts, "N=%d: rank %d holds non-expert bytes", n, r);
            w += mem[r].weights;
            ex += mem[r].experts;
        }
        CHECKF(mem[n - 1].e1 == c.n_exp, "N=%d: experts end at %d", n, mem[n - 1].e1);
        CHECKF(w == all && ex == experts, "N=%d: %llu/%llu bytes, %llu/%llu expert bytes", n,
               (unsigned long long)w, (unsigned long long)all, (unsigned long long)ex, (unsigned long long)experts);
        CHECKF(mem[0].weights - mem[0].experts == all - experts, "N=%d: rank 0 lacks non-expert bytes", n);
        /* one expert's tensor goes to the rank whose range holds it */
        for (int e = 0; e < c.n_exp; e++) {
            struct dsv4_rank_mem one[64];
            char                 name[96];
            dsv4_rank_mem_init(&c, &p, one);
            snprintf(name, sizeof(name), "mtp.0.ffn.experts.%d.w2.scale", e);
            dsv4_rank_add_tensor(&c, &p, one, name, 1);
            for (int r = 0; r < n; r++)
                CHECKF(one[r].weights == (uint64_t)(e >= one[r].e0 && e < one[r].e1), "N=%d expert %d rank %d", n, e,
                       r);
        }
    }
    dsv4_checkpoint_close(&ck);
}

struct seen {
    const struct dsv4_checkpoint *ck;
    size_t                        n, bad;
    char                          first[200];
};

static void check_one(void *ud, const char *name, enum dsv4_dtype dt, int ndim, const int64_t shape[2])
{
    struct seen              *s = ud;
    const struct dsv4_tensor *t = dsv4_checkpoint_find(s->ck, name);
    s->n++;
    if (t && t->dtype == dt && t->ndim == ndim && t->shape[0] == shape[0] && (ndim < 2 || t->shape[1] == shape[1]))
        return;
    if (!s->bad++) snprintf(s->first, sizeof(s->first), "%s", name);
}

/* dsv4_weights_layout lists exactly the tensors gen wrote, with their dtypes and shapes. */
static void test_layout_matches_gen(struct test_ctx *t)
{
    struct dsv4_config     c;
    struct dsv4_checkpoint ck;
    struct dsv4_err        err;
    if (!open_tiny(t, &c, &ck)) return;
    struct seen s = { .ck = &ck };
    CHECKF(dsv4_weights_layout(&c, true, check_one, &s, &err) == DSV4_OK, "%s", err.msg);
    size_t stored = 0;
    for (size_t i = 0; i < ck.n_tensors; i++)
        stored += strncmp(ck.tensors[i].name, DSV4_ST_PAD_PREFIX, strlen(DSV4_ST_PAD_PREFIX)) != 0;
    CHECKF(s.bad == 0 && s.n == stored, "layout %zu tensors, checkpoint %zu, %zu differ (first %s)", s.n, stored,
           s.bad, s.first);
    dsv4_checkpoint_close(&ck);
}

/* The repack per rank sums to what the CPU backend really did at load: the tiles it
 * allocated less the checkpoint bytes they replaced (both 0 on a level without tiles). */
static void test_repack_matches_load(struct test_ctx *t)
{
    struct dsv4_engine_params ep;
    dsv4_engine_params_default(&ep);
    ep.n_threads = 2;
    dsv4_engine    *e;
    struct dsv4_err err;
    if (dsv4_engine_open(&e, tiny_dir(t), &ep, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    struct dsv4_model *m = (struct dsv4_model *)dsv4_engine_model(e);
    CHECK(!strcmp(m->backend->name, "cpu"));
    const struct dsv4_cpu  *cpu = m->backend_impl;
    struct dsv4_rank_params p   = { 3, 64, 1, 16 };
    struct dsv4_rank_mem    mem[3];
    dsv4_rank_mem_init(&m->cfg, &p, mem);
    dsv4_rank_add_repack(&m->cfg, &p, mem, &m->w, &m->ck, m->backend, m->backend_impl);
    int64_t sum = mem[0].repack + mem[1].repack + mem[2].repack;
    CHECKF(sum == (int64_t)cpu->tiles_bytes - (int64_t)cpu->replaced, "repack %lld, load: tiles %zu - replaced %zu",
           (long long)sum, cpu->tiles_bytes, cpu->replaced);
    if (!cpu->tiles_bytes) test_not_here(t, "tiles (repack checked as 0 only)");
    dsv4_engine_close(e);
}

static json_t *run_json(struct test_ctx *t, const char *cmd, int want_rc)
{
    char *out = NULL;
    int   rc  = test_run(cmd, &out);
    json_error_t je;
    json_t      *j = out ? json_loads(out, 0, &je) : NULL;
    CHECKF(rc == want_rc && j, "%s: exit %d:\n%s", cmd, rc, out ? out : "");
    free(out);
    return j;
}

static uint64_t field(json_t *o, const char *k)
{
    return (uint64_t)json_integer_value(json_object_get(o, k));
}

/* -m and --config on the same model: the same bytes on every rank; the experts' sum is
 * the single process's. */
static void test_cli_same_totals(struct test_ctx *t)
{
    const char *bin = getenv("DSV4_BIN");
    CHECKF(bin != NULL, "DSV4_BIN not set (run through make test)");
    if (!bin) return;
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "%s inspect -m %s --ranks 3 --ctx 256 --json", bin, tiny_dir(t));
    json_t *a = run_json(t, cmd, 0);
    snprintf(cmd, sizeof(cmd), "%s inspect --config %s/config.json --ranks 3 --ctx 256 --json", bin, tiny_dir(t));
    json_t *b = run_json(t, cmd, 0);
    json_t *ra = json_object_get(a, "ranks"), *rb = json_object_get(b, "ranks");
    json_t *pa = json_object_get(ra, "per_rank"), *pb = json_object_get(rb, "per_rank");
    CHECK(json_array_size(pa) == 3 && json_array_size(pb) == 3);
    uint64_t ex = 0, w = 0;
    for (size_t r = 0; r < json_array_size(pa) && r < json_array_size(pb); r++) {
        json_t *x = json_array_get(pa, r), *y = json_array_get(pb, r);
        CHECKF(field(x, "weights_bytes") == field(y, "weights_bytes") && field(x, "kv_bytes") == field(y, "kv_bytes") &&
                   field(x, "scratch_bytes") == field(y, "scratch_bytes"),
               "rank %zu: -m and --config differ", r);
        CHECK(field(x, "scratch_bytes") > 0 && (r == 0) == (field(x, "kv_bytes") > 0));
        ex += field(x, "expert_bytes");
        w += field(x, "weights_bytes");
    }
    json_t *sa = json_object_get(ra, "single_process");
    CHECK(ex == field(sa, "expert_bytes") && w == field(sa, "weights_bytes") && w == field(a, "bytes"));
    CHECK(field(b, "bytes") == field(a, "bytes"));
    CHECK(json_is_integer(json_object_get(sa, "repack_bytes")));
    CHECK(json_is_null(json_object_get(json_object_get(rb, "single_process"), "repack_bytes")));
    json_decref(a);
    json_decref(b);
}

/* The official configs imply the published checkpoints (docs/MODEL.md §R2.1): tensor counts
 * exactly, bytes 159.6 and 864.7 GB to the stated digit. */
static void test_official_configs(struct test_ctx *t)
{
    (void)t;
    const char *bin = getenv("DSV4_BIN");
    if (!bin) return;
    const char *files[] = { "models/configs/v4-flash.json", "models/configs/v4-pro.json" };
    const long  tensors[] = { 69187, 145116 };
    const double gb[]     = { 159.6, 864.7 };
    for (int i = 0; i < 2; i++) {
        char cmd[600];
        snprintf(cmd, sizeof(cmd), "%s inspect --config %s --ranks 8 --ctx 65536 --json", bin, files[i]);
        json_t *j = run_json(t, cmd, 0);
        double  g = (double)field(j, "bytes") / 1e9;
        CHECKF(field(j, "tensors") == (uint64_t)tensors[i] && g > gb[i] - 0.05 && g < gb[i] + 0.05,
               "%s: %llu tensors, %.2f GB", files[i], (unsigned long long)field(j, "tensors"), g);
        json_decref(j);
    }
}

/* Bad input: a clear message, a non-zero exit, no crash. */
static void test_bad_input(struct test_ctx *t)
{
    const char *bin = getenv("DSV4_BIN");
    if (!bin) return;
    struct {
        const char *args, *msg;
        int         rc;
    } cases[] = {
        { "-m @ --ranks 0", "--ranks must be an integer in [1,", 2 },
        { "-m @ --ranks 9", "--ranks 9 outside [1, 8]", 1 },
        { "--config @/config.json --ranks 9", "--ranks 9 outside [1, 8]", 1 },
        { "--config @/none.json --ranks 2", "none.json", 1 },
        { "--config @/config.json --ctx 5000", "--ctx 5000 outside [1, 4096]", 1 },
        { "--config @/config.json -m @", "exclude each other", 2 },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char        args[1400], cmd[1600], *out = NULL;
        size_t      k = 0;
        const char *dir = tiny_dir(t);
        for (const char *a = cases[i].args; *a && k + strlen(dir) + 2 < sizeof(args); a++) /* @: the checkpoint */
            k += (size_t)(*a == '@' ? snprintf(args + k, sizeof(args) - k, "%s", dir)
                                    : snprintf(args + k, sizeof(args) - k, "%c", *a));
        args[k] = 0;
        snprintf(cmd, sizeof(cmd), "%s inspect %s", bin, args);
        int rc = test_run(cmd, &out);
        CHECKF(rc == cases[i].rc && out && strstr(out, cases[i].msg), "%s: exit %d (want %d):\n%s", args, rc,
               cases[i].rc, out ? out : "");
        free(out);
    }
}

const struct test_case test_group_ranks[] = {
    { "experts_split_over_ranks", test_split },
    { "layout_from_config_matches_gen", test_layout_matches_gen },
    { "repack_matches_load", test_repack_matches_load },
    { "inspect_m_and_config_agree", test_cli_same_totals },
    { "official_configs_published_sizes", test_official_configs },
    { "bad_input_refused", test_bad_input },
    { NULL, NULL },
};
