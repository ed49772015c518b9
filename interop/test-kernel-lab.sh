#!/usr/bin/env bash
# interop/test-kernel-lab.sh — blockwire against the real Linux kernel (../shared/kernel-lab/).
#
# Boots Debian's 6.12 kernel under QEMU (this machine's root shared read-only) once per guest
# suite and runs it there against the release blockwire binaries of this checkout:
#   interop/kernel/guest-initiator.sh   open-iscsi's kernel initiator: discovery and login
#                                       (None, CHAP, mutual CHAP, wrong secrets, ACL), digests,
#                                       fio crc32c verify on RAM / cached / direct LUNs, ext4 and
#                                       xfs with fstrim and fsck, fence_scsi's PR steps from two
#                                       I_T nexuses, target restarts (SIGTERM, kill -9) under fio
#   interop/kernel/guest-eh.sh          the SCSI error handler against a stalled LUN
#   interop/kernel/guest-multipath.sh   dm-multipath with ALUA over two portal groups
#   interop/kernel/guest-ublk.sh        `blockwire ublk`: a LUN as /dev/ublkbN
#   interop/kernel/guest-kscsi.sh       the blockwire_scsi kernel driver (initiator/kmod, built
#                                       here against the lab kernel's headers, warnings as
#                                       errors) with `blockwire attach`: LUNs as /dev/sdX
#   interop/kernel/guest-mgmt.sh        live changes (control socket, SIGHUP, config.save) under
#                                       the kernel initiator's fio verify; Prometheus histograms
#   interop/kernel/guest-rdma.sh        the verbs backend on Soft-RoCE (rdma_rxe): the RDMA
#                                       conformance suite through libibverbs and librdmacm,
#                                       then RDMA-assisted iSCSI on verbs end to end,
#                                       Linux's iSER initiator against blockwire's iSER target,
#                                       and blockwire's iSER initiator against blockwire's
#                                       and LIO's (ib_isert) iSER targets
#   interop/kernel/guest-atomic.sh      SBC-4 atomic writes: sd's atomic_write_max_bytes from the
#                                       Block Limits page, pwritev2(RWF_ATOMIC) through /dev/sdX
#                                       as WRITE ATOMIC(16), and a torn-write test (SIGKILL of the
#                                       target during a stream of 16 KiB atomic writes, restarted
#                                       on the same file: every unit wholly old or wholly new)
#   interop/kernel/guest-offload.sh    copy offload from the kernel initiator's /dev/sdX: the
#                                       Third-party Copy page through sg_vpd, POPULATE TOKEN and
#                                       WRITE USING TOKEN (ODX) sent exactly by sg_raw and by
#                                       sg3_utils' ddpt --odx and ddptctl, the block device zero
#                                       token, forged and deleted tokens refused, EXTENDED COPY
#   interop/kernel/guest-thin.sh        thin provisioning with a soft threshold: a sparse file LUN
#                                       on a small tmpfs; sg_vpd, sg_logs and sg_modes read the
#                                       provisioning pages; sd logs the soft threshold once and
#                                       sends its uevent; a full file system fails the write that
#                                       finds no space (DATA PROTECT) and nothing written before
#   interop/kernel/guest-pi.sh          T10 protection information (Type 1) on a file LUN: sd and
#                                       sg3_utils see it; fio verify through the target's checks;
#                                       READ/WRITE with RDPROTECT/WRPROTECT by sg_raw, guards
#                                       checked against python3's CRC; a byte changed in the
#                                       backing file fails its READ (guard check) across a restart
#   interop/kernel/guest-ocfs2.sh       two guests on one private link: an OCFS2 cluster (o2cb,
#                                       disk heartbeat) of two kernel nodes on one blockwire LUN
#                                       served by node1; shared writes, a target restart under
#                                       load, fsck, identity, fence_scsi's PREEMPT AND ABORT
#
# Needs root and the lab (`../shared/kernel-lab/setup.sh`, which .ci/run runs). Without the lab
# this test FAILS: it never passes without having booted the kernel.
#   KL_SUITES="initiator eh ..."   run only these suites (default: all)
#   KL_FIO_MIB=N                   fio size per LUN kind (default 256)
#   KL_LINK_PORT=N                 host port of the ocfs2 suite's private link (default 41016)
#   KL_SILENCE=S                   a one-guest suite's guest that prints nothing for S seconds
#                                  is frozen and stopped (default 420; see silence_guard)
# Each suite's logs (the guest's output, daemon logs, fio logs, dmesg) land in
# build/kernel-lab/SUITE/, with console.log: the guest kernel's console (warnings and worse),
# sent by netconsole over a user-mode NIC that has no address or route for anything else, so a
# guest whose kernel panics leaves its last words (interop/kernel/lib.sh). A guest that dies
# mid-suite (exit 255, no summary), or freezes (no line at all for KL_SILENCE seconds, its stall
# watchdog's included: see silence_guard), has them printed and is booted once more; its first
# run's logs stay in build/kernel-lab/SUITE.died. A guest script that prints no line for 240 s
# prints, as `watch| ` lines, every process's state and the kernel stacks of its own
# (interop/kernel/lib.sh), so that a suite stopped by the timeout shows where it waited.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
lab=${KLAB_SHARED:-$repo/../shared}/kernel-lab
build=${CARGO_TARGET_DIR:-$repo/build}
export PATH=/opt/kernel-lab/venv/bin:$PATH

step() { printf '==== %s\n' "$*"; }

if [ ! -x "$lab/run.sh" ] || [ ! -e /opt/kernel-lab/current ]; then
    echo "FAIL: the kernel lab is not set up ($lab/run.sh, /opt/kernel-lab/current):"
    echo "      run $lab/setup.sh as root first (.ci/run does)"
    exit 1
fi

step "release binaries: blockwire-target, blockwire (with the ublk front end and verbs), rdma_conformance and rdma_assisted_check (verbs)"
(cd "$repo" && scripts/build-release-daemons.sh -q &&
    cargo build -q --release -p blockwire-transport --features verbs --example rdma_conformance \
        --example reg_fig8 &&
    cargo build -q --release -p blockwire-tests --features blockwire-transport/verbs \
        --example rdma_assisted_check --example iser_check)

step "kernel module: blockwire_scsi.ko against the lab kernel's headers (-Werror, W=1)"
"$repo/initiator/kmod/build.sh" "$build/kmod" || { echo "FAIL: blockwire_scsi.ko does not build"; exit 1; }

# kernel_console DIR: the host's end of one guest's kernel console (netconsole, see
# interop/kernel/lib.sh): a listener appending to DIR/console.log, bounded by the guest's own
# timeout. Sets KC_PORT (for the guest's KL_CONSOLE_PORT) and KC_PID; console_stop ends it.
KC_PIDS=()
trap 'kill "${KC_PIDS[@]}" 2>/dev/null || true' EXIT
kernel_console() {
    local dir=$1
    mkdir -p "$dir"
    python3 "$here/kernel/console_listener.py" "$dir/console.log" $((${KL_TIMEOUT:-1500} + 120)) \
        >"$dir/console.port" &
    KC_PID=$!
    KC_PIDS+=("$KC_PID")
    if ! timeout 10 bash -c 'until [ -s "$1" ]; do sleep 0.1; done' _ "$dir/console.port"; then
        echo "FAIL: the kernel console listener for $dir did not start"
        return 1
    fi
    KC_PORT=$(head -n 1 "$dir/console.port")
}
console_stop() {
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}
# console_tail DIR [FROM] [LAST]: what the guest's kernel said on its console (warnings and
# worse): from the first oops, BUG, lockup, hung task or panic on (FROM lines, 70), else its
# last LAST lines (40).
console_tail() {
    local log=$1/console.log from=${2:-70} last=${3:-40} first
    [ -s "$log" ] || { echo "    the guest's kernel console ($log) is empty"; return 0; }
    first=$(grep -n -m 1 -E 'Kernel panic|BUG:|Oops|general protection|watchdog: BUG|INFO: task|WARNING:' \
        "$log" | cut -d: -f1) || true
    if [ -n "$first" ]; then
        echo "    the guest's kernel console ($log) from line $first:"
        tail -n "+$first" "$log" | head -n "$from" | sed 's/^/      /'
    else
        echo "    last kernel console lines of the guest ($log):"
        tail -n "$last" "$log" | sed 's/^/      /'
    fi
}

# silence_guard DIR PIDFILE: stops a frozen guest. A living guest never stays quiet for long:
# its script prints a line per step, and its stall watchdog (interop/kernel/lib.sh) prints
# `watch| ` lines after 240 s without one. A guest whose DIR/guest.log gains no line for
# KL_SILENCE seconds (420) therefore has stopped as a whole (its kernel or its QEMU no longer
# runs the script or the watchdog), and waiting out the suite's --timeout (1500 s) would only
# delay the verdict. The guard writes DIR/froze and signals the process group of the guest's
# `timeout` (PIDFILE, which run.sh execs into): TERM, then KILL after 10 s, since a QEMU that
# does not run does not handle TERM either.
silence_guard() {
    local dir=$1 pidfile=$2 bound=${KL_SILENCE:-420} pid= quiet
    while sleep 5; do
        [ -n "$pid" ] || pid=$(cat "$pidfile" 2>/dev/null) || continue
        [ -n "$pid" ] || continue
        kill -0 "$pid" 2>/dev/null || return 0
        quiet=$(($(date +%s) - $(stat -c %Y "$dir/guest.log" 2>/dev/null || date +%s)))
        [ "$quiet" -ge "$bound" ] || continue
        echo "$quiet" >"$dir/froze"
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            kill -0 "$pid" 2>/dev/null || return 0
            sleep 1
        done
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
        return 0
    done
}

# run_ocfs2 OUT: the two-guest suite. node1 (target and cluster node 1) listens on the private
# link, node2 connects to it; they meet through OUT/sync. Each guest prints its own summary
# line; the suite's line adds them up, so a guest that died early (no summary) fails the suite.
run_ocfs2() {
    local out=$1 port=${KL_LINK_PORT:-41016} rc1=0 rc2=0 pid1 n p f
    mkdir -p "$out/node1" "$out/node2" "$out/sync"
    if ss -Htln "sport = :$port" | grep -q .; then
        echo "FAIL: host port $port (the private link) is taken; set KL_LINK_PORT"
        return 1
    fi
    kernel_console "$out/node1" || return 1
    local kc1=$KC_PID
    KLAB_CWD=$repo "$lab/run.sh" --cpus 1 --mem 1G --link "listen:$port" --net --rw "$out" \
        --timeout "${KL_TIMEOUT:-1500}" -- \
        env KL_OUT="$out/node1" KL_SYNC="$out/sync" BLOCKWIRE_BUILD="$build" KL_CONSOLE_PORT="$KC_PORT" \
        "$here/kernel/guest-ocfs2.sh" node1 >"$out/node1.log" 2>&1 &
    pid1=$!
    # node2's QEMU connects to the socket node1's QEMU listens on.
    if ! timeout 60 bash -c 'until ss -Htln "sport = :$1" | grep -q .; do
            kill -0 "$2" 2>/dev/null || exit 1; sleep 0.5; done' _ "$port" "$pid1"; then
        echo "FAIL: node1's guest never listened on 127.0.0.1:$port"
        kill "$pid1" 2>/dev/null
        wait "$pid1" 2>/dev/null
        cat "$out/node1.log"
        return 1
    fi
    kernel_console "$out/node2" || return 1
    local kc2=$KC_PID
    KLAB_CWD=$repo "$lab/run.sh" --cpus 1 --mem 1G --link "connect:$port" --net --rw "$out" \
        --timeout "${KL_TIMEOUT:-1500}" -- \
        env KL_OUT="$out/node2" KL_SYNC="$out/sync" BLOCKWIRE_BUILD="$build" KL_CONSOLE_PORT="$KC_PORT" \
        "$here/kernel/guest-ocfs2.sh" node2 2>&1 | tee "$out/node2.log" | sed -u 's/^/node2| /' || rc2=$?
    # node1's guest is bounded by its own --timeout.
    wait "$pid1" || rc1=$?
    console_stop "$kc1"
    console_stop "$kc2"
    sed 's/^/node1| /' "$out/node1.log"
    n=0 f=0
    for p in node1 node2; do
        line=$(grep -E "^==== ocfs2 $p: [0-9]+ passed, [0-9]+ failed" "$out/$p.log" 2>/dev/null) || true
        if [ -z "$line" ]; then
            echo "FAIL: ocfs2 $p printed no summary (guest exit $([ $p = node1 ] && echo $rc1 || echo $rc2))"
            f=$((f + 1))
            continue
        fi
        set -- $line
        n=$((n + $4)) f=$((f + $6))
    done
    echo "==== ocfs2: $n passed, $f failed (guests exit $rc1, $rc2)"
    [ "$rc1" = 0 ] && [ "$rc2" = 0 ]
}

suites=${KL_SUITES:-initiator eh multipath ublk kscsi mgmt rdma ocfs2 atomic offload thin pi}
failed=() died=()
for s in $suites; do
    out=$build/kernel-lab/$s
    rm -rf "$out" "$out.died"
    mkdir -p "$out"
    step "guest suite $s (logs in $out)"
    rc=0
    if [ "$s" = ocfs2 ]; then
        run_ocfs2 "$out" 2>&1 | tee "$out/guest.log" || rc=$?
    else
        run_guest() {
            local guard
            rc=0
            rm -f "$out/froze" "$out/guest.pid"
            kernel_console "$out" || { rc=1; return; }
            : >"$out/guest.log"
            silence_guard "$out" "$out/guest.pid" &
            guard=$!
            # The wrapper leaves the PID that run.sh execs into `timeout` for the guard.
            KLAB_CWD=$repo bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$out/guest.pid" \
                "$lab/run.sh" --cpus 2 --mem 4G --net --rw "$out" --timeout "${KL_TIMEOUT:-1500}" -- \
                env KL_OUT="$out" KL_FIO_MIB="${KL_FIO_MIB:-256}" BLOCKWIRE_BUILD="$build" \
                KL_CONSOLE_PORT="$KC_PORT" "$here/kernel/guest-$s.sh" 2>&1 | tee -a "$out/guest.log" || rc=$?
            kill "$guard" 2>/dev/null || true
            wait "$guard" 2>/dev/null || true
            console_stop "$KC_PID"
            if [ -e "$out/froze" ]; then
                echo "kernel-lab: the guest for suite $s printed nothing for $(cat "$out/froze") s" \
                    "(KL_SILENCE ${KL_SILENCE:-420}): stopped"
            fi
        }
        run_guest
        # A guest that printed nothing at all never reached the suite's script (virtme-ng
        # exits 255 when the guest does not come up): that is the lab failing to boot, not a
        # test result, so it gets one more boot. Any output means the suite ran, and its
        # verdict stands, with one exception: a guest that vanished mid-suite (exit 255, no
        # summary line: its kernel panicked or QEMU ended) or froze (see silence_guard) before
        # its summary line gets one more boot, after its
        # kernel's last console lines are printed here and its logs moved to $out.died. A
        # second death, like any failure of the second run, fails the suite.
        if [ "$rc" != 0 ] && ! [ -s "$out/guest.log" ]; then
            echo "kernel-lab: the guest for suite $s printed nothing (exit $rc): booting it once more"
            run_guest
        elif { [ "$rc" = 255 ] || { [ -e "$out/froze" ] && ! grep -q '^watch|' "$out/guest.log"; }; } &&
            ! grep -q "^==== $s: [0-9]* passed" "$out/guest.log"; then
            # A guest stopped for silence whose stall watchdog never spoke froze as a whole,
            # like one whose kernel panicked; one whose watchdog spoke was stuck in a step of
            # the suite, and its failure stands (its watch| lines say where it waited).
            if [ "$rc" = 255 ]; then
                echo "kernel-lab: the guest for suite $s DIED mid-suite (exit 255, no summary line)"
            else
                echo "kernel-lab: the guest for suite $s FROZE (no line, not even from its stall watchdog)"
            fi
            console_tail "$out"
            mv "$out" "$out.died"
            mkdir -p "$out"
            died+=("$s")
            echo "kernel-lab: its logs are in $out.died; booting suite $s once more"
            run_guest
        fi
    fi
    # The guest's own summary line is the verdict: a guest that died early printed none.
    if [ "$rc" != 0 ] || ! grep -q "^==== $s: [0-9]* passed, 0 failed" "$out/guest.log"; then
        echo "FAIL: kernel-lab suite $s (exit $rc)"
        grep -E '^(node[12]\| )?FAIL' "$out/guest.log" | sed 's/^/    /' || true
        # A guest that died mid-suite printed no verdict: its last kernel messages may say why.
        for d in "$out"/dmesg.log "$out"/*/dmesg.log; do
            [ -s "$d" ] || continue
            echo "    last kernel messages of the guest ($d):"
            tail -n 25 "$d" | sed 's/^/      /'
        done
        # A guest that died: the kernel's own last words, sent by netconsole from the panic.
        if [ "$rc" = 255 ] || [ "$s" = ocfs2 ]; then
            for d in "$out" "$out"/node1 "$out"/node2; do
                [ -e "$d/console.port" ] && console_tail "$d"
            done
        fi
        failed+=("$s")
    fi
done
if [ ${#died[@]} -gt 0 ]; then
    echo "NOTE: kernel-lab guests that died or froze mid-suite and were booted once more: ${died[*]} (first run's logs in $build/kernel-lab/SUITE.died)"
fi
if [ ${#failed[@]} -gt 0 ]; then
    # A CI log is often read from its end: each failed suite once more, in a few lines (its
    # FAIL lines, and for a guest that vanished the first lines of its kernel's last words),
    # with what the guests ran on.
    echo "==== summary of the failed kernel-lab suites (full logs above and in $build/kernel-lab/)"
    echo "    lab kernel $(readlink /opt/kernel-lab/current); $(qemu-system-x86_64 --version | head -n 1);" \
        "host $(uname -r), $(grep -m 1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs"
    # A guest that vanished may have been QEMU killed on the host (its memory is the largest).
    echo "    host memory now: $(free -m | awk '/^Mem:/ {print $3 " MiB used, " $7 " MiB available of " $2}')"
    dmesg 2>/dev/null | grep -iE 'out of memory|oom-kill|killed process' | tail -n 3 | sed 's/^/    host kernel: /' || true
    for s in "${failed[@]}"; do
        echo "  $s:"
        grep -E '^(node[12]\| )?FAIL' "$build/kernel-lab/$s/guest.log" 2>/dev/null | head -n 8 | sed 's/^/    /' || true
        for d in "$build/kernel-lab/$s" "$build/kernel-lab/$s.died"; do
            if [ -s "$d/console.log" ]; then console_tail "$d" 12 6; fi
        done
    done
    echo "FAIL: kernel-lab suites: ${failed[*]}"
    exit 1
fi
echo "PASS: kernel-lab suites: $suites"
