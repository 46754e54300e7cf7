/*
 * cmd_tokenize.c - `dsv4 tokenize` and `dsv4 detokenize`: the tokenizer as a filter.
 *
 *   dsv4 tokenize --tokenizer FILE [--bos] < text     one id per line
 *   dsv4 detokenize --tokenizer FILE < ids            exactly the decoded bytes
 *
 * tokenize encodes the whole of standard input as one text, byte for byte (no newline is
 * stripped, invalid UTF-8 is repaired as the library documents). detokenize reads ids
 * separated by any whitespace and writes the bytes they stand for, adding nothing.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static char *read_all(FILE *f, size_t *n)
{
    size_t cap = 1 << 16, len = 0;
    char  *buf = malloc(cap);
    while (buf) {
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap) break;
        char *nb = cap <= SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    if (buf && ferror(f)) {
        free(buf);
        buf = NULL;
    }
    *n = len;
    return buf;
}

struct tok_opts {
    const char *path;
    bool        bos;
};

/* detokenize takes the first option alone. */
static const struct cli_opt TOK_OPTS[] = {
    { "--tokenizer", "-t", "FILE", "tokenizer.json (or a model directory holding one)", CLI_STR,
      offsetof(struct tok_opts, path), 0, 0, NULL },
    { "--bos", NULL, NULL, "put the BOS id first", CLI_FLAG, offsetof(struct tok_opts, bos), 0, 0, NULL },
};

/* Parses the shared options; CLI_PARSED to go on, or an exit status. */
static int parse_args(const char *cmd, int argc, char **argv, struct tok_opts *o)
{
    bool                   tok   = !strcmp(cmd, "tokenize");
    const struct cli_group group = { NULL, TOK_OPTS, tok ? 2 : 1, o };
    const struct cli_spec  spec  = {
        cmd, tok ? "usage: dsv4 tokenize --tokenizer FILE [--bos] < text\n" : "usage: dsv4 detokenize --tokenizer FILE < ids\n",
        &group, 1,
        tok ? "Encodes all of standard input as one text and prints one id per line.\n" : "Reads whitespace-separated ids and writes exactly the bytes they decode to.\n"
    };
    int rc = cli_parse(&spec, argc, argv);
    if (rc != CLI_PARSED) return rc;
    if (!o->path) return cli_usage_error(&spec, "--tokenizer FILE is required");
    return CLI_PARSED;
}

int cmd_tokenize(int argc, char **argv)
{
    struct tok_opts o  = { 0 };
    int             rc = parse_args("tokenize", argc, argv, &o);
    if (rc != CLI_PARSED) return rc;
    const char *path = o.path;
    bool        bos  = o.bos;

    struct dsv4_err err;
    dsv4_tokenizer *tok;
    if (dsv4_tokenizer_load(&tok, path, &err)) {
        fprintf(stderr, "dsv4 tokenize: %s\n", err.msg);
        return 1;
    }
    size_t n;
    char  *text = read_all(stdin, &n);
    if (!text) {
        fprintf(stderr, "dsv4 tokenize: cannot read standard input: %s\n", strerror(errno));
        dsv4_tokenizer_free(tok);
        return 1;
    }
    size_t   cap = 3 * n + 1, n_ids;
    int32_t *ids = malloc(cap * sizeof(*ids));
    rc           = 1;
    if (!ids) {
        fprintf(stderr, "dsv4 tokenize: out of memory\n");
    } else if (dsv4_tokenizer_encode(tok, text, n, bos ? DSV4_TOKENIZE_BOS : 0, ids, cap, &n_ids, &err)) {
        fprintf(stderr, "dsv4 tokenize: %s\n", err.msg);
    } else {
        for (size_t i = 0; i < n_ids; i++) printf("%d\n", (int)ids[i]);
        rc = fflush(stdout) == 0 ? 0 : 1;
    }
    free(ids);
    free(text);
    dsv4_tokenizer_free(tok);
    return rc;
}

int cmd_detokenize(int argc, char **argv)
{
    struct tok_opts o  = { 0 };
    int             rc = parse_args("detokenize", argc, argv, &o);
    if (rc != CLI_PARSED) return rc;
    const char *path = o.path;

    struct dsv4_err err;
    dsv4_tokenizer *tok;
    if (dsv4_tokenizer_load(&tok, path, &err)) {
        fprintf(stderr, "dsv4 detokenize: %s\n", err.msg);
        return 1;
    }
    size_t n;
    char  *text = read_all(stdin, &n);
    if (!text) {
        fprintf(stderr, "dsv4 detokenize: cannot read standard input: %s\n", strerror(errno));
        dsv4_tokenizer_free(tok);
        return 1;
    }
    /* Every id is at least one character plus a separator, so n / 2 + 1 ids fit. */
    int32_t *ids   = malloc((n / 2 + 1) * sizeof(*ids));
    size_t   n_ids = 0, i = 0;
    rc             = ids ? 0 : 1;
    while (rc == 0 && i < n) {
        if (strchr(" \t\r\n\v\f", text[i]) && text[i]) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < n && !(strchr(" \t\r\n\v\f", text[j]) && text[j])) j++;
        char word[16];
        long long v;
        if (j - i >= sizeof(word)) {
            fprintf(stderr, "dsv4 detokenize: '%.*s...' is not a token id\n", 15, text + i);
            rc = 1;
            break;
        }
        memcpy(word, text + i, j - i);
        word[j - i] = '\0';
        if (!cli_parse_int("detokenize", "an id", word, 0, INT32_MAX, &v)) {
            rc = 1;
            break;
        }
        ids[n_ids++] = (int32_t)v;
        i            = j;
    }
    if (rc == 0) {
        size_t len, cap = n_ids * dsv4_tokenizer_max_token_bytes(tok) + 1;
        char  *out = malloc(cap);
        if (!out) {
            fprintf(stderr, "dsv4 detokenize: out of memory\n");
            rc = 1;
        } else if (dsv4_tokenizer_decode(tok, ids, n_ids, out, cap, &len, &err)) {
            fprintf(stderr, "dsv4 detokenize: %s\n", err.msg);
            rc = 1;
        } else if (fwrite(out, 1, len, stdout) != len || fflush(stdout) != 0) {
            fprintf(stderr, "dsv4 detokenize: cannot write standard output\n");
            rc = 1;
        }
        free(out);
    }
    free(ids);
    free(text);
    dsv4_tokenizer_free(tok);
    return rc;
}
