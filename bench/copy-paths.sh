#!/usr/bin/env bash
# Copy-path measurements (the GMBlock paper's copy accounting of the data paths): copies per
# byte and instructions per byte for cached read()+write(), sendfile, and O_DIRECT + send.
#
#   bench/copy-paths.sh [MiB]     (default 64)
#
# Builds target/benches/copy_paths.rs (release), runs every path natively
# (copies per byte from the harness's counters, CPU time per byte from
# getrusage, which includes the kernel's copies), then each path under
# `valgrind --tool=callgrind`, whose instruction counts cover user space only
# (the kernel's copies are invisible to it). The `none` run (set-up only) is
# subtracted.
set -euo pipefail
cd "$(dirname "$0")/.."
MIB=${1:-64}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/build}
BIN=$(cargo bench -p blockwire-target --features bench --bench copy_paths --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import sys,json
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="copy_paths" and m.get("executable"): print(m["executable"])' | tail -1)
[ -x "$BIN" ] || { echo "copy_paths bench binary not built" >&2; exit 1; }

echo "# native run, $MIB MiB per path"
"$BIN" --bench all "$MIB"

command -v valgrind >/dev/null || { echo "valgrind not installed: skipping instruction counts"; exit 0; }
OUT=$(mktemp -d)
ir() { # path -> total Ir
  valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.$1" "$BIN" --bench "$1" "$MIB" >/dev/null 2>"$OUT/log.$1"
  sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$OUT/log.$1" | tail -1
}
BASE=$(ir none)
echo
echo "# callgrind (user-space instructions only), $MIB MiB, baseline (set-up) $BASE Ir subtracted"
printf "%-9s %14s %10s\n" path Ir Ir/byte
for p in cached sendfile direct; do
  N=$(ir "$p")
  python3 -c "import sys; n,b,m=int('$N'),int('$BASE'),$MIB; d=n-b; print(f'%-9s %14d %10.3f' % ('$p', d, d/(m*1048576)))"
  grep -h "direct path engine" "$OUT/log.$p" || true
done
rm -rf "$OUT"
