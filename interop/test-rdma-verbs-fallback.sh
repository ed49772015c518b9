#!/usr/bin/env bash
# With `[fabric] rdma_backend = "verbs"` on a machine without an RDMA device
# (this kind of machine: no /dev/infiniband, no rxe/siw), blockwire-target must say
# clearly what is missing and keep serving plain iSCSI over TCP. Builds the daemon
# with the verbs feature (debug), starts it on a free port, checks the log message
# and that libiscsi logs in and reads.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
. "$here/lib/peers.sh"

tmp=$(mktemp -d)
pid=""
cleanup() {
    if [ -n "$pid" ]; then stop_pid "$pid" || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

(cd "$root" && cargo build -q -p blockwire-mgmt --features verbs)
bin="$root/build/debug/blockwire-target"
port=$(free_port)
cat >"$tmp/verbs.toml" <<TOML
[fabric]
rdma_listen = "127.0.0.1:0"
rdma_backend = "verbs"
[[portal_group]]
tag = 1
listen = ["127.0.0.1:$port"]
[[target]]
name = "iqn.2026-11.io.blockwire:verbs-fallback"
[[target.lun]]
id = 0
backstore = "ram"
size = "64M"
TOML
"$bin" --config "$tmp/verbs.toml" >"$tmp/log" 2>&1 &
pid=$!
timeout 20 bash -c "until (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; do sleep 0.1; done"

fails=0
if [ -e /dev/infiniband ]; then
    echo "FAIL this machine has /dev/infiniband: the no-device path this script checks cannot be shown here"
    fails=$((fails + 1))
else
    if grep -q "no RDMA device" "$tmp/log" && grep -q "fall back to plain TCP\|serving plain iSCSI" "$tmp/log"; then
        echo "PASS the daemon names the missing RDMA device and falls back to TCP:"
        grep "no RDMA device" "$tmp/log" | sed 's/\x1b\[[0-9;]*m//g; s/^/    /' | cut -c1-220
    else
        echo "FAIL no clear no-device message in the log:"; sed 's/^/    | /' "$tmp/log" | head -20
        fails=$((fails + 1))
    fi
fi
if out=$(timeout 20 iscsi-ls -s "iscsi://127.0.0.1:$port") && grep -q "verbs-fallback" <<<"$out"; then
    echo "PASS plain iSCSI works: $(tr '\n' ' ' <<<"$out")"
else
    echo "FAIL iscsi-ls against the fallback target"; fails=$((fails + 1))
fi
[ "$fails" = 0 ] && echo "== all passed" || { echo "== $fails FAILED"; exit 1; }
