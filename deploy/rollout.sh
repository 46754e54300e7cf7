#!/bin/sh
# deploy/rollout.sh - a staged rollout of a dsv4 canary: phases of growing traffic share
# (1 % -> 5 % -> 20 % -> 50 % -> 100 % in deploy/rollout-gates.example), each held only if
# `dsv4 loadtest` against the canary meets that phase's gates and the canary's own /metrics
# show no failed forward pass and no restart. Stops at the first failing phase, names the
# gate with the measured value and the limit, runs the rollback hook and exits 1.
# docs/DEPLOY.md "Staged rollout".
#
# usage: deploy/rollout.sh --url URL --gates FILE [options] [-- LOADTEST-ARGS...]
#   --url URL           the canary's base URL (loadtest and /metrics go there only)
#   --gates FILE        one line per phase (format below)
#   --set-weight CMD    run as `CMD PERCENT` before each phase: shifts that share of the
#                       traffic to the canary (an ingress weight, replica counts, ...)
#   --rollback CMD      run as `CMD PHASE PERCENT GATE` when a phase fails
#   --dsv4 BIN          the dsv4 binary (default: $DSV4_BIN, else dsv4 on PATH)
#   --api-key KEY       sent by loadtest (default: $DSV4_API_KEY)
#   --rss-metric NAME   the /metrics series the max_rss_mb gate reads
#                       (default process_resident_memory_bytes)
#   anything after -- is passed to every `dsv4 loadtest` (e.g. --max-tokens 32; split at
#   spaces)
#
# Gates file: '#' starts a comment; each other line is one phase, whitespace-separated:
#   percent duration_s concurrency p99_ttft_ms p99_itl_ms max_error_rate min_pass_rate
#   max_server_errors max_rss_mb
# '-' leaves a gate out. pass rate = requests answered in full / requests sent; a phase
# below min_pass_rate fails (the rollback rule). max_server_errors bounds the canary's
# dsv4_requests_finished_total{reason="error"} growth over the phase (failed forward
# passes, an allocation among them); a restart (its counters went back: an OOM kill and a
# restart, say) or a /metrics that stops answering always fails.
#
# Exit status: 0 every phase passed, 1 a gate failed (rolled back), 2 a usage or setup
# error (bad gates file, the canary unreachable, loadtest gave no summary).
set -u

URL='' GATES='' SET_WEIGHT='' ROLLBACK='' API_KEY=${DSV4_API_KEY:-} RSS_METRIC=process_resident_memory_bytes
DSV4=${DSV4_BIN:-dsv4}
usage() { sed -n '8,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
    --url) URL=$2; shift 2 ;;
    --gates) GATES=$2; shift 2 ;;
    --set-weight) SET_WEIGHT=$2; shift 2 ;;
    --rollback) ROLLBACK=$2; shift 2 ;;
    --dsv4) DSV4=$2; shift 2 ;;
    --api-key) API_KEY=$2; shift 2 ;;
    --rss-metric) RSS_METRIC=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) usage ;;
    *) echo "rollout: unknown option $1" >&2; usage ;;
    esac
done
if [ -z "$URL" ] || [ -z "$GATES" ]; then usage; fi
[ -r "$GATES" ] || { echo "rollout: cannot read the gates file $GATES" >&2; exit 2; }
command -v curl >/dev/null 2>&1 || { echo "rollout: needs curl (for the canary's /metrics)" >&2; exit 2; }

# The canary's /metrics, or nothing when it does not answer.
scrape() { curl -fsS --max-time 10 "$URL/metrics" 2>/dev/null; }
# The sum of a metric's samples whose series starts with $2 (name or name{labels).
metric_sum() { printf '%s\n' "$1" | awk -v s="$2" 'index($0, s) == 1 { v += $NF; n++ } END { if (n) print v; else print "-" }'; }
# A number from loadtest's JSON summary: top-level key, or KEY.p99_ms for ttft/itl.
jnum() {
    case $2 in
    *.*) printf '%s\n' "$1" | sed -n "s/.*\"${2%%.*}\":{[^}]*\"${2#*.}\":\([^,}]*\).*/\1/p" ;;
    *) printf '%s\n' "$1" | sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" ;;
    esac
}
# $1 with $2 decimals; "-" when it is not a number (null: nothing was measured).
num() { case $1 in ''|null|-) echo - ;; *) awk -v v="$1" -v d="$2" 'BEGIN { printf("%." d "f\n", v) }' ;; esac; }
# True (0) when measured value $1 breaks limit $2 under comparison $3 (le: must be <=, ge: >=);
# an unmeasured value (null, -, empty) breaks any limit.
breaks() { awk -v v="$1" -v l="$2" -v op="$3" 'BEGIN {
    if (v == "" || v == "null" || v == "-") exit 0
    if (op == "le") exit !(v + 0 > l + 0); exit !(v + 0 < l + 0) }'; }

phase=0 total=$(grep -cv '^[[:space:]]*\(#\|$\)' "$GATES")
[ "$total" -gt 0 ] || { echo "rollout: $GATES lists no phase" >&2; exit 2; }
# One phase: sets $failed to "gate measured limit" when a gate fails.
run_phase() {
    pct=$1 dur=$2 conc=$3 ttft=$4 itl=$5 maxerr=$6 minpass=$7 maxsrv=$8 maxrss=$9
    if [ -n "$SET_WEIGHT" ]; then
        sh -c "$SET_WEIGHT \"\$1\"" rollout "$pct" || { failed="set_weight_hook_status $? 0"; return; }
    fi
    before=$(scrape) || { echo "rollout: the canary's /metrics at $URL does not answer" >&2; exit 2; }
    # shellcheck disable=SC2086 # the loadtest arguments after -- are split at spaces
    summary=$(DSV4_API_KEY=$API_KEY "$DSV4" loadtest --url "$URL" --duration "$dur" --concurrency "$conc" --json \
        $LT_ARGS 2>/dev/null | grep '^{' | tail -n 1)
    after=$(scrape)
    [ -n "$summary" ] || { echo "rollout: dsv4 loadtest printed no summary (is $DSV4 a dsv4 binary?)" >&2; exit 2; }
    reqs=$(jnum "$summary" requests) ok=$(jnum "$summary" ok) erate=$(num "$(jnum "$summary" error_rate)" 4)
    p99ttft=$(num "$(jnum "$summary" ttft.p99_ms)" 3) p99itl=$(num "$(jnum "$summary" itl.p99_ms)" 3)
    pass=$(awk -v r="$reqs" -v o="$ok" 'BEGIN { printf "%.4f", (r > 0) ? o / r : 0 }')
    h0=$(metric_sum "$before" dsv4_http_requests_total) h1=$(metric_sum "$after" dsv4_http_requests_total)
    e0=$(metric_sum "$before" 'dsv4_requests_finished_total{reason="error"') e1=$(metric_sum "$after" 'dsv4_requests_finished_total{reason="error"')
    restarts=$(awk -v a="$h0" -v b="$h1" 'BEGIN { print (b == "-" || b + 0 < a + 0) ? 1 : 0 }')
    srverr=$(awk -v a="$e0" -v b="$e1" 'BEGIN { print (a == "-" || b == "-") ? "-" : b - a }')
    rss=$(metric_sum "$after" "$RSS_METRIC")
    [ "$rss" = - ] || rss=$(awk -v v="$rss" 'BEGIN { printf "%.1f", v / 1048576 }')
    printf 'phase %d/%d (%s%%): %s requests, pass rate %s, p99 TTFT %s ms, p99 ITL %s ms, error rate %s, server errors %s, restarts %s, RSS %s MiB\n' \
        "$phase" "$total" "$pct" "$reqs" "$pass" "$p99ttft" "$p99itl" "$erate" "$srverr" "$restarts" "$rss"
    failed=
    [ "$restarts" = 0 ] || { failed="canary_restarted_or_down $restarts 0"; return; }
    for g in "min_pass_rate $pass $minpass ge" "max_error_rate $erate $maxerr le" "p99_ttft_ms $p99ttft $ttft le" \
             "p99_itl_ms $p99itl $itl le" "max_server_errors $srverr $maxsrv le" "max_rss_mb $rss $maxrss le"; do
        # shellcheck disable=SC2086 # the four words of a gate
        set -- $g
        [ "$3" = - ] && continue
        if breaks "$2" "$3" "$4"; then failed="$1 $2 $3"; return; fi
    done
}

LT_ARGS="$*"
[ -z "$API_KEY" ] || export DSV4_API_KEY="$API_KEY"
while read -r pct dur conc ttft itl maxerr minpass maxsrv maxrss rest; do
    case $pct in ''|'#'*) continue ;; esac
    if [ -z "$maxrss" ] || [ -n "$rest" ]; then
        echo "rollout: $GATES: each phase needs 9 fields (percent duration_s concurrency p99_ttft_ms p99_itl_ms max_error_rate min_pass_rate max_server_errors max_rss_mb): '$pct $dur $conc $ttft $itl $maxerr $minpass $maxsrv $maxrss $rest'" >&2
        exit 2
    fi
    phase=$((phase + 1))
    run_phase "$pct" "$dur" "$conc" "$ttft" "$itl" "$maxerr" "$minpass" "$maxsrv" "$maxrss" </dev/null
    if [ -n "$failed" ]; then
        # shellcheck disable=SC2086 # gate, measured, limit
        set -- $failed
        case $1 in min_*) rel=">=" ;; *) rel="<=" ;; esac
        echo "rollout: FAIL at phase $phase/$total ($pct%): gate $1: measured $2, limit $rel $3"
        if [ -n "$ROLLBACK" ]; then
            echo "rollout: rolling back: $ROLLBACK $phase $pct $1"
            sh -c "$ROLLBACK \"\$1\" \"\$2\" \"\$3\"" rollout "$phase" "$pct" "$1" </dev/null || echo "rollout: the rollback hook failed (exit $?)" >&2
        fi
        exit 1
    fi
    echo "rollout: phase $phase/$total ($pct%) passed"
done <"$GATES"
echo "rollout: PASS: all $phase phases passed"
exit 0
