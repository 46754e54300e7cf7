#!/usr/bin/env python3
"""kv_disk_itl.py - the inter-token latency of a running stream while another request's
long prefix is loaded from the disk tier (docs/SERVING.md "Disk tier").

    bench/kv_disk_itl.py BIN MODEL N_TOKENS [ROUNDS [B_TOKENS]]

A server (--max-seqs 2) writes an N-token token-id prompt to a fresh --kv-disk-dir; it is
restarted (RAM empty) and, each round, a streamed request B decodes while the long prompt
is sent: its answer resumes from disk. Printed: B's median gap between tokens before the long
request, and its largest gap from the long request's send to its answer, per round. Then
the server is restarted for the next round (so the prefix comes from disk each time)."""
import json, re, statistics, subprocess, sys, tempfile, threading, time, urllib.request

binp, model, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
b_tokens = int(sys.argv[5]) if len(sys.argv) > 5 else 400
tmp = tempfile.mkdtemp()


def start():
    p = subprocess.Popen([binp, "serve", "-m", model, "--port", "0", "--max-seqs", "2", "--ctx", str(n + 600),
                          "--keep-finished", "0", "--prefix-cache", str(n // 256 + 2), "--kv-disk-dir", tmp + "/kv"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        m = re.search(r"listening on http://[^ ]*:(\d+) ", line)
        if m:
            port = int(m.group(1))
            break
    while True:
        try:
            if b'"ok"' in urllib.request.urlopen(f"http://127.0.0.1:{port}/health").read():
                return p, port
        except OSError:
            pass
        time.sleep(0.1)


def post(port, body):
    rq = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                {"Content-Type": "application/json"})
    return urllib.request.urlopen(rq)


vocab = 129280
out = subprocess.run([binp, "inspect", "-m", model], capture_output=True, text=True).stdout
m = re.search(r"vocab (\d+)", out)
if m:
    vocab = int(m.group(1))
long_body = {"prompt": [10 + (i * 7919) % (vocab - 10) for i in range(n)], "max_tokens": 1, "temperature": 0,
             "ignore_eos": True}
p, port = start()
post(port, long_body).read()  # writes the prefix's records
p.terminate(); p.wait()
for r in range(rounds):
    p, port = start()
    post(port, {"prompt": [5, 6, 7], "max_tokens": 1}).read()  # warm-up
    times, sent = [], {}

    def stream():
        resp = post(port, {"prompt": [5, 6, 7], "max_tokens": b_tokens, "temperature": 0, "ignore_eos": True, "stream": True})
        for line in resp:
            if line.startswith(b"data: {"):
                times.append(time.perf_counter())

    th = threading.Thread(target=stream)
    th.start()
    while len(times) < b_tokens // 8:
        time.sleep(0.001)
    sent["t0"] = time.perf_counter()
    ans = json.loads(post(port, long_body).read())
    sent["t1"] = time.perf_counter()
    th.join()
    p.terminate(); p.wait()
    gaps = [b - a for a, b in zip(times, times[1:])]
    before = [g for a, g in zip(times, gaps) if a < sent["t0"]]
    during = [g for a, b, g in zip(times, times[1:], gaps) if b > sent["t0"] and a < sent["t1"]]
    cached = (ans["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    print(f"round {r}: B median gap {statistics.median(before) * 1e3:.2f} ms, largest gap while the prefix loads "
          f"{max(during) * 1e3:.2f} ms ({len(during)} gaps), long request {(sent['t1'] - sent['t0']) * 1e3:.1f} ms, "
          f"cached {cached}")
