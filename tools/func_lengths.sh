#!/bin/sh
# func_lengths.sh - the C functions longer than N lines (default 120) under the given paths
# (default: src tools), longest first, as "LINES FILE:LINE NAME"; exit 1 when there is one.
# The house rule (README "Layout"): no function in src/ or tools/ over 120 lines, tests aside.
# Needs Universal Ctags (Debian: universal-ctags) for each function's first and last line.
#
#   tools/func_lengths.sh [N] [PATH...]
set -u
n=${1:-120}
[ $# -gt 0 ] && shift
[ $# -gt 0 ] || set -- src tools
command -v ctags >/dev/null 2>&1 || { echo "func_lengths.sh: ctags not found (apt-get install universal-ctags)" >&2; exit 2; }
long=$(find "$@" \( -name '*.c' -o -name '*.h' -o -name '*.inc' \) | sort |
  xargs ctags --language-force=C --fields=+ne --c-kinds=f -o - |
  awk -F'\t' -v n="$n" '
    { s = ""; e = ""
      for (i = 4; i <= NF; i++) { if ($i ~ /^line:/) s = substr($i, 6); if ($i ~ /^end:/) e = substr($i, 5) }
      if (s != "" && e != "" && e - s + 1 > n) printf "%5d %s:%d %s\n", e - s + 1, $2, s, $1 }' | sort -rn)
[ -z "$long" ] && exit 0
echo "$long"
exit 1
