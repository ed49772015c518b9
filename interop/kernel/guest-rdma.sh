#!/usr/bin/env bash
# interop/kernel/guest-rdma.sh — runs INSIDE the kernel lab guest (see interop/test-kernel-lab.sh).
#
# The verbs backend on real verbs: Soft-RoCE (rdma_rxe) over a veth pair, driven through
# libibverbs and librdmacm by the same conformance suite the soft provider passes in
# `cargo test` (transport/src/rdma/conformance.rs): RDMA CM connect/accept/reject with private
# data, RDMA Write/Read with SGE lists, Send/Recv, remote access errors (forged and stale keys,
# out-of-bounds ranges, missing permission) leaving both sides' memory untouched, rkey
# invalidation and deregistration, local protection errors, and disconnect flushing receives.
# The soft provider runs the suite here too, as the baseline. Then RDMA-assisted iSCSI on
# verbs end to end (tests/examples/rdma_assisted_check.rs): a target whose offload listener
# runs on rxe0, blockwire's initiator moving 32 MiB by RDMA Read/Write and reading it back,
# both sides' counters, and plain-iSCSI fallback for an initiator asking another backend.
# Env: KL_OUT (results dir shared with the host).
. "$(dirname "$0")/lib.sh"

RUNNER=$KL_BIN/examples/rdma_conformance
ASSISTED=$KL_BIN/examples/rdma_assisted_check
ip link set lo up
[ -x "$RUNNER" ] || { fail "no $RUNNER (cargo build --release -p blockwire-transport --features verbs --example rdma_conformance)"; finish rdma; exit 1; }

if modprobe rdma_rxe; then pass "modprobe rdma_rxe"; else fail "modprobe rdma_rxe"; finish rdma; exit 1; fi
# One veth pair: rxe0 on veth0 carries both ends of every connection (rxe loops traffic
# between QPs of one device back internally).
ip link add veth0 type veth peer name veth1
ip link set veth0 up
ip link set veth1 up
ip addr add 10.77.0.1/24 dev veth0
if rdma link add rxe0 type rxe netdev veth0; then
    pass "rdma link add rxe0 (veth0, 10.77.0.1)"
else
    fail "rdma link add rxe0"
    finish rdma
    exit 1
fi
log "$(rdma link show 2>&1 | tr '\n' ' ')"
log "ibv_devices: $(ibv_devices 2>&1 | tail -n +3 | tr '\n' ' ')"
# Wait until the port is ACTIVE (GIDs appear once the netdev has its address).
timeout 20 bash -c 'until rdma link show rxe0/1 2>/dev/null | grep -q "state ACTIVE"; do sleep 0.2; done' &&
    pass "rxe0 port ACTIVE" || fail "rxe0 port not ACTIVE: $(rdma link show 2>&1 | tr '\n' ' ')"

# run_suite NAME SUMMARY-PREFIX CMD...: every PASS/FAIL line CMD prints becomes a check.
run_suite() {
    local name=$1 summary=$2
    shift 2
    local out="$KL_OUT/$name.log"
    if timeout 300 "$@" >"$out" 2>&1; then :; fi
    # Every line of the runner becomes a check of this suite.
    while IFS= read -r line; do
        case $line in
            PASS\ *) pass "${line#PASS }" ;;
            FAIL\ *) fail "${line#FAIL }" ;;
            *) log "$line" ;;
        esac
    done <"$out"
    grep -q "^$summary: [0-9]* passed, 0 failed" "$out" ||
        fail "$name did not finish cleanly: $(tail -n 3 "$out" | tr '\n' ' ')"
}

run_suite conformance-soft soft "$RUNNER" soft 127.0.0.1
run_suite conformance-verbs verbs "$RUNNER" verbs 10.77.0.1 rxe0
[ -x "$ASSISTED" ] || fail "no $ASSISTED (cargo build --release -p blockwire-tests --features blockwire-transport/verbs --example rdma_assisted_check)"
run_suite assisted-verbs "rdma-assisted verbs" "$ASSISTED" verbs 10.77.0.1 rxe0

dmesg | grep -i -E "rxe|rdma" | tail -n 20 >"$KL_OUT/dmesg-rdma.log" || true
finish rdma
