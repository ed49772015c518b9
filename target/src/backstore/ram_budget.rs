//! The memory the RAM LUNs of one process may hold together.
//!
//! A RAM store is thin: a 1 MiB chunk comes into being on the first write
//! into it. Unbounded, RAM LUNs larger than the machine's memory (or several
//! that fill up) can end with the kernel's OOM killer stopping the daemon, and
//! with it every LUN and session it serves. Bounded, a write that needs a
//! chunk past the limit fails as a thin-provisioned device out of space
//! fails (SBC-4 thin provisioning: DATA PROTECT, SPACE ALLOCATION FAILED
//! WRITE PROTECT), nothing of it lands, and the daemon goes on serving; UNMAP,
//! WRITE SAME with UNMAP, a shrink or a removed LUN gives chunks back.
//!
//! One budget serves the whole process ([`RamBudget::process`]): memory is
//! the process's, and a live change that adds a LUN must count against the
//! same limit as the LUNs already there.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// The share of the machine's memory RAM LUNs may hold unless configured:
/// three quarters, leaving the rest to the daemon's buffers, the page cache
/// of file LUNs and everything else the machine runs.
const DEFAULT_SHARE_NUM: u64 = 3;
const DEFAULT_SHARE_DEN: u64 = 4;

/// Bytes RAM stores hold, against a limit.
#[derive(Debug)]
pub struct RamBudget {
    limit: AtomicU64,
    held: AtomicU64,
}

impl RamBudget {
    /// A budget of `limit` bytes, none of it held.
    pub fn with_limit(limit: u64) -> Arc<RamBudget> {
        Arc::new(RamBudget {
            limit: AtomicU64::new(limit),
            held: AtomicU64::new(0),
        })
    }

    /// The process's budget, which every RAM store shares unless it was
    /// given another; its limit is [`default_limit`] until
    /// [`RamBudget::set_limit`] changes it.
    pub fn process() -> &'static Arc<RamBudget> {
        static PROCESS: OnceLock<Arc<RamBudget>> = OnceLock::new();
        PROCESS.get_or_init(|| RamBudget::with_limit(default_limit()))
    }

    /// Sets the limit. Chunks already held stay; new ones are refused while
    /// the held bytes are at or past it.
    pub fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// The limit, in bytes.
    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Takes `count` charges of `each` bytes at once, or none: refused (a
    /// `StorageFull` error that says how much is held and what to do) when
    /// they would take the held bytes past the limit.
    pub(super) fn charge(self: &Arc<Self>, count: u64, each: u64) -> io::Result<Charges> {
        let want = count.saturating_mul(each);
        let limit = self.limit();
        let taken = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                held.checked_add(want).filter(|&total| total <= limit)
            });
        match taken {
            Ok(_) => Ok(Charges {
                budget: self.clone(),
                each,
                left: count,
            }),
            Err(held) => Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "the RAM LUNs hold {held} bytes and this write needs {want} more, past the \
                     {limit} bytes they may hold together ([fabric] ram_limit): free blocks \
                     (UNMAP, fstrim), raise ram_limit if the machine has the memory, or put the \
                     LUN on a sparse file (backstore = \"file\")"
                ),
            )),
        }
    }

    fn give_back(&self, bytes: u64) {
        self.held.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Charges taken together and not yet given to chunks; what is left goes
/// back to the budget when they are dropped.
#[derive(Debug)]
pub(super) struct Charges {
    budget: Arc<RamBudget>,
    each: u64,
    left: u64,
}

impl Charges {
    /// One charge for one chunk, while any is left.
    pub(super) fn take(&mut self) -> Option<Charge> {
        self.left = self.left.checked_sub(1)?;
        Some(Charge {
            budget: self.budget.clone(),
            bytes: self.each,
        })
    }
}

impl Drop for Charges {
    fn drop(&mut self) {
        self.budget.give_back(self.left * self.each);
    }
}

/// The memory one chunk holds, given back when the chunk goes (freed by a
/// discard, cut off by a shrink, or dropped with its store).
#[derive(Debug)]
pub(super) struct Charge {
    budget: Arc<RamBudget>,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

/// Three quarters of the memory this process may use ([`usable_memory`]).
/// Unknown: no limit.
pub fn default_limit() -> u64 {
    usable_memory().map_or(u64::MAX, |memory| {
        memory / DEFAULT_SHARE_DEN * DEFAULT_SHARE_NUM
    })
}

/// The memory this process may use: the machine's (`MemTotal`), or the
/// lowest limit of its control group and the groups above it where that
/// is lower (a container, a systemd unit with MemoryMax=, or the slice it
/// runs in); None when neither is known.
pub fn usable_memory() -> Option<u64> {
    let machine = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| mem_total(&m));
    let group = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|c| lowest_limit(&group_limit_files(&c)));
    match (machine, group) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(u64::MAX).min(b.unwrap_or(u64::MAX))),
    }
}

/// The lowest limit the files of [`group_limit_files`] hold: a file that
/// does not exist (the root on a host) or says "max" (v2) sets none; v1
/// says a number past any machine's memory instead.
fn lowest_limit(files: &[String]) -> Option<u64> {
    files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .filter_map(|v| v.trim().parse::<u64>().ok())
        .min()
}

/// `MemTotal` of a /proc/meminfo text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line.split_whitespace().skip(1);
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

/// The files that hold the memory limits of this process's control group
/// and of every group above it, from /proc/self/cgroup, the process's own
/// first: the v1 memory controller's `memory.limit_in_bytes` where that
/// controller is mounted (an `N:memory:PATH` line), else the unified (v2)
/// hierarchy's `memory.max` (the `0::PATH` line). A group's usage counts
/// against each ancestor's limit, so the lowest of them binds. The
/// hierarchy's root has no limit file on a host; in a container with its
/// own cgroup namespace, the root seen is the container's group and its
/// file holds the container's limit.
fn group_limit_files(cgroup: &str) -> Vec<String> {
    let v1 = cgroup.lines().find_map(|l| {
        let (_, rest) = l.split_once(':')?;
        let (controllers, path) = rest.split_once(':')?;
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    });
    let (mount, path, file) = match v1 {
        Some(path) => ("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes"),
        None => match cgroup.lines().find_map(|l| l.strip_prefix("0::")) {
            Some(path) => ("/sys/fs/cgroup", path, "memory.max"),
            None => return Vec::new(),
        },
    };
    let mut files = Vec::new();
    let mut group = path.trim_end_matches('/');
    loop {
        files.push(format!("{mount}{group}/{file}"));
        match group.rsplit_once('/') {
            Some((parent, _)) => group = parent,
            None => return files,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_are_all_or_nothing_and_come_back_when_dropped() {
        let b = RamBudget::with_limit(10);
        let mut three = b.charge(3, 2).unwrap();
        assert_eq!(b.held(), 6);
        let e = b.charge(3, 2).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        assert!(e.to_string().contains("ram_limit"), "{e}");
        assert_eq!(b.held(), 6, "a refused charge takes nothing");
        let one = three.take().unwrap();
        drop(three);
        assert_eq!(b.held(), 2, "charges not given to a chunk went back");
        let mut four = b.charge(4, 2).unwrap();
        assert_eq!(b.held(), 10);
        drop(one);
        assert_eq!(b.held(), 8);
        let taken: Vec<Charge> = std::iter::from_fn(|| four.take()).collect();
        assert_eq!(taken.len(), 4);
        drop(four);
        assert_eq!(b.held(), 8);
        drop(taken);
        assert_eq!(b.held(), 0);
        // A lower limit refuses new charges, never takes back held ones.
        let kept = b.charge(5, 2).unwrap();
        b.set_limit(4);
        assert!(b.charge(1, 1).is_err());
        drop(kept);
        assert!(b.charge(2, 2).is_ok());
    }

    #[test]
    fn the_default_is_three_quarters_of_the_lower_of_machine_and_group() {
        let meminfo = "MemTotal:       24576000 kB\nMemFree:        1000 kB\n";
        assert_eq!(mem_total(meminfo), Some(24_576_000 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(
            group_limit_files("0::/system.slice/blockwire.service\n"),
            [
                "/sys/fs/cgroup/system.slice/blockwire.service/memory.max",
                "/sys/fs/cgroup/system.slice/memory.max",
                "/sys/fs/cgroup/memory.max",
            ]
        );
        assert_eq!(
            group_limit_files("5:devices:/\n4:memory:/box/1\n0::/\n"),
            [
                "/sys/fs/cgroup/memory/box/1/memory.limit_in_bytes",
                "/sys/fs/cgroup/memory/box/memory.limit_in_bytes",
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            ]
        );
        assert_eq!(group_limit_files("0::/\n"), ["/sys/fs/cgroup/memory.max"]);
        assert!(group_limit_files("1:cpu:/\n").is_empty());
        // A unit without MemoryMax= in a slice with one: the slice's binds.
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: Option<&str>| {
            let path = dir.path().join(name);
            if let Some(text) = text {
                std::fs::write(&path, text).unwrap();
            }
            path.to_str().unwrap().to_owned()
        };
        let files = [
            file("unit", Some("max\n")),
            file("slice", Some("1073741824\n")),
            file("parent", Some("2147483648\n")),
            file("root", None),
        ];
        assert_eq!(lowest_limit(&files), Some(1 << 30));
        assert_eq!(lowest_limit(&[files[0].clone(), files[3].clone()]), None);
        let limit = default_limit();
        let machine = mem_total(&std::fs::read_to_string("/proc/meminfo").unwrap()).unwrap();
        assert!(limit <= machine / 4 * 3, "{limit} of {machine}");
        assert!(limit > 0);
    }
}
