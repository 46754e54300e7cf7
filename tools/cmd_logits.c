/*
 * cmd_logits.c - `dsv4 logits`: teacher-forced logits for a token list at any chunking, the
 * contract shared with tools/ref/dsv4_ref.py logits (float32 little-endian [T, vocab], no
 * header, row t after tokens[0..t]).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dsv4 logits -m DIR (--tokens LIST | --tokens-file F) [--chunk N] [--revision current|initial]\n"
               "                   [--mtp-out FILE] --out FILE\n"
               "  --tokens LIST      ids separated by commas, spaces or newlines\n"
               "  --chunk N          feed the tokens in chunks of N (1 = pure decode; default: all at once)\n"
               "  --revision R       demo revision to reproduce (default current)\n"
               "  --mtp-out FILE     also write the MTP head's logits, [T-1, vocab]: row t predicts token t+2\n"
               "  --out FILE         float32 little-endian [T, vocab], row t after tokens[0..t]\n");
    fputs(CLI_ENGINE_USAGE, f);
}

int cmd_logits(int argc, char **argv)
{
    const char *dir = NULL, *out = NULL, *mtp_out = NULL, *tok_text = NULL, *tok_file = NULL;
    long long   chunk = 0;
    struct dsv4_engine_params ep;
    dsv4_engine_params_default(&ep);
    cli_engine_env(&ep);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int         eo = cli_engine_option("logits", argc, argv, &i, &ep);
        if (eo < 0) return 2;
        if (eo > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(dir = cli_value("logits", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--tokens")) {
            if (!(tok_text = cli_value("logits", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--tokens-file")) {
            if (!(tok_file = cli_value("logits", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--out")) {
            if (!(out = cli_value("logits", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--mtp-out")) {
            if (!(mtp_out = cli_value("logits", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--chunk")) {
            if (!(v = cli_value("logits", argc, argv, &i)) || !cli_parse_int("logits", a, v, 1, 1 << 20, &chunk)) return 2;
        } else if (!strcmp(a, "--revision")) {
            if (!cli_revision("logits", argc, argv, &i, &ep.revision)) return 2;
        } else {
            fprintf(stderr, "dsv4 logits: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!dir || !out || (!tok_text == !tok_file)) {
        fprintf(stderr, "dsv4 logits: -m, --out and one of --tokens / --tokens-file are required\n");
        usage(stderr);
        return 2;
    }
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
    sp.mtp       = mtp_out != NULL;
    int           rc = 1;
    dsv4_session *s  = NULL;
    float        *lg = malloc(sizeof(float) * (size_t)T * (size_t)info.vocab_size);
    float        *ml = mtp_out ? malloc(sizeof(float) * (size_t)T * (size_t)info.vocab_size) : NULL;
    if (!lg || (mtp_out && !ml)) {
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
    }
    if (!cli_write_f32("logits", out, lg, (size_t)T * (size_t)info.vocab_size)) goto done;
    if (mtp_out && !cli_write_f32("logits", mtp_out, ml, (size_t)n_mtp * (size_t)info.vocab_size)) goto done;
    rc = 0;
done:
    dsv4_session_free(s);
    dsv4_engine_close(e);
    free(lg);
    free(ml);
    free(toks);
    return rc;
}
