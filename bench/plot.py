#!/usr/bin/env python3
"""plot.py - draws the CSV of `dsv4 bench --csv FILE` as an SVG (no plotting library needed).

Left: decode tokens/s against batch size, one line per context length. Right: share of the
measured read bandwidth used by decode, same axes.

usage: python3 bench/plot.py bench.csv > bench.svg
"""
import csv
import sys
from collections import defaultdict


def panel(x0, title, series, ykey, ymax, ylabel):
    w, h, pad = 380, 260, 40
    out = [f'<g transform="translate({x0},20)">',
           f'<text x="{w/2}" y="0" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{pad}" y1="{h}" x2="{w}" y2="{h}" stroke="black"/>',
           f'<line x1="{pad}" y1="20" x2="{pad}" y2="{h}" stroke="black"/>',
           f'<text x="10" y="{h/2}" font-size="11" transform="rotate(-90 10 {h/2})">{ylabel}</text>']
    batches = sorted({b for s in series.values() for b, _ in s})
    if not batches:
        return ""
    xs = {b: pad + (w - pad - 10) * i / max(1, len(batches) - 1) for i, b in enumerate(batches)}
    for b, x in xs.items():
        out.append(f'<text x="{x}" y="{h+15}" text-anchor="middle" font-size="11">{b}</text>')
    for i in range(5):
        v = ymax * i / 4
        y = h - (h - 20) * i / 4
        out.append(f'<text x="{pad-4}" y="{y+4}" text-anchor="end" font-size="10">{v:.3g}</text>')
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    for k, (ctx, pts) in enumerate(sorted(series.items())):
        c = colours[k % len(colours)]
        pts = sorted(pts)
        path = " ".join(f"{xs[b]:.1f},{h - (h - 20) * v / ymax:.1f}" for b, v in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{w-70}" y="{30 + 14*k}" font-size="11" fill="{c}">ctx {ctx}</text>')
    out.append(f'<text x="{w/2}" y="{h+30}" text-anchor="middle" font-size="11">batch</text></g>')
    return "\n".join(out)


def main():
    rows = list(csv.DictReader(open(sys.argv[1])))
    tps, share = defaultdict(list), defaultdict(list)
    for r in rows:
        tps[int(r["ctx"])].append((int(r["batch"]), float(r["decode_tok_s"])))
        share[int(r["ctx"])].append((int(r["batch"]), 100 * float(r["bw_share"])))
    ymax = max([v for s in tps.values() for _, v in s] + [1]) * 1.1
    print('<svg xmlns="http://www.w3.org/2000/svg" width="820" height="330" font-family="sans-serif">')
    if rows:
        bws = [float(r["read_gbps"]) for r in rows]
        print(f'<text x="10" y="325" font-size="10">{rows[0]["machine"]} {rows[0]["backend"]} '
              f'{rows[0]["threads"]} threads, read bandwidth {min(bws):.1f}-{max(bws):.1f} GB/s (measured around each row), '
              f'commit {rows[0]["commit"]}</text>')
    print(panel(0, "decode tokens/s", tps, "decode_tok_s", ymax, "tokens/s"))
    print(panel(420, "share of read bandwidth", share, "bw_share", 110, "%"))
    print("</svg>")


if __name__ == "__main__":
    main()
