#!/bin/sh
# bench/soak.sh - the soak benchmark behind `make soak` (not part of `make test` or CI).
#
# Starts `dsv4 serve -m MODEL --port 0` (the port is read from the "listening on" line it
# prints), waits for "dsv4 serve: ready", and runs `dsv4 loadtest --soak` against it on
# 127.0.0.1 for MINUTES: a bounded mixed load (streamed and plain requests, chat and text
# completions, short and long prompts, clients that hang up mid-stream, a few slow
# senders, bad requests), with a report line every REPORT_S seconds (server RSS through
# --server-pid, KV pool occupancy and fragmentation from /metrics, P50/P99 TTFT and ITL
# of the window, requests and errors by kind) and a final one; loadtest then judges the
# run (RSS growth after warm-up, lost requests, P99 ITL drift: tools/support/soak.c).
# Last the server gets SIGTERM and must drain and exit 0.
#
# usage: bench/soak.sh DSV4_BIN MODEL_DIR MINUTES REPORT_S
# environment: SOAK_SERVE_ARGS, SOAK_ARGS: more options for dsv4 serve / dsv4 loadtest
#              (split at spaces); SOAK_READY_S: how long the model may take to load (300).
# exit status: 0 the soak passed and the server exited 0; 1 otherwise (the reason is
# printed); 2 usage.
set -u

if [ $# -ne 4 ]; then
    echo "usage: bench/soak.sh DSV4_BIN MODEL_DIR MINUTES REPORT_S" >&2
    exit 2
fi
bin=$1 model=$2 minutes=$3 report_s=$4
duration=$(awk -v m="$minutes" 'BEGIN { if (m + 0 > 0) printf "%g", m * 60 }')
if [ -z "$duration" ]; then
    echo "soak: MINUTES must be a positive number (got '$minutes')" >&2
    exit 2
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsv4-soak.XXXXXX") || exit 1
pid=
# An interrupted soak must not leave its server running.
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    if [ -n "$pid" ]; then
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck disable=SC2086 # SOAK_SERVE_ARGS is a list of options
"$bin" serve -m "$model" --port 0 ${SOAK_SERVE_ARGS:-} >"$tmp/serve.out" 2>"$tmp/serve.log" &
pid=$!

# The server prints its port at once and "ready" after loading the model.
port=
ready=0
i=0
limit=$(( ${SOAK_READY_S:-300} * 10 ))
while [ $i -lt $limit ]; do
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    if grep -q '^dsv4 serve: ready' "$tmp/serve.out" 2>/dev/null; then ready=1; break; fi
    sleep 0.1
    i=$((i + 1))
done
port=$(sed -n 's|.*listening on http://[^ ]*:\([0-9][0-9]*\).*|\1|p' "$tmp/serve.out" | head -n 1)
if [ $ready -ne 1 ] || [ -z "$port" ]; then
    echo "soak: FAIL: dsv4 serve did not get ready (log: $tmp/serve.log)"
    tail -n 20 "$tmp/serve.log"
    exit 1
fi
echo "soak: dsv4 serve pid $pid on 127.0.0.1:$port, model $model, ${duration} s, a report every ${report_s} s"

# shellcheck disable=SC2086 # SOAK_ARGS is a list of options
"$bin" loadtest --url "http://127.0.0.1:$port" --soak --duration "$duration" --report "$report_s" \
    --server-pid "$pid" ${SOAK_ARGS:-}
lt=$?

# SIGTERM drains (accepted requests run to their end, none are left by now) and exits 0.
# A zombie counts as exited: wait collects its status below.
kill -TERM "$pid" 2>/dev/null
i=0
while [ $i -lt 900 ] && [ -e "/proc/$pid" ] && [ "$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null)" != Z ]; do
    sleep 0.1
    i=$((i + 1))
done
if [ $i -ge 900 ]; then
    echo "soak: FAIL: dsv4 serve still running 90 s after SIGTERM; killed"
    kill -KILL "$pid" 2>/dev/null
fi
wait "$pid"
srv=$?
pid=

status=0
if [ "$srv" -eq 0 ]; then
    echo "soak: dsv4 serve exited 0 on SIGTERM"
else
    echo "soak: FAIL: dsv4 serve exited $srv on SIGTERM (log: $tmp/serve.log)"
    tail -n 20 "$tmp/serve.log"
    status=1
fi
if [ "$lt" -ne 0 ]; then
    echo "soak: FAIL: dsv4 loadtest exited $lt (log of the server: $tmp/serve.log)"
    status=1
fi
if [ $status -eq 0 ]; then
    rm -rf "$tmp"
    echo "soak: PASS"
fi
exit $status
