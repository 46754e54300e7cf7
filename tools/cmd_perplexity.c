/*
 * cmd_perplexity.c - `dsv4 perplexity`: perplexity of a model over a text, and the KL
 * divergence of its next-token distributions from saved base logits.
 *
 * Protocol (shared with tools/train/eval_ppl.py, which computes the same numbers with the
 * float training model or the PyTorch reference): the text is tokenized whole with the model
 * directory's tokenizer.json (no BOS); the ids are cut into consecutive pieces of ctx - 1;
 * each piece is evaluated from an empty session as BOS + piece, and every token of the piece
 * is scored (the first one from BOS alone). Every text token is scored exactly once.
 * --chunk only sets how many tokens go into one forward call; the engine is
 * chunk-invariant, so it changes speed and scratch memory, never the numbers.
 *
 * Logits file (--save-logits writes it, --kl-base reads it), little-endian:
 *   "DSV4LGT1"  u32 version = 1, u32 n_vocab, u32 ctx, u32 0, u64 n_rows,
 *   i32 target[n_rows] (the token each row predicts), f32 logits[n_rows][n_vocab].
 * The header and the targets come first so that a mismatched text or model is refused
 * before any row is compared.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static const char LGT_MAGIC[8] = { 'D', 'S', 'V', '4', 'L', 'G', 'T', '1' };

struct lgt_header {
    uint32_t version, n_vocab, ctx, reserved;
    uint64_t n_rows;
};

static void usage(FILE *f)
{
    fprintf(f, "usage: dsv4 perplexity -m DIR (-f TEXT | --tokens-file F) [--ctx N] [--chunk N] [--max-tokens N]\n"
               "                       [--save-logits F | --kl-base F] [--revision current|initial]\n"
               "  -f TEXT           text file, tokenized with DIR/tokenizer.json\n"
               "  --tokens-file F   token ids instead of a text (commas, spaces or newlines; no BOS)\n"
               "  --ctx N           window length: each window is BOS + N-1 text tokens, from an empty\n"
               "                    state (default 512, or the model's limit if smaller)\n"
               "  --chunk N         tokens per forward call (default: the window; results do not depend on it)\n"
               "  --max-tokens N    score only the first N text tokens\n"
               "  --save-logits F   write the logits of every scored position (a base for --kl-base)\n"
               "  --kl-base F       compare with saved logits: KL(base || model), top-1 agreement\n");
    fputs(CLI_ENGINE_USAGE, f);
}

/* ------------------------------------------------------------------ small helpers */

static char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "dsv4 perplexity: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, len = 0, r;
    char  *buf = malloc(cap);
    while (buf && (r = fread(buf + len, 1, cap - len, f)) > 0) {
        len += r;
        if (len == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) free(buf);
            buf = nb;
            cap *= 2;
        }
    }
    if (buf && ferror(f)) {
        fprintf(stderr, "dsv4 perplexity: read error on %s\n", path);
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *n = len;
    return buf;
}

/* log-softmax of row [n] into out (double); returns nothing, never fails */
static void log_softmax(const float *row, int n, double *out)
{
    double mx = row[0];
    for (int i = 1; i < n; i++)
        if (row[i] > mx) mx = row[i];
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)row[i] - mx);
    double lse = mx + log(s);
    for (int i = 0; i < n; i++) out[i] = (double)row[i] - lse;
}

static int argmax(const float *row, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[b]) b = i;
    return b;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void progress(int done, int total, double nll, long long n, double t0)
{
    int    w = 30, k = total ? (int)((long long)w * done / total) : w;
    double el = cli_now() - t0;
    fprintf(stderr, "\r[%.*s%*s] %d/%d windows  ppl %8.4f  %6.0f tok/s", k, "##############################", w - k, "",
            done, total, n ? exp(nll / (double)n) : 0.0, el > 0 ? (double)n / el : 0.0);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

/* ------------------------------------------------------------------ base logits */

struct base_file {
    FILE             *f;
    struct lgt_header h;
    int32_t          *targets;
};

static bool base_open(struct base_file *b, const char *path, int n_vocab, const int32_t *targets, long long n_rows)
{
    memset(b, 0, sizeof(*b));
    b->f = fopen(path, "rb");
    if (!b->f) {
        fprintf(stderr, "dsv4 perplexity: cannot open %s: %s\n", path, strerror(errno));
        return false;
    }
    char magic[8];
    if (fread(magic, 1, 8, b->f) != 8 || memcmp(magic, LGT_MAGIC, 8) || fread(&b->h, sizeof(b->h), 1, b->f) != 1 ||
        b->h.version != 1) {
        fprintf(stderr, "dsv4 perplexity: %s is not a dsv4 logits file (version 1)\n", path);
        return false;
    }
    if ((int)b->h.n_vocab != n_vocab || (long long)b->h.n_rows != n_rows) {
        fprintf(stderr, "dsv4 perplexity: %s holds %llu rows of %u logits; this run scores %lld rows of %d\n", path,
                (unsigned long long)b->h.n_rows, b->h.n_vocab, n_rows, n_vocab);
        return false;
    }
    b->targets = malloc(sizeof(int32_t) * (size_t)(n_rows ? n_rows : 1));
    if (!b->targets || fread(b->targets, sizeof(int32_t), (size_t)n_rows, b->f) != (size_t)n_rows) {
        fprintf(stderr, "dsv4 perplexity: %s is truncated\n", path);
        return false;
    }
    for (long long i = 0; i < n_rows; i++)
        if (b->targets[i] != targets[i]) {
            fprintf(stderr, "dsv4 perplexity: %s was made from another text: row %lld predicts token %d, here %d\n",
                    path, i, b->targets[i], targets[i]);
            return false;
        }
    return true;
}

static void base_close(struct base_file *b)
{
    if (b->f) fclose(b->f);
    free(b->targets);
}

/* ------------------------------------------------------------------ the command */

int cmd_perplexity(int argc, char **argv)
{
    const char *dir = NULL, *text_path = NULL, *tok_file = NULL, *save_path = NULL, *base_path = NULL;
    long long   ctx = 0, chunk = 0, max_tokens = 0;
    struct dsv4_engine_params ep;
    dsv4_engine_params_default(&ep);
    cli_engine_env(&ep);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int         eo = cli_engine_option("perplexity", argc, argv, &i, &ep);
        if (eo < 0) return 2;
        if (eo > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(dir = cli_value("perplexity", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(text_path = cli_value("perplexity", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--tokens-file")) {
            if (!(tok_file = cli_value("perplexity", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--save-logits")) {
            if (!(save_path = cli_value("perplexity", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--kl-base")) {
            if (!(base_path = cli_value("perplexity", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--ctx")) {
            if (!(v = cli_value("perplexity", argc, argv, &i)) || !cli_parse_int("perplexity", a, v, 2, 1 << 24, &ctx))
                return 2;
        } else if (!strcmp(a, "--chunk")) {
            if (!(v = cli_value("perplexity", argc, argv, &i)) || !cli_parse_int("perplexity", a, v, 1, 1 << 24, &chunk))
                return 2;
        } else if (!strcmp(a, "--max-tokens")) {
            if (!(v = cli_value("perplexity", argc, argv, &i)) ||
                !cli_parse_int("perplexity", a, v, 1, 1LL << 40, &max_tokens))
                return 2;
        } else if (!strcmp(a, "--revision")) {
            if (!cli_revision("perplexity", argc, argv, &i, &ep.revision)) return 2;
        } else {
            fprintf(stderr, "dsv4 perplexity: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!dir || (!text_path == !tok_file)) {
        fprintf(stderr, "dsv4 perplexity: -m and one of -f / --tokens-file are required\n");
        usage(stderr);
        return 2;
    }
    if (save_path && base_path) {
        fprintf(stderr, "dsv4 perplexity: --save-logits and --kl-base are exclusive\n");
        return 2;
    }

    int              rc   = 1;
    struct dsv4_err  err;
    dsv4_tokenizer  *tok  = NULL;
    dsv4_engine     *e    = NULL;
    dsv4_session    *s    = NULL;
    int32_t         *ids  = NULL, *targets = NULL, *win = NULL;
    float           *lg   = NULL;
    double          *lp   = NULL, *lpb = NULL, *kls = NULL, *nlls = NULL;
    float           *brow = NULL;
    FILE            *save = NULL;
    struct base_file base = { 0 };
    int              n_ids = 0;

    /* The tokenizer gives BOS even for --tokens-file input; without one, the config's. */
    int trc = dsv4_tokenizer_load(&tok, dir, &err);
    if (trc && text_path) {
        fprintf(stderr, "dsv4 perplexity: %s\n", err.msg);
        return 1;
    }
    if (text_path) {
        size_t len  = 0;
        char  *text = read_file(text_path, &len);
        if (!text) goto done;
        size_t cap = 3 * len + 1, n = 0;
        ids        = malloc(sizeof(int32_t) * cap);
        if (!ids || dsv4_tokenizer_encode(tok, text, len, 0, ids, cap, &n, &err)) {
            fprintf(stderr, "dsv4 perplexity: %s\n", ids ? err.msg : "out of memory");
            free(text);
            goto done;
        }
        free(text);
        n_ids = (int)n;
    } else if (!cli_read_tokens_file("perplexity", tok_file, &ids, &n_ids)) {
        rc = 2;
        goto done;
    }
    if (max_tokens && n_ids > max_tokens) n_ids = (int)max_tokens;
    if (n_ids < 1) {
        fprintf(stderr, "dsv4 perplexity: the text has no tokens\n");
        goto done;
    }

    ep.log    = cli_log_stderr;
    ep.log_ud = (void *)"perplexity";
    if (dsv4_engine_open(&e, dir, &ep, &err)) {
        fprintf(stderr, "dsv4 perplexity: %s\n", err.msg);
        goto done;
    }
    struct dsv4_model_info info;
    dsv4_engine_info(e, &info);
    int V   = info.vocab_size;
    int bos = tok ? dsv4_tokenizer_bos(tok) : info.bos_id;
    if (!ctx) ctx = info.max_ctx < 512 ? info.max_ctx : 512;
    if (ctx > info.max_ctx) {
        fprintf(stderr, "dsv4 perplexity: --ctx %lld is more than the model's %d positions\n", ctx, info.max_ctx);
        goto done;
    }
    if (!chunk || chunk > ctx) chunk = ctx;
    for (int i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= V) {
            fprintf(stderr, "dsv4 perplexity: token %d (id %d) is outside the model's vocabulary of %d\n", i, ids[i], V);
            goto done;
        }
    struct dsv4_session_params sp;
    dsv4_session_params_default(&sp);
    sp.max_ctx   = (int)ctx;
    sp.max_chunk = (int)chunk;
    if (dsv4_session_create(e, &sp, &s, &err)) {
        fprintf(stderr, "dsv4 perplexity: %s\n", err.msg);
        goto done;
    }
    int per       = (int)ctx - 1;
    int n_windows = (n_ids + per - 1) / per;
    win           = malloc(sizeof(int32_t) * (size_t)ctx);
    lg            = malloc(sizeof(float) * (size_t)ctx * (size_t)V);
    lp            = malloc(sizeof(double) * (size_t)V);
    nlls          = malloc(sizeof(double) * (size_t)n_ids);
    targets       = ids; /* row r predicts ids[r] */
    if (!win || !lg || !lp || !nlls) {
        fprintf(stderr, "dsv4 perplexity: out of memory\n");
        goto done;
    }
    if (base_path) {
        lpb  = malloc(sizeof(double) * (size_t)V);
        brow = malloc(sizeof(float) * (size_t)V);
        kls  = malloc(sizeof(double) * (size_t)n_ids);
        if (!lpb || !brow || !kls) {
            fprintf(stderr, "dsv4 perplexity: out of memory\n");
            goto done;
        }
        if (!base_open(&base, base_path, V, targets, n_ids)) goto done;
    }
    if (save_path) {
        save = fopen(save_path, "wb");
        struct lgt_header h = { 1, (uint32_t)V, (uint32_t)ctx, 0, (uint64_t)n_ids };
        if (!save || fwrite(LGT_MAGIC, 1, 8, save) != 8 || fwrite(&h, sizeof(h), 1, save) != 1 ||
            fwrite(targets, sizeof(int32_t), (size_t)n_ids, save) != (size_t)n_ids) {
            fprintf(stderr, "dsv4 perplexity: cannot write %s: %s\n", save_path, strerror(errno));
            goto done;
        }
    }

    bool      bar = isatty(2) && n_windows > 1;
    double    t0 = cli_now(), nll = 0, base_nll = 0;
    long long n_scored = 0, agree = 0;
    for (int w = 0; w < n_windows; w++) {
        int off = w * per, n = n_ids - off < per ? n_ids - off : per, T = n + 1;
        win[0]  = bos;
        memcpy(win + 1, ids + off, sizeof(int32_t) * (size_t)n);
        dsv4_session_reset(s);
        for (int c = 0; c < T; c += (int)chunk) {
            int m = T - c < chunk ? T - c : (int)chunk;
            if (dsv4_session_eval(s, win + c, m, lg + (size_t)c * (size_t)V, NULL, NULL, &err)) {
                fprintf(stderr, "%sdsv4 perplexity: %s\n", bar ? "\n" : "", err.msg);
                goto done;
            }
        }
        for (int t = 0; t < n; t++) {
            const float *row = lg + (size_t)t * (size_t)V;
            int          tgt = win[t + 1];
            log_softmax(row, V, lp);
            nlls[n_scored] = -lp[tgt];
            nll += -lp[tgt];
            if (save && fwrite(row, sizeof(float), (size_t)V, save) != (size_t)V) {
                fprintf(stderr, "%sdsv4 perplexity: write error on %s\n", bar ? "\n" : "", save_path);
                goto done;
            }
            if (base.f) {
                if (fread(brow, sizeof(float), (size_t)V, base.f) != (size_t)V) {
                    fprintf(stderr, "%sdsv4 perplexity: %s is truncated\n", bar ? "\n" : "", base_path);
                    goto done;
                }
                log_softmax(brow, V, lpb);
                double kl = 0;
                for (int i = 0; i < V; i++) kl += exp(lpb[i]) * (lpb[i] - lp[i]);
                kls[n_scored] = kl > 0 ? kl : 0;
                base_nll += -lpb[tgt];
                agree += argmax(brow, V) == argmax(row, V);
            }
            n_scored++;
        }
        if (bar) progress(w + 1, n_windows, nll, n_scored, t0);
    }
    double mean = nll / (double)n_scored, var = 0;
    for (long long i = 0; i < n_scored; i++) var += (nlls[i] - mean) * (nlls[i] - mean);
    double se = n_scored > 1 ? sqrt(var / (double)(n_scored - 1) / (double)n_scored) : 0;
    printf("perplexity: %.4f +/- %.4f over %lld tokens (%d windows, ctx %lld)\n", exp(mean), exp(mean) * se, n_scored,
           n_windows, ctx);
    printf("mean nll: %.6f nats/token\n", mean);
    if (base.f) {
        double ks = 0;
        for (long long i = 0; i < n_scored; i++) ks += kls[i];
        qsort(kls, (size_t)n_scored, sizeof(double), cmp_double);
        printf("base perplexity: %.4f (ratio %.5f)\n", exp(base_nll / (double)n_scored),
               exp(mean - base_nll / (double)n_scored));
        printf("KL divergence (base || model): mean %.6f  median %.6f  p99 %.6f  max %.6f\n", ks / (double)n_scored,
               kls[n_scored / 2], kls[(long long)((double)(n_scored - 1) * 0.99)], kls[n_scored - 1]);
        printf("top-1 agreement: %.2f%%\n", 100.0 * (double)agree / (double)n_scored);
    }
    fprintf(stderr, "%lld tokens in %.1f s\n", n_scored, cli_now() - t0);
    rc = 0;
done:
    if (save && fclose(save) != 0 && rc == 0) {
        fprintf(stderr, "dsv4 perplexity: write error on %s\n", save_path);
        rc = 1;
    }
    base_close(&base);
    free(win);
    free(lg);
    free(lp);
    free(lpb);
    free(brow);
    free(kls);
    free(nlls);
    free(ids);
    dsv4_session_free(s);
    dsv4_engine_close(e);
    dsv4_tokenizer_free(tok);
    return rc;
}
