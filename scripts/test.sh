#!/usr/bin/env bash
# The test command of the README: every test of the repository.
#
# Needs the Debian packages that .ci/run installs (libiscsi-bin, tgt,
# open-iscsi, tshark, ...). Starts its own servers on free 127.0.0.1 ports
# and stops them by PID.
#   FUZZ_RUNS=N   executions per fuzz target in the fuzz smoke (default 200000; 0 skips)
#   FUZZ_SECS=S   at most S seconds of fuzzing per target (default 60), so that the slow
#                 stateful targets (each input drives whole connections, some over LUN files)
#                 keep the run inside CI's 75 minutes with room to spare on a slow machine;
#                 libFuzzer's last line says how many executions were done. Long runs are for
#                 a developer's machine: cargo fuzz run <target> in the crate's fuzz directory
#   BLOCKWIRE_ALLOW_NO_IO_URING=1   only on a machine whose kernel lacks io_uring: the
#                 io_uring tests then accept the thread-pool engine (CI never sets it;
#                 without it a missing io_uring fails them)
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step and interop script says when it began (seconds since this script started), so a CI
# log shows where the time went.
step() { printf '\n==== [+%ss] %s\n' "$SECONDS" "$*"; }
# shellcheck source=scripts/lib/fuzz-flags.sh
. scripts/lib/fuzz-flags.sh

step "format"
cargo fmt --all -- --check

step "fuzz crates pin the main Cargo.lock's versions (one build of the dependencies for the fuzz smoke)"
scripts/check-fuzz-locks.py

step "every unsafe block has a SAFETY comment (clippy::undocumented_unsafe_blocks, verbs included)"
# Crate roots say #![warn(clippy::undocumented_unsafe_blocks)]; -D warnings makes it fail here.
cargo clippy --workspace --all-targets --features blockwire-transport/verbs -- \
  -A clippy::all -W clippy::undocumented_unsafe_blocks -D warnings

step "build (debug, all targets)"
cargo build --workspace --all-targets

step "RDMA verbs backend builds (no device on CI machines: its tests cover the no-device path)"
cargo build -p blockwire-transport --features verbs
cargo test -p blockwire-transport --features verbs --lib verbs

step "release build of the daemons (end-to-end and interop tests use it)"
# With the kernel lab's features, so its build finds them done.
scripts/build-release-daemons.sh

step "unit, property, golden and end-to-end tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
else
  cargo test --workspace --no-fail-fast
fi
# nextest does not run doctests.
cargo test --workspace --doc

step "interop scripts"
for t in interop/test-*.sh; do
  [ -x "$t" ] || { echo "FAIL: $t is not executable"; exit 1; }
  echo "-- [+${SECONDS}s] $t"
  # The kernel lab boots a TCG guest per suite (interop/test-kernel-lab.sh): minutes, not seconds.
  case "$t" in
    *test-kernel-lab.sh) limit=3600 ;;
    *) limit=600 ;;
  esac
  timeout "$limit" "$t"
done

# A fuzz target that fails prints what reproduces it, with the reason last, where a CI log that
# keeps only its tail still shows it: the crash input (base64; `base64 -d` it into a file and
# pass that file to `cargo fuzz run <target>`), the end of libFuzzer's report, then the panic.
fuzz_failure() {
  local fuzzdir="$1" target="$2" log="$3" input
  echo "FAIL: fuzz target $target in $fuzzdir"
  input=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
  # libFuzzer names the input relative to the fuzz directory, the working directory here.
  if [ -n "$input" ] && [ -f "$input" ]; then
    echo "crash input $fuzzdir/$input ($(stat -c %s "$input") bytes), base64:"
    base64 -w 120 "$input"
  fi
  echo "-- the end of libFuzzer's report (stack frames left out):"
  grep -v -e '^ *at ' -e '^ *[0-9]*: ' -e '^ *#[0-9]* 0x' "$log" | tail -n 12
  # A crash that is no panic (a signal, a sanitizer's report, a stack overflow, an exit) names
  # itself in these lines; a 0-byte input means it came between two runs, from a thread the
  # target left running.
  echo "-- the reason libFuzzer or the sanitizer gave, and the thread it came from:"
  grep -E -m 12 -e '==[0-9]+==ERROR' -e 'SUMMARY: ' -e 'deadly signal' -e 'overflowed its stack' \
    -e 'fatal runtime error' -e 'fuzz target exited' -e 'out-of-memory' -e '^==[0-9]+==.*(thread|T[0-9]+)' \
    -e 'Thread T[0-9]+' "$log"
  echo "-- the panic:"
  awk '/panicked at/ { on = 1; n = 0 } on && /^(stack backtrace:|note: )/ { exit } on && n++ < 20' "$log"
}

runs="${FUZZ_RUNS:-200000}"
if [ "$runs" != 0 ]; then
  secs="${FUZZ_SECS:-60}"
  step "fuzz smoke: $runs executions or $secs s per target, whichever comes first"
  if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz
  fi
  for fuzzdir in */fuzz; do
    (
      cd "$fuzzdir"
      targets=$(RUSTC_BOOTSTRAP=1 cargo fuzz list)
      [ -n "$targets" ] || { echo "FAIL: cargo fuzz list found no target in $fuzzdir"; exit 1; }
      for target in $targets; do
        # The target's own libFuzzer flags (scripts/lib/fuzz-flags.sh says which and why).
        fuzz_target_flags . "$target"
        extra=("${fuzz_flags[@]}")
        # Inputs that once failed the target, kept under regressions/ after the fix, run first
        # each time (libFuzzer executes every input of every corpus directory before it
        # mutates; new inputs go to the first, the untracked corpus/).
        corpora=()
        if [ -d "regressions/$target" ]; then
          mkdir -p "corpus/$target"
          corpora=("corpus/$target" "regressions/$target")
        fi
        echo "-- [+${SECONDS}s] $fuzzdir $target ${extra[*]}${corpora:+ (with $(find "regressions/$target" -type f | wc -l) kept inputs)}"
        log=$(mktemp)
        if RUSTC_BOOTSTRAP=1 timeout 900 cargo fuzz run "$target" "${corpora[@]}" -- -runs="$runs" -max_total_time="$secs" -max_len=4096 "${extra[@]}" >"$log" 2>&1; then
          tail -n 2 "$log"
          rm -f "$log"
        else
          fuzz_failure "$fuzzdir" "$target" "$log"
          exit 1
        fi
      done
    )
  done
  # The file-backed targets' LUN files (libFuzzer exits without unwinding,
  # so each process leaves its scratch directory for the next to sweep).
  rm -rf "${TMPDIR:-/tmp}"/blockwire-fuzz-* /dev/shm/blockwire-fuzz-*
fi

step "all tests passed"
