//! Every LUN's data paths in one table, by target name and LUN: for each
//! LUN one record of the paths it runs besides the SCSI core's copy path
//! (engine READs, [`super::syncread`]; sendfile READ payloads,
//! [`super::sendfile`]; double-buffered WRITEs, [`super::syncwrite`]),
//! filled at start-up from what the LUN's storage can do
//! ([`super::data_paths`]) and read once per command. While no LUN has a
//! data path, a lookup is one atomic load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use super::sendfile::SendfileLun;
use super::syncread::SyncReadLun;
use super::syncwrite::SyncWriteLun;

/// The data paths of one LUN.
#[derive(Debug, Default, Clone)]
pub struct LunDataPaths {
    /// READs through the I/O engine into registered buffers.
    pub engine_reads: Option<Arc<SyncReadLun>>,
    /// READ payloads from the page cache by `sendfile(2)`.
    pub sendfile: Option<Arc<SendfileLun>>,
    /// Double-buffered WRITEs through the I/O engine.
    pub engine_writes: Option<Arc<SyncWriteLun>>,
}

/// Every LUN's data paths.
#[derive(Default)]
pub struct LunPaths {
    // Looked up for every command by target name (foldhash: a short, fast
    // hash; the keys come from the configuration, not the wire).
    luns: RwLock<foldhash::HashMap<String, foldhash::HashMap<u16, Arc<LunDataPaths>>>>,
    any: AtomicBool,
}

impl std::fmt::Debug for LunPaths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LunPaths")
            .field("luns", &self.all().len())
            .finish()
    }
}

impl LunPaths {
    /// Changes the record of `lun` of `target` (made empty if it has none).
    pub fn update(&self, target: &str, lun: u16, change: impl FnOnce(&mut LunDataPaths)) {
        let mut luns = self.luns.write().unwrap_or_else(|e| e.into_inner());
        let record = luns
            .entry(target.to_owned())
            .or_default()
            .entry(lun)
            .or_default();
        let mut next = LunDataPaths::clone(record);
        change(&mut next);
        *record = Arc::new(next);
        self.any.store(true, Ordering::Release);
    }

    /// Forgets the data paths of `lun` of `target` (the LUN was removed or
    /// replaced: a new unit under the same number must not inherit them).
    pub fn remove(&self, target: &str, lun: u16) -> Option<Arc<LunDataPaths>> {
        let mut luns = self.luns.write().unwrap_or_else(|e| e.into_inner());
        let t = luns.get_mut(target)?;
        let gone = t.remove(&lun);
        if t.is_empty() {
            luns.remove(target);
        }
        gone
    }

    /// The data paths of `lun` of `target`, if it has any.
    pub fn get(&self, target: &str, lun: u16) -> Option<Arc<LunDataPaths>> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        self.luns
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(target)?
            .get(&lun)
            .cloned()
    }

    /// Every LUN with data paths, sorted by target name and LUN.
    pub fn all(&self) -> Vec<(String, u16, Arc<LunDataPaths>)> {
        let luns = self.luns.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = luns
            .iter()
            .flat_map(|(t, m)| m.iter().map(|(l, p)| (t.clone(), *l, p.clone())))
            .collect();
        out.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        out
    }
}
