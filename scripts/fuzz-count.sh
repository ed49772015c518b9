#!/usr/bin/env bash
# Runs one fuzz target for a fixed number of executions and prints the
# number libFuzzer reports having done ("Done N runs in S second(s)").
#
#   scripts/fuzz-count.sh TARGET [RUNS]        RUNS defaults to 10000000
#
# TARGET is any target of a `*/fuzz` crate (`cargo fuzz list` there).
# Environment:
#   FUZZ_SANITIZER=address|none   cargo fuzz's sanitizer (default address,
#                                 as `scripts/test.sh`; none runs faster)
#   FUZZ_MAX_LEN=N                libFuzzer -max_len (default 4096)
#   FUZZ_LOG=FILE                 keep libFuzzer's full output there
# Exits non-zero when the run fails (a crash, a leak, a timeout): the
# count is then not printed, libFuzzer's report is.
set -euo pipefail

target="${1:?usage: scripts/fuzz-count.sh TARGET [RUNS]}"
runs="${2:-10000000}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

crate=""
for manifest in */fuzz/Cargo.toml; do
  if grep -qx "name = \"$target\"" "$manifest"; then
    crate="$(dirname "$manifest")"
  fi
done
[ -n "$crate" ] || { echo "no fuzz crate has a target named $target" >&2; exit 2; }

log="${FUZZ_LOG:-$(mktemp)}"
sanitizer="${FUZZ_SANITIZER:-address}"
start=$(date +%s)
set +e
(cd "$crate" && RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer "$sanitizer" "$target" -- \
  -runs="$runs" -max_len="${FUZZ_MAX_LEN:-4096}" -print_final_stats=1) >"$log" 2>&1
status=$?
set -e
end=$(date +%s)

done_line="$(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$log" | tail -n 1 || true)"
if [ "$status" != 0 ] || [ -z "$done_line" ]; then
  echo "FAIL: $crate $target exited with status $status; libFuzzer's last words:" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
executions="$(sed -E 's/^Done ([0-9]+) runs.*/\1/' <<<"$done_line")"
echo "target: $target ($crate), sanitizer $sanitizer, commit $(git rev-parse --short HEAD)"
echo "asked: $runs executions"
echo "libFuzzer: $done_line"
grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 | sed 's/^/libFuzzer: /'
grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' "$log" | sed 's/^/libFuzzer: /'
echo "wall clock: $((end - start)) s (build included)"
echo "executions: $executions"
