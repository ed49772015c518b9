//! Where the tests that run the real target find its binary.

use std::path::PathBuf;

/// The blockwire-target binary: `BLOCKWIRE_TARGET_BIN`, else the release
/// build, else the debug build of this workspace. Panics, naming the
/// command that builds it, when there is none.
pub fn target_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("BLOCKWIRE_TARGET_BIN") {
        return p.into();
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let build = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("build"));
    ["release", "debug"]
        .iter()
        .map(|p| build.join(p).join("blockwire-target"))
        .find(|p| p.exists())
        .expect(
            "no blockwire-target binary: run `cargo build -p blockwire-mgmt` (scripts/test.sh \
             builds the workspace first)",
        )
}
