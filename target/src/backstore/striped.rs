//! A striped (RAID0) backstore: one LUN over N member files, stripe `k` of
//! `stripe` bytes on member `k mod N` (the mapping is
//! [`StripeLayout`]). It exists to show several independent streams
//! filling one request (the GMBlock paper's Exp. 2b): a large READ touches every
//! member. On the engine path ([`StripedBackstore::engine_source`]) every
//! chunk's per-member pieces are submitted together; on the SCSI core path
//! large direct-mode requests run one thread per member (see
//! `PARALLEL_MIN` for when that pays).
//!
//! Each member is a [`FileBackstore`], so cached vs `O_DIRECT`, durable
//! writes (`RWF_DSYNC`), hole punching, `ZERO_RANGE` and `SEEK_DATA` /
//! `SEEK_HOLE` behave exactly as on a file LUN; this module only splits
//! device ranges into per-member pieces and puts the answers back together.
//!
//! Member files are created or grown to `layout.member_size(size)`. Existing
//! members must be one set: all absent/empty (a new LUN) or all holding the
//! same length. A set where some members have data and others do not, or
//! lengths differ, was not created together (or a resize was interrupted),
//! and reading it would return another layout's bytes: it is refused with
//! an error naming the member and the fix.
//!
//! Errors keep the member's OS error unchanged (so the SCSI core maps EIO
//! to MEDIUM ERROR with the command's LBA, ENOSPC to DATA PROTECT, exactly
//! as for a file LUN) and are logged with the member, its path and the
//! device offset that failed.

use super::file::DIRECT_ALIGN;
use super::{Backstore, Extent, FileBackstore, FileMode};
use crate::datapath::stripe::{Extent as Piece, StripeLayout};
use crate::datapath::Source;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tracing::warn;

/// Largest stripe chunk accepted (larger stripes stop spreading requests).
pub const MAX_STRIPE: u64 = 16 << 20;
/// Smallest stripe chunk accepted (one 512-byte logical block).
pub const MIN_STRIPE: u64 = 512;

/// Requests at least this large that touch two or more members, and whose
/// pieces wait for a device (direct mode, or durable writes), are served by
/// one thread per member. Measured on this 2-core VM (4 members x 64K,
/// `read_at` in a loop): O_DIRECT on the ext4 virtio disk, 1 MiB reads went
/// from ~360 to ~560-700 MB/s with threads, 256 KiB reads stayed at ~400;
/// page-cache and tmpfs reads (memory copies) lost 12-75% to the spawns. So
/// smaller requests and cached reads run the members in turn.
const PARALLEL_MIN: usize = 512 << 10;

/// How many requests took the one-thread-per-member path (tests check it
/// really runs).
#[cfg(test)]
static PARALLEL_RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// At most this many stripe pieces are walked for one allocation map; the
/// rest of a larger range is reported mapped (always a truthful answer:
/// "mapped" only says the blocks may hold data). Bounds the work of a GET
/// LBA STATUS over a huge LUN; the initiator asks again from where it ends.
const MAX_MAP_PIECES: u64 = 1 << 20;

/// RAID0 over member files.
#[derive(Debug)]
pub struct StripedBackstore {
    members: Vec<FileBackstore>,
    paths: Vec<PathBuf>,
    layout: StripeLayout,
    size: u64,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// The current length of `path`, or None when it does not exist. Block
/// devices report 0 in their metadata, so they are asked by seeking.
fn existing_len(path: &Path) -> io::Result<Option<u64>> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("cannot stat striped member {}: {e}", path.display()),
        )),
        Ok(m) if m.file_type().is_block_device() => {
            let f = File::open(path)?;
            Ok(Some(rustix::fs::seek(&f, rustix::fs::SeekFrom::End(0))?))
        }
        Ok(m) => Ok(Some(m.len())),
    }
}

/// The member byte range holding the device bytes of `dev` that live on
/// `member`, or None. Contiguous: consecutive stripes of one member sit
/// back to back in its file, so only the first and last may be partial.
/// Arithmetic, so UNMAP of a huge range costs N calls, not one per stripe.
fn member_span(layout: &StripeLayout, dev: Range<u64>, member: u32) -> Option<Range<u64>> {
    if dev.start >= dev.end {
        return None;
    }
    let (s, n, m) = (layout.stripe, layout.members as u64, member as u64);
    let k0 = dev.start / s;
    let first = if k0 % n == m {
        layout.locate(dev.start).1
    } else {
        let k = k0 + (m + n - k0 % n) % n;
        if k * s >= dev.end {
            return None;
        }
        (k / n) * s
    };
    let k1 = (dev.end - 1) / s;
    let last = if k1 % n == m {
        layout.locate(dev.end - 1).1 + 1
    } else {
        let back = (k1 % n + n - m) % n;
        if back > k1 || k1 - back < k0 {
            return None;
        }
        ((k1 - back) / n) * s + s
    };
    (first < last).then_some(first..last)
}

/// Checks a stripe chunk size: a power of two from [`MIN_STRIPE`] to
/// [`MAX_STRIPE`], at least 4 KiB in direct mode (so every 4 KiB-aligned
/// device range maps to 4 KiB-aligned member ranges). The error says what
/// to write instead.
pub fn check_stripe(stripe: u64, mode: FileMode) -> Result<(), String> {
    if !stripe.is_power_of_two() || !(MIN_STRIPE..=MAX_STRIPE).contains(&stripe) {
        return Err(format!(
            "{stripe} bytes is not a stripe chunk: use a power of two from 512 to {}M, e.g. \"64K\"",
            MAX_STRIPE >> 20
        ));
    }
    if mode == FileMode::Direct && stripe < DIRECT_ALIGN {
        return Err(format!(
            "direct mode needs a stripe chunk of at least {}K ({stripe} bytes given): use \"64K\" or mode = \"cached\"",
            DIRECT_ALIGN >> 10
        ));
    }
    Ok(())
}

impl StripedBackstore {
    /// Opens (creating or growing as needed) the members `paths`, striped
    /// in chunks of `stripe` bytes. With `size` the members are sized to
    /// cover it; without, every member must exist with the same length and
    /// the LUN is as large as whole stripes on all of them allow.
    pub fn open(
        paths: &[PathBuf],
        stripe: u64,
        size: Option<u64>,
        read_only: bool,
        mode: FileMode,
    ) -> io::Result<StripedBackstore> {
        if paths.len() < 2 {
            return Err(invalid(format!(
                "a striped backstore needs at least 2 member paths ({} given); use backstore = \"file\" for one",
                paths.len()
            )));
        }
        if paths.len() > u16::MAX as usize {
            return Err(invalid(format!(
                "{} striped members are too many (at most {})",
                paths.len(),
                u16::MAX
            )));
        }
        check_stripe(stripe, mode).map_err(invalid)?;
        for (i, p) in paths.iter().enumerate() {
            if paths[..i].contains(p) {
                return Err(invalid(format!(
                    "striped member {} is listed twice: every member needs its own file",
                    p.display()
                )));
            }
        }
        let layout = StripeLayout::new(paths.len() as u32, stripe);
        let lens = paths
            .iter()
            .map(|p| existing_len(p))
            .collect::<io::Result<Vec<_>>>()?;
        // One set: all new (absent or empty), or all the same length.
        let with_data: Vec<(usize, u64)> = lens
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.filter(|&n| n > 0).map(|n| (i, n)))
            .collect();
        if let Some(&(first, flen)) = with_data.first() {
            if let Some(i) = (0..paths.len()).find(|&i| lens[i].unwrap_or(0) == 0) {
                return Err(invalid(format!(
                    "striped member {} is missing or empty while {} holds {flen} bytes: the members are not one striped set (a set cannot gain members without scrambling its data); restore the member or give all-new paths",
                    paths[i].display(),
                    paths[first].display()
                )));
            }
            if let Some(&(i, n)) = with_data.iter().find(|&&(_, n)| n != flen) {
                return Err(invalid(format!(
                    "striped member {} is {n} bytes but {} is {flen} bytes: members of one set are equal in size; if a resize was interrupted, grow the shorter members to {} bytes (truncate -s), else fix paths",
                    paths[i].display(),
                    paths[first].display(),
                    n.max(flen)
                )));
            }
        }
        let (size, need) = match size {
            Some(s) => (s, layout.member_size(s)),
            None => {
                let Some(&(_, flen)) = with_data.first() else {
                    return Err(invalid(format!(
                        "striped members {} ... do not exist yet: give the LUN a size",
                        paths[0].display()
                    )));
                };
                let whole = flen / stripe * stripe;
                if whole == 0 {
                    return Err(invalid(format!(
                        "striped member {} ({flen} bytes) is smaller than one stripe chunk ({stripe}): give the LUN a size",
                        paths[0].display()
                    )));
                }
                (whole * paths.len() as u64, whole)
            }
        };
        if let Some(&(i, n)) = with_data.first().filter(|&&(_, n)| n < need && read_only) {
            return Err(invalid(format!(
                "striped member {} is {n} bytes, a read-only LUN of {size} bytes needs {need} per member: lower the size or open it writable to grow the members",
                paths[i].display()
            )));
        }
        let mut members = Vec::with_capacity(paths.len());
        for (i, p) in paths.iter().enumerate() {
            let m = FileBackstore::open_with(p, Some(need), read_only, mode).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("striped member {i} ({}): {e}", p.display()),
                )
            })?;
            if m.size() < need {
                // A block device too small for its share.
                return Err(invalid(format!(
                    "striped member {} holds {} bytes, a LUN of {size} bytes needs {need} per member: lower the size or use a larger device",
                    p.display(),
                    m.size()
                )));
            }
            members.push(m);
        }
        Ok(StripedBackstore {
            members,
            paths: paths.to_vec(),
            layout,
            size,
        })
    }

    /// The RAID0 layout.
    pub fn layout(&self) -> StripeLayout {
        self.layout
    }

    /// True when every member really runs `O_DIRECT` (none fell back).
    pub fn direct(&self) -> bool {
        self.members.iter().all(|m| m.mode() == FileMode::Direct)
    }

    /// The members for the I/O engine ([`Source::Striped`]: one stream per
    /// member), opened read-only; `O_DIRECT` when every member runs direct.
    /// The flag says whether they are `O_DIRECT` (the engine path then
    /// needs 4 KiB-aligned ranges).
    pub fn open_members_for_engine(&self) -> io::Result<(Source, bool)> {
        let direct = self.direct();
        let mut files = Vec::with_capacity(self.paths.len());
        for p in &self.paths {
            let f = if direct {
                crate::datapath::open_direct(p, false)
            } else {
                File::open(p)
            };
            let f = f.map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "opening striped member {} for the I/O engine: {e}",
                        p.display()
                    ),
                )
            })?;
            files.push(Arc::new(f));
        }
        Ok((
            Source::Striped {
                files,
                layout: self.layout,
            },
            direct,
        ))
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(invalid(format!(
                "range {offset}+{len} beyond striped backstore of {} bytes",
                self.size
            ))),
        }
    }

    /// Logs a member failure with everything needed to find it, and hands
    /// the OS error on unchanged (its errno decides the sense).
    fn member_error(&self, e: io::Error, what: &str, dev_offset: u64, p: &Piece) -> io::Error {
        warn!(
            member = p.member,
            path = %self.paths[p.member as usize].display(),
            dev_offset,
            member_offset = p.member_offset,
            len = p.len,
            error = %e,
            "striped member {what} failed"
        );
        e
    }

    /// Runs `op` on every piece, grouped per member: in parallel (one
    /// thread per member, the caller's thread taking the first) when
    /// `parallel` and two or more members have work, else in device order.
    /// Returns the error of the piece lowest in the device, if any failed.
    fn fan_out<T: Send>(
        &self,
        work: Vec<Vec<(Piece, T)>>,
        parallel: bool,
        op: impl Fn(&Piece, T) -> io::Result<()> + Sync,
    ) -> io::Result<()> {
        let busy = work.iter().filter(|w| !w.is_empty()).count();
        let run = |pieces: Vec<(Piece, T)>| -> Result<(), (u64, io::Error)> {
            for (p, t) in pieces {
                let at = p.rel_offset;
                op(&p, t).map_err(|e| (at, e))?;
            }
            Ok(())
        };
        if !parallel || busy < 2 {
            // Device order, so the first failure is the lowest.
            let mut all: Vec<(Piece, T)> = work.into_iter().flatten().collect();
            all.sort_by_key(|(p, _)| p.rel_offset);
            return run(all).map_err(|(_, e)| e);
        }
        #[cfg(test)]
        PARALLEL_RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut lists = work.into_iter().filter(|w| !w.is_empty());
        let mine = lists.next().unwrap_or_default();
        let results: Vec<Result<(), (u64, io::Error)>> = std::thread::scope(|scope| {
            let handles: Vec<_> = lists.map(|w| scope.spawn(|| run(w))).collect();
            let mut out = vec![run(mine)];
            for h in handles {
                out.push(h.join().unwrap_or_else(|_| {
                    Err((
                        u64::MAX,
                        io::Error::other("striped member I/O thread panicked"),
                    ))
                }));
            }
            out
        });
        match results
            .into_iter()
            .filter_map(Result::err)
            .min_by_key(|(at, _)| *at)
        {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }

    /// Splits `[offset, offset + len)` into per-member lists of pieces, each
    /// paired with its part of `buf` (cut in device order).
    fn split<'b, B: SplitBuf<'b>>(&self, offset: u64, mut buf: B) -> Vec<Vec<(Piece, B)>> {
        let mut per: Vec<Vec<(Piece, B)>> = (0..self.members.len()).map(|_| Vec::new()).collect();
        let len = buf.length() as u64;
        for p in self.layout.map(offset..offset + len) {
            let (head, tail) = buf.cut(p.len as usize);
            per[p.member as usize].push((p, head));
            buf = tail;
        }
        per
    }

    fn write(&self, offset: u64, data: &[u8], durable: bool) -> io::Result<()> {
        self.check(offset, data.len() as u64)?;
        let parallel = data.len() >= PARALLEL_MIN && (durable || self.direct());
        let work = self.split(offset, data);
        self.fan_out(work, parallel, |p, d| {
            let m = &self.members[p.member as usize];
            let r = if durable {
                m.write_at_durable(p.member_offset, d)
            } else {
                m.write_at(p.member_offset, d)
            };
            r.map_err(|e| self.member_error(e, "write", offset + p.rel_offset, p))
        })
    }

    /// Runs `op` on every member's share of `[offset, offset + len)` (one
    /// contiguous member range each).
    fn per_member_span(
        &self,
        offset: u64,
        len: u64,
        what: &str,
        op: impl Fn(&FileBackstore, Range<u64>) -> io::Result<()>,
    ) -> io::Result<()> {
        self.check(offset, len)?;
        for (i, m) in self.members.iter().enumerate() {
            if let Some(r) = member_span(&self.layout, offset..offset + len, i as u32) {
                let piece = Piece {
                    member: i as u32,
                    member_offset: r.start,
                    rel_offset: 0,
                    len: r.end - r.start,
                };
                op(m, r).map_err(|e| self.member_error(e, what, offset, &piece))?;
            }
        }
        Ok(())
    }
}

/// A buffer that can be cut into consecutive disjoint pieces (`&[u8]` for
/// writes, `&mut [u8]` for reads).
trait SplitBuf<'b>: Sized + Send {
    fn length(&self) -> usize;
    fn cut(self, at: usize) -> (Self, Self);
}

impl<'b> SplitBuf<'b> for &'b [u8] {
    fn length(&self) -> usize {
        self.len()
    }
    fn cut(self, at: usize) -> (Self, Self) {
        self.split_at(at)
    }
}

impl<'b> SplitBuf<'b> for &'b mut [u8] {
    fn length(&self) -> usize {
        self.len()
    }
    fn cut(self, at: usize) -> (Self, Self) {
        self.split_at_mut(at)
    }
}

impl Backstore for StripedBackstore {
    fn capabilities(&self) -> super::Capabilities {
        super::Capabilities {
            file: None,
            engine_reads: true,
            allocation_map: true,
        }
    }

    fn engine_source(&self) -> io::Result<Option<(Source, bool)>> {
        self.open_members_for_engine().map(Some)
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        let parallel = buf.len() >= PARALLEL_MIN && self.direct();
        let work = self.split(offset, buf);
        self.fan_out(work, parallel, |p, b| {
            self.members[p.member as usize]
                .read_at(p.member_offset, b)
                .map_err(|e| self.member_error(e, "read", offset + p.rel_offset, p))
        })
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write(offset, data, false)
    }

    fn write_at_durable(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write(offset, data, true)
    }

    fn erase_copies(&self) -> io::Result<()> {
        self.members
            .iter()
            .try_for_each(FileBackstore::erase_copies)
    }

    /// Every member is synced (in parallel: each `fdatasync` waits for its
    /// own device); the first failure is returned after all have run, so
    /// one bad member does not leave the others unsynced.
    fn flush(&self) -> io::Result<()> {
        let results: Vec<io::Result<()>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .members
                .iter()
                .map(|m| scope.spawn(move || m.flush()))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(io::Error::other("flush thread panicked")))
                })
                .collect()
        });
        let mut first = Ok(());
        for (i, r) in results.into_iter().enumerate() {
            if let Err(e) = r {
                warn!(member = i, path = %self.paths[i].display(), error = %e, "striped member flush failed");
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.per_member_span(offset, len, "discard", |m, r| {
            m.discard(r.start, r.end - r.start)
        })
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.per_member_span(offset, len, "write zeroes", |m, r| {
            m.write_zeroes(r.start, r.end - r.start)
        })
    }

    /// Each member's map of its share, laid back onto the device stripe by
    /// stripe (a device range is mapped where its member's bytes are).
    /// Used: every member's blocks. Available: the least any member's file
    /// system has, since stripes fill the members evenly and the first
    /// member out of space fails the writes that reach it.
    fn space(&self) -> io::Result<Option<super::Space>> {
        let mut total = super::Space {
            used: 0,
            available: u64::MAX,
        };
        for m in &self.members {
            let Some(s) = m.space()? else {
                return Ok(None);
            };
            total.used = total.used.saturating_add(s.used);
            total.available = total.available.min(s.available);
        }
        Ok(Some(total))
    }

    fn allocation(&self, offset: u64, len: u64) -> io::Result<Option<Vec<Extent>>> {
        self.check(offset, len)?;
        let end = offset + len;
        let walk_end = end.min(offset.saturating_add(MAX_MAP_PIECES * self.layout.stripe));
        let mut maps = Vec::with_capacity(self.members.len());
        for (i, m) in self.members.iter().enumerate() {
            let map = match member_span(&self.layout, offset..walk_end, i as u32) {
                None => Vec::new(),
                Some(r) => match m.allocation(r.start, r.end - r.start)? {
                    None => return Ok(None),
                    Some(map) => map,
                },
            };
            maps.push((map, 0usize));
        }
        let mut out: Vec<Extent> = Vec::new();
        let mut push = |from: u64, len: u64, mapped: bool| match out.last_mut() {
            Some(l) if l.mapped == mapped && l.offset + l.len == from => l.len += len,
            _ => out.push(Extent {
                offset: from,
                len,
                mapped,
            }),
        };
        for p in self.layout.map(offset..walk_end) {
            let (map, cursor) = &mut maps[p.member as usize];
            let (lo, hi) = (p.member_offset, p.member_offset + p.len);
            // Member extents are in order; skip those wholly before this piece.
            while *cursor < map.len() && map[*cursor].offset + map[*cursor].len <= lo {
                *cursor += 1;
            }
            let mut at = lo;
            let mut i = *cursor;
            while at < hi {
                match map.get(i) {
                    Some(x) if x.offset < hi => {
                        let to = (x.offset + x.len).min(hi);
                        if to > at {
                            push(offset + p.rel_offset + (at - lo), to - at, x.mapped);
                            at = to;
                        }
                        i += 1;
                    }
                    // The member's map covers its span; anything uncovered
                    // is reported mapped (the safe answer).
                    _ => {
                        push(offset + p.rel_offset + (at - lo), hi - at, true);
                        at = hi;
                    }
                }
            }
        }
        if walk_end < end {
            push(walk_end, end - walk_end, true);
        }
        Ok(Some(out))
    }

    fn describe(&self) -> String {
        let modes: Vec<String> = self
            .members
            .iter()
            .map(|m| match (m.mode(), m.fallback_reason()) {
                (FileMode::Direct, _) => "direct".to_owned(),
                (FileMode::Cached, None) => "cached".to_owned(),
                (FileMode::Cached, Some(why)) => format!("cached: direct refused, {why}"),
            })
            .collect();
        let mode = if modes.iter().all(|m| *m == modes[0]) {
            modes[0].clone()
        } else {
            format!("mixed: {}", modes.join("; "))
        };
        let names: Vec<String> = self.paths.iter().map(|p| p.display().to_string()).collect();
        let stripe = match self.layout.stripe {
            s if s >= 1024 => format!("{} KiB", s >> 10),
            s => format!("{s} B"),
        };
        format!(
            "striped {} x {stripe} over {} ({} MiB, {mode})",
            self.members.len(),
            names.join(", "),
            self.size >> 20
        )
    }
}

#[cfg(test)]
#[path = "striped_tests.rs"]
mod tests;
