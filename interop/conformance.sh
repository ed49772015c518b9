#!/bin/bash
# interop/conformance.sh — libiscsi's whole conformance family (iscsi-test-cu -t ALL.SUITE,
# suite by suite, writes allowed with -d) against blockwire-target AND against tgtd, and a
# table of every test's result on both.
#
# Not run by CI (a few minutes). Writes:
#   interop/results/conformance.md          one row per test: blockwire | tgtd, then totals
#   interop/results/conformance-raw/        per-suite iscsi-test-cu output of both runs and the
#                                           full -V reruns (not committed: .gitignore)
#   interop/results/verbose-blockwire/      excerpts of -V reruns (every CDB and its answer)
#                                           of each test that did not pass or skip on
#                                           blockwire: 25 lines before each failure
# and prints the totals. conformance.md is rewritten from scratch, so afterwards run
# conformance-variants.sh, then `conformance-lio.sh --merge-only` to bring back LIO's column
# (LIO runs in the kernel lab; its per-test results are kept in results/conformance-lio.res).
#
# Both targets get a 1 GiB LUN: blockwire a RAM LUN 0, tgtd a file LUN 1 in /dev/shm (tgtd's
# LUN 0 is its controller; it has no RAM store). ACLs allow both iscsi-test-cu initiator names
# (the reservation tests log in with both). One iscsi-test-cu process per suite under
# `timeout` so a hang costs one suite; if a daemon dies, the suite is marked and the daemon
# restarted for the next suite.
#
# Env: SUITES="Read10 Inquiry" limits the run; SUITE_TIMEOUT (default 180 s).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/blockwire.sh"
. "$here/lib/testcu.sh"

IQN_BW=iqn.2026-11.io.blockwire:conformance
IQN_TGT=iqn.2026-11.io.tgtd:conformance
SIZE_MIB=1024
SECS=${SUITE_TIMEOUT:-180}
out=$here/results
raw=$out/conformance-raw
verbose=$out/verbose-blockwire

tmp=$(mktemp -d /dev/shm/bw-conformance.XXXXXX)
bw_pid="" tgt_pid="" tgt_port=""
cleanup() {
    if [ -n "$bw_pid" ]; then stop_blockwire "$bw_pid" 2>/dev/null || true; fi
    stop_tgtd "$tgt_port" "$tgt_pid"
    rm -rf "$tmp"
}
trap cleanup EXIT

suites=${SUITES:-$(testcu_suites ALL)}
rm -rf "$raw" "$verbose"
mkdir -p "$raw/blockwire" "$raw/tgtd" "$verbose"

# --- blockwire
bw_port=$(free_port)
blockwire_config_file "$tmp/target.toml" "$IQN_BW" "${SIZE_MIB}M" \
    "$LIBISCSI_TEST_INITIATOR" "$LIBISCSI_TEST_INITIATOR2"
bw_pid=$(start_blockwire "$bw_port" "$tmp" "$tmp/target.toml")
BW_URL="iscsi://127.0.0.1:$bw_port/$IQN_BW/0"
echo "== blockwire: $BW_URL"
t0=$SECONDS
for s in $suites; do
    testcu_run "$BW_URL" "ALL.$s" "$raw/blockwire" "$SECS" | awk '{ printf "  %-60s %s\n", $1, $2 }'
    if ! kill -0 "$bw_pid" 2>/dev/null; then
        echo "  !! blockwire-target died during ALL.$s; restarting it" | tee -a "$raw/blockwire/DIED"
        tail -n 40 "$tmp/blockwire-$bw_port.log" >"$raw/blockwire/died-during-$s.log" || true
        bw_pid=$(start_blockwire "$bw_port" "$tmp" "$tmp/target.toml")
    fi
done
bw_secs=$((SECONDS - t0))
cp "$tmp/blockwire-$bw_port.log" "$raw/blockwire/daemon.log" 2>/dev/null || true
# -V reruns of the tests that did not pass or skip, for the findings.
cat "$raw/blockwire"/*.res | awk '$2 != "PASSED" && $2 != "SKIPPED" { print $1 }' |
    while read -r t; do
        testcu_verbose "$BW_URL" "$t" "$raw/verbose-$t.log" 60
        grep -n -B25 -A3 -E '\[FAILED\]|^FAILED|TIMEOUT' "$raw/verbose-$t.log" >"$verbose/$t.log" || true
        kill -0 "$bw_pid" 2>/dev/null ||
            bw_pid=$(start_blockwire "$bw_port" "$tmp" "$tmp/target.toml")
    done
stop_blockwire "$bw_pid" 2>/dev/null || true
bw_pid=""

# --- tgtd
tgt_port=$(free_port)
tgt_pid=$(start_tgtd "$tgt_port" "$tmp")
tgtd_new_target "$tgt_port" 1 "$IQN_TGT"
tgtd_add_lun "$tgt_port" 1 1 "$tmp/tgtd-lun.img" "$SIZE_MIB"
TGT_URL="iscsi://127.0.0.1:$tgt_port/$IQN_TGT/1"
echo "== tgtd: $TGT_URL"
t0=$SECONDS
for s in $suites; do
    testcu_run "$TGT_URL" "ALL.$s" "$raw/tgtd" "$SECS" | awk '{ printf "  %-60s %s\n", $1, $2 }'
    if ! kill -0 "$tgt_pid" 2>/dev/null; then
        echo "  !! tgtd died during ALL.$s; restarting it" | tee -a "$raw/tgtd/DIED"
        stop_tgtd "$tgt_port" "$tgt_pid"
        tgt_pid=$(start_tgtd "$tgt_port" "$tmp")
        tgtd_new_target "$tgt_port" 1 "$IQN_TGT"
        tgtd_add_lun "$tgt_port" 1 1 "$tmp/tgtd-lun.img" "$SIZE_MIB"
    fi
done
tgt_secs=$((SECONDS - t0))
stop_tgtd "$tgt_port" "$tgt_pid"
tgt_pid=""

# --- the table
python3 - "$raw" "$out/conformance.md" "$bw_secs" "$tgt_secs" "$suites" <<'EOF'
import collections, glob, os, subprocess, sys
raw, md, bw_secs, tgt_secs, suites = sys.argv[1:6]
suites = suites.split()

def load(who):
    res = {}
    for s in suites:
        try:
            for line in open(os.path.join(raw, who, s + ".res")):
                parts = line.rstrip("\n").split(" ", 2)
                if len(parts) >= 2:
                    res[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
        except FileNotFoundError:
            pass
    return res

bw, tg = load("blockwire"), load("tgtd")
tests = []
for s in suites:
    for t in (bw.keys() | tg.keys()):
        pass
seen = set()
for s in suites:
    for src in (bw, tg):
        for t in src:
            if t.startswith(f"ALL.{s}.") and t not in seen:
                seen.add(t)
                tests.append(t)
version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "libiscsi-bin"],
                         capture_output=True, text=True).stdout
tgt_version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "tgt"],
                             capture_output=True, text=True).stdout
kinds = ["PASSED", "FAILED", "SKIPPED", "ABORTED", "NOTRUN"]
tot = {w: collections.Counter() for w in ("bw", "tg")}
rows = []
for t in tests:
    b = bw.get(t, ("-", ""))
    g = tg.get(t, ("-", ""))
    tot["bw"][b[0]] += 1
    tot["tg"][g[0]] += 1
    note = ""
    if b[0] not in ("PASSED", "SKIPPED"):
        note = b[1]
    elif b[0] == "SKIPPED" and g[0] != "SKIPPED":
        note = b[1]
    note = note.replace("|", "\\|")
    rows.append(f"| {t[4:]} | {b[0]} | {g[0]} | {note} |")
with open(md, "w") as f:
    f.write("# libiscsi conformance: blockwire vs tgtd\n\n")
    f.write(f"Generated by `interop/conformance.sh`: `iscsi-test-cu -d -t ALL.SUITE` (libiscsi-bin "
            f"{version}), one process per suite, against blockwire-target (1 GiB RAM LUN 0) and "
            f"tgtd {tgt_version} (1 GiB file LUN 1 in /dev/shm) on this machine. "
            "SKIPPED is counted from libiscsi's `[SKIPPED]` lines (CUnit itself counts skips as "
            "passes). ABORTED = no verdict (hang/crash/timeout), NOTRUN = never started. "
            "Notes quote blockwire's first failure message; -V logs of blockwire's failing "
            "tests are in `verbose-blockwire/`. No second URL is given, so MultipathIO tests "
            "mostly skip; SANITIZE tests skip without -S.\n\n")
    f.write("| test | blockwire | tgtd | blockwire note |\n|---|---|---|---|\n")
    f.write("\n".join(rows) + "\n\n## Totals\n\n")
    f.write("| target | tests | passed | failed | skipped | aborted | not run | seconds |\n")
    f.write("|---|---|---|---|---|---|---|---|\n")
    for name, key, secs in (("blockwire", "bw", bw_secs), ("tgtd", "tg", tgt_secs)):
        c = tot[key]
        f.write(f"| {name} | {sum(c.values())} | " + " | ".join(str(c[k]) for k in kinds)
                + f" | {secs} |\n")
    diff = [t for t in tests if bw.get(t, ("-",))[0] == "FAILED" and tg.get(t, ("-",))[0] != "FAILED"]
    f.write(f"\nFailing on blockwire but not on tgtd: {len(diff)}"
            + (": " + ", ".join(t[4:] for t in diff) if diff else "") + "\n")
    better = [t for t in tests if tg.get(t, ("-",))[0] == "FAILED" and bw.get(t, ("-",))[0] == "PASSED"]
    f.write(f"\nFailing on tgtd but passing on blockwire: {len(better)}"
            + (": " + ", ".join(t[4:] for t in better) if better else "") + "\n")
for name, key in (("blockwire", "bw"), ("tgtd", "tg")):
    c = tot[key]
    print(f"{name:10s} tests {sum(c.values()):4d}  " + "  ".join(f"{k.lower()} {c[k]:3d}" for k in kinds))
EOF
echo "table: $out/conformance.md"
