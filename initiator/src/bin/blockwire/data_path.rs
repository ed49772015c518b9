//! `--data-path`: how a session's READ and WRITE data move for `dd` and `bench`.
//!
//! - `tcp`: plain iSCSI, Data-In and Data-Out PDUs on the TCP connection;
//! - `rdma`: RDMA-assisted iSCSI (docs/rdma-assisted-iscsi.md): the login offers the
//!   offload key, commands and status stay on TCP, the target moves the data by RDMA
//!   Write/Read into registered buffers; without the target's grant or the RDMA device
//!   the session stays plain iSCSI, said once;
//! - `iser`: standard iSER (RFC 7145) to an iSER portal (RDMA CM): every PDU is an RDMA
//!   Send, the data moves by the target's RDMA Write/Read.
//!
//! The RDMA paths copy between the caller's bytes and a registered buffer; the library
//! ([`AssistedSession`], [`IserSession`]) reads and writes registered buffers directly.

use anyhow::{Context, Result};
use blockwire_initiator::iser::IserSession;
use blockwire_initiator::rdma::{AssistedSession, Mode, RdmaConfig};
use blockwire_initiator::{Capacity, InitiatorConfig, Session};
use blockwire_transport::rdma::any::Backend;
use clap::{Args, ValueEnum};

/// Which data path (`--data-path`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum DataPath {
    /// Plain iSCSI over TCP.
    #[default]
    Tcp,
    /// RDMA-assisted iSCSI: control on TCP, data by RDMA.
    Rdma,
    /// iSER (RFC 7145): the whole session over an RDMA connection.
    Iser,
}

/// The RDMA provider (`--rdma-backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum RdmaBackendArg {
    /// blockwire's software provider (RDMA semantics over TCP; runs anywhere).
    #[default]
    Soft,
    /// libibverbs: an RDMA NIC or Soft-RoCE (needs a blockwire built with `verbs`).
    Verbs,
}

/// The data-path options of `dd` and `bench`.
#[derive(Args, Debug, Clone, Default)]
pub struct DataPathArgs {
    /// How READ/WRITE data move: tcp (plain iSCSI), rdma (RDMA-assisted iSCSI: the
    /// target must offer it; otherwise plain iSCSI, said once) or iser (RFC 7145; needs
    /// an iSER portal, see --iser-portal).
    #[arg(long, value_enum, default_value_t = DataPath::Tcp, global = true)]
    pub data_path: DataPath,
    /// RDMA provider for rdma and iser.
    #[arg(long, value_enum, default_value_t = RdmaBackendArg::Soft, global = true)]
    pub rdma_backend: RdmaBackendArg,
    /// Verbs device (e.g. rxe0); default: the first one.
    #[arg(long, global = true)]
    pub rdma_device: Option<String>,
    /// The iSER portal, ADDR:PORT (an address of the target's RDMA device); default: the
    /// iSCSI portal's address and port.
    #[arg(long, global = true)]
    pub iser_portal: Option<String>,
}

impl DataPathArgs {
    fn rdma_config(&self) -> RdmaConfig {
        RdmaConfig {
            backend: match self.rdma_backend {
                RdmaBackendArg::Soft => Backend::Soft,
                RdmaBackendArg::Verbs => Backend::Verbs,
            },
            device: self.rdma_device.clone(),
            ..RdmaConfig::default()
        }
    }
}

/// A session whose READ and WRITE data take the chosen path.
pub enum LunSession {
    /// Plain iSCSI.
    Tcp(Session),
    /// RDMA-assisted iSCSI (plain when the target did not grant offload).
    Rdma(Box<AssistedSession>),
    /// iSER.
    Iser(IserSession),
}

impl LunSession {
    /// Logs in to `target` at `portal` (HOST[:PORT]) over `path`.
    pub async fn open(
        cfg: InitiatorConfig,
        path: &DataPathArgs,
        portal: &str,
        target: &str,
    ) -> Result<LunSession> {
        Ok(match path.data_path {
            DataPath::Tcp => LunSession::Tcp(
                Session::connect(cfg, portal, target)
                    .await
                    .with_context(|| format!("login to {target} at {portal}"))?,
            ),
            DataPath::Rdma => {
                let s = AssistedSession::connect(cfg, path.rdma_config(), portal, target)
                    .await
                    .with_context(|| format!("login to {target} at {portal}"))?;
                if s.mode().await == Mode::Plain {
                    eprintln!(
                        "blockwire: {target} did not take RDMA-assisted iSCSI \
                         (no offer from the target, or no RDMA device here): \
                         the data go over TCP"
                    );
                }
                LunSession::Rdma(Box::new(s))
            }
            DataPath::Iser => {
                let spec = path
                    .iser_portal
                    .clone()
                    .unwrap_or_else(|| blockwire_initiator::normalize_portal(portal));
                let addr = tokio::net::lookup_host(&spec)
                    .await
                    .with_context(|| format!("iSER portal {spec}"))?
                    .next()
                    .with_context(|| format!("iSER portal {spec}: no address"))?;
                LunSession::Iser(
                    IserSession::connect(cfg, path.rdma_config(), addr, target)
                        .await
                        .with_context(|| format!("iSER login to {target} at {addr}"))?,
                )
            }
        })
    }

    /// The data path in words (for the first line of `bench`).
    pub fn describe(&self) -> &'static str {
        match self {
            LunSession::Tcp(_) => "tcp",
            LunSession::Rdma(_) => "rdma-assisted",
            LunSession::Iser(_) => "iser",
        }
    }

    /// The target's name.
    pub fn target(&self) -> String {
        match self {
            LunSession::Tcp(s) => s.target().to_owned(),
            LunSession::Rdma(s) => s.session().target().to_owned(),
            LunSession::Iser(s) => s.target().to_owned(),
        }
    }

    /// READ CAPACITY.
    pub async fn read_capacity(&self, lun: u16) -> Result<Capacity> {
        Ok(match self {
            LunSession::Tcp(s) => s.read_capacity(lun).await?,
            LunSession::Rdma(s) => s.session().read_capacity(lun).await?,
            LunSession::Iser(s) => {
                let cdb = [0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];
                let mut buf = s.alloc(32)?;
                s.execute(lun, &cdb, Some(&mut buf), None).await?;
                let v = buf.to_vec();
                let last = u64::from_be_bytes(v[0..8].try_into().expect("8 bytes"));
                let block_size = u32::from_be_bytes(v[8..12].try_into().expect("4 bytes"));
                Capacity::from_answer("READ CAPACITY(16) over iSER", last, block_size)?
            }
        })
    }

    /// READ(16) of `blocks` blocks at `lba` into `buf`.
    pub async fn read(&self, lun: u16, lba: u64, blocks: u32, buf: &mut Vec<u8>) -> Result<()> {
        match self {
            LunSession::Tcp(s) => {
                s.read(lun, lba, blocks, buf).await?;
            }
            LunSession::Rdma(s) => {
                let mut r = s.alloc(buf.len())?;
                s.read(lun, lba, blocks, &mut r).await?;
                r.read_at(0, buf)?;
            }
            LunSession::Iser(s) => {
                let mut r = s.alloc(buf.len())?;
                s.read(lun, lba, blocks, &mut r).await?;
                r.read_at(0, buf)?;
            }
        }
        Ok(())
    }

    /// WRITE(16) of `buf` at `lba`.
    pub async fn write(&self, lun: u16, lba: u64, blocks: u32, buf: &[u8]) -> Result<()> {
        match self {
            LunSession::Tcp(s) => {
                s.write(lun, lba, blocks, buf).await?;
            }
            LunSession::Rdma(s) => {
                let mut w = s.alloc(buf.len())?;
                w.write_at(0, buf)?;
                s.write(lun, lba, blocks, &w).await?;
            }
            LunSession::Iser(s) => {
                let mut w = s.alloc(buf.len())?;
                w.write_at(0, buf)?;
                s.write(lun, lba, blocks, &w).await?;
            }
        }
        Ok(())
    }

    /// SYNCHRONIZE CACHE of the whole LUN.
    pub async fn synchronize_cache(&self, lun: u16) -> Result<()> {
        match self {
            LunSession::Tcp(s) => s.synchronize_cache(lun).await?,
            LunSession::Rdma(s) => s.session().synchronize_cache(lun).await?,
            LunSession::Iser(s) => {
                s.command(lun, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0]).await?;
            }
        }
        Ok(())
    }

    /// Logs out.
    pub async fn logout(self) -> Result<()> {
        match self {
            LunSession::Tcp(s) => s.logout().await?,
            LunSession::Rdma(s) => s.logout().await?,
            LunSession::Iser(s) => s.logout().await?,
        }
        Ok(())
    }
}
