//! The session `blockwire attach` runs the kernel's commands on: plain
//! iSCSI, or RDMA-assisted iSCSI (docs/rdma-assisted-iscsi.md) whose
//! commands and task management stay on the TCP connection while the data
//! move by RDMA.

use std::sync::atomic::AtomicU32;

use blockwire_initiator::kernel_host::Direction;
use blockwire_initiator::rdma::{AssistedSession, Mode};
use blockwire_initiator::{DataDir, Error, InitiatorConfig, RawCompletion, Session};

use crate::data_path::{DataPath, DataPathArgs, LunSession};

/// A logged-in session of either kind.
pub enum PassSession {
    /// Plain iSCSI: Data-In and Data-Out PDUs on the connection.
    Tcp(Session),
    /// RDMA-assisted iSCSI.
    Rdma(Box<AssistedSession>),
}

impl PassSession {
    /// Logs in over the data path `--data-path` chose (tcp or rdma).
    pub async fn open(
        cfg: InitiatorConfig,
        path: &DataPathArgs,
        portal: &str,
        target: &str,
    ) -> anyhow::Result<PassSession> {
        if path.data_path == DataPath::Iser {
            anyhow::bail!(
                "`blockwire attach` runs on plain or RDMA-assisted iSCSI sessions \
                 (--data-path tcp or rdma); iSER sessions have no task management here yet"
            );
        }
        Ok(match LunSession::open(cfg, path, portal, target).await? {
            LunSession::Tcp(s) => PassSession::Tcp(s),
            LunSession::Rdma(s) => PassSession::Rdma(s),
            LunSession::Iser(_) => anyhow::bail!("an iSER session where none was asked for"),
        })
    }

    /// The iSCSI session that carries commands and task management.
    pub fn control(&self) -> &Session {
        match self {
            PassSession::Tcp(s) => s,
            PassSession::Rdma(s) => s.session(),
        }
    }

    /// The data path in words.
    pub async fn describe(&self) -> &'static str {
        match self {
            PassSession::Tcp(_) => "tcp",
            PassSession::Rdma(s) if s.mode().await == Mode::Plain => {
                "tcp (the target did not grant RDMA-assisted iSCSI)"
            }
            PassSession::Rdma(_) => "rdma-assisted",
        }
    }

    /// Runs one of the kernel's commands. Data-Out comes from `data_out`,
    /// Data-In lands in `data_in` (both the command's length). `itt`
    /// follows the command's Initiator Task Tag where the command's task
    /// can be named for ABORT TASK (plain iSCSI, and commands without data);
    /// it stays 0 for commands whose data move by RDMA, whose abort the
    /// mid-layer then escalates to a LOGICAL UNIT RESET.
    pub async fn run(
        &self,
        lun: u16,
        cdb: &[u8],
        dir: Direction,
        data_out: &[u8],
        data_in: &mut Vec<u8>,
        itt: &AtomicU32,
    ) -> Result<RawCompletion, Error> {
        // A transfer of no bytes is a command without data on every path.
        let dir = if data_out.is_empty() && data_in.is_empty() {
            Direction::None
        } else {
            dir
        };
        match (self, dir) {
            (_, Direction::None) => {
                self.control()
                    .pass_through(lun, cdb, DataDir::None, itt)
                    .await
            }
            (PassSession::Tcp(s), Direction::ToDevice) => {
                s.pass_through(lun, cdb, DataDir::Write(data_out), itt)
                    .await
            }
            (PassSession::Tcp(s), Direction::FromDevice) => {
                s.pass_through(lun, cdb, DataDir::Read(data_in), itt).await
            }
            // As sent: the mid-layer sees every status (UNIT ATTENTION,
            // BUSY) and retries as it chooses, as on plain iSCSI.
            (PassSession::Rdma(s), Direction::ToDevice) => {
                let mut buf = s.alloc(data_out.len())?;
                buf.write_at(0, data_out)
                    .map_err(|e| Error::Protocol(format!("RDMA buffer: {e}")))?;
                s.write_cdb_as_sent(lun, cdb, std::slice::from_ref(&buf), itt)
                    .await
            }
            (PassSession::Rdma(s), Direction::FromDevice) => {
                let mut buf = s.alloc(data_in.len())?;
                let r = s
                    .read_cdb_as_sent(lun, cdb, std::slice::from_mut(&mut buf), itt)
                    .await;
                if let Ok(c) = &r {
                    let n = c.transferred.min(data_in.len());
                    buf.read_at(0, &mut data_in[..n])
                        .map_err(|e| Error::Protocol(format!("RDMA buffer: {e}")))?;
                    data_in.truncate(n);
                }
                r
            }
        }
    }

    /// Logs out.
    pub async fn logout(self) -> Result<(), Error> {
        match self {
            PassSession::Tcp(s) => s.logout().await,
            PassSession::Rdma(s) => s.logout().await,
        }
    }
}
