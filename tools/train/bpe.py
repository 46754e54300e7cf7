#!/usr/bin/python3
"""bpe.py - byte-level BPE: trainer, encoder and a Hugging Face tokenizer.json writer.

Owns: the demo model's tokenizer. `train` learns merges on a text (most frequent adjacent
pair first, ties to the smaller pair of token strings, so a run is reproducible) and writes
a tokenizer.json of exactly DeepSeek's kind (docs/MODEL.md §R6): an empty Sequence normalizer,
the DeepSeek-V3 pre-tokenizer (Split on digit runs of 1-3, Split on CJK runs, Split on the
GPT-style word regex, then ByteLevel without its own regex), a BPE model with vocab and
legacy "a b" merge strings, the ByteLevel decoder and post-processor, and V4's special and
chat tokens as added tokens. Layout of the ids:

    0 BOS "<｜begin▁of▁sentence｜>", 1 EOS "<｜end▁of▁sentence｜>", 2 "<｜▁pad▁｜>"
      (in the vocabulary and in added_tokens, special, as DeepSeek does)
    3 .. 258   the 256 byte symbols, in the byte-level alphabet's order
    259 ..     merges, in rank order
    the tail   V4's chat and task tokens (added tokens only): <｜User｜>, <｜Assistant｜>,
               <think>, </think>, ｜DSML｜, <｜latest_reminder｜>, the task tokens.

`Tokenizer` encodes with the same rules as the Hugging Face library (added tokens split
first, the three Split regexes in order, lowest-rank merge first within each piece), so
training data, perplexity texts and test fixtures can be tokenized without the C engine;
tools/train/check_tokenizer.sh compares it with dsv4's C tokenizer and the HF reference.

Why from scratch: no `tokenizers` Python package exists here, and the project writes its
own code. Needs only Debian's python3-regex (for \\p{..} classes).

    bpe.py train --text FILE --vocab 4096 --out tokenizer.json
    bpe.py encode --tokenizer tokenizer.json < text      (one id per line)
"""

import argparse
import collections
import heapq
import json
import sys

import regex

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
# V4's chat encoding (encoding_dsv4.py) and its task tokens, in this order after the merges.
CHAT_TOKENS = ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜",
               "<｜latest_reminder｜>", "<｜action｜>", "<｜query｜>", "<｜authority｜>",
               "<｜domain｜>", "<｜title｜>", "<｜read_url｜>", "<｜extracted_url｜>"]

# DeepSeek-V3's pre-tokenizer regexes (a configuration, the same in every DeepSeek file).
SPLIT_REGEXES = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"
    r" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]


def byte_alphabet():
    """GPT-2's reversible byte -> printable character map, and the byte order of the vocab."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    order = printable + [b for b in range(256) if b not in printable]
    return table, order


BYTE_TO_CHAR, BYTE_ORDER = byte_alphabet()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}
_COMPILED = [regex.compile(p) for p in SPLIT_REGEXES]


def pre_tokenize(text):
    """The pieces of text after the three Isolated Splits (each splits the pieces of the
    previous one: matches and the gaps between them both become pieces)."""
    pieces = [text]
    for rx in _COMPILED:
        out = []
        for p in pieces:
            pos = 0
            for m in rx.finditer(p):
                if m.start() > pos:
                    out.append(p[pos:m.start()])
                if m.end() > m.start():
                    out.append(m.group())
                pos = m.end()
            if pos < len(p):
                out.append(p[pos:])
        pieces = out
    return pieces


def to_symbols(piece):
    return "".join(BYTE_TO_CHAR[b] for b in piece.encode("utf-8"))


# ============================================================================ training


def train(text, vocab_size, log=None):
    """Learns merges until 3 + 256 + len(merges) + len(CHAT_TOKENS) == vocab_size.
    Returns the merges as a list of (left, right) token strings."""
    n_merges = vocab_size - 3 - 256 - len(CHAT_TOKENS)
    if n_merges < 0:
        raise ValueError(f"vocab_size {vocab_size} is too small")
    counts = collections.Counter(to_symbols(p) for p in pre_tokenize(text))
    words = [list(w) for w in counts]                 # each word: its current symbols
    freq = [counts[w] for w in counts]
    pairs = collections.Counter()                     # pair -> total count
    where = collections.defaultdict(set)              # pair -> word indices holding it
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pairs[(a, b)] += freq[i]
            where[(a, b)].add(i)
    # Max-heap on (count, then smaller pair first); stale entries are skipped when popped.
    heap = [(-c, p) for p, c in pairs.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < n_merges and heap:
        c, p = heapq.heappop(heap)
        if pairs.get(p, 0) != -c or c == 0:
            continue
        a, b = p
        merged = a + b
        merges.append(p)
        touched = collections.Counter()
        for i in list(where[p]):
            w, f = words[i], freq[i]
            for x, y in zip(w, w[1:]):
                pairs[(x, y)] -= f
                touched[(x, y)] += 1
            nw, k = [], 0
            while k < len(w):
                if k + 1 < len(w) and w[k] == a and w[k + 1] == b:
                    nw.append(merged)
                    k += 2
                else:
                    nw.append(w[k])
                    k += 1
            words[i] = nw
            for x, y in zip(nw, nw[1:]):
                pairs[(x, y)] += f
                where[(x, y)].add(i)
                touched[(x, y)] += 1
        del pairs[p]
        del where[p]
        for q in touched:
            if q in pairs:
                if pairs[q] > 0:
                    heapq.heappush(heap, (-pairs[q], q))
                else:
                    del pairs[q]
        if log and len(merges) % 500 == 0:
            log(f"  {len(merges)} merges, last {a + b!r} ({-c})")
    return merges


def build_json(merges):
    """The tokenizer.json document (a dict) for these merges."""
    vocab = {BOS: 0, EOS: 1, PAD: 2}
    for b in BYTE_ORDER:
        vocab[BYTE_TO_CHAR[b]] = len(vocab)
    for a, b in merges:
        vocab[a + b] = len(vocab)

    def added(i, content, special):
        return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": not special, "special": special}

    added_tokens = [added(0, BOS, True), added(1, EOS, True), added(2, PAD, True)]
    n = len(vocab)
    for k, t in enumerate(CHAT_TOKENS):
        added_tokens.append(added(n + k, t, False))
    split = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False}
             for r in SPLIT_REGEXES]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens,
        "normalizer": {"type": "Sequence", "normalizers": []},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": split + [
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }


def tokenizer_config():
    """tokenizer_config.json of the release's kind (docs/MODEL.md §R6)."""
    return {"add_bos_token": False, "add_eos_token": False, "bos_token": BOS, "eos_token": EOS,
            "pad_token": EOS, "clean_up_tokenization_spaces": False, "legacy": True,
            "model_max_length": 1048576, "tokenizer_class": "PreTrainedTokenizerFast",
            "unk_token": None}


# ============================================================================ encoding


class Tokenizer:
    """Encoder/decoder for a tokenizer.json written by build_json (or any file of that kind)."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        m = j["model"]
        self.vocab = m["vocab"]
        self.rank = {}
        for r, s in enumerate(m["merges"]):
            a, b = s.split(" ") if isinstance(s, str) else s
            self.rank[(a, b)] = r
        self.added = {a["content"]: a["id"] for a in j["added_tokens"]}
        self.id_to_str = {i: s for s, i in self.vocab.items()}
        self.id_to_str.update({i: s for s, i in self.added.items()})
        alts = sorted(self.added, key=len, reverse=True)
        self.added_rx = regex.compile("|".join(regex.escape(a) for a in alts)) if alts else None
        self.bos, self.eos = self.added.get(BOS, 0), self.added.get(EOS, 1)
        self.cache = {}

    def n_vocab(self):
        return max(self.id_to_str) + 1

    def bpe(self, piece):
        got = self.cache.get(piece)
        if got is not None:
            return got
        w = list(to_symbols(piece))
        while len(w) > 1:
            best, bi = None, -1
            for k in range(len(w) - 1):
                r = self.rank.get((w[k], w[k + 1]))
                if r is not None and (best is None or r < best):
                    best, bi = r, k
            if best is None:
                break
            a, b = w[bi], w[bi + 1]
            nw, k = [], 0
            while k < len(w):
                if k + 1 < len(w) and w[k] == a and w[k + 1] == b:
                    nw.append(a + b)
                    k += 2
                else:
                    nw.append(w[k])
                    k += 1
            w = nw
        ids = [self.vocab[s] for s in w]
        self.cache[piece] = ids
        return ids

    def encode(self, text, bos=False):
        ids = [self.bos] if bos else []
        segments = []
        pos = 0
        if self.added_rx is not None:
            for m in self.added_rx.finditer(text):
                segments.append((text[pos:m.start()], None))
                segments.append((None, self.added[m.group()]))
                pos = m.end()
        segments.append((text[pos:], None))
        for seg, tid in segments:
            if tid is not None:
                ids.append(tid)
            elif seg:
                for p in pre_tokenize(seg):
                    ids.extend(self.bpe(p))
        return ids

    def decode_bytes(self, ids):
        out = bytearray()
        for i in ids:
            s = self.id_to_str[i]
            if s in self.added:
                out += s.encode("utf-8")
            else:
                out += bytes(CHAR_TO_BYTE[c] for c in s)
        return bytes(out)

    def decode(self, ids):
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def main():
    p = argparse.ArgumentParser(prog="bpe.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--text", required=True)
    t.add_argument("--vocab", type=int, default=4096)
    t.add_argument("--out", required=True)
    e = sub.add_parser("encode")
    e.add_argument("--tokenizer", required=True)
    e.add_argument("--bos", action="store_true")
    args = p.parse_args()
    if args.cmd == "train":
        text = open(args.text, encoding="utf-8").read()
        merges = train(text, args.vocab, log=lambda s: print(s, file=sys.stderr))
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(build_json(merges), f, ensure_ascii=False, indent=1)
            f.write("\n")
    else:
        tok = Tokenizer(args.tokenizer)
        ids = tok.encode(sys.stdin.buffer.read().decode("utf-8", errors="replace"), bos=args.bos)
        sys.stdout.write("".join(f"{i}\n" for i in ids))


if __name__ == "__main__":
    main()
