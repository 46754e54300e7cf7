#!/usr/bin/python3
"""kjv.py - the demo model's training and held-out text: the King James Bible.

Owns: turning Debian's bible-kjv (`bible -f Gen1:1-Rev22:21`: one "Book1:1 text" line per
verse, ASCII) into plain text: the verse references are dropped, each verse is one line and
a blank line ends each chapter. The last five books (1 John, 2 John, 3 John, Jude,
Revelation; 2% of the text) are held out for evaluation; everything before is training text.

    kjv.py --out DIR      writes DIR/train.txt and DIR/heldout.txt
"""

import argparse
import os
import re
import subprocess

HELDOUT_FROM = "1Jn"          # the bible-kjv abbreviation of the first held-out book


def verses():
    """(book, chapter, verse, text) for every verse, in order."""
    raw = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True, capture_output=True).stdout
    out = []
    for line in raw.decode("ascii").split("\n"):
        if not line.strip():
            continue
        m = re.match(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$", line)
        if not m:
            raise ValueError(f"unexpected bible-kjv line: {line!r}")
        out.append((m.group(1), int(m.group(2)), int(m.group(3)), m.group(4).strip()))
    return out


def render(vs):
    """Verse per line, a blank line after each chapter."""
    parts, prev = [], None
    for book, chap, _, text in vs:
        if prev is not None and (book, chap) != prev:
            parts.append("\n")
        parts.append(text + "\n")
        prev = (book, chap)
    return "".join(parts)


def split():
    vs = verses()
    cut = next(i for i, v in enumerate(vs) if v[0] == HELDOUT_FROM)
    return render(vs[:cut]), render(vs[cut:])


def main():
    p = argparse.ArgumentParser(prog="kjv.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    train, held = split()
    for name, text in (("train.txt", train), ("heldout.txt", held)):
        with open(os.path.join(args.out, name), "w", encoding="ascii") as f:
            f.write(text)
        print(f"{name}: {len(text)} bytes, {text.count(chr(10))} lines")


if __name__ == "__main__":
    main()
