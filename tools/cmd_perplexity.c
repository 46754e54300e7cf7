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
#include <stddef.h>
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

struct ppl_opts {
    const char *dir, *text_path, *tok_file, *save_path, *base_path;
    int         ctx, chunk;
    long long   max_tokens;
};

#define PO(field) offsetof(struct ppl_opts, field)
static const struct cli_opt PPL_OPTS[] = {
    { "--model", "-m", "DIR", "checkpoint directory", CLI_STR, PO(dir), 0, 0, NULL },
    { "--file", "-f", "TEXT", "text file, tokenized with DIR/tokenizer.json", CLI_STR, PO(text_path), 0, 0, NULL },
    { "--tokens-file", NULL, "F", "token ids instead of a text (commas, spaces or newlines; no BOS)", CLI_STR,
      PO(tok_file), 0, 0, NULL },
    { "--ctx", NULL, "N",
      "window length: each window is BOS + N-1 text tokens, from an empty\nstate (default 512, or the model's limit if "
      "smaller)",
      CLI_INT, PO(ctx), 2, 1 << 24, NULL },
    { "--chunk", NULL, "N", "tokens per forward call (default: the window; results do not depend on it)", CLI_INT,
      PO(chunk), 1, 1 << 24, NULL },
    { "--max-tokens", NULL, "N", "score only the first N text tokens", CLI_LLONG, PO(max_tokens), 1, (double)(1LL << 40),
      NULL },
    { "--save-logits", NULL, "F", "write the logits of every scored position (a base for --kl-base)", CLI_STR,
      PO(save_path), 0, 0, NULL },
    { "--kl-base", NULL, "F", "compare with saved logits: KL(base || model), top-1 agreement", CLI_STR, PO(base_path), 0,
      0, NULL },
};
#undef PO

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

/* One run: the text's ids, the engine, the buffers and the running sums. */
struct ppl {
    const struct ppl_opts *o;
    dsv4_tokenizer        *tok;
    dsv4_engine           *e;
    dsv4_session          *s;
    int32_t               *ids, *win;
    int                    n_ids, V, bos, ctx, chunk, n_windows;
    float                 *lg, *brow;
    double                *lp, *lpb, *kls, *nlls;
    FILE                  *save;
    struct base_file       base;
    bool                   bar;
    double                 t0, nll, base_nll;
    long long              n_scored, agree;
};

/* The text's ids (or the --tokens-file list), cut to --max-tokens; 0 or the exit status. */
static int load_ids(struct ppl *P)
{
    const struct ppl_opts *o = P->o;
    struct dsv4_err        err;
    /* The tokenizer gives BOS even for --tokens-file input; without one, the config's. */
    int trc = dsv4_tokenizer_load(&P->tok, o->dir, &err);
    if (trc && o->text_path) {
        fprintf(stderr, "dsv4 perplexity: %s\n", err.msg);
        return 1;
    }
    if (o->text_path) {
        size_t len  = 0;
        char  *text = read_file(o->text_path, &len);
        if (!text) return 1;
        size_t cap = 3 * len + 1, n = 0;
        P->ids     = malloc(sizeof(int32_t) * cap);
        if (!P->ids || dsv4_tokenizer_encode(P->tok, text, len, 0, P->ids, cap, &n, &err)) {
            fprintf(stderr, "dsv4 perplexity: %s\n", P->ids ? err.msg : "out of memory");
            free(text);
            return 1;
        }
        free(text);
        P->n_ids = (int)n;
    } else if (!cli_read_tokens_file("perplexity", o->tok_file, &P->ids, &P->n_ids)) {
        return 2;
    }
    if (o->max_tokens && P->n_ids > o->max_tokens) P->n_ids = (int)o->max_tokens;
    if (P->n_ids < 1) {
        fprintf(stderr, "dsv4 perplexity: the text has no tokens\n");
        return 1;
    }
    return 0;
}

/* The engine and a session of one window; the window length and chunk checked. */
static bool open_model(struct ppl *P, struct dsv4_engine_params *ep)
{
    struct dsv4_err err;
    ep->log    = cli_log_stderr;
    ep->log_ud = (void *)"perplexity";
    if (dsv4_engine_open(&P->e, P->o->dir, ep, &err)) {
        fprintf(stderr, "dsv4 perplexity: %s\n", err.msg);
        return false;
    }
    struct dsv4_model_info info;
    dsv4_engine_info(P->e, &info);
    P->V   = info.vocab_size;
    P->bos = P->tok ? dsv4_tokenizer_bos(P->tok) : info.bos_id;
    P->ctx = P->o->ctx ? P->o->ctx : info.max_ctx < 512 ? info.max_ctx : 512;
    if (P->ctx > info.max_ctx) {
        fprintf(stderr, "dsv4 perplexity: --ctx %d is more than the model's %d positions\n", P->ctx, info.max_ctx);
        return false;
    }
    P->chunk = !P->o->chunk || P->o->chunk > P->ctx ? P->ctx : P->o->chunk;
    for (int i = 0; i < P->n_ids; i++)
        if (P->ids[i] < 0 || P->ids[i] >= P->V) {
            fprintf(stderr, "dsv4 perplexity: token %d (id %d) is outside the model's vocabulary of %d\n", i, P->ids[i],
                    P->V);
            return false;
        }
    struct dsv4_session_params sp;
    dsv4_session_params_default(&sp);
    sp.max_ctx   = P->ctx;
    sp.max_chunk = P->chunk;
    if (dsv4_session_create(P->e, &sp, &P->s, &err)) {
        fprintf(stderr, "dsv4 perplexity: %s\n", err.msg);
        return false;
    }
    return true;
}

/* The buffers, the base logits to compare with and the logits file to write. */
static bool open_buffers(struct ppl *P)
{
    const struct ppl_opts *o = P->o;
    int                    per = P->ctx - 1;
    P->n_windows               = (P->n_ids + per - 1) / per;
    P->win                     = malloc(sizeof(int32_t) * (size_t)P->ctx);
    P->lg                      = malloc(sizeof(float) * (size_t)P->ctx * (size_t)P->V);
    P->lp                      = malloc(sizeof(double) * (size_t)P->V);
    P->nlls                    = malloc(sizeof(double) * (size_t)P->n_ids);
    if (o->base_path) {
        P->lpb  = malloc(sizeof(double) * (size_t)P->V);
        P->brow = malloc(sizeof(float) * (size_t)P->V);
        P->kls  = malloc(sizeof(double) * (size_t)P->n_ids);
    }
    if (!P->win || !P->lg || !P->lp || !P->nlls || (o->base_path && (!P->lpb || !P->brow || !P->kls))) {
        fprintf(stderr, "dsv4 perplexity: out of memory\n");
        return false;
    }
    /* row r predicts ids[r] */
    if (o->base_path && !base_open(&P->base, o->base_path, P->V, P->ids, P->n_ids)) return false;
    if (o->save_path) {
        P->save             = fopen(o->save_path, "wb");
        struct lgt_header h = { 1, (uint32_t)P->V, (uint32_t)P->ctx, 0, (uint64_t)P->n_ids };
        if (!P->save || fwrite(LGT_MAGIC, 1, 8, P->save) != 8 || fwrite(&h, sizeof(h), 1, P->save) != 1 ||
            fwrite(P->ids, sizeof(int32_t), (size_t)P->n_ids, P->save) != (size_t)P->n_ids) {
            fprintf(stderr, "dsv4 perplexity: cannot write %s: %s\n", o->save_path, strerror(errno));
            return false;
        }
    }
    return true;
}

/* Scores row t of the window (target tgt): its NLL, and the KL from the base row. */
static bool score_row(struct ppl *P, const float *row, int tgt)
{
    int V = P->V;
    log_softmax(row, V, P->lp);
    P->nlls[P->n_scored] = -P->lp[tgt];
    P->nll += -P->lp[tgt];
    if (P->save && fwrite(row, sizeof(float), (size_t)V, P->save) != (size_t)V) {
        fprintf(stderr, "%sdsv4 perplexity: write error on %s\n", P->bar ? "\n" : "", P->o->save_path);
        return false;
    }
    if (P->base.f) {
        if (fread(P->brow, sizeof(float), (size_t)V, P->base.f) != (size_t)V) {
            fprintf(stderr, "%sdsv4 perplexity: %s is truncated\n", P->bar ? "\n" : "", P->o->base_path);
            return false;
        }
        log_softmax(P->brow, V, P->lpb);
        double kl = 0;
        for (int i = 0; i < V; i++) kl += exp(P->lpb[i]) * (P->lpb[i] - P->lp[i]);
        P->kls[P->n_scored] = kl > 0 ? kl : 0;
        P->base_nll += -P->lpb[tgt];
        P->agree += argmax(P->brow, V) == argmax(row, V);
    }
    P->n_scored++;
    return true;
}

/* Window w: BOS + its piece of the text from an empty state, every piece token scored. */
static bool run_window(struct ppl *P, int w)
{
    struct dsv4_err err;
    int             per = P->ctx - 1, off = w * per, n = P->n_ids - off < per ? P->n_ids - off : per, T = n + 1;
    P->win[0]           = P->bos;
    memcpy(P->win + 1, P->ids + off, sizeof(int32_t) * (size_t)n);
    dsv4_session_reset(P->s);
    for (int c = 0; c < T; c += P->chunk) {
        int m = T - c < P->chunk ? T - c : P->chunk;
        if (dsv4_session_eval(P->s, P->win + c, m, P->lg + (size_t)c * (size_t)P->V, NULL, NULL, &err)) {
            fprintf(stderr, "%sdsv4 perplexity: %s\n", P->bar ? "\n" : "", err.msg);
            return false;
        }
    }
    for (int t = 0; t < n; t++)
        if (!score_row(P, P->lg + (size_t)t * (size_t)P->V, P->win[t + 1])) return false;
    return true;
}

static void print_results(struct ppl *P)
{
    long long n_scored = P->n_scored;
    double    mean = P->nll / (double)n_scored, var = 0;
    for (long long i = 0; i < n_scored; i++) var += (P->nlls[i] - mean) * (P->nlls[i] - mean);
    double se = n_scored > 1 ? sqrt(var / (double)(n_scored - 1) / (double)n_scored) : 0;
    printf("perplexity: %.4f +/- %.4f over %lld tokens (%d windows, ctx %d)\n", exp(mean), exp(mean) * se, n_scored,
           P->n_windows, P->ctx);
    printf("mean nll: %.6f nats/token\n", mean);
    if (P->base.f) {
        double ks = 0, *kls = P->kls;
        for (long long i = 0; i < n_scored; i++) ks += kls[i];
        qsort(kls, (size_t)n_scored, sizeof(double), cmp_double);
        printf("base perplexity: %.4f (ratio %.5f)\n", exp(P->base_nll / (double)n_scored),
               exp(mean - P->base_nll / (double)n_scored));
        printf("KL divergence (base || model): mean %.6f  median %.6f  p99 %.6f  max %.6f\n", ks / (double)n_scored,
               kls[n_scored / 2], kls[(long long)((double)(n_scored - 1) * 0.99)], kls[n_scored - 1]);
        printf("top-1 agreement: %.2f%%\n", 100.0 * (double)P->agree / (double)n_scored);
    }
    fprintf(stderr, "%lld tokens in %.1f s\n", n_scored, cli_now() - P->t0);
}

static int ppl_close(struct ppl *P, int rc)
{
    if (P->save && fclose(P->save) != 0 && rc == 0) {
        fprintf(stderr, "dsv4 perplexity: write error on %s\n", P->o->save_path);
        rc = 1;
    }
    base_close(&P->base);
    free(P->win);
    free(P->lg);
    free(P->lp);
    free(P->lpb);
    free(P->brow);
    free(P->kls);
    free(P->nlls);
    free(P->ids);
    dsv4_session_free(P->s);
    dsv4_engine_close(P->e);
    dsv4_tokenizer_free(P->tok);
    return rc;
}

int cmd_perplexity(int argc, char **argv)
{
    struct ppl_opts           o = { 0 };
    struct dsv4_engine_params ep;
    cli_engine_params(&ep);
    const struct cli_group groups[] = { { NULL, PPL_OPTS, sizeof(PPL_OPTS) / sizeof(PPL_OPTS[0]), &o },
                                        cli_engine_group(&ep, true) };
    const struct cli_spec  spec     = {
        "perplexity", "usage: dsv4 perplexity -m DIR (-f TEXT | --tokens-file F) [options]\n", groups, 2, NULL
    };
    int rc = cli_parse(&spec, argc, argv);
    if (rc != CLI_PARSED) return rc;
    if (!o.dir || (!o.text_path == !o.tok_file))
        return cli_usage_error(&spec, "-m and one of -f / --tokens-file are required");
    if (o.save_path && o.base_path) {
        fprintf(stderr, "dsv4 perplexity: --save-logits and --kl-base are exclusive\n");
        return 2;
    }
    struct ppl P = { .o = &o };
    if ((rc = load_ids(&P))) return ppl_close(&P, rc);
    if (!open_model(&P, &ep) || !open_buffers(&P)) return ppl_close(&P, 1);
    P.bar = isatty(2) && P.n_windows > 1;
    P.t0  = cli_now();
    for (int w = 0; w < P.n_windows; w++) {
        if (!run_window(&P, w)) return ppl_close(&P, 1);
        if (P.bar) progress(w + 1, P.n_windows, P.nll, P.n_scored, P.t0);
    }
    print_results(&P);
    return ppl_close(&P, 0);
}
