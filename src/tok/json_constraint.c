/*
 * json_constraint.c - constrained decoding to JSON: an automaton over bytes that accepts
 * exactly the JSON texts of a schema (or any JSON object), and the per-step token mask it
 * gives over a byte-level vocabulary.
 *
 * The vocabulary (dsv4_json_vocab, built once per tokenizer and shared) is a byte trie of
 * every non-added token's bytes. A step's mask walks the trie depth first with a copy of the
 * automaton per depth, pruning at the first byte the automaton refuses, so the cost is the
 * number of token prefixes still possible, not vocabulary x length. The walk allocates
 * nothing (it runs inside the scheduler's no-allocation region): its state stack is sized
 * when the constraint is made.
 *
 * The automaton is a stack of frames, one per JSON value being read:
 *   VALUE   a value is expected here (what kinds, from the schema node)
 *   OBJECT  a schema object: its properties in the schema's order, every one required,
 *           nothing else (OpenAI's strict mode; the order is the schema's)
 *   ANYOBJ  an object of any keys; ANYARR / ARRAY arrays of any / of the schema's items
 *   STRING  inside a string (escapes, \u with four hex digits, no control bytes, UTF-8
 *           sequences whole: a lead byte then its continuation bytes)
 *   NUMBER  a number (integer when the schema says so), ended by the first byte that
 *           cannot continue it, which the frame below then reads
 *   LITERAL an exact text: a key with its quotes, true / false / null, an enum value
 * Whitespace between tokens is bounded (one newline and some indentation), so a model cannot
 * run on in spaces. After the top value nothing but the end of the turn may come.
 *
 * The same object can bound a thinking turn's reasoning: past think_budget tokens only
 * </think> may come (dsv4_constraint_new_think without JSON, or set on a JSON one).
 *
 * Schemas (a subset of JSON Schema; anything else is refused with a message naming it):
 * "type" object (with "properties", optional "required", "additionalProperties": false),
 * array ("items"), string, number, integer, boolean, null, or a list of one of them with
 * "null"; "enum" of strings, numbers, booleans or null; "const". Other keywords that do not
 * change the set of texts accepted here (description, title, default, examples, $schema,
 * strict) are ignored.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tok/tok.h"

/* Whitespace between tokens: one space or tab, or a newline and up to 2 * (depth + 1) spaces
 * or tabs of indentation: compact or pretty-printed JSON, and no running on (no \r). DIGITS_MAX: digits in the
 * integer and fraction parts of a number (past 17 a double cannot hold them);
 * EXP_DIGITS_MAX: in the exponent (so no number overflows a double). */
enum { DEPTH_MAX = 32, ENUM_MAX = 64, DIGITS_MAX = 17, EXP_DIGITS_MAX = 2 };

/* ------------------------------------------------------------------ schema nodes */

enum jkind { JK_ANY, JK_ANYOBJ, JK_OBJECT, JK_ARRAY, JK_STRING, JK_NUMBER, JK_INTEGER, JK_BOOLEAN, JK_NULL, JK_ENUM };

struct jnode {
    enum jkind     kind;
    bool           nullable;
    int            n;      /* properties (object) or enum values */
    char         **lit;    /* object: "\"key\"" per property; enum: each value's JSON text */
    struct jnode **props;  /* object: the property schemas */
    struct jnode  *items;  /* array */
    int            min, max; /* string: minLength/maxLength (code points); array: minItems/maxItems; -1 none */
};

static void jnode_free(struct jnode *n)
{
    if (!n) return;
    for (int i = 0; i < n->n; i++) {
        free(n->lit[i]);
        if (n->props) jnode_free(n->props[i]);
    }
    free(n->lit);
    free(n->props);
    jnode_free(n->items);
    free(n);
}

static int compile(json_t *s, int depth, struct jnode **out, struct dsv4_err *err);

static int compile_enum(json_t *vals, struct jnode *n, struct dsv4_err *err)
{
    size_t k = json_array_size(vals);
    if (!json_is_array(vals) || k == 0 || k > ENUM_MAX)
        return dsv4_err_set(err, DSV4_EINVAL, "schema: enum must be an array of 1 to %d values", ENUM_MAX);
    n->kind = JK_ENUM;
    n->lit  = calloc(k, sizeof(char *));
    if (!n->lit) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    for (size_t i = 0; i < k; i++) {
        json_t *v = json_array_get(vals, i);
        if (json_is_object(v) || json_is_array(v))
            return dsv4_err_set(err, DSV4_EUNSUPPORTED, "schema: enum values must be strings, numbers, booleans or null");
        if (!(n->lit[i] = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT))) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        n->n++;
    }
    /* no value may be a prefix of another (1 and 10): the automaton ends a value when it is
     * complete */
    for (int i = 0; i < n->n; i++)
        for (int j = 0; j < n->n; j++)
            if (i != j && !strncmp(n->lit[i], n->lit[j], strlen(n->lit[i])))
                return dsv4_err_set(err, DSV4_EUNSUPPORTED, "schema: enum value %s is a prefix of %s", n->lit[i],
                                    n->lit[j]);
    return DSV4_OK;
}

static int compile_object(json_t *s, int depth, struct jnode *n, struct dsv4_err *err)
{
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl  = json_object_get(s, "additionalProperties");
    n->kind       = JK_OBJECT;
    if (!props && (!addl || json_is_true(addl) || json_is_object(addl))) { /* any object */
        n->kind = JK_ANYOBJ;
        return DSV4_OK;
    }
    if (props && !json_is_object(props)) return dsv4_err_set(err, DSV4_EINVAL, "schema: properties must be an object");
    size_t k = props ? json_object_size(props) : 0;
    if (req && (!json_is_array(req) || json_array_size(req) != k))
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "schema: every property must be required (strict mode)");
    n->lit   = calloc(k ? k : 1, sizeof(char *));
    n->props = calloc(k ? k : 1, sizeof(struct jnode *));
    if (!n->lit || !n->props) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    const char *key;
    json_t     *v;
    json_object_foreach(props, key, v) {
        json_t *ks = json_string(key);
        n->lit[n->n] = ks ? json_dumps(ks, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        json_decref(ks);
        if (!n->lit[n->n]) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        n->n++;
        int rc = compile(v, depth + 1, &n->props[n->n - 1], err);
        if (rc) return rc;
    }
    return DSV4_OK;
}

static int compile(json_t *s, int depth, struct jnode **out, struct dsv4_err *err)
{
    *out = NULL;
    if (depth > DEPTH_MAX) return dsv4_err_set(err, DSV4_EINVAL, "schema: nested deeper than %d", DEPTH_MAX);
    if (!json_is_object(s)) return dsv4_err_set(err, DSV4_EINVAL, "schema: a schema must be an object");
    static const char *const known[] = { "type", "properties", "required", "additionalProperties", "items", "enum",
                                         "const", "description", "title", "default", "examples", "$schema", "strict",
                                         "minLength", "maxLength", "minItems", "maxItems", NULL };
    const char *key;
    json_t     *v;
    json_object_foreach(s, key, v) {
        bool ok = false;
        for (const char *const *k = known; *k && !ok; k++) ok = !strcmp(*k, key);
        if (!ok) return dsv4_err_set(err, DSV4_EUNSUPPORTED, "schema: the keyword '%s' is not supported", key);
    }
    struct jnode *n = calloc(1, sizeof(*n));
    if (!n) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    *out   = n;
    int rc = DSV4_OK;
    n->min = n->max = -1;
    static const char *const bounds[2][2] = { { "minLength", "maxLength" }, { "minItems", "maxItems" } };
    for (int b = 0; b < 2; b++)
        for (int m = 0; m < 2; m++) {
            json_t *x = json_object_get(s, bounds[b][m]);
            if (!x) continue;
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 60000)
                return dsv4_err_set(err, DSV4_EINVAL, "schema: %s must be an integer in [0, 60000]", bounds[b][m]);
            if (m == 0) n->min = (int)json_integer_value(x);
            else n->max = (int)json_integer_value(x);
        }
    if (json_object_get(s, "const")) {
        json_t *one = json_pack("[O]", json_object_get(s, "const"));
        rc          = compile_enum(one, n, err);
        json_decref(one);
        return rc;
    }
    if (json_object_get(s, "enum")) return compile_enum(json_object_get(s, "enum"), n, err);
    json_t     *type = json_object_get(s, "type");
    const char *t    = json_string_value(type);
    if (json_is_array(type)) { /* [T, "null"] */
        size_t k = json_array_size(type);
        for (size_t i = 0; i < k; i++) {
            const char *x = json_string_value(json_array_get(type, i));
            if (x && !strcmp(x, "null") && k == 2) n->nullable = true;
            else if (x && !t) t = x;
            else return dsv4_err_set(err, DSV4_EUNSUPPORTED, "schema: a type list must be [T, \"null\"]");
        }
    }
    if (!t) return dsv4_err_set(err, DSV4_EUNSUPPORTED, "schema: every schema needs a type, enum or const");
    if (!strcmp(t, "object")) rc = compile_object(s, depth, n, err);
    else if (!strcmp(t, "array")) {
        n->kind = JK_ARRAY;
        json_t *items = json_object_get(s, "items");
        if (items) rc = compile(items, depth + 1, &n->items, err);
        else if (!(n->items = calloc(1, sizeof(struct jnode)))) rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    } else if (!strcmp(t, "string")) n->kind = JK_STRING;
    else if (!strcmp(t, "number")) n->kind = JK_NUMBER;
    else if (!strcmp(t, "integer")) n->kind = JK_INTEGER;
    else if (!strcmp(t, "boolean")) n->kind = JK_BOOLEAN;
    else if (!strcmp(t, "null")) n->kind = JK_NULL;
    else rc = dsv4_err_set(err, DSV4_EUNSUPPORTED, "schema: type '%s' is not supported", t);
    return rc;
}

/* ------------------------------------------------------------------ the automaton */

enum ftype { F_VALUE, F_OBJECT, F_ANYOBJ, F_ARRAY, F_STRING, F_NUMBER, F_LITERAL, F_ENUM, F_RAW, F_CALL };

/* The ｜DSML｜ control token stands for these bytes in the trie and the literals: 0xFF never
 * appears in a text token's bytes. */
#define DSML_MARK     0xff
#define DSML          "\xff" "D"
#define DSML_MARK_LEN 2

/* A forced DSML tool call under strict schemas: the tools' names (each followed by "\">\n",
 * what comes after the forced opening's `name="`), their parameter objects, and per
 * parameter the opening tag of its DSML parameter (string="true" for plain strings, whose
 * value is raw text; string="false" and a JSON value otherwise). */
struct jcall {
    struct jnode   names; /* JK_ENUM of NAME">\n */
    int            n_tools;
    struct jnode **params;
    char        ***open;  /* [tool][param] */
    bool         **raw;   /* [tool][param] */
};

struct frame {
    uint8_t             type;
    uint8_t             phase; /* per type, below */
    uint16_t            pos;   /* bytes of a literal matched, a property's index, hex digits left */
    const struct jnode *n;
    const char         *lit;   /* F_LITERAL */
    uint64_t            cand;  /* F_ENUM: values still possible */
    uint32_t            count; /* F_STRING: code points; F_ARRAY: items; F_NUMBER: digits in the part */
};

struct jstate {
    int          sp;   /* frames in use */
    int          ws, nl; /* spaces or tabs, and newlines, in a row */
    bool         dead;
    struct frame f[DEPTH_MAX + 2];
};

static const struct jnode ANY_NODE = { .kind = JK_ANY };

static bool is_ws(int c)
{
    return c == ' ' || c == '\n' || c == '\t';
}

static bool push(struct jstate *s, struct frame f)
{
    if (s->sp >= DEPTH_MAX + 2) return false;
    s->f[s->sp++] = f;
    return true;
}

static bool push_value(struct jstate *s, const struct jnode *n)
{
    return push(s, (struct frame){ .type = F_VALUE, .n = n });
}

static bool push_lit(struct jstate *s, const char *lit)
{
    return push(s, (struct frame){ .type = F_LITERAL, .lit = lit });
}

static bool step(struct jstate *s, int c);

/* A value's first byte c (not whitespace), for node n: replaces the VALUE frame at the top. */
static bool start_value(struct jstate *s, const struct jnode *n, int c)
{
    s->sp--;
    if (n->nullable && c == 'n') return push_lit(s, "null") && step(s, c);
    switch (n->kind) {
    case JK_OBJECT:
        if (c != '{') return false;
        return push(s, (struct frame){ .type = F_OBJECT, .n = n });
    case JK_ARRAY:
        if (c != '[') return false;
        return push(s, (struct frame){ .type = F_ARRAY, .n = n });
    case JK_STRING:
        if (c != '"') return false;
        return push(s, (struct frame){ .type = F_STRING, .n = n });
    case JK_NUMBER:
    case JK_INTEGER:
        if (c != '-' && !(c >= '0' && c <= '9')) return false;
        return push(s, (struct frame){ .type = F_NUMBER, .n = n }) && step(s, c);
    case JK_BOOLEAN:
        if (c == 't') return push_lit(s, "true") && step(s, c);
        if (c == 'f') return push_lit(s, "false") && step(s, c);
        return false;
    case JK_NULL: return c == 'n' && push_lit(s, "null") && step(s, c);
    case JK_ANYOBJ:
        if (c != '{') return false;
        return push(s, (struct frame){ .type = F_ANYOBJ });
    case JK_ENUM: {
        uint64_t cand = n->n >= 64 ? ~0ull : (1ull << n->n) - 1;
        return push(s, (struct frame){ .type = F_ENUM, .n = n, .cand = cand }) && step(s, c);
    }
    case JK_ANY:
    default:
        if (c == '{') return push(s, (struct frame){ .type = F_ANYOBJ });
        if (c == '[') return push(s, (struct frame){ .type = F_ARRAY, .n = NULL });
        if (c == '"') return push(s, (struct frame){ .type = F_STRING });
        if (c == '-' || (c >= '0' && c <= '9')) return push(s, (struct frame){ .type = F_NUMBER }) && step(s, c);
        if (c == 't') return push_lit(s, "true") && step(s, c);
        if (c == 'f') return push_lit(s, "false") && step(s, c);
        if (c == 'n') return push_lit(s, "null") && step(s, c);
        return false;
    }
}

/* Number phases: 0 start, 1 after '-', 2 after a leading 0, 3 in integer digits, 4 after
 * '.', 5 in fraction digits, 6 after e/E, 7 after its sign, 8 in exponent digits. */
static bool number_step1(struct frame *f, int c, bool *ended, bool integer, bool digit)
{
    switch (f->phase) {
    case 0:
        if (c == '-') return f->phase = 1, true;
        /* fall through */
    case 1:
        if (c == '0') return f->phase = 2, true;
        if (digit) return f->phase = 3, true;
        return false;
    case 2:
    case 3:
        if (f->phase == 3 && digit) return true;
        if (!integer && c == '.') return f->phase = 4, true;
        if (!integer && (c == 'e' || c == 'E')) return f->phase = 6, true;
        *ended = true;
        return true;
    case 4: return digit && (f->phase = 5, true);
    case 5:
        if (digit) return true;
        if (c == 'e' || c == 'E') return f->phase = 6, true;
        *ended = true;
        return true;
    case 6:
        if (c == '+' || c == '-') return f->phase = 7, true;
        /* fall through */
    case 7: return digit && (f->phase = 8, true);
    case 8:
        if (digit) return true;
        *ended = true;
        return true;
    }
    return false;
}

static bool number_step(struct frame *f, int c, bool *ended)
{
    bool integer = f->n && f->n->kind == JK_INTEGER, digit = c >= '0' && c <= '9';
    *ended       = false;
    uint8_t before = f->phase;
    if (digit && (before == 3 || before == 5 || before == 8) && f->count >= (before == 8 ? EXP_DIGITS_MAX : DIGITS_MAX))
        return *ended = true, true;
    bool ok = number_step1(f, c, ended, integer, digit);
    if (ok && !*ended) f->count = f->phase == before && digit ? f->count + 1 : digit ? 1 : 0;
    return ok;
}


static const char CALL_PARAM_END_RAW[] = DSML "parameter>";
static const char CALL_PARAM_END[]     = "</" DSML "parameter>";
static const char CALL_INVOKE_END[]    = "\n</" DSML "invoke>";
/* after an invoke: the end of the block, or another call */
static char        CALL_NEXT_END[]     = "\n</" DSML "tool_calls>";
static char        CALL_NEXT_CALL[]    = "\n<" DSML "invoke name=\"";
static char       *CALL_NEXT_LIT[]     = { CALL_NEXT_END, CALL_NEXT_CALL };
static const struct jnode CALL_NEXT    = { .kind = JK_ENUM, .n = 2, .lit = CALL_NEXT_LIT };
/* what turns an unforced turn into a call: the DSML block's opening (dsml.c's marker) */
static const char CALL_TRIGGER[]       = "\n\n<" DSML "tool_calls";
static const char CALL_OPEN_REST[]     = ">\n<" DSML "invoke name=\"";

/* F_CALL: phases 0 the tool's name (an enum of the names) unless forced by name, 1 before
 * parameter `count` (its opening tag, then its value), 2 after a value (the closing tag), 3
 * the invoke's end tag, then (phase 4) the block's end or another call (an enum: its
 * completion sets the phase, call_next); pos = the tool, lit = (const struct jcall *), cand =
 * the tools later calls may name (0: all). */
static bool call_step(struct jstate *s, struct frame *f, int c)
{
    const struct jcall *call = (const struct jcall *)(const void *)f->lit;
    if (f->phase == 0) {
        f->phase = 1;
        /* f->cand: the tools a call may name (0: all; a forced name: that one) */
        uint64_t cand = f->cand ? f->cand : call->n_tools >= 64 ? ~0ull : (1ull << call->n_tools) - 1;
        return push(s, (struct frame){ .type = F_ENUM, .phase = 1, .n = &call->names, .cand = cand }) && step(s, c);
    }
    const struct jnode *obj = call->params[f->pos];
    if (f->phase == 1) {
        if ((int)f->count == obj->n) {
            f->phase = 3;
            return push_lit(s, CALL_INVOKE_END) && step(s, c);
        }
        f->phase = 2;
        bool raw = call->raw[f->pos][f->count];
        /* the value after the opening tag: raw text or a JSON value */
        if (!push(s, (struct frame){ .type = raw ? F_RAW : F_VALUE, .n = obj->props[f->count] }))
            return false;
        return push_lit(s, call->open[f->pos][f->count]) && step(s, c);
    }
    if (f->phase == 2) {
        bool raw = call->raw[f->pos][f->count];
        f->phase = 1;
        f->count++;
        return push_lit(s, raw ? CALL_PARAM_END_RAW : CALL_PARAM_END) && step(s, c);
    }
    if (f->phase == 3) {
        f->phase = 4;
        return push(s, (struct frame){ .type = F_ENUM, .phase = 2, .n = &CALL_NEXT, .cand = 3 }) && step(s, c);
    }
    return false;
}

/* The enum after an invoke ended (k: 0 the block's end, 1 another call): the call frame
 * ends, or starts over at the name. */
static void call_next(struct jstate *s, int k)
{
    struct frame *f = &s->f[s->sp - 1];
    if (k == 0) {
        s->sp--;
        return;
    }
    f->phase = 0;
    f->count = 0;
    f->pos   = 0;
}

/* UTF-8 inside a string or raw text: f->pos continuation bytes still due, the first in the
 * range its lead allows (f->cand: lo | hi << 8), so no overlong form, surrogate or code point
 * past U+10FFFF passes; raw text also takes newlines and tabs. */
static bool utf8_step(struct frame *f, int c, bool raw)
{
    if (f->pos) {
        unsigned lo = (unsigned)(f->cand & 0xff), hi = (unsigned)(f->cand >> 8 & 0xff);
        if ((c & 0xc0) != 0x80 || (f->cand && ((unsigned)c < lo || (unsigned)c > hi))) return false;
        f->cand = 0;
        f->pos--;
        return true;
    }
    if ((c < 0x20 && !(raw && (c == '\n' || c == '\t'))) || (c & 0xc0) == 0x80 || c >= 0xf5 || c == 0xc0 || c == 0xc1)
        return false;
    f->pos  = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
    f->cand = c == 0xe0 ? 0xbfa0 : c == 0xed ? 0x9f80 : c == 0xf0 ? 0xbf90 : c == 0xf4 ? 0x8f80 : 0;
    return true;
}

/* F_LITERAL: the next byte of the literal; the frame ends with its last byte. */
static bool literal_step(struct jstate *s, struct frame *f, int c)
{
    if ((unsigned char)f->lit[f->pos] != c) return false;
    if (f->lit[++f->pos] == '\0') s->sp--;
    return true;
}

/* F_ENUM: keeps the values whose next byte is c; the frame ends when one is complete. */
static bool enum_step(struct jstate *s, struct frame *f, int c)
{
    uint64_t keep = 0;
    bool     done = false;
    for (int i = 0; i < f->n->n && i < 64; i++) {
        if (!(f->cand >> i & 1)) continue;
        const char *l = f->n->lit[i];
        if ((unsigned char)l[f->pos] == c) {
            keep |= 1ull << i;
            if (l[f->pos + 1] == '\0') done = true;
        }
    }
    if (!keep) return false;
    f->cand = keep;
    f->pos++;
    if (done) { /* no value is a prefix of another (compile) */
        int kind = f->phase; /* 1: a tool's name, 2: after an invoke (call_step) */
        s->sp--;
        if (kind == 1) s->f[s->sp - 1].pos = (uint16_t)__builtin_ctzll(keep);
        if (kind == 2) call_next(s, __builtin_ctzll(keep));
    }
    return true;
}

/* F_RAW: a DSML string parameter's raw text, ended by "</" + ｜DSML｜ (the parent reads the
 * rest of the closing tag); phases: 0 text, 1 after '<', 2 after "</". Code points are counted
 * for min/maxLength once they are known to be text (a '<' or "</" that does not start the
 * closing tag counts when the next byte shows it). */
static bool raw_step(struct jstate *s, struct frame *f, int c)
{
    int lo = f->n ? f->n->min : -1, hi = f->n ? f->n->max : -1;
    if (c == DSML_MARK) {
        if (f->phase != 2 || (lo >= 0 && (int)f->count < lo)) return false;
        s->sp--;
        return step(s, c);
    }
    if (f->phase == 1 && c == '/') return f->phase = 2, true;
    uint32_t held = f->phase; /* '<' or "</" turned out to be text */
    if (c == '<' && !f->pos) {
        f->count += held;
        f->phase = 1;
        return hi < 0 || (int)f->count < hi || (int)f->count == hi; /* may still close */
    }
    f->phase = 0;
    if (!f->pos) f->count += held + 1;
    if (hi >= 0 && (int)f->count > hi) return false;
    return utf8_step(f, c, true);
}

/* F_STRING: phases 0 text, 1 after a backslash, 2 the \u digits (pos: digits left). */
static bool string_step(struct jstate *s, struct frame *f, int c)
{
    if (f->phase == 1) { /* after a backslash */
        if (c == 'u') return f->phase = 2, f->pos = 4, true;
        if (!strchr("\"\\/bfnrt", c) || c == 0) return false;
        f->phase = 0;
        return true;
    }
    if (f->phase == 2) { /* \u digits */
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return false;
        if (--f->pos == 0) f->phase = 0;
        return true;
    }
    int lo = f->n ? f->n->min : -1, hi = f->n ? f->n->max : -1;
    if (f->pos) return utf8_step(f, c, false);
    if (c == '"') return (lo < 0 || (int)f->count >= lo) && (s->sp--, true);
    if (c < 0x20) return false;
    if (hi >= 0 && (int)f->count >= hi) return false;
    f->count++;
    if (c == '\\') return f->phase = 1, true;
    return utf8_step(f, c, false);
}

/* F_OBJECT (a schema's object): phases 0 after '{' (a key or, with no properties, '}'), 1
 * after a value (',' or '}'), 2 the key literal is next (after ','), 3 ':' expected. */
static bool object_step(struct jstate *s, struct frame *f, int c)
{
    const struct jnode *n = f->n;
    if (f->phase == 0 || f->phase == 2) {
        if (f->phase == 0 && n->n == 0) return c == '}' && (s->sp--, true);
        if (c != '"') return false;
        f->phase = 3;
        return push_lit(s, n->lit[f->pos]) && step(s, c);
    }
    if (f->phase == 3) {
        if (c != ':') return false;
        f->phase = 1;
        return push_value(s, n->props[f->pos++]);
    }
    if (f->pos < n->n) return c == ',' && (f->phase = 2, true);
    return c == '}' && (s->sp--, true);
}

/* F_ANYOBJ (any object): phases 0 after '{', 1 after a value, 2 after ',', 3 after a key. */
static bool anyobj_step(struct jstate *s, struct frame *f, int c)
{
    if (f->phase == 0 && c == '}') return s->sp--, true;
    if (f->phase == 0 || f->phase == 2) {
        if (c != '"') return false;
        f->phase = 3;
        return push(s, (struct frame){ .type = F_STRING });
    }
    if (f->phase == 3) {
        if (c != ':') return false;
        f->phase = 1;
        return push_value(s, &ANY_NODE);
    }
    if (c == ',') return f->phase = 2, true;
    return c == '}' && (s->sp--, true);
}

/* F_ARRAY: phases 0 after '[', 1 after a value; count: the items so far. */
static bool array_step(struct jstate *s, struct frame *f, int c)
{
    const struct jnode *item = f->n ? f->n->items : &ANY_NODE;
    int                 lo = f->n ? f->n->min : -1, hi = f->n ? f->n->max : -1;
    if (c == ']') return (lo < 0 || (int)f->count >= lo) && (s->sp--, true);
    if (f->phase == 0) {
        if (hi == 0) return false;
        f->phase = 1;
        f->count = 1;
        return push_value(s, item) && step(s, c);
    }
    if (c != ',' || (hi >= 0 && (int)f->count >= hi)) return false;
    f->count++;
    return push_value(s, item);
}

/* Feeds one byte; false once the text cannot be accepted (the state is then dead). */
static bool step(struct jstate *s, int c)
{
    if (s->dead) return false;
    if (s->sp == 0) return false; /* the value is complete: nothing may follow */
    struct frame *f = &s->f[s->sp - 1];
    /* whitespace between tokens (not inside strings, literals or numbers), bounded */
    if (is_ws(c) && (f->type == F_VALUE || f->type == F_OBJECT || f->type == F_ANYOBJ || f->type == F_ARRAY))
        return c == '\n' ? s->ws == 0 && ++s->nl <= 1 : ++s->ws <= (s->nl ? 2 * s->sp + 2 : 1);
    s->ws = s->nl = 0;
    switch (f->type) {
    case F_VALUE:   return start_value(s, f->n, c);
    case F_LITERAL: return literal_step(s, f, c);
    case F_ENUM:    return enum_step(s, f, c);
    case F_RAW:     return raw_step(s, f, c);
    case F_CALL:    return call_step(s, f, c);
    case F_STRING:  return string_step(s, f, c);
    case F_NUMBER: {
        bool ended;
        if (!number_step(f, c, &ended)) return false;
        if (!ended) return true;
        s->sp--; /* the byte belongs to what follows the number */
        return step(s, c);
    }
    case F_OBJECT:  return object_step(s, f, c);
    case F_ANYOBJ:  return anyobj_step(s, f, c);
    case F_ARRAY:   return array_step(s, f, c);
    }
    return false;
}

/* dst = src, copying only the frames in use (the walk copies a state per trie edge). */
static void copy_state(struct jstate *dst, const struct jstate *src)
{
    dst->sp   = src->sp;
    dst->ws   = src->ws;
    dst->nl   = src->nl;
    dst->dead = src->dead;
    memcpy(dst->f, src->f, sizeof(struct frame) * (size_t)src->sp);
}

static bool feed(struct jstate *s, const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!step(s, b[i])) return s->dead = true, false;
    return true;
}

/* Complete: nothing open, or only a number that may end here. */
static bool complete(const struct jstate *s)
{
    if (s->dead) return false;
    if (s->sp == 0) return true;
    if (s->sp == 1 && s->f[0].type == F_NUMBER) {
        uint8_t p = s->f[0].phase;
        return p == 2 || p == 3 || p == 5 || p == 8;
    }
    return false;
}

/* ------------------------------------------------------------------ the vocabulary trie */

struct tnode {
    int32_t  token;       /* the token ending here, or -1 */
    uint32_t first, n;    /* children: edges[first, first + n) */
};

struct tedge {
    uint8_t  byte;
    uint32_t child;
};

struct dsv4_json_vocab {
    struct tnode *node;
    struct tedge *edge;
    uint32_t      n_node, n_edge;
    int32_t       vocab, eos, dsml; /* dsml: the ｜DSML｜ token (in the trie as DSML), or -1 */
    size_t        max_len;
};

/* Build: insert every token into a simple pointer trie, then flatten breadth-first. */
struct btrie {
    int32_t        token;
    int            n, cap;
    uint8_t       *bytes;
    struct btrie **kids;
};

static struct btrie *bt_child(struct btrie *t, uint8_t b)
{
    for (int i = 0; i < t->n; i++)
        if (t->bytes[i] == b) return t->kids[i];
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 2;
        uint8_t       *nb = realloc(t->bytes, (size_t)cap);
        if (!nb) return NULL;
        t->bytes = nb;
        struct btrie **nk = realloc(t->kids, sizeof(*nk) * (size_t)cap);
        if (!nk) return NULL;
        t->kids = nk;
        t->cap  = cap;
    }
    struct btrie *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->token       = -1;
    t->bytes[t->n] = b;
    t->kids[t->n++] = c;
    return c;
}

static void bt_free(struct btrie *t)
{
    if (!t) return;
    for (int i = 0; i < t->n; i++) bt_free(t->kids[i]);
    free(t->bytes);
    free(t->kids);
    free(t);
}

static uint32_t bt_count(const struct btrie *t)
{
    uint32_t n = 1;
    for (int i = 0; i < t->n; i++) n += bt_count(t->kids[i]);
    return n;
}

/* Preorder numbering; a node's children get consecutive edges. */
static void bt_flat(const struct btrie *t, struct dsv4_json_vocab *v, uint32_t *next_node, uint32_t *next_edge,
                    uint32_t me)
{
    v->node[me] = (struct tnode){ .token = t->token, .first = *next_edge, .n = (uint32_t)t->n };
    uint32_t e0 = *next_edge;
    *next_edge += (uint32_t)t->n;
    for (int i = 0; i < t->n; i++) {
        uint32_t c      = (*next_node)++;
        v->edge[e0 + i] = (struct tedge){ .byte = t->bytes[i], .child = c };
        bt_flat(t->kids[i], v, next_node, next_edge, c);
    }
}

int dsv4_json_vocab_new(dsv4_json_vocab **out, const dsv4_tokenizer *tok, struct dsv4_err *err)
{
    *out = NULL;
    int32_t       V    = dsv4_tokenizer_n_vocab(tok);
    size_t        max  = dsv4_tokenizer_max_token_bytes(tok);
    char         *buf  = malloc(max + 8);
    struct btrie *root = calloc(1, sizeof(*root));
    bool          ok   = buf && root;
    if (root) root->token = -1;
    for (int32_t id = 0; id < V && ok; id++) {
        size_t n = 0;
        if (dsv4_tokenizer_is_added(tok, id) || dsv4_tokenizer_decode(tok, &id, 1, buf, max + 8, &n, NULL) || n == 0 ||
            memchr(buf, DSML_MARK, n)) /* 0xFF is never in UTF-8, and it marks ｜DSML｜ */
            continue;
        struct btrie *t = root;
        for (size_t i = 0; i < n && t; i++) t = bt_child(t, (uint8_t)buf[i]);
        if (!t) ok = false;
        else if (t->token < 0) t->token = id;
    }
    int32_t dsml = -1;
    if (ok && dsv4_tokenizer_token_id(tok, "｜DSML｜", &dsml, NULL) == DSV4_OK) {
        struct btrie *t = root;
        for (size_t i = 0; i < DSML_MARK_LEN && t; i++) t = bt_child(t, (uint8_t)DSML[i]);
        if (!t) ok = false;
        else t->token = dsml;
    } else {
        dsml = -1;
    }
    free(buf);
    struct dsv4_json_vocab *v = ok ? calloc(1, sizeof(*v)) : NULL;
    if (v) {
        v->n_node = bt_count(root);
        v->n_edge = v->n_node - 1;
        v->node   = malloc(sizeof(*v->node) * v->n_node);
        v->edge   = malloc(sizeof(*v->edge) * (v->n_edge ? v->n_edge : 1));
        v->vocab  = V;
        v->eos    = dsv4_tokenizer_eos(tok);
        v->dsml   = dsml;
        v->max_len = max;
        if (v->node && v->edge) {
            uint32_t nn = 1, ne = 0;
            bt_flat(root, v, &nn, &ne, 0);
        } else {
            dsv4_json_vocab_free(v);
            v = NULL;
        }
    }
    bt_free(root);
    if (!v) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory building the JSON vocabulary trie");
    *out = v;
    return DSV4_OK;
}

void dsv4_json_vocab_free(dsv4_json_vocab *v)
{
    if (!v) return;
    free(v->node);
    free(v->edge);
    free(v);
}

/* ------------------------------------------------------------------ constraints */

struct dsv4_constraint {
    const dsv4_json_vocab *v;
    char                  *schema;    /* the schema's text (NULL: any object), for clones */
    size_t                 schema_len;
    struct jnode          *root;
    struct jcall          *call;      /* a strict forced tool call (dsv4_constraint_new_call), or NULL */
    char                  *call_name; /* the forced tool, or NULL: any */
    bool                   watch;     /* unforced: free until CALL_TRIGGER, then the call */
    int                    trig;      /* bytes of CALL_TRIGGER matched so far */
    bool                   call_auto; /* made by dsv4_constraint_new_tools (for clones) */
    int32_t                think_end; /* -1, or the token before which the output is free */
    bool                   free_text; /* before think_end */
    bool                   json;      /* a JSON text follows (else only the thinking budget) */
    int                    think_budget, n_think; /* tokens of reasoning at most (-1: no bound), so far */
    struct jstate          st;
    struct jstate         *stack;     /* [max_len + 1]: the mask walk's states by depth */
    uint32_t              *edge_at;   /* [max_len + 1] */
    uint8_t               *allowed;   /* [vocab] */
    const dsv4_tokenizer  *tok;
};

int dsv4_constraint_new_json(dsv4_constraint **out, const dsv4_json_vocab *v, const dsv4_tokenizer *tok,
                             const char *schema, size_t len, int32_t think_end, struct dsv4_err *err)
{
    *out                 = NULL;
    dsv4_constraint *c   = calloc(1, sizeof(*c));
    if (!c) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    c->v         = v;
    c->tok       = tok;
    c->think_end = think_end;
    c->free_text = think_end >= 0;
    c->json      = true;
    c->think_budget = -1;
    c->stack     = malloc(sizeof(*c->stack) * (v->max_len + 1));
    c->edge_at   = malloc(sizeof(*c->edge_at) * (v->max_len + 1));
    c->allowed   = malloc((size_t)v->vocab);
    int rc       = c->stack && c->edge_at && c->allowed ? DSV4_OK : dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    if (!rc && schema && !(c->schema = malloc(len + 1))) rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    if (!rc && schema) {
        memcpy(c->schema, schema, len);
        c->schema[len] = '\0';
        c->schema_len  = len;
        json_error_t je;
        json_t      *s = json_loadb(schema, len, 0, &je);
        if (!s) rc = dsv4_err_set(err, DSV4_EINVAL, "schema: not valid JSON (%s)", je.text);
        else rc = compile(s, 0, &c->root, err);
        json_decref(s);
    } else if (!rc) { /* json_object: any object */
        if (!(c->root = calloc(1, sizeof(*c->root)))) rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        else c->root->kind = JK_ANYOBJ, c->root->min = c->root->max = -1;
    }
    if (rc) {
        dsv4_constraint_free(c);
        return rc;
    }
    push_value(&c->st, c->root);
    *out = c;
    return DSV4_OK;
}

int dsv4_constraint_new_think(dsv4_constraint **out, const dsv4_tokenizer *tok, int32_t think_end, int budget,
                              struct dsv4_err *err)
{
    *out               = NULL;
    dsv4_constraint *c = calloc(1, sizeof(*c));
    if (!c) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    c->tok          = tok;
    c->think_end    = think_end;
    c->free_text    = think_end >= 0;
    c->think_budget = budget;
    *out            = c;
    return DSV4_OK;
}

void dsv4_constraint_set_think_budget(dsv4_constraint *c, int budget)
{
    c->think_budget = budget;
}

int dsv4_constraint_clone(const dsv4_constraint *c, dsv4_constraint **out, struct dsv4_err *err)
{
    if (c->call_auto) return dsv4_constraint_new_tools(out, c->v, c->tok, c->schema, c->schema_len, c->think_end, err);
    if (c->call) return dsv4_constraint_new_call(out, c->v, c->tok, c->schema, c->schema_len, c->call_name, err);
    int rc = c->json ? dsv4_constraint_new_json(out, c->v, c->tok, c->schema, c->schema_len, c->think_end, err)
                     : dsv4_constraint_new_think(out, c->tok, c->think_end, c->think_budget, err);
    if (rc == DSV4_OK) (*out)->think_budget = c->think_budget;
    return rc;
}

static void jcall_free(struct jcall *k)
{
    if (!k) return;
    for (int i = 0; i < k->n_tools; i++) {
        int np = k->params && k->params[i] ? k->params[i]->n : 0;
        for (int j = 0; j < np && k->open[i]; j++) free(k->open[i][j]);
        if (k->open) free(k->open[i]);
        if (k->raw) free(k->raw[i]);
        if (k->params) jnode_free(k->params[i]);
    }
    for (int i = 0; i < k->names.n; i++) free(k->names.lit[i]);
    free(k->names.lit);
    free(k->params);
    free(k->open);
    free(k->raw);
    free(k);
}

/* tools: [{"name", "parameters"}]; each parameters a strict object schema (or absent). */
static int compile_call(json_t *tools, struct jcall **out, struct dsv4_err *err)
{
    size_t        n = json_array_size(tools);
    struct jcall *k = calloc(1, sizeof(*k));
    *out            = k;
    if (!k) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    if (!json_is_array(tools) || n == 0 || n > ENUM_MAX)
        return dsv4_err_set(err, DSV4_EINVAL, "strict tool call: 1 to %d tools", ENUM_MAX);
    k->names.kind = JK_ENUM;
    k->names.lit  = calloc(n, sizeof(char *));
    k->params     = calloc(n, sizeof(*k->params));
    k->open       = calloc(n, sizeof(*k->open));
    k->raw        = calloc(n, sizeof(*k->raw));
    if (!k->names.lit || !k->params || !k->open || !k->raw) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t     *t    = json_array_get(tools, i);
        const char *name = json_string_value(json_object_get(t, "name"));
        json_t     *par  = json_object_get(t, "parameters");
        if (!name) return dsv4_err_set(err, DSV4_EINVAL, "strict tool call: tool %zu has no name", i);
        size_t nl = strlen(name);
        if (!(k->names.lit[i] = malloc(nl + 4))) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        memcpy(k->names.lit[i], name, nl);
        memcpy(k->names.lit[i] + nl, "\">\n", 4);
        k->names.n++;
        k->n_tools++;
        json_t *empty = NULL;
        if (!par || json_is_null(par)) par = empty = json_pack("{s:s, s:{}, s:b}", "type", "object", "properties",
                                                              "additionalProperties", 0);
        int rc = compile(par, 1, &k->params[i], err);
        json_decref(empty);
        if (rc) return rc;
        struct jnode *o = k->params[i];
        if (o->kind != JK_OBJECT)
            return dsv4_err_set(err, DSV4_EUNSUPPORTED, "strict tool %s: parameters must be an object schema with "
                                "properties", name);
        k->open[i] = calloc((size_t)(o->n ? o->n : 1), sizeof(char *));
        k->raw[i]  = calloc((size_t)(o->n ? o->n : 1), sizeof(bool));
        if (!k->open[i] || !k->raw[i]) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        const char *key;
        json_t     *v;
        int         j = 0;
        json_object_foreach(json_object_get(par, "properties"), key, v) {
            k->raw[i][j] = o->props[j]->kind == JK_STRING && !o->props[j]->nullable;
            size_t need  = strlen(key) + 64;
            if (!(k->open[i][j] = malloc(need))) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
            snprintf(k->open[i][j], need, "%s<" DSML "parameter name=\"%s\" string=\"%s\">", j ? "\n" : "", key,
                     k->raw[i][j] ? "true" : "false");
            j++;
        }
    }
    for (int i = 0; i < k->names.n; i++) /* no name may be a prefix of another with its suffix: never */
        for (int j = 0; j < k->names.n; j++)
            if (i != j && !strcmp(k->names.lit[i], k->names.lit[j]))
                return dsv4_err_set(err, DSV4_EINVAL, "strict tool call: two tools named %s", k->names.lit[i]);
    return DSV4_OK;
}

int dsv4_constraint_new_tools(dsv4_constraint **out, const dsv4_json_vocab *v, const dsv4_tokenizer *tok,
                              const char *tools, size_t len, int32_t think_end, struct dsv4_err *err)
{
    int rc = dsv4_constraint_new_call(out, v, tok, tools, len, NULL, err);
    if (rc) return rc;
    dsv4_constraint *c = *out;
    c->st.sp           = 0; /* nothing until the model opens a block */
    c->watch           = true;
    c->call_auto       = true;
    c->think_end       = think_end;
    c->free_text       = think_end >= 0;
    return DSV4_OK;
}

int dsv4_constraint_new_call(dsv4_constraint **out, const dsv4_json_vocab *v, const dsv4_tokenizer *tok,
                             const char *tools, size_t len, const char *name, struct dsv4_err *err)
{
    *out = NULL;
    if (v->dsml < 0) return dsv4_err_set(err, DSV4_EUNSUPPORTED, "the tokenizer has no ｜DSML｜ token");
    dsv4_constraint *c = NULL;
    int              rc = dsv4_constraint_new_json(&c, v, tok, NULL, 0, -1, err);
    if (rc) return rc;
    json_error_t je;
    json_t      *t = json_loadb(tools, len, 0, &je);
    if (!t) rc = dsv4_err_set(err, DSV4_EINVAL, "tools: not valid JSON (%s)", je.text);
    else rc = compile_call(t, &c->call, err);
    json_decref(t);
    if (!rc && !(c->schema = malloc(len + 1))) rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    if (!rc) {
        memcpy(c->schema, tools, len);
        c->schema[len] = '\0';
        c->schema_len  = len;
    }
    int idx = -1;
    if (!rc && name) {
        for (int i = 0; i < c->call->n_tools && idx < 0; i++)
            if (!strncmp(c->call->names.lit[i], name, strlen(name)) && !strcmp(c->call->names.lit[i] + strlen(name), "\">\n"))
                idx = i;
        if (idx < 0) rc = dsv4_err_set(err, DSV4_EINVAL, "strict tool call: no tool named %s", name);
        else if (!(c->call_name = strdup(name))) rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    }
    if (rc) {
        dsv4_constraint_free(c);
        return rc;
    }
    c->st.sp = 0;
    push(&c->st, (struct frame){ .type = F_CALL, .phase = (uint8_t)(name ? 1 : 0), .pos = (uint16_t)(idx < 0 ? 0 : idx),
                                 .lit = (const char *)(const void *)c->call, .cand = idx < 0 ? 0 : 1ull << idx });
    *out = c;
    return DSV4_OK;
}

void dsv4_constraint_free(dsv4_constraint *c)
{
    if (!c) return;
    jcall_free(c->call);
    free(c->call_name);
    free(c->schema);
    jnode_free(c->root);
    free(c->stack);
    free(c->edge_at);
    free(c->allowed);
    free(c);
}

/* Unforced strict tools: follows the free text for the block's opening; once it is there, the
 * rest of the opening and the call are constrained. */
static void watch_byte(dsv4_constraint *c, uint8_t b)
{
    size_t tn = sizeof(CALL_TRIGGER) - 1;
    if ((uint8_t)CALL_TRIGGER[c->trig] == b) {
        if ((size_t)++c->trig < tn) return;
        c->watch = false;
        c->st.sp = 0;
        push(&c->st, (struct frame){ .type = F_CALL, .lit = (const char *)(const void *)c->call });
        push_lit(&c->st, CALL_OPEN_REST);
        return;
    }
    /* the longest prefix of the trigger that ends here (the trigger is short: try them all) */
    int k = c->trig;
    c->trig = 0;
    for (int len = k; len > 0; len--) {
        if ((uint8_t)CALL_TRIGGER[len - 1] != b) continue;
        if (len == 1 || !memcmp(CALL_TRIGGER, CALL_TRIGGER + (k - len + 1), (size_t)len - 1)) {
            c->trig = len;
            break;
        }
    }
}

bool dsv4_constraint_done(const dsv4_constraint *c)
{
    if (c->watch) return !c->free_text;
    return !c->free_text && (!c->json || complete(&c->st));
}

void dsv4_constraint_accept(dsv4_constraint *c, int32_t token)
{
    if (c->free_text) {
        if (token == c->think_end) c->free_text = false;
        else c->n_think++;
        return;
    }
    if (!c->json) return;
    if (token == c->v->eos) return;
    char   buf[512];
    size_t n = 0;
    if (token == c->v->dsml) {
        memcpy(buf, DSML, n = DSML_MARK_LEN);
    } else if (dsv4_tokenizer_is_added(c->tok, token) ||
               dsv4_tokenizer_decode(c->tok, &token, 1, buf, sizeof(buf), &n, NULL) != DSV4_OK) {
        if (!c->watch) c->st.dead = true; /* free text may hold other control tokens */
        return;
    }
    size_t i = 0;
    while (c->watch && i < n) watch_byte(c, (uint8_t)buf[i++]);
    if (!c->watch) feed(&c->st, (const uint8_t *)buf + i, n - i);
}

/* Depth-first over the trie: a token is allowed when its bytes all step. */
static void walk(dsv4_constraint *c)
{
    const dsv4_json_vocab *v = c->v;
    int                    d = 0;
    copy_state(&c->stack[0], &c->st);
    c->edge_at[0]            = 0;
    uint32_t node[1024];
    node[0] = 0;
    while (d >= 0) {
        const struct tnode *t = &v->node[node[d]];
        if (c->edge_at[d] >= t->n || d + 1 > (int)v->max_len || d + 1 >= 1024) {
            d--;
            continue;
        }
        const struct tedge *e = &v->edge[t->first + c->edge_at[d]++];
        copy_state(&c->stack[d + 1], &c->stack[d]);
        if (!step(&c->stack[d + 1], e->byte)) continue;
        if (v->node[e->child].token >= 0) c->allowed[v->node[e->child].token] = 1;
        node[d + 1]       = e->child;
        c->edge_at[d + 1] = 0;
        d++;
    }
}

void dsv4_constraint_mask(dsv4_constraint *c, float *logits)
{
    if (c->free_text) { /* the reasoning is free, up to the budget; after it, the JSON */
        if (c->think_budget >= 0 && c->n_think >= c->think_budget) {
            int32_t V = dsv4_tokenizer_n_vocab(c->tok);
            for (int32_t i = 0; i < V; i++)
                if (i != c->think_end) logits[i] = -INFINITY;
        }
        return;
    }
    if (!c->json || c->watch) return;
    const dsv4_json_vocab *v = c->v;
    memset(c->allowed, 0, (size_t)v->vocab);
    if (!c->st.dead) walk(c);
    bool done = complete(&c->st), any = false;
    if (v->eos >= 0 && v->eos < v->vocab) c->allowed[v->eos] = done || c->st.dead;
    for (int32_t i = 0; i < v->vocab; i++) {
        if (!c->allowed[i]) logits[i] = -INFINITY;
        else any = true;
    }
    if (!any && v->eos >= 0 && v->eos < v->vocab) logits[v->eos] = 0; /* nothing can continue: end */
}
