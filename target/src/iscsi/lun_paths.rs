//! A data path's per-LUN state, by target name and LUN number: the
//! registries of the sendfile ([`super::sendfile`]), engine READ
//! ([`super::syncread`]) and double-buffered WRITE ([`super::syncwrite`])
//! paths. LUNs are added at start-up and looked up for every command; while
//! no LUN uses a path, the lookup is one atomic load.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// One path's LUNs.
pub struct LunPaths<T> {
    luns: RwLock<HashMap<String, HashMap<u16, Arc<T>>>>,
    any: AtomicBool,
}

impl<T> Default for LunPaths<T> {
    fn default() -> Self {
        LunPaths {
            luns: RwLock::default(),
            any: AtomicBool::new(false),
        }
    }
}

impl<T> std::fmt::Debug for LunPaths<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LunPaths")
            .field("luns", &self.all().len())
            .finish()
    }
}

impl<T> LunPaths<T> {
    /// Puts `lun` of `target` on the path (replacing what it had).
    pub fn insert(&self, target: &str, lun: u16, path: T) {
        self.luns
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(target.to_owned())
            .or_default()
            .insert(lun, Arc::new(path));
        self.any.store(true, Ordering::Release);
    }

    /// The path's state for `lun` of `target`, if it is on the path.
    pub fn get(&self, target: &str, lun: u16) -> Option<Arc<T>> {
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

    /// Every LUN on the path, sorted by target name and LUN.
    pub fn all(&self) -> Vec<(String, u16, Arc<T>)> {
        let luns = self.luns.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = luns
            .iter()
            .flat_map(|(t, m)| m.iter().map(|(l, p)| (t.clone(), *l, p.clone())))
            .collect();
        out.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        out
    }
}
