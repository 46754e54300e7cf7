/*
 * test_mpi.c - expert parallelism over MPI (src/dist/ep.h, docs/DISTRIBUTED.md): `dsv4
 * logits` under `mpirun -np N ... --ep N` writes the same bytes as one process, on tiny-a,
 * tiny-b and the demo model, both revisions, prefill and decode, both dispatches, 2 and 3
 * ranks, on the CPU and on backends the host cannot read (cpu-staged, Vulkan); each rank
 * holds only its experts; the wrong rank counts are refused with the fix;
 * a rank that dies ends the job (no hang); a served request survives a SIGTERM (drain).
 * The server tests run whole under mpirun too: `run_tests --mpi 2 server` (.ci/run).
 *
 * Every run uses TCP on loopback (--mca btl self,tcp: no shared memory, as between nodes)
 * and --oversubscribe (more ranks than this machine's cores).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support/gen.h"
#include "test_cases.h"
#include "test_server_util.h"

#define MPIRUN "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --mca btl self,tcp"

/* Sanitizer builds leave MPI out (Makefile: the MPI library's allocations at load are not
 * ours to report): there every test here is a skip of this build, not of a missing package. */
static bool mpi_built(struct test_ctx *t)
{
    if (DSV4_HAVE_MPI) return true;
    test_skip(t, TEST_SKIP_MACHINE, "this sanitizer build has no MPI (Makefile: MPI)");
    return false;
}

static bool gen_model(struct test_ctx *t, const char *preset, char *dir, size_t n)
{
    snprintf(dir, n, "%s/mpi-%s", t->tmpdir, preset);
    if (access(dir, F_OK) == 0) return true;
    struct gen_opts o;
    gen_opts_default(&o);
    o.preset = preset;
    o.seed   = 29;
    o.quiet  = true;
    struct dsv4_err err;
    int             rc = gen_checkpoint(&o, dir, &err);
    CHECKF(rc == DSV4_OK, "gen %s: %s", preset, err.msg);
    return rc == DSV4_OK;
}

/* Whether two files hold the same bytes (and exist). */
static bool same_file(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    char  *x = test_read_file(a, &na), *y = test_read_file(b, &nb);
    bool   same = x && y && na == nb && na > 0 && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

/* `dsv4 logits` of T tokens on dir, alone and under mpirun with `ranks` ranks: the logits
 * (and the MTP head's, where the checkpoint has one) must be the same bytes. */
static void logits_same(struct test_ctx *t, const char *dir, const char *opts, int ranks, const char *dispatch)
{
    const char *bin = getenv("DSV4_BIN");
    char        cmd[2400], one[400], many[400], mtp1[400], mtpn[400], *out = NULL;
    static int  serial;
    int         k = serial++;
    snprintf(one, sizeof(one), "%s/mpi-one-%d.bin", t->tmpdir, k);
    snprintf(many, sizeof(many), "%s/mpi-many-%d.bin", t->tmpdir, k);
    snprintf(mtp1, sizeof(mtp1), "%s/mpi-mtp1-%d.bin", t->tmpdir, k);
    snprintf(mtpn, sizeof(mtpn), "%s/mpi-mtpn-%d.bin", t->tmpdir, k);
    const char *toks = "5,17,300,2,99,1023,44,8,600,31,77,1500,12,13,14,15,900,1,2,3,4,5,6,7,8,9,10,11,250,251,252,"
                       "253,254,255,256,257,400,401,402,403,404,405,406,407,408,409,410";
    snprintf(cmd, sizeof(cmd), "'%s' logits -m %s --tokens %s --out %s --mtp-out %s --threads 1 %s 2>&1", bin, dir,
             toks, one, mtp1, opts);
    CHECKF(test_run(cmd, &out) == 0, "one process: %s", out ? out : "");
    free(out);
    snprintf(cmd, sizeof(cmd),
             MPIRUN " -np %d '%s' logits -m %s --tokens %s --out %s --mtp-out %s --threads 1 %s --ep %d "
                    "--ep-dispatch %s 2>&1",
             ranks, bin, dir, toks, many, mtpn, opts, ranks, dispatch);
    out = NULL;
    int rc = test_run(cmd, &out);
    CHECKF(rc == 0, "mpirun -np %d: %s", ranks, out ? out : "");
    free(out);
    CHECKF(same_file(one, many), "%s %s, %d ranks, %s dispatch: logits differ from one process", dir, opts, ranks,
           dispatch);
    CHECKF(same_file(mtp1, mtpn), "%s %s, %d ranks, %s dispatch: MTP logits differ from one process", dir, opts,
           ranks, dispatch);
}

static void test_logits_bit_identical(struct test_ctx *t)
{
    if (!mpi_built(t)) return;
    char a[300], b[300];
    if (!gen_model(t, "tiny-a", a, sizeof(a)) || !gen_model(t, "tiny-b", b, sizeof(b))) return;
    /* prefill (one call), decode (--chunk 1), chunks across the compression blocks (--chunk 5) */
    static const char *const chunking[] = { "", "--chunk 1", "--chunk 5" };
    for (int m = 0; m < 2; m++)
        for (int rev = 0; rev < 2; rev++)
            for (int c = 0; c < 3; c++) {
                char opts[96];
                snprintf(opts, sizeof(opts), "--revision %s %s", rev ? "initial" : "current", chunking[c]);
                int ranks = 2 + (m + rev + c) % 2;
                logits_same(t, m ? b : a, opts, ranks, (rev + c) % 2 ? "tokens" : "rows");
            }
}

static void test_demo_model_identical(struct test_ctx *t)
{
    if (!mpi_built(t)) return;
    logits_same(t, "models/kjv-v4-tiny", "", 2, "rows");
    logits_same(t, "models/kjv-v4-tiny", "--chunk 1", 3, "tokens");
}

/* On a backend whose memory the host cannot read the rows go through host copies
 * (src/dist/ep_stage.c): cpu-staged, and Vulkan where a device exists (lavapipe here). */
static void test_device_backends_identical(struct test_ctx *t)
{
    if (!mpi_built(t)) return;
    char dir[300];
    if (!gen_model(t, "tiny-b", dir, sizeof(dir))) return;
    logits_same(t, dir, "--backend cpu-staged", 3, "rows");
    logits_same(t, dir, "--backend cpu-staged --chunk 1", 2, "tokens");
    if (!test_need_backend(t, "vulkan")) return;
    logits_same(t, dir, "--backend vulkan", 2, "rows");
    logits_same(t, dir, "--backend vulkan --chunk 3", 3, "tokens");
}

/* What the ranks say they hold (DSV4_LOG=info): each rank's experts, and only rank 0 the
 * trunk; the experts' bytes split across them. */
static void test_each_rank_holds_its_part(struct test_ctx *t)
{
    if (!mpi_built(t)) return;
    char dir[300], cmd[1200], *out = NULL;
    if (!gen_model(t, "tiny-b", dir, sizeof(dir))) return;
    snprintf(cmd, sizeof(cmd),
             "DSV4_LOG=info " MPIRUN " -np 3 '%s' logits -m %s --tokens 1,2,3 --out %s/held.bin --threads 1 --ep 3 2>&1",
             getenv("DSV4_BIN"), dir, t->tmpdir);
    CHECKF(test_run(cmd, &out) == 0, "%s", out ? out : "");
    double held[3] = { 0 };
    int    lo[3] = { -1, -1, -1 }, hi[3] = { -1, -1, -1 };
    for (int r = 0; r < 3 && out; r++) {
        char key[64];
        snprintf(key, sizeof(key), "MPI rank %d: routed experts [", r);
        const char *at = strstr(out, key);
        CHECKF(at != NULL, "no line for rank %d in: %s", r, out);
        if (!at) continue;
        CHECK(sscanf(at + strlen(key), "%d, %d)", &lo[r], &hi[r]) == 2);
        const char *h = strstr(at, "GB of the checkpoint held");
        const char *c = h ? h : at;
        while (c > at && c[-1] != ' ') c--;
        while (c > at && c[-1] == ' ') c--;
        while (c > at && c[-1] != ' ') c--;
        if (h) held[r] = atof(c);
        CHECKF((r == 0) == (strstr(at, "and the trunk") != NULL && strstr(at, "and the trunk") < strchr(at, '\n')),
               "rank %d and the trunk: %.120s", r, at);
    }
    /* tiny-b: 8 experts over 3 ranks */
    CHECK(lo[0] == 0 && hi[0] == lo[1] && hi[1] == lo[2] && hi[2] == 8);
    CHECKF(held[1] > 0 && held[2] > 0 && held[0] > 4 * held[1], "held: %.4f %.4f %.4f GB", held[0], held[1], held[2]);
    free(out);
}

/* dsv4 bench under mpirun: each rank's read bandwidth, measured at once, and what went
 * through MPI per prefill and decode row. */
static void test_bench_per_rank(struct test_ctx *t)
{
    if (!mpi_built(t)) return;
    char dir[300], cmd[1200], *out = NULL;
    if (!gen_model(t, "tiny-b", dir, sizeof(dir))) return;
    snprintf(cmd, sizeof(cmd),
             MPIRUN " -np 2 '%s' bench -m %s --ep 2 --ctx-list 16 --batch-list 1 --decode-steps 2 --threads 1 2>&1",
             getenv("DSV4_BIN"), dir);
    CHECKF(test_run(cmd, &out) == 0, "%s", out ? out : "");
    const char *bw = out ? strstr(out, "read bandwidth per MPI rank") : NULL;
    double      r0 = 0, r1 = 0;
    CHECKF(bw && sscanf(strstr(bw, "rank 0 "), "rank 0 %lf GB/s, rank 1 %lf", &r0, &r1) == 2 && r0 > 0 && r1 > 0,
           "no per-rank bandwidth in: %s", out ? out : "");
    CHECKF(out && strstr(out, "prefill MPI, 2 ranks:") && strstr(out, "decode  MPI, 2 ranks:"),
           "no MPI figures in: %s", out ? out : "");
    free(out);
}

static void test_rank_counts_refused(struct test_ctx *t)
{
    if (!mpi_built(t)) return;
    const char *bin = getenv("DSV4_BIN");
    char        cmd[1200], *out = NULL;
    struct {
        const char *launch, *ep, *says;
    } cases[] = {
        { "", "--ep 2", "start it with mpirun -np 2" },
        { MPIRUN " -np 2", "", "give --ep" },
        { MPIRUN " -np 3", "--ep 2", "mpirun started 3 ranks" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(cmd, sizeof(cmd), "%s '%s' logits -m models/kjv-v4-tiny --tokens 1,2 --out %s/refused.bin %s 2>&1",
                 cases[i].launch, bin, t->tmpdir, cases[i].ep);
        out    = NULL;
        int rc = test_run(cmd, &out);
        CHECKF(rc != 0 && out && strstr(out, cases[i].says), "case %zu: rc %d, output: %s", i, rc, out ? out : "");
        free(out);
    }
}

/* `dsv4 serve` on tiny-a with a tokenizer, under mpirun on 2 ranks. */
static bool serve_on_two_ranks(struct test_ctx *t, struct tsrv *s)
{
    char            dir[300];
    struct dsv4_err err;
    if (!gen_model(t, "tiny-a", dir, sizeof(dir))) return false;
    CHECKF(tsrv_write_tokenizer(dir, 2048, &err) == DSV4_OK, "%s", err.msg);
    return tsrv_start_mpi(t, s, dir, "", 2);
}

/* A rank killed mid-generation ends the job: mpirun exits, with an error, within seconds. */
static void test_dead_rank_ends_the_job(struct test_ctx *t)
{
    if (!mpi_built(t)) return;
    struct tsrv s;
    if (!serve_on_two_ranks(t, &s)) return;
    pid_t r1 = tsrv_mpi_rank_pid(s.pid, 1);
    CHECKF(r1 > 0, "rank 1 not found under mpirun %d", (int)s.pid);
    if (r1 > 0) kill(r1, SIGKILL);
    /* no signal from us: mpirun ends the job by itself */
    int rc = tsrv_stop(&s, 0, 30);
    CHECKF(rc != -1, "mpirun still running 30 s after rank 1 died");
    CHECKF(rc != 0, "mpirun exited 0 after a rank died");
}

static void test_drain_under_mpirun(struct test_ctx *t)
{
    if (!mpi_built(t)) return;
    struct tsrv s;
    if (!serve_on_two_ranks(t, &s)) return;
    json_t *r = NULL;
    int     st = tsrv_post(&s, "/v1/completions", "{\"prompt\":\"abc\",\"max_tokens\":5,\"temperature\":0}", NULL, &r);
    CHECKF(st == 200, "status %d", st);
    json_decref(r);
    int rc = tsrv_stop(&s, SIGTERM, 60);
    CHECKF(rc == 0, "mpirun exit status %d after SIGTERM to rank 0 (log %s)", rc, s.log);
}

const struct test_case test_group_mpi[] = {
    { "logits_bit_identical", test_logits_bit_identical, TEST_NEEDS_MPI },
    { "demo_model_identical", test_demo_model_identical, TEST_NEEDS_MPI },
    { "device_backends_identical", test_device_backends_identical, TEST_NEEDS_MPI },
    { "each_rank_holds_its_part", test_each_rank_holds_its_part, TEST_NEEDS_MPI },
    { "bench_per_rank", test_bench_per_rank, TEST_NEEDS_MPI },
    { "rank_counts_refused", test_rank_counts_refused, TEST_NEEDS_MPI },
    { "dead_rank_ends_the_job", test_dead_rank_ends_the_job, TEST_NEEDS_MPI },
    { "drain_under_mpirun", test_drain_under_mpirun, TEST_NEEDS_MPI },
    { NULL, NULL },
};
