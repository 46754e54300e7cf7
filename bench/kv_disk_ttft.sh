#!/bin/sh
# kv_disk_ttft.sh - time to first token of one token-id prompt through `dsv4 serve`: cold,
# from the RAM prefix cache (the same server, repeated), from the disk tier after a restart
# (its files in the page cache), and again after a restart with the files dropped from the
# page cache (posix_fadvise DONTNEED, so they are read from the device); then the bytes the
# tier holds. docs/SERVING.md "Disk tier" has the figures.
#
#   bench/kv_disk_ttft.sh MODEL N_TOKENS [serve options...]
#
# One sequence, --keep-finished 0 (a kept sequence would resume instead of the prefix
# cache), --prefix-cache sized for the whole prompt. Each server gets a 3-token warm-up
# request first, so one-time costs are not in the figures. Needs curl and python3.
set -eu
model=$1
n=$2
shift 2
bin=${DSV4_BIN:-./dsv4}
tmp=$(mktemp -d)
pid=
cleanup() {
    if [ -n "$pid" ]; then
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

pages=$((n / 256 + 2))
vocab=$("$bin" inspect -m "$model" | sed -n 's/.*vocab \([0-9]*\).*/\1/p')
awk -v n="$n" -v v="$vocab" 'BEGIN { printf "{\"prompt\":["; for (i = 0; i < n; i++) printf "%s%d", i ? "," : "", 10 + (i * 7919) % (v - 10);
                       printf "],\"max_tokens\":1,\"temperature\":0,\"ignore_eos\":true}" }' >"$tmp/body"
echo '{"prompt":[5,6,7],"max_tokens":1,"temperature":0,"ignore_eos":true}' >"$tmp/warm"

start() {
    "$bin" serve -m "$model" --port 0 --max-seqs 1 --ctx $((n + 64)) --keep-finished 0 --prefix-cache "$pages" \
        --kv-disk-dir "$tmp/kv" "$@" >"$tmp/out" 2>"$tmp/err" &
    pid=$!
    port=
    while [ -z "$port" ]; do
        kill -0 "$pid" 2>/dev/null || { echo "kv_disk_ttft: the server exited:" >&2; cat "$tmp/err" >&2; exit 1; }
        port=$(sed -n 's|.*listening on http://[^ ]*:\([0-9]*\) .*|\1|p' "$tmp/out")
        [ -n "$port" ] || sleep 0.2
    done
    until curl -s "http://127.0.0.1:$port/health" | grep -q '"status":"ok"'; do
        kill -0 "$pid" 2>/dev/null || { echo "kv_disk_ttft: the server exited:" >&2; cat "$tmp/err" >&2; exit 1; }
        sleep 0.2
    done
    ask "$tmp/warm" >/dev/null
}
stop() {
    kill -TERM "$pid"
    wait "$pid" || true
    pid=
}
# Posts body file $1; prints the seconds it took and the cached tokens of the answer.
ask() {
    t=$(curl -sS -o "$tmp/resp" -w '%{time_total}' -H 'Content-Type: application/json' \
        --data-binary "@$1" "http://127.0.0.1:$port/v1/completions")
    cached=$(python3 -c 'import json,sys
r = json.load(open(sys.argv[1]))
if "usage" not in r: sys.exit("kv_disk_ttft: " + json.dumps(r))
print((r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0))' "$tmp/resp")
    echo "$t $cached"
}
# Prints one line: label $1, then "seconds cached" from $2.
row() {
    # shellcheck disable=SC2086 # split on purpose
    set -- "$1" $2
    printf '%-14s ttft %8.3f s   cached %6d tokens\n' "$1" "$2" "$3"
}

start "$@"
cold=$(ask "$tmp/body")
ram=$(ask "$tmp/body")
stop
start "$@"
disk=$(ask "$tmp/body")
stop
python3 -c 'import os,sys
for f in os.listdir(sys.argv[1]):
    fd = os.open(os.path.join(sys.argv[1], f), os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$tmp/kv"
start "$@"
dev=$(ask "$tmp/body")
stop
row cold "$cold"
row ram "$ram"
row disk-cached "$disk"
row disk-device "$dev"
bytes=$(du -sb "$tmp/kv" | cut -f1)
files=$(find "$tmp/kv" -name '*.kvc' | wc -l)
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; $("$bin" ops 2>/dev/null | sed -n 's/^backend: //p')"
echo "disk: $bytes bytes in $files records for $n tokens: $(awk -v b="$bytes" -v n="$n" 'BEGIN { printf "%.2f", b / n * 1024 / 1048576 }') MiB per 1k tokens"
