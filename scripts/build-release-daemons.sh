#!/usr/bin/env bash
# The release daemons every test uses, built once with the features the kernel lab needs:
# blockwire-target with the RDMA verbs backend, the blockwire CLI with the ublk front end and
# verbs. scripts/test.sh and interop/test-kernel-lab.sh both call this, so the same build serves
# both. Without an RDMA device the verbs backend is never opened
# (interop/test-rdma-verbs-fallback.sh). Needs libibverbs-dev, librdmacm-dev and libclang-dev.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build "$@" --release -p blockwire-mgmt --features verbs
cargo build "$@" --release -p blockwire-initiator --features ublk,verbs
