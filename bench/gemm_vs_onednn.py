#!/usr/bin/python3
"""gemm_vs_onednn.py - dsv4's prefill projection against oneDNN's bf16 GEMM, same shapes,
same run.

dsv4 side: `dsv4 bench --gemm M,N,K,fp8,i16:...` (FP8 weights with e8m0 block scales in the
interleaved tiles made at load, activations quantised to e4m3, VDPBF16PS kernels: the full
projection as the engine runs it).
oneDNN side: torch.matmul on bf16 tensors (Debian's torch 1.13 dispatches bf16 matmul to
oneDNN), the best a dense bf16 GEMM library does on this machine. Shapes: the projections of
a V4-Flash layer for a 2048-token prefill chunk (and a routed expert with its average share
of tokens). Prints GFLOP/s of both and the ratio.

usage: /usr/bin/python3 bench/gemm_vs_onednn.py [--dsv4 ./dsv4] [--tokens 2048]
"""
import argparse
import subprocess
import time

import torch


def shapes(T):
    return [
        ("wq_a", T, 1024, 4096),
        ("wq_b", T, 32768, 1024),
        ("wkv", T, 512, 4096),
        ("wo_a (one group)", T, 1024, 4096),
        ("wo_b", T, 4096, 8192),
        ("shared w1/w3", T, 2048, 4096),
        ("shared w2", T, 4096, 2048),
        ("routed expert (T*6/256 tokens)", max(1, T * 6 // 256), 2048, 4096),
    ]


def onednn_gflops(M, N, K):
    a = torch.randn(M, K).to(torch.bfloat16)
    b = torch.randn(K, N).to(torch.bfloat16)
    torch.matmul(a, b)
    best = 1e30
    for _ in range(3):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * M * N * K / best / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsv4", default="./dsv4")
    ap.add_argument("--tokens", type=int, default=2048)
    args = ap.parse_args()
    torch.set_num_threads(2)
    sh = shapes(args.tokens)
    # ",i16": the interleaved 16-row tiles the engine repacks its projections into at load
    spec = ":".join(f"{M},{N},{K},fp8,i16" for _, M, N, K in sh)
    out = subprocess.run([args.dsv4, "bench", "--gemm", spec], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    col = lines[1].split().index("GFLOP/s")  # the table's header names its columns
    ours = [float(line.split()[col]) for line in lines[2:] if line.strip()]
    print(out.splitlines()[0])
    print(f"{'projection':32} {'M':>6} {'N':>6} {'K':>6} {'dsv4 GF/s':>10} {'oneDNN GF/s':>12} {'ratio':>6}")
    tot_ours = tot_ref = 0.0
    for (name, M, N, K), g in zip(sh, ours):
        r = onednn_gflops(M, N, K)
        tot_ours += 2.0 * M * N * K / g
        tot_ref += 2.0 * M * N * K / r
        print(f"{name:32} {M:6d} {N:6d} {K:6d} {g:10.1f} {r:12.1f} {g / r:6.2f}")
    print(f"time-weighted ratio over the shapes: {tot_ref / tot_ours:.2f} (dsv4 / oneDNN throughput)")


if __name__ == "__main__":
    main()
