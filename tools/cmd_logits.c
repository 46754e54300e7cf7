/*
 * cmd_logits.c - `dsv4 logits`: teacher-forced logits for a token list at any chunking, the
 * contract shared with tools/ref/dsv4_ref.py logits (float32 little-endian [T, vocab], no
 * header, row t after tokens[0..t]).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

struct logits_opts {
    const char *dir, *out, *mtp_out, *dspark_out, *tok_text, *tok_file;
    int         chunk;
};

#define LO(field) offsetof(struct logits_opts, field)
static const struct cli_opt LOGITS_OPTS[] = {
    { "--model", "-m", "DIR", "checkpoint directory", CLI_STR, LO(dir), 0, 0, NULL },
    { "--tokens", NULL, "LIST", "ids separated by commas, spaces or newlines", CLI_STR, LO(tok_text), 0, 0, NULL },
    { "--tokens-file", NULL, "F", "the ids from a file (same syntax)", CLI_STR, LO(tok_file), 0, 0, NULL },
    { "--chunk", NULL, "N", "feed the tokens in chunks of N (1 = pure decode; default: all at once)", CLI_INT, LO(chunk),
      1, 1 << 20, NULL },
    { "--mtp-out", NULL, "FILE", "also write the MTP head's logits, [T-1, vocab]: row t predicts token t+2", CLI_STR,
      LO(mtp_out), 0, 0, NULL },
    { "--dspark-out", NULL, "FILE",
      "DeepSeek-V4.1: also write the DSpark draft after each position, [T-1, B, vocab + 1]: row t drafts "
      "tokens t+2 .. t+B+1 with token t+1 known (greedy Markov chain), column vocab the confidence; the "
      "tokens are then fed one at a time",
      CLI_STR, LO(dspark_out), 0, 0, NULL },
    { "--out", NULL, "FILE", "float32 little-endian [T, vocab], row t after tokens[0..t]", CLI_STR, LO(out), 0, 0, NULL },
};
#undef LO

/* The DSpark rows of a V4.1 session fed tokens one at a time: after position t (t < T - 1),
 * the draft with toks[t + 1] known, [B, V] logits then the confidence column, into
 * rows [T - 1, B, V + 1]. */
static bool dspark_after(dsv4_session *s, const int32_t *toks, int t, int T, int B, int V, float *rows, float *tmp,
                         struct dsv4_err *err)
{
    float conf[64];
    if (t + 1 >= T) return true;
    if (B > 64 || dsv4_session_dspark_rows(s, toks[t + 1], tmp, conf, err)) {
        if (B > 64) snprintf(err->msg, sizeof(err->msg), "a DSpark block of %d rows (at most 64)", B);
        return false;
    }
    for (int i = 0; i < B; i++) {
        float *row = rows + ((size_t)t * (size_t)B + (size_t)i) * (size_t)(V + 1);
        memcpy(row, tmp + (size_t)i * (size_t)V, sizeof(float) * (size_t)V);
        row[V] = conf[i];
    }
    return true;
}

int cmd_logits(int argc, char **argv)
{
    struct logits_opts        o = { 0 };
    struct dsv4_engine_params ep;
    cli_engine_params(&ep);
    const struct cli_group groups[] = { { NULL, LOGITS_OPTS, sizeof(LOGITS_OPTS) / sizeof(LOGITS_OPTS[0]), &o },
                                        cli_engine_group(&ep, true) };
    const struct cli_spec  spec     = {
        "logits", "usage: dsv4 logits -m DIR (--tokens LIST | --tokens-file F) --out FILE [options]\n", groups, 2, NULL
    };
    int rc = cli_parse(&spec, argc, argv);
    if (rc != CLI_PARSED) return rc;
    const char *dir = o.dir, *out = o.out, *mtp_out = o.mtp_out, *tok_text = o.tok_text, *tok_file = o.tok_file;
    int         chunk = o.dspark_out ? 1 : o.chunk; /* a draft follows every position */
    if (!dir || !out || (!tok_text == !tok_file))
        return cli_usage_error(&spec, "-m, --out and one of --tokens / --tokens-file are required");
    int32_t *toks;
    int      T;
    if (tok_text ? !cli_parse_tokens("logits", tok_text, &toks, &T) : !cli_read_tokens_file("logits", tok_file, &toks, &T))
        return 2;
    ep.log    = cli_log_stderr;
    ep.log_ud = (void *)"logits";
    struct dsv4_err err;
    dsv4_engine    *e;
    if (dsv4_engine_open(&e, dir, &ep, &err)) {
        fprintf(stderr, "dsv4 logits: %s\n", err.msg);
        free(toks);
        return 1;
    }
    struct dsv4_model_info info;
    dsv4_engine_info(e, &info);
    struct dsv4_session_params sp;
    dsv4_session_params_default(&sp);
    sp.max_ctx   = T;
    sp.max_chunk = chunk ? (int)chunk : T;
    sp.mtp       = mtp_out != NULL || o.dspark_out != NULL;
    rc               = 1;
    dsv4_session *s  = NULL;
    size_t        V  = (size_t)info.vocab_size, B = (size_t)info.dspark_block;
    float        *lg = malloc(sizeof(float) * (size_t)T * V);
    float        *ml = mtp_out ? malloc(sizeof(float) * (size_t)T * V) : NULL;
    float        *dr = o.dspark_out ? malloc(sizeof(float) * (size_t)T * B * (V + 1) + 1) : NULL;
    float        *dt = o.dspark_out ? malloc(sizeof(float) * B * V + 1) : NULL;
    if (o.dspark_out && !B) {
        fprintf(stderr, "dsv4 logits: --dspark-out: the checkpoint has no DSpark stages\n");
        goto done;
    }
    if (!lg || (mtp_out && !ml) || (o.dspark_out && (!dr || !dt))) {
        fprintf(stderr, "dsv4 logits: out of memory for %d x %d logits\n", T, info.vocab_size);
        goto done;
    }
    if (dsv4_session_create(e, &sp, &s, &err)) {
        fprintf(stderr, "dsv4 logits: %s\n", err.msg);
        goto done;
    }
    int step = sp.max_chunk, n_mtp = 0;
    for (int off = 0; off < T; off += step) {
        int n = T - off < step ? T - off : step, got = 0;
        if (dsv4_session_eval(s, toks + off, n, lg + (size_t)off * (size_t)info.vocab_size,
                              ml ? ml + (size_t)n_mtp * (size_t)info.vocab_size : NULL, &got, &err)) {
            fprintf(stderr, "dsv4 logits: %s\n", err.msg);
            goto done;
        }
        n_mtp += got;
        if (dr && !dspark_after(s, toks, off, T, (int)B, (int)V, dr, dt, &err)) {
            fprintf(stderr, "dsv4 logits: %s\n", err.msg);
            goto done;
        }
    }
    if (!cli_write_f32("logits", out, lg, (size_t)T * (size_t)info.vocab_size)) goto done;
    if (mtp_out && !cli_write_f32("logits", mtp_out, ml, (size_t)n_mtp * (size_t)info.vocab_size)) goto done;
    if (dr && !cli_write_f32("logits", o.dspark_out, dr, (size_t)(T - 1) * B * (V + 1))) goto done;
    rc = 0;
done:
    dsv4_session_free(s);
    dsv4_engine_close(e);
    free(lg);
    free(ml);
    free(dr);
    free(dt);
    free(toks);
    return rc;
}
