#!/usr/bin/env python3
"""Check that each fuzz crate's Cargo.lock pins the main workspace's versions.

The fuzz crates (*/fuzz) are workspaces of their own, outside the main one, with
lock files of their own. When every package that the main workspace also uses is
locked at the main workspace's version, cargo builds those packages once for the
whole fuzz smoke instead of once per fuzz crate, and a fuzz target runs against
the same dependency code the product ships. Versions are compared within one
semver-compatible series (1.x, 0.4.x, ...): a package only a fuzz crate uses
(libfuzzer-sys, arbitrary, ...), or a series of it the main workspace does not
use (a fuzz-only dependent wanting another major version), must be pinned at one
version in every fuzz lock that has it.

Prints each package whose version differs and how to fix it; exits 1 then.
"""
import pathlib
import sys
import tomllib

root = pathlib.Path(__file__).resolve().parent.parent


def series(version: str) -> str:
    """The semver-compatible series of a version: 1.3.0 -> 1, 0.4.2 -> 0.4, 0.0.3 -> 0.0.3."""
    parts = version.split("+")[0].split("-")[0].split(".")
    for i, part in enumerate(parts):
        if part != "0":
            return ".".join(parts[: i + 1])
    return ".".join(parts)


def versions(lock: pathlib.Path) -> dict[tuple[str, str], str]:
    """(package name, series) -> the version a lock file pins for that series."""
    with lock.open("rb") as f:
        packages = tomllib.load(f).get("package", [])
    # The workspace's own crates have no source.
    return {(p["name"], series(p["version"])): p["version"] for p in packages if "source" in p}


main = versions(root / "Cargo.lock")
locks = sorted(root.glob("*/fuzz/Cargo.lock"))
# A package of the fuzz crates alone: the version the first fuzz lock that has it pins.
first: dict[tuple[str, str], tuple[str, pathlib.Path]] = {}
bad = 0
for lock in locks:
    rel = lock.relative_to(root)
    for (name, ser), pinned in sorted(versions(lock).items()):
        if (name, ser) in main:
            wanted, where = main[(name, ser)], "the main Cargo.lock"
        else:
            wanted, other = first.setdefault((name, ser), (pinned, rel))
            where = str(other)
        if wanted != pinned:
            bad += 1
            print(f"FAIL: {rel} pins {name} {pinned}; {where} pins {wanted}")
if bad:
    print(f"{bad} pin(s) differ. Fix: in that fuzz directory, "
          "`cargo update -p NAME --precise VERSION` to the version named after it.")
    sys.exit(1)
print(f"{len(locks)} fuzz lock files pin the main Cargo.lock's version of every package they "
      "share with it, and one version of each package of the fuzz crates alone")
