//! The real `blockwire-target` binary as the child of a test: started on a
//! configuration in the test's scratch directory with stderr in a log file
//! (as a service manager runs it), killed when dropped, and its log printed
//! when the test failed.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_blockwire-target");

/// A running daemon.
pub struct DaemonProcess {
    pub child: Child,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl DaemonProcess {
    /// Starts `blockwire-target --config CONFIG ARGS...` with stderr in
    /// `dir/daemon.log`; `dir` lives as long as the daemon. The log
    /// environment variables are cleared so that only ARGS choose logging.
    pub fn spawn(
        dir: tempfile::TempDir,
        config: &Path,
        args: impl IntoIterator<Item = impl AsRef<OsStr>>,
    ) -> DaemonProcess {
        Self::spawn_env(dir, config, args, [] as [(&str, &OsStr); 0])
    }

    /// [`DaemonProcess::spawn`] with `env` added to the daemon's
    /// environment (e.g. NOTIFY_SOCKET, as a service manager sets it).
    pub fn spawn_env(
        dir: tempfile::TempDir,
        config: &Path,
        args: impl IntoIterator<Item = impl AsRef<OsStr>>,
        env: impl IntoIterator<Item = (impl AsRef<OsStr>, impl AsRef<OsStr>)>,
    ) -> DaemonProcess {
        let log = dir.path().join("daemon.log");
        let child = command(config, args)
            .envs(env)
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start blockwire-target");
        DaemonProcess {
            child,
            log,
            _dir: dir,
        }
    }

    /// Stops the daemon (SIGTERM; it must exit cleanly) and starts it
    /// again as `blockwire-target --config CONFIG ARGS...`, in the same
    /// scratch directory, its log going on in the same file.
    pub fn restart(&mut self, config: &Path, args: impl IntoIterator<Item = impl AsRef<OsStr>>) {
        self.signal("TERM");
        let status = self.wait_exit();
        assert!(
            status.success(),
            "the daemon exited with {status} at SIGTERM"
        );
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .unwrap();
        self.child = command(config, args)
            .stderr(log)
            .spawn()
            .expect("start blockwire-target again");
    }

    /// The daemon's scratch directory.
    pub fn dir(&self) -> &Path {
        self._dir.path()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log satisfies `found` (which returns what it found).
    pub fn wait_log<T>(&mut self, what: &str, found: impl Fn(&str) -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(t) = found(&self.log_text()) {
                return t;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the daemon exited ({status}) before logging {what}");
            }
            assert!(Instant::now() < deadline, "the daemon never logged {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Waits (at most 20 s) for the daemon to exit.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the daemon did not exit");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `blockwire-target --config CONFIG ARGS...` with the log environment
/// variables cleared (only ARGS choose logging) and no stdin or stdout.
fn command(config: &Path, args: impl IntoIterator<Item = impl AsRef<OsStr>>) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--config")
        .arg(config)
        .args(args)
        .env_remove("BLOCKWIRE_LOG")
        .env_remove("BLOCKWIRE_LOG_FORMAT")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    c
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- blockwire-target log ---\n{}", self.log_text());
        }
    }
}
