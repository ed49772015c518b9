// A loop device over a scratch file, for tests of block device LUNs (root
// and util-linux's losetup, as CI has). Tests take it in with `#[path]` or
// `include!` (no inner attributes here, so both work), and use what they
// need of it.

use std::path::{Path, PathBuf};

/// A loop device over a scratch file, detached when dropped.
pub struct LoopDevice(pub PathBuf);

impl LoopDevice {
    /// Needs root and util-linux's losetup (as CI runs): without them the
    /// test fails, saying so.
    pub fn over(file: &Path) -> LoopDevice {
        LoopDevice::with_sector_size(file, 512)
    }

    /// [`LoopDevice::over`] with logical blocks of `bytes` (`losetup -b`):
    /// 4096 makes a 4Kn disk.
    pub fn with_sector_size(file: &Path, bytes: u32) -> LoopDevice {
        let out = std::process::Command::new("losetup")
            .args(["-f", "--show", "-b", &bytes.to_string()])
            .arg(file)
            .output()
            .expect("losetup (util-linux) runs");
        assert!(
            out.status.success(),
            "losetup -f --show failed (this test needs root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        LoopDevice(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    }

    /// `losetup -c`: the device takes its file's new size.
    #[allow(dead_code)]
    pub fn refresh(&self) {
        let ok = std::process::Command::new("losetup")
            .arg("-c")
            .arg(&self.0)
            .status()
            .expect("losetup runs")
            .success();
        assert!(ok, "losetup -c {}", self.0.display());
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .arg("-d")
            .arg(&self.0)
            .status();
    }
}
