#!/usr/bin/env bash
# Runs one fuzz target for a fixed number of executions and prints the
# number libFuzzer reports having done ("Done N runs in S second(s)").
#
#   scripts/fuzz-count.sh TARGET [RUNS]        RUNS defaults to 10000000
#
# TARGET is any target of a `*/fuzz` crate (`cargo fuzz list` there). Its own libFuzzer flags
# (fuzz_targets/TARGET.flags, if there is one) are passed as scripts/test.sh passes them.
# Environment:
#   FUZZ_JOBS=J                   J libFuzzer processes at once, RUNS split
#                                 between them (default 1); the count is the
#                                 sum of what each reports
#   FUZZ_MAX_TIME=S               stop each process after S seconds even if
#                                 its runs are not done (libFuzzer
#                                 -max_total_time; the count says how far
#                                 it got)
#   FUZZ_SANITIZER=address|none   cargo fuzz's sanitizer (default address,
#                                 as `scripts/test.sh`; none runs faster)
#   FUZZ_MAX_LEN=N                libFuzzer -max_len (default 4096)
#   FUZZ_LOGS=DIR                 keep libFuzzer's output there
# Exits non-zero when a process fails (a crash, a leak, a timeout): the
# count is then not printed, libFuzzer's report is.
set -euo pipefail

target="${1:?usage: scripts/fuzz-count.sh TARGET [RUNS]}"
runs="${2:-10000000}"
jobs="${FUZZ_JOBS:-1}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

crate=""
for manifest in */fuzz/Cargo.toml; do
  if grep -qx "name = \"$target\"" "$manifest"; then
    crate="$(dirname "$manifest")"
  fi
done
[ -n "$crate" ] || { echo "no fuzz crate has a target named $target" >&2; exit 2; }

logs="${FUZZ_LOGS:-$(mktemp -d)}"
mkdir -p "$logs"
sanitizer="${FUZZ_SANITIZER:-address}"
# The target's own libFuzzer flags, as the fuzz smoke of scripts/test.sh passes them (see
# scripts/lib/fuzz-flags.sh for which and why).
# shellcheck source=scripts/lib/fuzz-flags.sh
. scripts/lib/fuzz-flags.sh
fuzz_target_flags "$crate" "$target"
extra=("${fuzz_flags[@]}")
[ -z "${FUZZ_MAX_TIME:-}" ] || extra+=("-max_total_time=$FUZZ_MAX_TIME")

# Build once, so that the processes do not wait for each other's build.
(cd "$crate" && RUSTC_BOOTSTRAP=1 cargo fuzz build --sanitizer "$sanitizer" "$target") \
  >"$logs/build.log" 2>&1 || { tail -n 40 "$logs/build.log" >&2; exit 1; }

commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo +changes)"
start=$(date +%s)
pids=()
for ((j = 0; j < jobs; j++)); do
  share=$((runs / jobs + (j < runs % jobs ? 1 : 0)))
  (cd "$crate" && RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer "$sanitizer" "$target" -- \
    -runs="$share" -seed="$((j + 1))" -max_len="${FUZZ_MAX_LEN:-4096}" \
    -print_final_stats=1 "${extra[@]}") >"$logs/job-$j.log" 2>&1 &
  pids+=($!)
done
failed=0
for j in "${!pids[@]}"; do
  wait "${pids[$j]}" || failed=1
done
end=$(date +%s)

total=0
lines=()
for ((j = 0; j < jobs; j++)); do
  done_line="$(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$logs/job-$j.log" | tail -n 1 || true)"
  if [ -z "$done_line" ]; then
    failed=1
    echo "FAIL: $crate $target process $j; libFuzzer's last words:" >&2
    tail -n 40 "$logs/job-$j.log" >&2
    continue
  fi
  lines+=("libFuzzer process $j: $done_line")
  total=$((total + $(sed -E 's/^Done ([0-9]+) runs.*/\1/' <<<"$done_line")))
done
[ "$failed" = 0 ] || { echo "FAIL: see $logs" >&2; exit 1; }

echo "target: $target ($crate), sanitizer $sanitizer, commit $commit"
echo "asked: $runs executions in $jobs process(es)${FUZZ_MAX_TIME:+, at most $FUZZ_MAX_TIME s each}; libFuzzer flags: ${extra[*]:-none}"
printf '%s\n' "${lines[@]}"
for ((j = 0; j < jobs; j++)); do
  grep -E '^#[0-9]+[[:space:]]+DONE' "$logs/job-$j.log" | tail -n 1 | sed "s/^/libFuzzer process $j: /"
done
echo "wall clock: $((end - start)) s"
echo "executions: $total"
