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
#   interop/kernel/guest-rdma.sh        the verbs backend on Soft-RoCE (rdma_rxe): the RDMA
#                                       conformance suite through libibverbs and librdmacm,
#                                       then RDMA-assisted iSCSI on verbs end to end
#
# Needs root and the lab (`../shared/kernel-lab/setup.sh`, which .ci/run runs). Without the lab
# this test FAILS: it never passes without having booted the kernel.
#   KL_SUITES="initiator eh ..."   run only these suites (default: all)
#   KL_FIO_MIB=N                   fio size per LUN kind (default 256)
# Each suite's logs (the guest's output, daemon logs, fio logs, dmesg) land in
# build/kernel-lab/SUITE/.
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

step "release binaries: blockwire-target, blockwire (with the ublk front end), rdma_conformance and rdma_assisted_check (verbs)"
(cd "$repo" && cargo build -q --release -p blockwire-mgmt &&
    cargo build -q --release -p blockwire-initiator --features ublk &&
    cargo build -q --release -p blockwire-transport --features verbs --example rdma_conformance &&
    cargo build -q --release -p blockwire-tests --features blockwire-transport/verbs \
        --example rdma_assisted_check)

suites=${KL_SUITES:-initiator eh multipath ublk rdma}
failed=()
for s in $suites; do
    out=$build/kernel-lab/$s
    rm -rf "$out"
    mkdir -p "$out"
    step "guest suite $s (logs in $out)"
    rc=0
    KLAB_CWD=$repo "$lab/run.sh" --cpus 2 --mem 4G --rw "$out" --timeout "${KL_TIMEOUT:-1500}" -- \
        env KL_OUT="$out" KL_FIO_MIB="${KL_FIO_MIB:-256}" BLOCKWIRE_BUILD="$build" \
        "$here/kernel/guest-$s.sh" 2>&1 | tee "$out/guest.log" || rc=$?
    # The guest's own summary line is the verdict: a guest that died early printed none.
    if [ "$rc" != 0 ] || ! grep -q "^==== $s: [0-9]* passed, 0 failed" "$out/guest.log"; then
        echo "FAIL: kernel-lab suite $s (exit $rc)"
        grep '^FAIL' "$out/guest.log" | sed 's/^/    /' || true
        failed+=("$s")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "FAIL: kernel-lab suites: ${failed[*]}"
    exit 1
fi
echo "PASS: kernel-lab suites: $suites"
