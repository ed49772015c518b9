//! Service manager readiness notifications (systemd's `Type=notify`): the
//! daemon tells the manager READY=1 once its portals accept connections,
//! RELOADING=1 / READY=1 around a SIGHUP, and STOPPING=1 when it begins
//! shutting down.
//!
//! The protocol is one datagram of newline-separated `KEY=VALUE` lines
//! sent to the Unix datagram socket named by `$NOTIFY_SOCKET`: a path, or
//! an abstract socket when the name starts with `@` (Linux). Without the
//! variable (not started by a service manager) nothing is sent. A failed
//! send is logged and otherwise ignored: a target that serves is more
//! useful than one that exits because its manager went away.

use std::os::unix::net::UnixDatagram;

use tracing::{debug, warn};

/// Where notifications go, taken from `$NOTIFY_SOCKET` once at start.
#[derive(Debug)]
pub struct Notifier {
    socket: Option<String>,
}

impl Notifier {
    /// The manager named by `$NOTIFY_SOCKET`, if any.
    pub fn from_env() -> Notifier {
        Notifier {
            socket: std::env::var("NOTIFY_SOCKET")
                .ok()
                .filter(|s| !s.is_empty()),
        }
    }

    /// Sends `state` (e.g. "READY=1\nSTATUS=serving"); nothing without a
    /// manager.
    pub fn notify(&self, state: &str) {
        let Some(name) = &self.socket else {
            return;
        };
        match send(name, state) {
            Ok(()) => debug!(socket = %name, state, "service manager notified"),
            Err(e) => warn!(
                socket = %name,
                state,
                error = %e,
                "could not notify the service manager through NOTIFY_SOCKET"
            ),
        }
    }
}

fn send(name: &str, state: &str) -> std::io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    if let Some(abstract_name) = name.strip_prefix('@') {
        #[cfg(target_os = "linux")]
        {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name)?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
            return Ok(());
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = abstract_name;
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "abstract NOTIFY_SOCKET names exist on Linux only",
            ));
        }
    }
    sock.send_to(state.as_bytes(), name)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_socket_receives_the_state_as_one_datagram() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        let n = Notifier {
            socket: Some(path.to_str().unwrap().to_owned()),
        };
        n.notify("READY=1\nSTATUS=serving");
        let mut buf = [0u8; 256];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=serving");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn an_at_sign_names_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("blockwire-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        let n = Notifier {
            socket: Some(format!("@{name}")),
        };
        n.notify("STOPPING=1");
        let mut buf = [0u8; 64];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"STOPPING=1");
    }
}
