#!/usr/bin/env bash
# Builds blockwire_scsi.ko against the kernel lab's headers (../shared/kernel-lab/setup.sh
# --headers installs them), in OUTDIR (default: build/kmod of the repository), warnings as
# errors. Prints the module's path.
# Env: KDIR (headers; default /usr/src/linux-headers-<the lab kernel>).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-$repo/build/kmod}
if [ -z "${KDIR:-}" ]; then
    release=$(readlink /opt/kernel-lab/current 2>/dev/null) || {
        echo "build.sh: no kernel lab at /opt/kernel-lab: run ../shared/kernel-lab/setup.sh --headers" >&2
        exit 1
    }
    KDIR=/usr/src/linux-headers-$release
fi
[ -f "$KDIR/Makefile" ] || {
    echo "build.sh: no kernel headers at $KDIR: run ../shared/kernel-lab/setup.sh --headers" >&2
    exit 1
}
mkdir -p "$out"
cp "$here/blockwire_scsi.c" "$here/blockwire_scsi.h" "$here/Makefile" "$out/"
make -s -C "$KDIR" M="$out" W=1 modules >&2
echo "$out/blockwire_scsi.ko"
