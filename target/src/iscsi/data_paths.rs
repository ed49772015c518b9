//! Starting each LUN's data paths from what was asked for (its
//! [`DataPathPolicy`]) and what its storage can do (its backstore's
//! [`Capabilities`](crate::backstore::Capabilities)): READs through the I/O
//! engine ([`super::syncread`]), READ payloads by `sendfile(2)`
//! ([`super::sendfile`]) and double-buffered WRITEs ([`super::syncwrite`]).
//! A path the storage cannot carry is an error naming the LUN, except
//! sendfile, which only ever replaces the copy path where it can.

use std::io;

use super::catalog::DataPathPolicy;
use super::Fabric;

/// A data path that could not start.
#[derive(Debug, thiserror::Error)]
#[error("{target} LUN {lun}: {what}: {source}")]
pub struct DataPathError {
    /// The target.
    pub target: String,
    /// The LUN.
    pub lun: u16,
    /// Which path, and the fix when there is one.
    pub what: String,
    /// Why.
    #[source]
    pub source: io::Error,
}

/// One data path that started, for the start-up log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartedPath {
    /// The target.
    pub target: String,
    /// The LUN.
    pub lun: u16,
    /// What runs, e.g. "READ engine: synchronized sends, ...".
    pub line: String,
}

impl Fabric {
    /// Starts every configured LUN's data paths (see the module docs).
    pub fn start_data_paths(&self) -> Result<Vec<StartedPath>, DataPathError> {
        let mut started = Vec::new();
        for t in &self.catalog().targets {
            for &(lun, policy) in &t.data_paths {
                for line in self.start_lun_paths(&t.name, lun, &t.luns, policy)? {
                    started.push(StartedPath {
                        target: t.name.clone(),
                        lun,
                        line,
                    });
                }
            }
        }
        Ok(started)
    }

    /// Starts the data paths of one LUN (at start-up, or when the
    /// management plane adds it); returns a line per path for the log.
    pub fn start_lun_paths(
        &self,
        target: &str,
        lun: u16,
        luns: &crate::scsi::LunTable,
        policy: DataPathPolicy,
    ) -> Result<Vec<String>, DataPathError> {
        let fail = |what: &str, source: io::Error| DataPathError {
            target: target.to_owned(),
            lun,
            what: what.to_owned(),
            source,
        };
        let lu = luns.get(lun).ok_or_else(|| {
            fail(
                "data paths",
                io::Error::new(io::ErrorKind::NotFound, "no such LUN"),
            )
        })?;
        let store = &lu.config().backstore;
        let caps = store.capabilities();
        let mut lines = Vec::new();
        if let Some(mode) = policy.engine_reads {
            let what = "enabling the engine READ path";
            let (source, direct) = store
                .engine_source()
                .map_err(|e| fail(what, e))?
                .ok_or_else(|| {
                    fail(
                        what,
                        io::Error::new(
                            io::ErrorKind::Unsupported,
                            format!("the I/O engine cannot read {}", store.describe()),
                        ),
                    )
                })?;
            let line = self
                .sync_reads
                .enable_source(target, lun, source, direct, policy.chunk, mode)
                .map_err(|e| fail(what, e))?;
            lines.push(format!("READ engine: {line}"));
        }
        if policy.double_buffered_writes {
            let what = "enabling double-buffered writes (sync_write)";
            let file = caps.file.as_ref().ok_or_else(|| {
                fail(
                    what,
                    io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!("{} is not one file", store.describe()),
                    ),
                )
            })?;
            let (engine, _) = self.sync_reads.engine().map_err(|e| fail(what, e))?;
            let line = self
                .sync_writes
                .enable(engine, target, lun, &file.path, file.direct, policy.chunk)
                .map_err(|e| fail(what, e))?;
            lines.push(format!("WRITE engine: {line}"));
        }
        // sendfile needs the bytes in the page cache; an engine READ path
        // takes precedence.
        if let Some(file) = caps
            .file
            .as_ref()
            .filter(|f| policy.sendfile && !f.direct && policy.engine_reads.is_none())
        {
            let what = format!(
                "opening {} for sendfile READs (set zero_copy = false to use the copy path)",
                file.path.display()
            );
            let line = self
                .sendfile_reads
                .enable(target, lun, &file.path)
                .map_err(|e| fail(&what, e))?;
            lines.push(format!("READ engine: {line}"));
        }
        Ok(lines)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::sync::watch;

    use super::*;
    use crate::backstore::{Backstore, FileBackstore, FileMode, RamBackstore};
    use crate::datapath::Mode;
    use crate::iscsi::catalog::{Acl, AuthPolicy, Catalog, TargetEntry};
    use crate::iscsi::FabricSettings;
    use crate::scsi::{LogicalUnit, LuConfig, LunTable};

    const TARGET: &str = "iqn.2026-11.test:paths";

    fn fabric(stores: Vec<(u16, Arc<dyn Backstore>, DataPathPolicy)>) -> Arc<Fabric> {
        let luns = stores
            .iter()
            .map(|(id, store, _)| {
                (
                    *id,
                    Arc::new(LogicalUnit::new(LuConfig::new(store.clone()))),
                )
            })
            .collect();
        let catalog = Catalog {
            targets: vec![Arc::new(TargetEntry {
                name: TARGET.into(),
                alias: None,
                portal_groups: vec![1],
                acl: Acl::Any,
                auth: AuthPolicy::default(),
                luns: Arc::new(LunTable::new(luns)),
                data_paths: stores.iter().map(|(id, _, p)| (*id, *p)).collect(),
                qos: Vec::new(),
            })],
            ..Catalog::default()
        };
        let (_, shutdown) = watch::channel(false);
        Fabric::new(Arc::new(catalog), FabricSettings::default(), shutdown)
    }

    fn policy(engine_reads: Option<Mode>, sendfile: bool, writes: bool) -> DataPathPolicy {
        DataPathPolicy {
            engine_reads,
            sendfile,
            double_buffered_writes: writes,
            chunk: 64 << 10,
        }
    }

    fn file(dir: &tempfile::TempDir, name: &str) -> Arc<dyn Backstore> {
        let path = dir.path().join(name);
        Arc::new(FileBackstore::open_with(&path, Some(1 << 20), false, FileMode::Cached).unwrap())
    }

    #[test]
    fn a_cached_file_gets_sendfile_and_double_buffered_writes() {
        let dir = tempfile::tempdir().unwrap();
        let f = fabric(vec![(3, file(&dir, "a.img"), policy(None, true, true))]);
        let started = f.start_data_paths().unwrap();
        let lines: Vec<&str> = started.iter().map(|p| p.line.as_str()).collect();
        assert!(
            lines.iter().any(|l| l.starts_with("READ engine: sendfile")),
            "{lines:?}"
        );
        assert!(
            lines.iter().any(|l| l.starts_with("WRITE engine:")),
            "{lines:?}"
        );
        assert!(f.sendfile_reads.get(TARGET, 3).is_some());
        assert!(f.sync_writes.get(TARGET, 3).is_some());
        assert!(f.sync_reads.get(TARGET, 3).is_none());
    }

    #[test]
    fn engine_reads_take_precedence_over_sendfile() {
        let dir = tempfile::tempdir().unwrap();
        let f = fabric(vec![(
            0,
            file(&dir, "b.img"),
            policy(Some(Mode::Synchronized), true, false),
        )]);
        f.start_data_paths().unwrap();
        let path = f.sync_reads.get(TARGET, 0).expect("engine READ path");
        assert_eq!((path.mode, path.chunk), (Mode::Synchronized, 64 << 10));
        assert!(f.sendfile_reads.get(TARGET, 0).is_none());
    }

    #[test]
    fn storage_that_cannot_carry_a_path_is_named_in_the_error() {
        let ram: Arc<dyn Backstore> = Arc::new(RamBackstore::new(1 << 20));
        // sendfile only replaces the copy path where it can: no error.
        let f = fabric(vec![(1, ram.clone(), policy(None, true, false))]);
        assert!(f.start_data_paths().unwrap().is_empty());
        assert!(f.sendfile_reads.get(TARGET, 1).is_none());
        let f = fabric(vec![(
            1,
            ram.clone(),
            policy(Some(Mode::Serial), false, false),
        )]);
        let e = f.start_data_paths().unwrap_err();
        assert_eq!((e.target.as_str(), e.lun), (TARGET, 1));
        assert!(
            e.to_string().contains("the I/O engine cannot read ram"),
            "{e}"
        );
        let f = fabric(vec![(2, ram, policy(None, false, true))]);
        let e = f.start_data_paths().unwrap_err();
        assert!(e.to_string().contains("double-buffered writes"), "{e}");
        assert!(e.to_string().contains("is not one file"), "{e}");
    }
}
