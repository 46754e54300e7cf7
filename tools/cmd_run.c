/*
 * cmd_run.c - `dsv4 run`: generate from a prompt (text through the model directory's
 * tokenizer.json, or token ids), streaming the output as it comes, then one line with the
 * prefill and decode speeds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dsv4 run -m DIR (-p TEXT | --tokens LIST) [-n N] [--temp T] [--top-k K] [--top-p P]\n"
               "                [--min-p M] [--seed S] [--ctx N] [--revision current|initial] [--bos] [--ids]\n"
               "  -p TEXT        prompt text, encoded with DIR/tokenizer.json (no BOS unless --bos)\n"
               "  --tokens LIST  prompt as token ids (commas, spaces or newlines)\n"
               "  -n N           tokens to generate (default 64); stops earlier at EOS\n"
               "  --temp T       temperature (default 0: greedy)\n"
               "  --top-k K --top-p P --min-p M --seed S   sampling filters and seed\n"
               "  --ctx N        context length (default: prompt + N)\n"
               "  --ids          print token ids instead of text\n"
               "  --spec-draft K speculative decoding: K tokens drafted by the MTP block per step, verified\n"
               "                 in one (default %d; 0 = off; docs/SPECULATIVE.md)\n", DSV4_SPEC_DRAFT_DEFAULT);
    fputs(CLI_ENGINE_USAGE, f);
}

int cmd_run(int argc, char **argv)
{
    const char *dir = NULL, *prompt = NULL, *tok_text = NULL;
    long long   n_gen = 64, ctx = 0, spec = -1;
    bool        bos = false, print_ids = false;
    struct dsv4_sampler_params sp;
    dsv4_sampler_params_default(&sp);
    struct dsv4_engine_params ep;
    dsv4_engine_params_default(&ep);
    cli_engine_env(&ep);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int         eo = cli_engine_option("run", argc, argv, &i, &ep);
        if (eo < 0) return 2;
        if (eo > 0) continue;
        int         so = cli_sampler_option("run", argc, argv, &i, &sp, NULL);
        if (so < 0) return 2;
        if (so > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(dir = cli_value("run", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(prompt = cli_value("run", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--tokens")) {
            if (!(tok_text = cli_value("run", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-n")) {
            if (!(v = cli_value("run", argc, argv, &i)) || !cli_parse_int("run", a, v, 0, 1 << 24, &n_gen)) return 2;
        } else if (!strcmp(a, "--ctx")) {
            if (!(v = cli_value("run", argc, argv, &i)) || !cli_parse_int("run", a, v, 1, 1 << 30, &ctx)) return 2;
        } else if (!strcmp(a, "--spec-draft")) {
            if (!(v = cli_value("run", argc, argv, &i)) || !cli_parse_int("run", a, v, 0, DSV4_SPEC_MAX_DRAFT, &spec))
                return 2;
        } else if (!strcmp(a, "--revision")) {
            if (!cli_revision("run", argc, argv, &i, &ep.revision)) return 2;
        } else if (!strcmp(a, "--bos")) {
            bos = true;
        } else if (!strcmp(a, "--ids")) {
            print_ids = true;
        } else {
            fprintf(stderr, "dsv4 run: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!dir || (!prompt == !tok_text)) {
        fprintf(stderr, "dsv4 run: -m and one of -p / --tokens are required\n");
        usage(stderr);
        return 2;
    }
    struct dsv4_err err;
    int             rc   = 1;
    dsv4_tokenizer *tok  = NULL;
    dsv4_engine    *e    = NULL;
    dsv4_session   *s    = NULL;
    dsv4_sampler   *smp  = NULL;
    int32_t        *ids  = NULL;
    int             n_ids = 0;
    char           *text = NULL;
    if (prompt || !print_ids) {
        int trc = dsv4_tokenizer_load(&tok, dir, &err);
        if (trc && prompt) {
            fprintf(stderr, "dsv4 run: %s\n", err.msg);
            return 1;
        }
        if (trc) print_ids = true; /* no tokenizer: show ids */
    }
    if (prompt) {
        size_t len = strlen(prompt), cap = 3 * len + 2, n = 0;
        ids        = malloc(sizeof(int32_t) * cap);
        if (!ids || dsv4_tokenizer_encode(tok, prompt, len, bos ? DSV4_TOKENIZE_BOS : 0, ids, cap, &n, &err)) {
            fprintf(stderr, "dsv4 run: %s\n", ids ? err.msg : "out of memory");
            goto done;
        }
        n_ids = (int)n;
        if (n_ids == 0) {
            fprintf(stderr, "dsv4 run: the prompt encodes to no tokens\n");
            goto done;
        }
    } else if (!cli_parse_tokens("run", tok_text, &ids, &n_ids)) {
        rc = 2;
        goto done;
    }
    ep.log    = cli_log_stderr;
    ep.log_ud = (void *)"run";
    if (dsv4_engine_open(&e, dir, &ep, &err)) {
        fprintf(stderr, "dsv4 run: %s\n", err.msg);
        goto done;
    }
    struct dsv4_model_info info;
    dsv4_engine_info(e, &info);
    struct dsv4_session_params ssp;
    dsv4_session_params_default(&ssp);
    ssp.max_ctx = ctx ? (int)ctx : n_ids + (int)n_gen;
    if (ssp.max_ctx > info.max_ctx) ssp.max_ctx = info.max_ctx;
    if (spec < 0) spec = info.has_mtp ? DSV4_SPEC_DRAFT_DEFAULT : 0;
    if (spec > 0 && !info.has_mtp) {
        fprintf(stderr, "dsv4 run: --spec-draft needs a checkpoint with an MTP block\n");
        goto done;
    }
    ssp.mtp        = spec > 0;
    ssp.spec_draft = (int)spec;
    if (n_ids > ssp.max_ctx) {
        fprintf(stderr, "dsv4 run: the prompt has %d tokens, more than the context of %d\n", n_ids, ssp.max_ctx);
        goto done;
    }
    if (dsv4_session_create(e, &ssp, &s, &err) || dsv4_sampler_create(&smp, info.vocab_size, &sp, &err)) {
        fprintf(stderr, "dsv4 run: %s\n", err.msg);
        goto done;
    }
    int32_t eos = tok ? dsv4_tokenizer_eos(tok) : info.eos_id;
    double  t0  = cli_now();
    if (dsv4_session_eval(s, ids, n_ids, NULL, NULL, NULL, &err)) {
        fprintf(stderr, "dsv4 run: %s\n", err.msg);
        goto done;
    }
    double t1 = cli_now();
    struct dsv4_tokenizer_stream ts;
    size_t tcap = tok ? 3 * (dsv4_tokenizer_max_token_bytes(tok) + 3) : 0;
    text        = tok ? malloc(tcap + 8) : NULL;
    if (tok) dsv4_tokenizer_stream_init(&ts);
    int     generated = 0, n_pend = 0, steps = 0, drafted = 0;
    int     kept_at[DSV4_SPEC_MAX_DRAFT] = { 0 };
    int32_t pend[DSV4_SPEC_MAX_DRAFT + 1]; /* chosen tokens not printed yet; the last is not fed */
    pend[n_pend++] = dsv4_sampler_sample(smp, dsv4_session_logits(s), NULL);
    while (generated < n_gen) {
        int32_t next = pend[0];
        if (next == eos) break;
        if (print_ids) {
            printf("%s%d", generated ? " " : "", next);
        } else {
            size_t n = 0;
            if (dsv4_tokenizer_stream_push(tok, &ts, next, text, tcap, &n, &err) == DSV4_OK) fwrite(text, 1, n, stdout);
        }
        fflush(stdout);
        generated++;
        memmove(pend, pend + 1, sizeof(int32_t) * (size_t)--n_pend);
        if (n_pend) continue; /* evaluated already by the speculative step */
        if (generated == n_gen) break;
        if (dsv4_session_pos(s) >= ssp.max_ctx) {
            fprintf(stderr, "\ndsv4 run: context of %d tokens is full\n", ssp.max_ctx);
            break;
        }
        int k = (int)spec < ssp.max_ctx - dsv4_session_pos(s) - 1 ? (int)spec : ssp.max_ctx - dsv4_session_pos(s) - 1;
        if (dsv4_session_spec_step(s, next, k, smp, pend, &n_pend, NULL, &err)) {
            fprintf(stderr, "\ndsv4 run: %s\n", err.msg);
            goto done;
        }
        if (k > 0) {
            steps++, drafted += k;
            for (int i = 0; i < n_pend - 1; i++) kept_at[i]++;
        }
    }
    if (tok && !print_ids) {
        size_t n = 0;
        dsv4_tokenizer_stream_flush(&ts, text, &n);
        fwrite(text, 1, n, stdout);
    }
    double t2 = cli_now();
    printf("\n");
    fflush(stdout); /* the text, then the figures on stderr */
    fprintf(stderr, "prefill: %d tokens in %.3f s (%.2f tok/s); decode: %d tokens in %.3f s (%.2f tok/s)\n", n_ids,
            t1 - t0, n_ids / (t1 - t0), generated, t2 - t1, generated > 0 ? generated / (t2 - t1) : 0.0);
    if (steps) {
        int kept = 0;
        for (int i = 0; i < spec; i++) kept += kept_at[i];
        fprintf(stderr, "speculative: %d steps of %lld drafts, %d drafted, %d kept (%.1f %%), %.2f tokens a step; kept "
                        "per position:", steps, spec, drafted, kept, 100.0 * kept / drafted, (double)(kept + steps) / steps);
        for (int i = 0; i < spec; i++) fprintf(stderr, " %.2f", (double)kept_at[i] / steps);
        fprintf(stderr, "\n");
    }
    rc = 0;
done:
    free(text);
    free(ids);
    dsv4_sampler_free(smp);
    dsv4_session_free(s);
    dsv4_engine_close(e);
    dsv4_tokenizer_free(tok);
    return rc;
}
