/*
 * cmd_chat.c - `dsv4 chat`: an interactive multi-turn conversation with a model.
 *
 * Each turn renders the whole conversation with the library's V4 chat encoding
 * (dsv4_chat_render: BOS, optional system text, <｜User｜>...<｜Assistant｜></think> in chat
 * mode or <think> in thinking mode, earlier replies closed by EOS), tokenizes it with the
 * model's tokenizer.json and feeds the session only what it does not hold yet: when the
 * session's tokens are a prefix of the new prompt (the usual case: the reply's own tokens
 * re-tokenize the same), only the new user turn is evaluated; otherwise the session starts
 * over. The reply streams as it is sampled and ends at EOS, at -n tokens or on Ctrl-C.
 *
 * Input: on a terminal, a small line editor (raw mode via termios; no readline): arrows,
 * Home/End, Ctrl-A/E/B/F, Backspace/Delete, Ctrl-U/K/W, Ctrl-L, history with Up/Down;
 * Ctrl-C clears the line, Ctrl-D on an empty line (or end of input) leaves. Otherwise lines
 * are read plainly, so a conversation can be scripted through a pipe. Lines starting with
 * '/' are commands: /reset, /quit, /help.
 *
 * --save FILE writes the conversation after each reply and at exit: the session
 * (dsv4_session_save: its tokens, KV and last logits) to FILE and the turns' text to
 * FILE.turns (JSON), both crash-safely. --load FILE resumes from them at start, so the next
 * user turn evaluates only its own tokens; a file that fails a check is reported and the
 * conversation starts empty.
 *
 * --kv-disk-dir DIR evaluates each turn's new tokens through the prompt cache
 * (dsv4_prompt_cache_eval): when the session holds nothing (the first turn, after /reset or
 * after the prompt diverged) the deepest stored prefix of the prompt is loaded, and each
 * turn stores the state at the deepest page boundary its prompt reaches past what the
 * session held (boundaries the reply's own tokens cross are stored by the next turn only when its
 * prompt reaches a later one). Both --save/--load and --kv-disk-dir may be given.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* ------------------------------------------------------------------ line editor */

enum { LINE_MAX_BYTES = 8192, HISTORY_MAX = 100 };

struct editor {
    bool           tty;
    struct termios saved;
    char          *history[HISTORY_MAX];
    int            n_history;
};

static bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

static int n_chars(const char *s, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++) k += !is_cont((unsigned char)s[i]);
    return k;
}

static void refresh(const char *prompt, const char *buf, size_t len, size_t pos)
{
    printf("\r%s%.*s\x1b[K", prompt, (int)len, buf);
    int back = n_chars(buf + pos, len - pos);
    if (back) printf("\x1b[%dD", back);
    fflush(stdout);
}

static size_t left_of(const char *buf, size_t pos)
{
    if (pos > 0) pos--;
    while (pos > 0 && is_cont((unsigned char)buf[pos])) pos--;
    return pos;
}

static size_t right_of(const char *buf, size_t len, size_t pos)
{
    if (pos < len) pos++;
    while (pos < len && is_cont((unsigned char)buf[pos])) pos++;
    return pos;
}

static int read_byte(void)
{
    unsigned char c;
    for (;;) {
        ssize_t r = read(STDIN_FILENO, &c, 1);
        if (r == 1) return c;
        if (r == 0 || errno != EINTR) return -1;
    }
}

static void history_add(struct editor *ed, const char *line)
{
    if (!*line || (ed->n_history && !strcmp(ed->history[ed->n_history - 1], line))) return;
    char *copy = strdup(line);
    if (!copy) return;
    if (ed->n_history == HISTORY_MAX) {
        free(ed->history[0]);
        memmove(ed->history, ed->history + 1, sizeof(char *) * (HISTORY_MAX - 1));
        ed->n_history--;
    }
    ed->history[ed->n_history++] = copy;
}

/* One edited line into buf (NUL-terminated). Returns 1 for a line, 0 at end of input. */
static int edit_line(struct editor *ed, const char *prompt, char *buf)
{
    struct termios raw = ed->saved;
    raw.c_iflag &= (tcflag_t) ~(BRKINT | ICRNL | INPCK | ISTRIP | IXON);
    raw.c_lflag &= (tcflag_t) ~(ECHO | ICANON | IEXTEN | ISIG);
    raw.c_cc[VMIN]  = 1;
    raw.c_cc[VTIME] = 0;
    tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw);
    size_t len = 0, pos = 0;
    int    hist = ed->n_history, ret = 1;
    buf[0]      = 0;
    refresh(prompt, buf, len, pos);
    for (;;) {
        int c = read_byte();
        if (c < 0 || (c == 4 && len == 0)) { /* end of input, or Ctrl-D on an empty line */
            ret = 0;
            break;
        }
        if (c == '\r' || c == '\n') break;
        if (c == 3) { /* Ctrl-C: drop the line */
            printf("^C\r\n");
            len = pos = 0;
        } else if (c == 127 || c == 8) { /* Backspace */
            size_t s = left_of(buf, pos);
            memmove(buf + s, buf + pos, len - pos);
            len -= pos - s;
            pos = s;
        } else if (c == 4) { /* Ctrl-D: delete under the cursor */
            size_t e = right_of(buf, len, pos);
            memmove(buf + pos, buf + e, len - e);
            len -= e - pos;
        } else if (c == 1) {
            pos = 0;
        } else if (c == 5) {
            pos = len;
        } else if (c == 21) { /* Ctrl-U */
            memmove(buf, buf + pos, len - pos);
            len -= pos;
            pos = 0;
        } else if (c == 11) { /* Ctrl-K */
            len = pos;
        } else if (c == 23) { /* Ctrl-W: the word before the cursor */
            size_t s = pos;
            while (s > 0 && buf[s - 1] == ' ') s--;
            while (s > 0 && buf[s - 1] != ' ') s--;
            memmove(buf + s, buf + pos, len - pos);
            len -= pos - s;
            pos = s;
        } else if (c == 12) { /* Ctrl-L */
            printf("\x1b[H\x1b[2J");
        } else if (c == 2) { /* Ctrl-B / Ctrl-F */
            pos = left_of(buf, pos);
        } else if (c == 6) {
            pos = right_of(buf, len, pos);
        } else if (c == 27) { /* escape sequences: arrows, Home/End, Delete */
            int a = read_byte(), b = a < 0 ? -1 : read_byte();
            if (a != '[' && a != 'O') continue;
            if (b >= '0' && b <= '9') {
                int t = read_byte();
                if (t != '~') continue;
                if (b == '1' || b == '7') pos = 0;
                else if (b == '4' || b == '8') pos = len;
                else if (b == '3' && pos < len) {
                    size_t e = right_of(buf, len, pos);
                    memmove(buf + pos, buf + e, len - e);
                    len -= e - pos;
                }
            } else if (b == 'H') {
                pos = 0;
            } else if (b == 'F') {
                pos = len;
            } else if (b == 'A' || b == 'B') {
                int h = hist + (b == 'A' ? -1 : 1);
                if (h < 0 || h > ed->n_history) continue;
                hist            = h;
                const char *src = h < ed->n_history ? ed->history[h] : "";
                len = pos = strlen(src) < LINE_MAX_BYTES - 1 ? strlen(src) : LINE_MAX_BYTES - 1;
                memcpy(buf, src, len);
            } else if (b == 'D') {
                pos = left_of(buf, pos);
            } else if (b == 'C') {
                pos = right_of(buf, len, pos);
            }
        } else if (c >= 32 && len < LINE_MAX_BYTES - 1) {
            memmove(buf + pos + 1, buf + pos, len - pos);
            buf[pos++] = (char)c;
            len++;
        }
        buf[len] = 0;
        refresh(prompt, buf, len, pos);
    }
    buf[len] = 0;
    tcsetattr(STDIN_FILENO, TCSAFLUSH, &ed->saved);
    printf("\n");
    fflush(stdout);
    if (ret) history_add(ed, buf);
    return ret;
}

static int read_line(struct editor *ed, const char *prompt, char *buf)
{
    if (ed->tty) return edit_line(ed, prompt, buf);
    if (!fgets(buf, LINE_MAX_BYTES, stdin)) return 0;
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = 0;
    return 1;
}

/* ------------------------------------------------------------------ conversation */

struct turn {
    char *user, *reply, *reasoning;
};

struct chat {
    dsv4_tokenizer            *tok;
    dsv4_engine               *engine;
    dsv4_session              *s;
    dsv4_sampler              *smp;
    struct dsv4_model_info     info;
    struct dsv4_chat_params    cp;
    const char                *system;
    struct turn               *turns;
    int                        n_turns, cap_turns;
    int32_t                   *held; /* tokens the session holds, in order */
    int                        n_held, ctx;
    long long                  max_reply;
    int                        spec; /* --spec-draft */
    const char                *save; /* --save FILE */
    dsv4_prompt_cache         *pc;   /* --kv-disk-dir, or NULL */
    char                      *loaded_system; /* --load's system text (owned) */
};

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

static void forget(struct chat *c)
{
    for (int i = 0; i < c->n_turns; i++) {
        free(c->turns[i].user);
        free(c->turns[i].reply);
        free(c->turns[i].reasoning);
    }
    c->n_turns = 0;
    c->n_held  = 0;
    dsv4_session_reset(c->s);
}

static int fail(struct dsv4_err *err, int code, const char *msg)
{
    err->code = code;
    snprintf(err->msg, sizeof(err->msg), "%s", msg);
    return code;
}

/* The prompt for the conversation so far plus the pending user turn, as token ids. */
static int render_prompt(struct chat *c, int32_t **ids, int *n_ids, struct dsv4_err *err)
{
    size_t                    n_msgs = (size_t)(2 * c->n_turns + 1), k = 0;
    struct dsv4_chat_message *m      = calloc(n_msgs, sizeof(*m));
    if (!m) return fail(err, DSV4_ENOMEM, "out of memory");
    if (c->system) m[k++] = (struct dsv4_chat_message){ .role = DSV4_CHAT_ROLE_SYSTEM, .content = c->system };
    for (int i = 0; i < c->n_turns; i++) {
        m[k++] = (struct dsv4_chat_message){ .role = DSV4_CHAT_ROLE_USER, .content = c->turns[i].user };
        if (c->turns[i].reply)
            m[k++] = (struct dsv4_chat_message){ .role      = DSV4_CHAT_ROLE_ASSISTANT,
                                                 .content   = c->turns[i].reply,
                                                 .reasoning = c->turns[i].reasoning };
    }
    char  *text = NULL;
    size_t len  = 0;
    int    rc   = dsv4_chat_render(m, k, &c->cp, &text, &len, err);
    free(m);
    if (rc) return rc;
    size_t cap = 3 * len + 1, n = 0;
    *ids       = malloc(sizeof(int32_t) * cap);
    if (!*ids) rc = fail(err, DSV4_ENOMEM, "out of memory");
    else rc = dsv4_tokenizer_encode(c->tok, text, len, 0, *ids, cap, &n, err);
    free(text);
    *n_ids = (int)n;
    return rc;
}

/* Feeds the session the tokens of ids it does not hold yet (from scratch if they diverge). */
static int sync_session(struct chat *c, const int32_t *ids, int n, struct dsv4_err *err)
{
    if (c->n_held > n || memcmp(c->held, ids, sizeof(int32_t) * (size_t)c->n_held) != 0) {
        dsv4_session_reset(c->s);
        c->n_held = 0;
    }
    if (n > c->n_held) {
        int rc = cli_prompt_cache_eval("chat", c->pc, c->s, ids, n, err);
        if (rc) {
            dsv4_session_reset(c->s);
            c->n_held = 0;
            return rc;
        }
        memcpy(c->held + c->n_held, ids + c->n_held, sizeof(int32_t) * (size_t)(n - c->n_held));
        c->n_held = n;
    }
    return DSV4_OK;
}

static bool append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = (*cap + n + 1) * 2;
        char  *nb = realloc(*buf, nc);
        if (!nb) return false;
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return true;
}

/* One exchange: the user's line in, the streamed reply out. */
/* ------------------------------------------------------------------ --save / --load */

static json_t *turns_json(const struct chat *c)
{
    json_t *turns = json_array();
    for (int i = 0; i < c->n_turns; i++) {
        const struct turn *t = &c->turns[i];
        json_array_append_new(turns, json_pack("{s:s, s:s?, s:s?}", "user", t->user, "reply", t->reply,
                                               "reasoning", t->reasoning));
    }
    return json_pack("{s:i, s:s?, s:b, s:o}", "version", 1, "system", c->system, "think",
                     c->cp.mode == DSV4_CHAT_MODE_THINKING, "turns", turns);
}

/* FILE.turns written crash-safely (temp, fsync, rename); false with errno. */
static bool save_turns(const struct chat *c, const char *path)
{
    char tmp[4200], dst[4200];
    snprintf(dst, sizeof(dst), "%s.turns", path);
    snprintf(tmp, sizeof(tmp), "%s.turns.tmp.%ld", path, (long)getpid());
    json_t *j  = turns_json(c);
    FILE   *f  = j ? fopen(tmp, "w") : NULL;
    bool    ok = f && json_dumpf(j, f, JSON_INDENT(1)) == 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f && fclose(f) != 0) ok = false;
    json_decref(j);
    if (ok && rename(tmp, dst) == 0) return true;
    unlink(tmp);
    return false;
}

static void save_chat(struct chat *c, const char *path)
{
    struct dsv4_err err;
    if (dsv4_session_pos(c->s) != c->n_held) return; /* cannot happen: held mirrors the session */
    if (!save_turns(c, path)) fprintf(stderr, "dsv4 chat: cannot save %s.turns: %s\n", path, strerror(errno));
    else if (dsv4_session_save(c->s, path, c->held, c->n_held, &err))
        fprintf(stderr, "dsv4 chat: %s\n", err.msg);
}

/* The turns of FILE.turns into c; false with a message in why. */
static bool load_turns(struct chat *c, const char *path, char *why, size_t cap)
{
    char         name[4200];
    json_error_t je;
    snprintf(name, sizeof(name), "%s.turns", path);
    json_t *j = json_load_file(name, 0, &je), *turns = json_object_get(j, "turns");
    if (!j || !json_is_array(turns) || json_integer_value(json_object_get(j, "version")) != 1) {
        snprintf(why, cap, "%s: %s", name, j ? "not a version 1 turns file" : je.text);
        json_decref(j);
        return false;
    }
    size_t n = json_array_size(turns);
    c->turns = calloc(n ? n : 1, sizeof(*c->turns));
    c->cap_turns = (int)(n ? n : 1);
    for (size_t i = 0; c->turns && i < n; i++) {
        const char *u = NULL, *r = NULL, *rs = NULL;
        json_unpack(json_array_get(turns, i), "{s?s, s?s, s?s}", "user", &u, "reply", &r, "reasoning", &rs);
        c->turns[c->n_turns++] = (struct turn){ strdup(u ? u : ""), r ? strdup(r) : NULL, rs ? strdup(rs) : NULL };
    }
    const char *sys = json_string_value(json_object_get(j, "system"));
    if (sys && !c->system) c->system = c->loaded_system = strdup(sys);
    if (json_is_true(json_object_get(j, "think"))) c->cp.mode = DSV4_CHAT_MODE_THINKING;
    json_decref(j);
    return c->turns != NULL;
}

static void load_chat(struct chat *c, const char *path)
{
    struct dsv4_err err;
    char            why[4800];
    int             n = 0;
    if (dsv4_session_load(c->s, path, c->held, c->ctx, &n, &err)) {
        fprintf(stderr, "dsv4 chat: not resumed: %s\n", err.msg);
    } else if (!load_turns(c, path, why, sizeof(why))) {
        fprintf(stderr, "dsv4 chat: not resumed: %s\n", why);
        dsv4_session_reset(c->s);
    } else {
        c->n_held = n;
        fprintf(stderr, "dsv4 chat: resumed %s: %d turns, %d tokens held\n", path, c->n_turns, n);
    }
}

static int exchange(struct chat *c, const char *line)
{
    struct dsv4_err err;
    if (c->n_turns == c->cap_turns) {
        int          nc = c->cap_turns ? 2 * c->cap_turns : 8;
        struct turn *nt = realloc(c->turns, sizeof(*nt) * (size_t)nc);
        if (!nt) return DSV4_ENOMEM;
        c->turns     = nt;
        c->cap_turns = nc;
    }
    struct turn *t = &c->turns[c->n_turns];
    *t             = (struct turn){ strdup(line), NULL, NULL };
    if (!t->user) return DSV4_ENOMEM;
    c->n_turns++;
    int32_t *ids = NULL;
    int      n   = 0;
    int      rc  = render_prompt(c, &ids, &n, &err);
    if (rc == DSV4_OK && n >= c->ctx) {
        fprintf(stderr, "dsv4 chat: the conversation has %d tokens, the context holds %d; /reset to start over\n", n,
                c->ctx);
        rc = DSV4_ERANGE;
    } else if (rc == DSV4_OK) {
        rc = sync_session(c, ids, n, &err);
        if (rc) fprintf(stderr, "dsv4 chat: %s\n", err.msg);
    } else {
        fprintf(stderr, "dsv4 chat: %s\n", err.msg);
    }
    free(ids);
    if (rc) {
        free(t->user);
        c->n_turns--;
        return rc;
    }

    int32_t                      eos  = dsv4_tokenizer_eos(c->tok);
    size_t                       tcap = 3 * (dsv4_tokenizer_max_token_bytes(c->tok) + 3);
    char                        *piece = malloc(tcap + 1), *reply = NULL;
    size_t                       rlen = 0, rcap = 0;
    struct dsv4_tokenizer_stream ts;
    dsv4_tokenizer_stream_init(&ts);
    if (!piece || !append(&reply, &rlen, &rcap, "", 0)) {
        free(piece);
        return DSV4_ENOMEM;
    }
    interrupted = 0;
    /* chosen tokens not printed yet; all but the last are in the session (and in held) */
    int32_t pend[DSV4_SPEC_MAX_DRAFT + 1];
    int     n_pend = 0;
    pend[n_pend++] = dsv4_sampler_sample(c->smp, dsv4_session_logits(c->s), NULL);
    for (long long k = 0; k < c->max_reply && !interrupted; k++) {
        int32_t next = pend[0];
        memmove(pend, pend + 1, sizeof(int32_t) * (size_t)--n_pend);
        if (next == eos) break;
        size_t m = 0;
        if (dsv4_tokenizer_stream_push(c->tok, &ts, next, piece, tcap, &m, &err) == DSV4_OK && m) {
            fwrite(piece, 1, m, stdout);
            fflush(stdout);
            append(&reply, &rlen, &rcap, piece, m);
        }
        if (n_pend) continue; /* evaluated already by the speculative step */
        if (c->n_held + 1 >= c->ctx) {
            fprintf(stderr, "\ndsv4 chat: the context of %d tokens is full; /reset to start over", c->ctx);
            break;
        }
        int kk = c->spec < c->ctx - c->n_held - 2 ? c->spec : c->ctx - c->n_held - 2;
        if (dsv4_session_spec_step(c->s, next, kk > 0 ? kk : 0, c->smp, pend, &n_pend, NULL, &err)) {
            fprintf(stderr, "\ndsv4 chat: %s", err.msg);
            break;
        }
        c->held[c->n_held++] = next;
        for (int j = 0; j + 1 < n_pend; j++) c->held[c->n_held++] = pend[j];
    }
    size_t m = 0;
    dsv4_tokenizer_stream_flush(&ts, piece, &m);
    fwrite(piece, 1, m, stdout);
    append(&reply, &rlen, &rcap, piece, m);
    printf(interrupted ? " [interrupted]\n" : "\n");
    fflush(stdout);
    free(piece);
    /* In thinking mode the reply holds the reasoning, then </think>, then the answer. */
    char *end = c->cp.mode == DSV4_CHAT_MODE_THINKING ? strstr(reply, "</think>") : NULL;
    if (end) {
        *end         = 0;
        t->reasoning = strdup(reply);
        t->reply     = strdup(end + strlen("</think>"));
        free(reply);
    } else {
        t->reply = reply;
    }
    if (c->save) save_chat(c, c->save);
    return DSV4_OK;
}

/* ------------------------------------------------------------------ the command */

struct chat_opts {
    const char *dir, *system, *save, *load;
    int         max_reply, ctx, spec;
    bool        think;
};

#define CO(field) offsetof(struct chat_opts, field)
static const struct cli_opt CHAT_OPTS[] = {
    { "--model", "-m", "DIR", "checkpoint directory (with tokenizer.json)", CLI_STR, CO(dir), 0, 0, NULL },
    { "--system", NULL, "TEXT", "system prompt (raw text before the first user turn)", CLI_STR, CO(system), 0, 0, NULL },
    { "--think", NULL, NULL, "thinking mode: the reply opens with <think> (default: chat mode)", CLI_FLAG, CO(think), 0,
      0, NULL },
    { "-n", NULL, "N", "most tokens per reply (default 256)", CLI_INT, CO(max_reply), 1, 1 << 24, NULL },
    { "--ctx", NULL, "N", "context length in tokens (default: the model's, at most 4096)", CLI_INT, CO(ctx), 16, 1 << 30,
      NULL },
    { "--spec-draft", NULL, "K",
      "speculative decoding: tokens the MTP block drafts per step (default 0 =\noff; docs/SPECULATIVE.md)", CLI_INT,
      CO(spec), 0, DSV4_SPEC_MAX_DRAFT, NULL },
    { "--save", NULL, "FILE", "save the conversation after each reply and at exit (and FILE.turns)", CLI_STR, CO(save),
      0, 0, NULL },
    { "--load", NULL, "FILE", "resume the conversation --save wrote, without evaluating it again", CLI_STR, CO(load),
      0, 0, NULL },
};
#undef CO

/* The engine, a session of the context and the sampler; false after a message. */
static bool open_chat(struct chat *c, const struct chat_opts *o, struct dsv4_engine_params *ep,
                      const struct dsv4_sampler_params *sp)
{
    struct dsv4_err err;
    if (dsv4_tokenizer_load(&c->tok, o->dir, &err)) {
        fprintf(stderr, "dsv4 chat: %s\n", err.msg);
        return false;
    }
    ep->log    = cli_log_stderr;
    ep->log_ud = (void *)"chat";
    if (dsv4_engine_open(&c->engine, o->dir, ep, &err)) {
        fprintf(stderr, "dsv4 chat: %s\n", err.msg);
        return false;
    }
    dsv4_engine_info(c->engine, &c->info);
    c->ctx = o->ctx ? o->ctx : (c->info.max_ctx < 4096 ? c->info.max_ctx : 4096);
    if (c->ctx > c->info.max_ctx) c->ctx = c->info.max_ctx;
    struct dsv4_session_params ssp;
    dsv4_session_params_default(&ssp);
    ssp.max_ctx    = c->ctx;
    ssp.mtp        = c->spec > 0 && c->info.has_mtp;
    ssp.spec_draft = ssp.mtp ? c->spec : 0;
    if (c->spec > 0 && !c->info.has_mtp)
        fprintf(stderr, "dsv4 chat: no MTP block in this checkpoint: --spec-draft ignored\n");
    c->held = malloc(sizeof(int32_t) * (size_t)c->ctx);
    if (!c->held || dsv4_session_create(c->engine, &ssp, &c->s, &err) ||
        dsv4_sampler_create(&c->smp, c->info.vocab_size, sp, &err)) {
        fprintf(stderr, "dsv4 chat: %s\n", c->held ? err.msg : "out of memory");
        return false;
    }
    return true;
}

int cmd_chat(int argc, char **argv)
{
    struct chat_opts    o  = { .max_reply = 256 };
    struct cli_sampling cs = { 0 };
    struct chat         c  = { 0 };
    struct cli_kv_disk  kd = { 0 };
    dsv4_chat_params_default(&c.cp);
    dsv4_sampler_params_default(&cs.sp);
    cs.sp.temperature = 0.8f;
    cs.sp.top_p       = 0.95f;
    struct dsv4_engine_params ep;
    cli_engine_params(&ep);
    const struct cli_group groups[] = { { NULL, CHAT_OPTS, sizeof(CHAT_OPTS) / sizeof(CHAT_OPTS[0]), &o },
                                        cli_sampler_group(&cs), cli_kv_disk_group(&kd), cli_engine_group(&ep, true) };
    const struct cli_spec  spec     = {
        "chat", "usage: dsv4 chat -m DIR [options]\n", groups, 4,
        "\nsampling here defaults to --temp 0.8 --top-p 0.95, seeded from the clock\n"
        "commands: /reset (forget the conversation), /quit, /help; Ctrl-D leaves\n"
    };
    int rc = cli_parse(&spec, argc, argv);
    if (rc != CLI_PARSED) return rc;
    if (!o.dir) return cli_usage_error(&spec, "-m DIR is required");
    if (!cs.seeded) cs.sp.seed = (uint64_t)time(NULL);
    if (o.think) c.cp.mode = DSV4_CHAT_MODE_THINKING;
    c.system    = o.system;
    c.max_reply = o.max_reply;
    c.spec      = o.spec;
    c.save      = o.save;

    struct editor ed   = { .tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO) };
    char         *line = malloc(LINE_MAX_BYTES);
    rc                 = 1;
    if (!line) return 1;
    if (!open_chat(&c, &o, &ep, &cs.sp) || !cli_prompt_cache_open("chat", &kd, c.s, &c.pc)) goto done;
    if (o.load) load_chat(&c, o.load);
    struct sigaction sa = { 0 }, old_sa;
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa);
    if (ed.tty) {
        tcgetattr(STDIN_FILENO, &ed.saved);
        fprintf(stderr, "dsv4 chat: %s (%d-token context). /help for commands, Ctrl-D to leave.\n", o.dir, c.ctx);
    }
    while (read_line(&ed, "> ", line)) {
        if (line[0] == '/') {
            if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
            if (!strcmp(line, "/reset")) {
                forget(&c);
                fprintf(stderr, "(conversation cleared)\n");
            } else {
                fprintf(stderr, "/reset  forget the conversation\n/quit   leave (or Ctrl-D)\n");
            }
            continue;
        }
        if (!line[0]) continue;
        if (exchange(&c, line) == DSV4_ENOMEM) {
            fprintf(stderr, "dsv4 chat: out of memory\n");
            goto done_sig;
        }
    }
    rc = 0;
    if (c.save) save_chat(&c, c.save);
done_sig:
    sigaction(SIGINT, &old_sa, NULL);
done:
    for (int i = 0; i < ed.n_history; i++) free(ed.history[i]);
    if (c.s) forget(&c);
    free(c.turns);
    free(c.loaded_system);
    free(c.held);
    free(line);
    dsv4_prompt_cache_close(c.pc);
    dsv4_sampler_free(c.smp);
    dsv4_session_free(c.s);
    dsv4_engine_close(c.engine);
    dsv4_tokenizer_free(c.tok);
    return rc;
}
