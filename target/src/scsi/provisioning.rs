//! Logical block provisioning thresholds (SBC-4 4.7.3.7): a thin unit's
//! warning, before its space runs out, that it is running out.
//!
//! A sparse file or a RAM LUN takes space as it is written, from a pool other
//! writers draw on too (the file system, the RAM LUNs' common limit). When
//! that pool is empty, writes fail with DATA PROTECT, SPACE ALLOCATION
//! FAILED WRITE PROTECT, which a file system above sees as I/O errors. A
//! soft threshold warns first: once the space left falls below it, every
//! initiator hears THIN PROVISIONING SOFT THRESHOLD REACHED (a unit attention;
//! Linux logs "reached a thin provisioning soft threshold" and sends a
//! uevent, VMware raises an alarm), while writes still succeed.
//!
//! The unit reports what it knows in the places SBC-4 puts it: the Logical
//! Block Provisioning VPD page (THRESHOLD EXPONENT), the Logical Block
//! Provisioning mode page (one armed-decreasing soft threshold on available
//! LBA mapping resources, enabled when configured), the Read-Write Error
//! Recovery mode page (LBPERE set while a threshold is enabled), and the
//! Logical Block Provisioning log page (available and used resource counts).
//! Counts are in threshold sets of 1 MiB.
//!
//! The space is looked at once a second for every unit with a threshold, by
//! one thread for the whole process ([`watch`]), and whenever an initiator
//! asks for the log page, so space taken by other files or LUNs on the same
//! file system is noticed as well as this unit's own writes.

use std::io;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use blockwire_pdu::scsi::log::{lbp_parameter, page as log_page, LogBody};
use blockwire_pdu::scsi::mode::FIRST_THRESHOLD_DESCRIPTOR_OFFSET;
use blockwire_pdu::scsi::{
    Asc, Cdb, LogPage, LogicalBlockProvisioningPage, ModePage, PageControl,
    ReadWriteErrorRecoveryPage, ResourceCount, ResourceScope, Sense, ThresholdDescriptor,
};
use tracing::warn;

use super::logical_unit::LogicalUnit;
use super::outcome::{backstore_failure, invalid_cdb, CmdResult, Done};
use crate::backstore::Space;

/// Bytes in one threshold set: the unit of every resource count and
/// threshold count this unit reports.
pub(crate) const THRESHOLD_SET_BYTES: u64 = 1 << 20;

/// How often the watcher looks at the space of units with a threshold.
const WATCH_PERIOD: Duration = Duration::from_secs(1);

/// After a notification, the least time before the same threshold notifies
/// again (the "vendor specific frequency" SBC-4 4.7.3.7.6 allows), so that
/// free space hovering at the threshold does not interrupt every initiator's
/// commands over and over.
const RENOTIFY_AFTER: Duration = Duration::from_secs(60);

/// THRESHOLD EXPONENT for `block_size`: 2^exponent blocks make a threshold set.
pub(crate) fn threshold_exponent(block_size: u32) -> u8 {
    (THRESHOLD_SET_BYTES / u64::from(block_size.max(1))).trailing_zeros() as u8
}

/// Whole threshold sets in `bytes`, as a 32-bit count (saturating).
fn sets(bytes: u64) -> u32 {
    u32::try_from(bytes / THRESHOLD_SET_BYTES).unwrap_or(u32::MAX)
}

/// One armed-decreasing soft threshold on available space (SBC-4 figure 7):
/// the notification trigger is enabled when the space falls into the
/// threshold range from above, and fires (once) when it falls below the
/// range; rising above the range again re-arms it.
#[derive(Debug)]
pub(crate) struct LowSpace {
    /// The threshold count, in threshold sets; `None`: no threshold.
    count: Option<u32>,
    /// The space was last seen above the threshold range.
    above: bool,
    /// The notification trigger.
    trigger: bool,
    /// When the threshold last notified.
    notified: Option<Instant>,
}

impl Default for LowSpace {
    fn default() -> Self {
        // As if the space came from above: a unit that starts with its space
        // already below the threshold warns at once.
        LowSpace {
            count: None,
            above: true,
            trigger: false,
            notified: None,
        }
    }
}

impl LowSpace {
    /// Sets the threshold to `bytes` of available space (rounded to whole
    /// threshold sets, at least one), or none. A changed threshold starts
    /// armed, as a new one would.
    pub(crate) fn set(&mut self, bytes: Option<u64>) {
        let count = bytes.map(|b| {
            let rounded = (b + THRESHOLD_SET_BYTES / 2) / THRESHOLD_SET_BYTES;
            u32::try_from(rounded.max(1)).unwrap_or(u32::MAX)
        });
        if count != self.count {
            *self = LowSpace {
                count,
                ..LowSpace::default()
            };
        }
    }

    /// The threshold count, if a threshold is set.
    pub(crate) fn count(&self) -> Option<u32> {
        self.count
    }

    /// Follows the available space; true when the threshold is crossed and
    /// the initiators should hear of it now.
    fn observe(&mut self, available: u64, now: Instant) -> bool {
        let Some(count) = self.count else {
            return false;
        };
        let centre = u64::from(count) * THRESHOLD_SET_BYTES;
        let max = centre + THRESHOLD_SET_BYTES / 2;
        let min = centre.saturating_sub(THRESHOLD_SET_BYTES / 2);
        if available > max {
            self.above = true;
            self.trigger = false;
            return false;
        }
        if self.above {
            self.above = false;
            self.trigger = true;
        }
        if !(self.trigger && available < min) {
            return false;
        }
        let too_soon = self
            .notified
            .is_some_and(|t| now.duration_since(t) < RENOTIFY_AFTER);
        if too_soon {
            // Stay armed: the notification comes once the interval is over
            // if the space is still below the range then.
            return false;
        }
        self.trigger = false;
        self.notified = Some(now);
        true
    }
}

/// The unit attention sense for `code`: THIN PROVISIONING SOFT THRESHOLD
/// REACHED carries the threshold descriptor's offset in the mode page in
/// INFORMATION (SBC-4 4.7.3.7.6); there is one descriptor.
pub(crate) fn unit_attention(code: Asc) -> Sense {
    let mut s = Sense::unit_attention(code);
    if code == Asc::THIN_PROVISIONING_SOFT_THRESHOLD_REACHED {
        s.information = Some(FIRST_THRESHOLD_DESCRIPTOR_OFFSET);
    }
    s
}

impl LogicalUnit {
    /// Whether the unit reports provisioning resources and thresholds: a
    /// thin unit whose store allocates as it is written.
    pub fn reports_space(&self) -> bool {
        self.cfg.thin_provisioning && self.store_reports_space
    }

    /// Sets the soft threshold: when the space this unit's writes allocate
    /// from falls below `bytes`, every initiator hears THIN PROVISIONING
    /// SOFT THRESHOLD REACHED. `None` removes it. The unit is then watched
    /// once a second (see the module documentation). Refused for a unit
    /// whose store has no such space (a block device, the null store).
    pub fn set_low_space_threshold(self: &Arc<Self>, bytes: Option<u64>) -> io::Result<()> {
        if bytes.is_some() && !self.reports_space() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} takes no space as it is written, so it has no low-space threshold",
                    self.cfg.backstore.describe()
                ),
            ));
        }
        {
            let mut st = self.lock();
            let before = st.low_space.count();
            st.low_space.set(bytes);
            // The threshold descriptor of the Logical Block Provisioning
            // mode page changed by other than a MODE SELECT: every nexus
            // hears MODE PARAMETERS CHANGED (SBC-4 6.5.9.1).
            if st.low_space.count() != before {
                st.ua.push_others(None, Asc::MODE_PARAMETERS_CHANGED);
            }
        }
        if bytes.is_some() {
            watch(self);
            self.check_space()?;
        }
        Ok(())
    }

    /// The soft threshold in bytes, if one is set.
    pub fn low_space_threshold(&self) -> Option<u64> {
        self.lock()
            .low_space
            .count()
            .map(|c| u64::from(c) * THRESHOLD_SET_BYTES)
    }

    /// The space a thin unit's store takes and may still take now; `None`
    /// for a unit that does not report space (see [`Self::reports_space`]).
    pub fn space(&self) -> io::Result<Option<Space>> {
        if !self.reports_space() {
            return Ok(None);
        }
        self.cfg.backstore.space()
    }

    /// Looks at the store's space now, and tells every initiator if that
    /// crossed the threshold. Returns the space (`None`: the unit reports
    /// none).
    pub fn check_space(&self) -> io::Result<Option<Space>> {
        let Some(space) = self.space()? else {
            return Ok(None);
        };
        let mut st = self.lock();
        if st.low_space.observe(space.available, Instant::now()) {
            warn!(
                store = %self.cfg.backstore.describe(),
                available = space.available,
                threshold = st.low_space.count().map(|c| u64::from(c) * THRESHOLD_SET_BYTES),
                "low on space: every initiator hears THIN PROVISIONING SOFT THRESHOLD REACHED"
            );
            st.ua
                .push_others(None, Asc::THIN_PROVISIONING_SOFT_THRESHOLD_REACHED);
        }
        Ok(Some(space))
    }

    /// The Logical Block Provisioning mode page (1Ch/02h) for page control
    /// `pc`: one soft threshold on available LBA mapping resources, armed
    /// decreasing, enabled while a threshold is set. Nothing in it is
    /// changeable (the configuration sets the threshold).
    pub(crate) fn provisioning_mode_page(&self, pc: PageControl) -> Option<ModePage> {
        if !self.reports_space() {
            return None;
        }
        let count = self.lock().low_space.count();
        let descriptor = if pc == PageControl::Changeable {
            ThresholdDescriptor::default()
        } else {
            ThresholdDescriptor {
                enabled: count.is_some(),
                threshold_type: 0,
                arming: 0,
                resource: lbp_parameter::AVAILABLE as u8,
                count: count.unwrap_or(0),
            }
        };
        Some(ModePage::LogicalBlockProvisioning(
            LogicalBlockProvisioningPage {
                ps: false,
                situa: false,
                thresholds: vec![descriptor],
            },
        ))
    }

    /// The Read-Write Error Recovery mode page (01h): only LBPERE means
    /// anything here (set while a threshold is enabled; no field is
    /// changeable).
    pub(crate) fn error_recovery_mode_page(&self, pc: PageControl) -> ModePage {
        let lbpere = pc != PageControl::Changeable && self.lock().low_space.count().is_some();
        ModePage::ReadWriteErrorRecovery(ReadWriteErrorRecoveryPage {
            lbpere,
            ..ReadWriteErrorRecoveryPage::default()
        })
    }

    /// LOG SENSE (SPC-4 6.6): the Supported Log Pages page, and the Logical
    /// Block Provisioning page of a unit that reports its space. Every page
    /// control value returns the current values (the parameters have no
    /// thresholds and nothing resets them); saving is not supported.
    pub(crate) fn log_sense(&self, cdb: &Cdb) -> CmdResult {
        let Cdb::LogSense {
            sp,
            ppc,
            page_code,
            subpage_code,
            parameter_pointer,
            allocation_length,
            ..
        } = *cdb
        else {
            return Err(invalid_cdb(0, None));
        };
        if sp {
            return Err(invalid_cdb(1, Some(0)));
        }
        if ppc {
            return Err(invalid_cdb(1, Some(1)));
        }
        if subpage_code != 0 {
            return Err(invalid_cdb(3, None));
        }
        let page = match page_code {
            log_page::SUPPORTED_PAGES => {
                let mut codes = vec![log_page::SUPPORTED_PAGES];
                if self.reports_space() {
                    codes.push(log_page::LOGICAL_BLOCK_PROVISIONING);
                }
                LogPage {
                    ds: false,
                    spf: false,
                    page_code,
                    subpage_code: 0,
                    body: LogBody::SupportedPages(codes),
                }
            }
            log_page::LOGICAL_BLOCK_PROVISIONING if self.reports_space() => {
                let space = self
                    .check_space()
                    .map_err(|e| backstore_failure(&e, false, 0))?
                    .unwrap_or(Space {
                        used: 0,
                        available: 0,
                    });
                let params = [
                    (
                        lbp_parameter::AVAILABLE,
                        space.available,
                        ResourceScope::Shared,
                    ),
                    (
                        lbp_parameter::USED,
                        space.used.div_ceil(THRESHOLD_SET_BYTES) * THRESHOLD_SET_BYTES,
                        ResourceScope::Dedicated,
                    ),
                ];
                if parameter_pointer > lbp_parameter::USED {
                    return Err(invalid_cdb(5, None));
                }
                LogPage {
                    ds: true,
                    spf: false,
                    page_code,
                    subpage_code: 0,
                    body: LogBody::Parameters(
                        params
                            .into_iter()
                            .filter(|(code, ..)| *code >= parameter_pointer)
                            .map(|(code, bytes, scope)| {
                                ResourceCount {
                                    count: sets(bytes),
                                    scope,
                                }
                                .to_parameter(code)
                            })
                            .collect(),
                    ),
                }
            }
            _ => return Err(invalid_cdb(2, Some(5))),
        };
        Ok(Done::data(page.encode(), u32::from(allocation_length)))
    }
}

/// The units with a threshold, looked at by the watcher thread; a unit that
/// is dropped leaves the list at the next look.
fn watched() -> &'static Mutex<Vec<Weak<LogicalUnit>>> {
    static UNITS: OnceLock<Mutex<Vec<Weak<LogicalUnit>>>> = OnceLock::new();
    UNITS.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("lbp-thresholds".into())
            .spawn(watch_forever);
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start the low-space watcher: thresholds are checked only when an initiator reads the Logical Block Provisioning log page");
        }
        Mutex::new(Vec::new())
    })
}

/// Adds `unit` to the units the watcher looks at (once).
fn watch(unit: &Arc<LogicalUnit>) {
    let mut units = watched().lock().unwrap_or_else(|e| e.into_inner());
    let weak = Arc::downgrade(unit);
    if !units.iter().any(|u| u.ptr_eq(&weak)) {
        units.push(weak);
    }
}

fn watch_forever() {
    loop {
        std::thread::sleep(WATCH_PERIOD);
        let units: Vec<Arc<LogicalUnit>> = {
            let mut list = watched().lock().unwrap_or_else(|e| e.into_inner());
            list.retain(|u| u.strong_count() > 0);
            list.iter().filter_map(Weak::upgrade).collect()
        };
        for unit in units {
            if unit.low_space_threshold().is_none() {
                continue;
            }
            if let Err(e) = unit.check_space() {
                warn!(store = %unit.config().backstore.describe(), error = %e, "cannot look at the space left");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn an_armed_decreasing_threshold_fires_once_below_its_range_and_rearms_above_it() {
        let t0 = Instant::now();
        let mut l = LowSpace::default();
        l.set(Some(10 * MIB));
        assert!(!l.observe(100 * MIB, t0));
        // Into the range: armed, not yet crossed.
        assert!(!l.observe(10 * MIB, t0));
        // Below the range: fires once.
        assert!(l.observe(9 * MIB, t0));
        assert!(!l.observe(5 * MIB, t0));
        assert!(!l.observe(0, t0));
        // Back above the range, then down again: fires again, once the
        // interval since the last notification is over.
        assert!(!l.observe(11 * MIB, t0));
        assert!(!l.observe(8 * MIB, t0 + Duration::from_secs(1)));
        assert!(l.observe(8 * MIB, t0 + RENOTIFY_AFTER));
        assert!(!l.observe(8 * MIB, t0 + 2 * RENOTIFY_AFTER));
    }

    #[test]
    fn a_unit_that_starts_below_its_threshold_warns_at_once() {
        let mut l = LowSpace::default();
        l.set(Some(10 * MIB));
        assert!(l.observe(MIB, Instant::now()));
        let mut none = LowSpace::default();
        assert!(!none.observe(0, Instant::now()));
    }

    #[test]
    fn thresholds_round_to_whole_sets_of_at_least_one() {
        let mut l = LowSpace::default();
        l.set(Some(1));
        assert_eq!(l.count(), Some(1));
        l.set(Some(5 * MIB + MIB / 2));
        assert_eq!(l.count(), Some(6));
        l.set(None);
        assert_eq!(l.count(), None);
        assert_eq!(threshold_exponent(512), 11);
        assert_eq!(threshold_exponent(4096), 8);
    }
}
