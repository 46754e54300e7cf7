#!/bin/sh
# bench/standby.sh - a hot standby's takeover time against a cold start (docs/DEPLOY.md
# "Hot standby"). Not part of `make test`.
#
# Cold start: `dsv4 serve -m MODEL` is started; measured from the start to the first
# answered request (poll /health until 200, then one request read to its end).
# Standby: `dsv4 serve -m MODEL --standby` is started and left to load and warm until
# /health says "standby"; then SIGUSR1 promotes it, and the takeover time is measured from
# the signal to the first answered request (the same poll and request). The request is a
# chat (4 tokens) when MODEL has a tokenizer.json, else a text completion of 4 tokens from
# token ids. Both runs start from the same page cache: the first of ROUNDS rounds runs
# after whatever the machine last did; quote the later rounds.
#
# usage: bench/standby.sh DSV4_BIN MODEL_DIR [ROUNDS]
# environment: STANDBY_SERVE_ARGS: more options for dsv4 serve (split at spaces);
#              STANDBY_READY_S: how long the model may take to load (600).
# exit status: 0 measured; 1 a server failed; 2 usage.
set -u

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
    echo "usage: bench/standby.sh DSV4_BIN MODEL_DIR [ROUNDS]" >&2
    exit 2
fi
bin=$1 model=$2 rounds=${3:-2}
command -v curl >/dev/null 2>&1 || { echo "standby: needs curl" >&2; exit 2; }
ready_s=${STANDBY_READY_S:-600}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsv4-standby.XXXXXX") || exit 1
pid=
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    if [ -n "$pid" ]; then
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }

if [ -r "$model/tokenizer.json" ]; then
    path=/v1/chat/completions
    body='{"messages":[{"role":"user","content":"In the beginning"}],"max_tokens":4,"temperature":0}'
else
    path=/v1/completions
    body='{"prompt":[1,100,200,300],"max_tokens":4,"temperature":0,"ignore_eos":true}'
fi

# Starts the server with "$@"; sets pid and port (from its "listening on" line).
start() {
    # shellcheck disable=SC2086 # STANDBY_SERVE_ARGS is split on purpose
    "$bin" serve -m "$model" --port 0 ${STANDBY_SERVE_ARGS:-} "$@" >"$tmp/out" 2>"$tmp/err" &
    pid=$!
    port=
    i=0
    while [ -z "$port" ] && [ $i -lt 200 ]; do
        port=$(sed -n 's|.*listening on http://[^ ]*:\([0-9]*\) .*|\1|p' "$tmp/out")
        [ -n "$port" ] || sleep 0.05
        i=$((i + 1))
    done
    [ -n "$port" ] || { echo "standby: the server did not start:" >&2; cat "$tmp/err" >&2; exit 1; }
}
stop() {
    kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    pid=
}
# Polls /health until it answers $1 (a status word), for at most ready_s seconds.
wait_health() {
    t=$(now)
    until curl -s --max-time 5 "http://127.0.0.1:$port/health" 2>/dev/null | grep -q "\"status\":\"$1\""; do
        kill -0 "$pid" 2>/dev/null || { echo "standby: the server died:" >&2; cat "$tmp/err" >&2; exit 1; }
        [ "$(awk -v a="$t" -v b="$(now)" -v l="$ready_s" 'BEGIN { print (b - a > l) }')" = 0 ] ||
            { echo "standby: /health never said $1" >&2; exit 1; }
        sleep 0.01
    done
}
# One request read to its end; fails unless it is answered 200.
ask() {
    code=$(curl -s -o "$tmp/answer" -w '%{http_code}' --max-time 600 -H 'Content-Type: application/json' \
        -d "$body" "http://127.0.0.1:$port$path")
    [ "$code" = 200 ] || { echo "standby: the request got $code: $(cat "$tmp/answer")" >&2; exit 1; }
}

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; $("$bin" ops 2>/dev/null | sed -n 's/^backend: //p')"
echo "model: $model ($(du -sh "$model" | cut -f1)), request: $path, 4 tokens"
r=1
while [ $r -le "$rounds" ]; do
    t0=$(now)
    start
    wait_health ok
    t_ready=$(since "$t0")
    ask
    cold=$(since "$t0")
    stop

    t0=$(now)
    start --standby
    wait_health standby
    t_standby=$(since "$t0")
    t1=$(now)
    kill -USR1 "$pid"
    wait_health ok
    t_promoted=$(since "$t1")
    ask
    takeover=$(since "$t1")
    warm="$(sed -n 's/.*info: \(.* GB of weights read into memory and mapped in .*\)/\1/p' "$tmp/err" | head -n 1), $(sed -n 's/.*standby: \(warm-up request in .*\)/\1/p' "$tmp/err" | head -n 1)"
    stop
    printf 'round %d: cold start to first answer %8.3f s (ready after %.3f s) | standby ready after %.3f s (%s) | takeover %6.3f s (health ok after %.3f s)\n' \
        "$r" "$cold" "$t_ready" "$t_standby" "$warm" "$takeover" "$t_promoted"
    r=$((r + 1))
done
