/*
 * cli.c - argument helpers shared by the subcommands: the option-table parser and usage
 * printer (cli_parse, cli_usage), the engine and sampling options declared once, numbers,
 * token lists, logging.
 */
#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli.h"

bool cli_parse_int(const char *cmd, const char *opt, const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno       = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "dsv4 %s: %s must be an integer in [%lld, %lld], got '%s'\n", cmd, opt, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

/* A byte count: an integer with an optional K, M, G or T suffix (powers of 1024). */
static bool parse_bytes(const char *cmd, const char *opt, const char *s, double lo, double hi, uint64_t *out)
{
    char              *end;
    errno              = 0;
    unsigned long long v = strtoull(s, &end, 10);
    static const char  units[] = "KMGT";
    const char        *u       = *end ? strchr(units, *end == 'k' ? 'K' : *end) : NULL;
    int                shift   = u ? 10 * (int)(u - units + 1) : 0;
    bool               ok      = !errno && end != s && *s != '-' && (!*end || (u && *u && !end[1]));
    if (ok && shift && v > (~0ull >> shift)) ok = false;
    if (ok) v <<= shift;
    if (!ok || (double)v < lo || (double)v > hi) {
        fprintf(stderr, "dsv4 %s: %s must be a size in bytes (suffix K, M, G or T) in [%.0f, %.0f], got '%s'\n", cmd,
                opt, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_float(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno    = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "dsv4 %s: %s must be a number in [%g, %g], got '%s'\n", cmd, opt, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

/* Returns argv[*i + 1] and advances, or prints a "needs a value" error and returns NULL. */
static const char *cli_value(const char *cmd, int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "dsv4 %s: option %s needs a value\n", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

bool cli_parse_tokens(const char *cmd, const char *text, int32_t **ids, int *n)
{
    size_t   cap = 64, k = 0;
    int32_t *v   = malloc(cap * sizeof(*v));
    const char *p = text;
    if (!v) return false;
    for (;;) {
        while (*p == ',' || *p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
        if (!*p) break;
        char *end;
        errno     = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX ||
            (*end && *end != ',' && *end != ' ' && *end != '\n' && *end != '\r' && *end != '\t')) {
            fprintf(stderr, "dsv4 %s: bad token id near '%.20s' (ids are non-negative integers separated by commas, spaces or newlines)\n", cmd, p);
            free(v);
            return false;
        }
        if (k == cap) {
            int32_t *nv = realloc(v, cap * 2 * sizeof(*v));
            if (!nv) {
                free(v);
                return false;
            }
            v = nv;
            cap *= 2;
        }
        v[k++] = (int32_t)x;
        p      = end;
    }
    if (k == 0) {
        fprintf(stderr, "dsv4 %s: no token ids given\n", cmd);
        free(v);
        return false;
    }
    *ids = v;
    *n   = (int)k;
    return true;
}

bool cli_read_tokens_file(const char *cmd, const char *path, int32_t **ids, int *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "dsv4 %s: cannot open %s: %s\n", cmd, path, strerror(errno));
        return false;
    }
    size_t cap = 4096, len = 0;
    char  *buf = malloc(cap + 1);
    size_t r;
    while (buf && (r = fread(buf + len, 1, cap - len, f)) > 0) {
        len += r;
        if (len == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf) return false;
    buf[len] = 0;
    if (strlen(buf) != len) {
        fprintf(stderr, "dsv4 %s: %s contains NUL bytes\n", cmd, path);
        free(buf);
        return false;
    }
    bool ok = cli_parse_tokens(cmd, buf, ids, n);
    free(buf);
    return ok;
}

bool cli_write_f32(const char *cmd, const char *path, const float *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "dsv4 %s: cannot create %s: %s\n", cmd, path, strerror(errno));
        return false;
    }
    size_t w  = fwrite(data, sizeof(float), n, f);
    int    rc = fclose(f);
    if (w != n || rc != 0) {
        fprintf(stderr, "dsv4 %s: write error on %s\n", cmd, path);
        return false;
    }
    return true;
}

/* Errors and warnings always; informational lines (backend chosen, weights repacked at load)
 * when stderr is a terminal or DSV4_LOG=info; DSV4_LOG=debug adds debug lines. */
static enum dsv4_log_level log_threshold(void)
{
    static int t = -1;
    if (t < 0) {
        const char *e = getenv("DSV4_LOG");
        t = e && !strcmp(e, "debug") ? DSV4_LOG_DEBUG
          : e && !strcmp(e, "info")  ? DSV4_LOG_INFO
          : e && !strcmp(e, "warn")  ? DSV4_LOG_WARN
          : isatty(2)                ? DSV4_LOG_INFO
                                     : DSV4_LOG_WARN;
    }
    return (enum dsv4_log_level)t;
}

void cli_log_stderr(void *ud, enum dsv4_log_level level, const char *msg)
{
    if (level > log_threshold()) return;
    fprintf(stderr, "dsv4 %s: %s%s\n", (const char *)ud, level == DSV4_LOG_WARN ? "warning: " : "", msg);
}

/* The option strings the flags build (struct dsv4_engine_params keeps a pointer to the
 * last): kept for the life of the process, a few per command line. */
struct opt_str {
    struct opt_str *next;
    char            s[];
};
static struct opt_str *opt_strs;
static pthread_mutex_t opt_strs_lock = PTHREAD_MUTEX_INITIALIZER;

bool cli_backend_opt(struct dsv4_engine_params *ep, const char *key, const char *val)
{
    const char *old = ep->backend_opts && *ep->backend_opts ? ep->backend_opts : NULL;
    size_t      n   = (old ? strlen(old) + 1 : 0) + (key ? strlen(key) + 1 : 0) + strlen(val) + 1;
    struct opt_str *o = malloc(sizeof(*o) + n);
    if (!o) return false;
    snprintf(o->s, n, "%s%s%s%s%s", old ? old : "", old ? "," : "", key ? key : "", key ? "=" : "", val);
    pthread_mutex_lock(&opt_strs_lock);
    o->next  = opt_strs;
    opt_strs = o;
    pthread_mutex_unlock(&opt_strs_lock);
    ep->backend_opts = o->s;
    return true;
}

void cli_engine_params(struct dsv4_engine_params *ep)
{
    dsv4_engine_params_default(ep);
    const char *cpu = getenv("DSV4_CPU"), *tiles = getenv("DSV4_TILES"), *prof = getenv("DSV4_PROFILE");
    if (cpu && *cpu) cli_backend_opt(ep, "level", cpu);
    const char *gmin = getenv("DSV4_GEMM_MIN");
    if (gmin && *gmin) cli_backend_opt(ep, "gemm_min", gmin);
    if (tiles && !strcmp(tiles, "0")) cli_backend_opt(ep, "tiles", "0");
    if (prof && *prof) ep->profile_path = prof;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}


/* ------------------------------------------------------------------ option tables */

/* The usage column where help text starts. */
enum { CLI_HELP_COL = 25 };

static void usage_opt(FILE *f, const struct cli_opt *o)
{
    char left[96];
    int  n = snprintf(left, sizeof(left), "  %s%s%s%s%s", o->alias ? o->alias : "", o->alias ? ", " : "", o->name,
                      o->arg ? " " : "", o->arg ? o->arg : "");
    fputs(left, f);
    fprintf(f, "%*s", n < CLI_HELP_COL - 1 ? CLI_HELP_COL - n : 2, "");
    for (const char *h = o->help; *h;) {
        size_t len = strcspn(h, "\n");
        fprintf(f, "%.*s\n", (int)len, h);
        h += len;
        if (*h) {
            fprintf(f, "%*s", CLI_HELP_COL, ""); /* a continuation line, under the first */
            h++;
        }
    }
}

void cli_usage(const struct cli_spec *spec, FILE *f)
{
    fputs(spec->synopsis, f);
    for (size_t g = 0; g < spec->n_groups; g++) {
        const struct cli_group *gr = &spec->groups[g];
        if (gr->heading) fprintf(f, "\n%s:\n", gr->heading);
        for (size_t k = 0; k < gr->n; k++) usage_opt(f, &gr->opts[k]);
    }
    if (spec->epilog) fputs(spec->epilog, f);
}

int cli_usage_error(const struct cli_spec *spec, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "dsv4 %s: ", spec->cmd);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    cli_usage(spec, stderr);
    return 2;
}

/* Stores v (NULL for a flag) as o says into base; false after printing why. */
static bool set_opt(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    char     *t = (char *)base + o->off;
    long long iv;
    double    fv;
    switch (o->type) {
    case CLI_FLAG: *(bool *)t = true; return true;
    case CLI_STR: *(const char **)t = v; return true;
    case CLI_CALL: return o->call(o, cmd, v, base);
    case CLI_BYTES: return parse_bytes(cmd, o->name, v, o->lo, o->hi, (uint64_t *)(void *)t);
    case CLI_FLOAT:
    case CLI_DOUBLE:
        if (!cli_parse_float(cmd, o->name, v, o->lo, o->hi, &fv)) return false;
        if (o->type == CLI_FLOAT) *(float *)t = (float)fv;
        else *(double *)t = fv;
        return true;
    default: break;
    }
    if (!cli_parse_int(cmd, o->name, v, (long long)o->lo, (long long)o->hi, &iv)) return false;
    switch (o->type) {
    case CLI_INT: *(int *)t = (int)iv; break;
    case CLI_LLONG: *(long long *)t = iv; break;
    case CLI_MIB: *(size_t *)t = (size_t)iv << 20; break;
    default: *(size_t *)t = (size_t)iv; break;
    }
    return true;
}

static const struct cli_opt *find_opt(const struct cli_spec *spec, const char *a, void **base)
{
    for (size_t g = 0; g < spec->n_groups; g++)
        for (size_t k = 0; k < spec->groups[g].n; k++) {
            const struct cli_opt *o = &spec->groups[g].opts[k];
            if (!strcmp(a, o->name) || (o->alias && !strcmp(a, o->alias))) {
                *base = spec->groups[g].base;
                return o;
            }
        }
    return NULL;
}

int cli_parse(const struct cli_spec *spec, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            cli_usage(spec, stdout);
            return 0;
        }
        void                 *base = NULL;
        const struct cli_opt *o    = find_opt(spec, a, &base);
        if (!o) return cli_usage_error(spec, "unknown option '%s'", a);
        const char *v = NULL;
        if (o->arg && !(v = cli_value(spec->cmd, argc, argv, &i))) return 2;
        if (!set_opt(o, spec->cmd, v, base)) return 2;
    }
    return CLI_PARSED;
}

/* ------------------------------------------------------------------ engine and sampling options */

static bool set_revision(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    enum dsv4_revision *rev = (enum dsv4_revision *)(void *)((char *)base + o->off);
    if (!strcmp(v, "current")) *rev = DSV4_REVISION_CURRENT;
    else if (!strcmp(v, "initial")) *rev = DSV4_REVISION_INITIAL;
    else {
        fprintf(stderr, "dsv4 %s: --revision must be current or initial\n", cmd);
        return false;
    }
    return true;
}

/* The spellings of the CPU's backend options (--cpu-level L = level=L, ...) and
 * --backend-opt K=V: each appends an entry to the backend options (a later one wins). */
static bool set_backend_opt(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    struct dsv4_engine_params *ep  = base;
    const char                *key = !strcmp(o->name, "--cpu-level") ? "level"
                                     : !strcmp(o->name, "--gemm-min") ? "gemm_min"
                                     : !strcmp(o->name, "--no-tiles") ? "tiles"
                                                                      : NULL;
    if (!key && (!strchr(v, '=') || v[0] == '=')) {
        fprintf(stderr, "dsv4 %s: --backend-opt wants KEY=VALUE (got '%s')\n", cmd, v);
        return false;
    }
    if (!cli_backend_opt(ep, key, v ? v : "0")) {
        fprintf(stderr, "dsv4 %s: out of memory\n", cmd);
        return false;
    }
    return true;
}

/* --backend's usage: the registry's list, written once (cli_engine_group) */
static char           backend_help[320];
static pthread_once_t backend_help_once = PTHREAD_ONCE_INIT;

static void write_backend_help(void)
{
    char names[256];
    dsv4_backend_list(names, sizeof(names));
    snprintf(backend_help, sizeof(backend_help), "the backend: %s (default: the first)", names);
}

static bool set_ep_dispatch(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    enum dsv4_ep_dispatch *how = (enum dsv4_ep_dispatch *)(void *)((char *)base + o->off);
    if (!strcmp(v, "rows")) *how = DSV4_EP_ROWS;
    else if (!strcmp(v, "tokens")) *how = DSV4_EP_TOKENS;
    else {
        fprintf(stderr, "dsv4 %s: --ep-dispatch must be rows or tokens\n", cmd);
        return false;
    }
    return true;
}

#define EP(field) offsetof(struct dsv4_engine_params, field)
/* --revision last: cli_engine_group leaves it out for a command that opens no model. */
static const struct cli_opt ENGINE_OPTS[] = {
    { "--threads", NULL, "N", "CPU threads (default: all)", CLI_INT, EP(n_threads), 0, 4096, NULL },
    { "--cpu-level", NULL, "L",
      "ref|scalar|avx2|avx512|avx512bf16|amx|neon, or avx2-int / avx512-int (exact FP4\nblock sums); default: the best; env DSV4_CPU; backend option level=L",
      CLI_CALL, EP(backend_opts), 0, 0, set_backend_opt },
    { "--gemm-min", NULL, "A,B,C",
      "FP8,FP4,BF16 token counts from which the f32 kernels take the GEMM\n(default: measured for this core; env "
      "DSV4_GEMM_MIN; backend option gemm_min=A,B,C)",
      CLI_CALL, EP(backend_opts), 0, 0, set_backend_opt },
    { "--no-tiles", NULL, NULL, "keep the checkpoint's layout (env DSV4_TILES=0; backend option tiles=0)", CLI_CALL,
      EP(backend_opts), 0, 0, set_backend_opt },
    { "--backend-opt", NULL, "K=V", "an option of the backend (repeatable; the cpu's: level, gemm_min, tiles)",
      CLI_CALL, EP(backend_opts), 0, 0, set_backend_opt },
    { "--profile", NULL, "FILE", "Chrome trace of every op, per-op shares at exit (env DSV4_PROFILE)", CLI_STR,
      EP(profile_path), 0, 0, NULL },
    { "--ep", NULL, "N",
      "spread the routed experts over N MPI ranks: mpirun -np N dsv4 ... --ep N\n(docs/DISTRIBUTED.md; default 1)",
      CLI_INT, EP(ep), 1, 4096, NULL },
    { "--ep-dispatch", NULL, "HOW",
      "rows|tokens: send each rank its routed rows, or every rank the layer's tokens\n(default rows)", CLI_CALL,
      EP(ep_dispatch), 0, 0, set_ep_dispatch },
    /* an unknown name is refused at engine open, with the list */
    { "--backend", NULL, "NAME", backend_help, CLI_STR, EP(backend), 0, 0, NULL },
    { "--revision", NULL, "R", "current|initial: the demo revision to reproduce (default current)", CLI_CALL,
      EP(revision), 0, 0, set_revision },
};
#undef EP

struct cli_group cli_engine_group(struct dsv4_engine_params *ep, bool opens_model)
{
    pthread_once(&backend_help_once, write_backend_help);
    size_t n = sizeof(ENGINE_OPTS) / sizeof(ENGINE_OPTS[0]);
    return (struct cli_group){ "engine options", ENGINE_OPTS, opens_model ? n : n - 1, ep };
}

static bool set_seed(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    struct cli_sampling *s = base;
    long long            iv;
    if (!cli_parse_int(cmd, o->name, v, 0, 1LL << 62, &iv)) return false;
    s->sp.seed = (uint64_t)iv;
    s->seeded  = true;
    return true;
}

#define SP(field) offsetof(struct cli_sampling, sp.field)
static const struct cli_opt SAMPLER_OPTS[] = {
    { "--temp", NULL, "T", "temperature (0 = greedy)", CLI_FLOAT, SP(temperature), 0, 100, NULL },
    { "--top-k", NULL, "K", "keep the K most likely tokens (0 = all)", CLI_INT, SP(top_k), 0, 1 << 24, NULL },
    { "--top-p", NULL, "P", "nucleus: the smallest set of tokens with probability P", CLI_FLOAT, SP(top_p), 1e-9, 1,
      NULL },
    { "--min-p", NULL, "M", "drop tokens below M x the most likely one's probability", CLI_FLOAT, SP(min_p), 0, 1,
      NULL },
    { "--seed", NULL, "S", "sampling seed", CLI_CALL, SP(seed), 0, 0, set_seed },
};
#undef SP

struct cli_group cli_sampler_group(struct cli_sampling *s)
{
    return (struct cli_group){ "sampling options", SAMPLER_OPTS, sizeof(SAMPLER_OPTS) / sizeof(SAMPLER_OPTS[0]), s };
}

#define KD(field) offsetof(struct cli_kv_disk, field)
static const struct cli_opt KV_DISK_OPTS[] = {
    { "--kv-disk-dir", NULL, "DIR",
      "prompt cache on disk in DIR/session: kept across runs (docs/SERVING.md\n\"Disk tier\"; one process per "
      "directory)",
      CLI_STR, KD(dir), 0, 0, NULL },
    { "--kv-disk-budget", NULL, "SIZE", "bytes the disk tier may take (suffix K, M, G, T; default 10G)", CLI_BYTES,
      KD(budget), 1 << 20, 1e18, NULL },
};
#undef KD

struct cli_group cli_kv_disk_group(struct cli_kv_disk *kd)
{
    return (struct cli_group){ "prompt cache", KV_DISK_OPTS, sizeof(KV_DISK_OPTS) / sizeof(KV_DISK_OPTS[0]), kd };
}

bool cli_prompt_cache_open(const char *cmd, const struct cli_kv_disk *kd, const dsv4_session *s,
                           dsv4_prompt_cache **pc)
{
    struct dsv4_err err;
    *pc = NULL;
    if (!kd->dir || dsv4_prompt_cache_open(pc, s, kd->dir, kd->budget, &err) == DSV4_OK) return true;
    fprintf(stderr, "dsv4 %s: %s\n", cmd, err.msg);
    return false;
}

int cli_prompt_cache_eval(const char *cmd, dsv4_prompt_cache *pc, dsv4_session *s, const int32_t *tokens, int n,
                          struct dsv4_err *err)
{
    int pos = dsv4_session_pos(s);
    if (!pc) return dsv4_session_eval(s, tokens + pos, n - pos, NULL, NULL, NULL, err);
    struct dsv4_prompt_cache_eval r;
    int                           rc = dsv4_prompt_cache_eval(pc, s, tokens, n, &r, err);
    if (r.probed && r.loaded)
        fprintf(stderr, "dsv4 %s: prompt cache: loaded %d of %d prompt tokens from %s in %.1f ms\n", cmd, r.loaded, n,
                dsv4_prompt_cache_dir(pc), r.load_ms);
    else if (r.probed)
        fprintf(stderr, "dsv4 %s: prompt cache: no cached prefix of the %d prompt tokens in %s\n", cmd, n,
                dsv4_prompt_cache_dir(pc));
    return rc;
}
