/* cli.c - argument helpers shared by the subcommands. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

const char *cli_value(const char *cmd, int argc, char **argv, int *i)
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

void cli_engine_env(struct dsv4_engine_params *ep)
{
    const char *cpu = getenv("DSV4_CPU"), *tiles = getenv("DSV4_TILES"), *prof = getenv("DSV4_PROFILE");
    if (cpu && *cpu) ep->cpu_level = cpu;
    const char *gmin = getenv("DSV4_GEMM_MIN");
    if (gmin && *gmin) ep->gemm_min = gmin;
    if (tiles && !strcmp(tiles, "0")) ep->tiles = 0;
    if (prof && *prof) ep->profile_path = prof;
}

int cli_engine_option(const char *cmd, int argc, char **argv, int *i, struct dsv4_engine_params *ep)
{
    const char *a = argv[*i], *v;
    if (!strcmp(a, "--cpu-level")) {
        if (!(v = cli_value(cmd, argc, argv, i))) return -1;
        ep->cpu_level = v;
    } else if (!strcmp(a, "--gemm-min")) {
        if (!(v = cli_value(cmd, argc, argv, i))) return -1;
        ep->gemm_min = v;
    } else if (!strcmp(a, "--no-tiles")) {
        ep->tiles = 0;
    } else if (!strcmp(a, "--profile")) {
        if (!(v = cli_value(cmd, argc, argv, i))) return -1;
        ep->profile_path = v;
    } else if (!strcmp(a, "--backend")) {
        if (!(v = cli_value(cmd, argc, argv, i))) return -1;
        ep->backend = v; /* an unknown name is refused at engine open, with the list */
    } else {
        return 0;
    }
    return 1;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bool cli_revision(const char *cmd, int argc, char **argv, int *i, enum dsv4_revision *rev)
{
    const char *v = cli_value(cmd, argc, argv, i);
    if (!v) return false;
    if (!strcmp(v, "current")) *rev = DSV4_REVISION_CURRENT;
    else if (!strcmp(v, "initial")) *rev = DSV4_REVISION_INITIAL;
    else {
        fprintf(stderr, "dsv4 %s: --revision must be current or initial\n", cmd);
        return false;
    }
    return true;
}

int cli_sampler_option(const char *cmd, int argc, char **argv, int *i, struct dsv4_sampler_params *sp, bool *seeded)
{
    const char *a = argv[*i], *v;
    double      fv;
    long long   iv;
    if (!strcmp(a, "--temp")) {
        if (!(v = cli_value(cmd, argc, argv, i)) || !cli_parse_float(cmd, a, v, 0, 100, &fv)) return -1;
        sp->temperature = (float)fv;
    } else if (!strcmp(a, "--top-k")) {
        if (!(v = cli_value(cmd, argc, argv, i)) || !cli_parse_int(cmd, a, v, 0, 1 << 24, &iv)) return -1;
        sp->top_k = (int)iv;
    } else if (!strcmp(a, "--top-p")) {
        if (!(v = cli_value(cmd, argc, argv, i)) || !cli_parse_float(cmd, a, v, 1e-9, 1, &fv)) return -1;
        sp->top_p = (float)fv;
    } else if (!strcmp(a, "--min-p")) {
        if (!(v = cli_value(cmd, argc, argv, i)) || !cli_parse_float(cmd, a, v, 0, 1, &fv)) return -1;
        sp->min_p = (float)fv;
    } else if (!strcmp(a, "--seed")) {
        if (!(v = cli_value(cmd, argc, argv, i)) || !cli_parse_int(cmd, a, v, 0, (1LL << 62), &iv)) return -1;
        sp->seed = (uint64_t)iv;
        if (seeded) *seeded = true;
    } else {
        return 0;
    }
    return 1;
}
