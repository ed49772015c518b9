//! MODE SENSE and MODE SELECT (SPC-4 6.11-6.14): the read-write error
//! recovery, caching, control and informational exceptions pages, and the
//! logical block provisioning subpage of units that report their space (see
//! [`super::provisioning`]).
//!
//! Changeable: WCE (caching), D_SENSE and SWP (control). Nothing is saved
//! across restarts, so PS is 0; as SPC-4 requires, MODE SENSE of the saved
//! values (PC 11b) is refused with SAVING PARAMETERS NOT SUPPORTED, and
//! MODE SELECT with SP=1 with INVALID FIELD IN CDB (6.13, 6.14).

use blockwire_pdu::scsi::mode::page;
use blockwire_pdu::scsi::{
    Asc, BlockDescriptor, CachingPage, Cdb, ControlPage, FieldPointer, InformationalExceptionsPage,
    ModeHeader, ModePage, ModeParameters, PageControl, Sense,
};
use tracing::{info, warn};

use super::logical_unit::{LogicalUnit, LuConfig};
use super::outcome::{
    backstore_failure, invalid_cdb, invalid_param, param_length, CmdResult, Done, Failure,
};
use super::ScsiRequest;

/// The mode parameters that can change at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ModeState {
    /// Caching page WCE.
    pub wce: bool,
    /// Control page D_SENSE.
    pub d_sense: bool,
    /// Control page SWP: software write protect.
    pub swp: bool,
}

impl ModeState {
    /// Power-on values.
    pub fn defaults(cfg: &LuConfig) -> ModeState {
        ModeState {
            wce: cfg.write_cache,
            d_sense: false,
            swp: false,
        }
    }
}

/// The three pages for one page control value.
fn pages(pc: PageControl, cur: ModeState, def: ModeState) -> [ModePage; 3] {
    let changeable = pc == PageControl::Changeable;
    let vals = if pc == PageControl::Current { cur } else { def };
    let caching = if changeable {
        CachingPage {
            wce: true,
            ..CachingPage::default()
        }
    } else {
        CachingPage {
            wce: vals.wce,
            ..CachingPage::default()
        }
    };
    let control = if changeable {
        ControlPage {
            d_sense: true,
            swp: true,
            ..ControlPage::default()
        }
    } else {
        ControlPage {
            d_sense: vals.d_sense,
            swp: vals.swp,
            // Commands run concurrently and may complete in any order.
            queue_algorithm_modifier: 1,
            // No limit on how long BUSY may last (FFFFh = unlimited).
            busy_timeout_period: 0xffff,
            ..ControlPage::default()
        }
    };
    let ie = InformationalExceptionsPage::default();
    [
        ModePage::Caching(caching),
        ModePage::Control(control),
        ModePage::InformationalExceptions(ie),
    ]
}

impl LogicalUnit {
    pub(crate) fn mode_sense(&self, cdb: &Cdb) -> CmdResult {
        let (ten, llbaa, dbd, pc, code, sub, alloc) = match *cdb {
            Cdb::ModeSense6 {
                dbd,
                page_control,
                page_code,
                subpage_code,
                allocation_length,
            } => (
                false,
                false,
                dbd,
                page_control,
                page_code,
                subpage_code,
                u32::from(allocation_length),
            ),
            Cdb::ModeSense10 {
                llbaa,
                dbd,
                page_control,
                page_code,
                subpage_code,
                allocation_length,
            } => (
                true,
                llbaa,
                dbd,
                page_control,
                page_code,
                subpage_code,
                u32::from(allocation_length),
            ),
            _ => return Err(invalid_cdb(0, None)),
        };
        if pc == PageControl::Saved {
            return Err(Failure::Check(Sense::illegal_request(
                Asc::SAVING_PARAMETERS_NOT_SUPPORTED,
                Some(FieldPointer::cdb(2, Some(7))),
            )));
        }
        let (cur, wp) = {
            let st = self.lock();
            (st.mode, self.cfg.read_only || st.mode.swp)
        };
        // In page code order, each page before its subpages.
        let mut all = vec![self.error_recovery_mode_page(pc)];
        all.extend(pages(pc, cur, ModeState::defaults(&self.cfg)));
        all.extend(self.provisioning_mode_page(pc));
        let known_page = code == page::ALL || all.iter().any(|p| p.code().0 == code);
        if !known_page {
            return Err(invalid_cdb(2, Some(5)));
        }
        // SPC-4 table "mode page code usage": 3Fh takes subpage 00h (every
        // page) or FFh (every page and subpage); 01h-FEh are reserved.
        if code == page::ALL && sub != 0 && sub != 0xff {
            return Err(invalid_cdb(3, None));
        }
        // Subpage 00h: the page itself; FFh: the page and its subpages; any
        // other: that subpage, which must exist.
        let chosen: Vec<ModePage> = all
            .into_iter()
            .filter(|p| {
                let (c, s) = p.code();
                (code == page::ALL || c == code)
                    && match sub {
                        0 => s.is_none(),
                        0xff => true,
                        _ => s == Some(sub),
                    }
            })
            .collect();
        if chosen.is_empty() {
            return Err(invalid_cdb(3, None));
        }
        let blocks = self.blocks();
        let params = ModeParameters {
            header: ModeHeader {
                medium_type: 0,
                wp,
                dpofua: true,
            },
            block_descriptors: if dbd {
                Vec::new()
            } else {
                vec![BlockDescriptor {
                    number_of_blocks: blocks,
                    block_length: self.cfg.block_size,
                }]
            },
            long_lba: ten && llbaa && !dbd,
            pages: chosen,
        };
        let data = if ten {
            params.encode10()
        } else {
            params.encode6()
        };
        Ok(Done::data(data, alloc))
    }

    pub(crate) fn mode_select(&self, req: &ScsiRequest<'_>, cdb: &Cdb) -> CmdResult {
        let (ten, pf, sp, len) = match *cdb {
            Cdb::ModeSelect6 {
                pf,
                sp,
                parameter_list_length,
            } => (false, pf, sp, usize::from(parameter_list_length)),
            Cdb::ModeSelect10 {
                pf,
                sp,
                parameter_list_length,
            } => (true, pf, sp, usize::from(parameter_list_length)),
            _ => return Err(invalid_cdb(0, None)),
        };
        // SPC-4 6.13: SP=1 where the unit implements no saved pages is an
        // invalid field (SAVING PARAMETERS NOT SUPPORTED is MODE SENSE's
        // answer to PC 11b).
        if sp {
            return Err(invalid_cdb(1, Some(0)));
        }
        // Only the page format (SPC) is understood; vendor formats are not.
        if !pf && len > 0 {
            return Err(invalid_cdb(1, Some(4)));
        }
        if len == 0 {
            return Ok(Done::none());
        }
        let Some(buf) = req.data_out.get(..len) else {
            return Err(param_length());
        };
        let params = if ten {
            ModeParameters::decode10(buf)
        } else {
            ModeParameters::decode6(buf)
        }
        .map_err(|e| Failure::Check(e.to_sense()))?;
        let hlen: usize = if ten { 8 } else { 4 };
        let bd_unit: usize = if params.long_lba { 16 } else { 8 };
        for (i, d) in params.block_descriptors.iter().enumerate() {
            // The block length cannot change. The count is ignored: SBC-4
            // §6.5.2 has a unit whose capacity MODE SELECT cannot change
            // ignore it, and a descriptor sent back as MODE SENSE gave it
            // holds FFFFFFFFh for a capacity past 2^32 blocks. The pointer
            // names the LOGICAL BLOCK LENGTH of the descriptor at fault.
            if d.block_length != self.cfg.block_size {
                let field = if params.long_lba { 12 } else { 5 };
                let at = hlen + i * bd_unit + field;
                return Err(invalid_param(at as u16, None));
            }
        }
        let mut next = self.lock().mode;
        let mut sent = SentPages::default();
        let def = ModeState::defaults(&self.cfg);
        let mut off = hlen + params.block_descriptors.len() * bd_unit;
        for p in &params.pages {
            // Page bytes sit at `off`; field pointers below are relative to it.
            let mut enc = Vec::new();
            p.encode_into(&mut enc);
            let ps_bit = enc.first().is_some_and(|b| b & 0x80 != 0);
            if ps_bit {
                // PS is reserved in MODE SELECT.
                return Err(invalid_param(off as u16, Some(7)));
            }
            match p {
                // Nothing of these is changeable: they may only restate
                // the current values.
                ModePage::ReadWriteErrorRecovery(_) | ModePage::LogicalBlockProvisioning(_) => {
                    let current = match p {
                        ModePage::ReadWriteErrorRecovery(_) => {
                            Some(self.error_recovery_mode_page(PageControl::Current))
                        }
                        _ => self.provisioning_mode_page(PageControl::Current),
                    };
                    let Some(current) = current else {
                        return Err(invalid_param(off as u16, Some(5)));
                    };
                    if *p != current {
                        return Err(first_diff(&enc, &page_bytes(&current), off));
                    }
                }
                ModePage::Caching(c) => {
                    let want = CachingPage {
                        wce: c.wce,
                        ..CachingPage::default()
                    };
                    if *c != want {
                        return Err(first_diff(&enc, &page_bytes(&ModePage::Caching(want)), off));
                    }
                    next.wce = c.wce;
                    sent.caching = true;
                }
                ModePage::Control(c) => {
                    let fixed = match pages(PageControl::Current, next, def) {
                        [_, ModePage::Control(f), _] => f,
                        _ => ControlPage::default(),
                    };
                    let want = ControlPage {
                        d_sense: c.d_sense,
                        swp: c.swp,
                        ..fixed
                    };
                    if *c != want {
                        return Err(first_diff(&enc, &page_bytes(&ModePage::Control(want)), off));
                    }
                    next.d_sense = c.d_sense;
                    next.swp = c.swp;
                    sent.control = true;
                }
                ModePage::InformationalExceptions(ie) => {
                    if *ie != InformationalExceptionsPage::default() {
                        let want =
                            page_bytes(&ModePage::InformationalExceptions(Default::default()));
                        return Err(first_diff(&enc, &want, off));
                    }
                }
                ModePage::Other { .. } => return Err(invalid_param(off as u16, Some(5))),
            }
            off += enc.len();
        }
        let cache_turned_off = {
            let mut st = self.lock();
            let was_on = st.mode.wce;
            // Only the fields of the pages sent change: a MODE SELECT of
            // another page that ran since the snapshot keeps its change.
            let next = ModeState {
                wce: if sent.caching { next.wce } else { st.mode.wce },
                d_sense: if sent.control {
                    next.d_sense
                } else {
                    st.mode.d_sense
                },
                swp: if sent.control { next.swp } else { st.mode.swp },
            };
            if st.mode != next {
                info!(
                    initiator = %req.nexus.initiator_port,
                    wce = next.wce,
                    d_sense = next.d_sense,
                    swp = next.swp,
                    "mode parameters changed"
                );
                st.mode = next;
                st.ua
                    .push_others(Some(req.nexus), Asc::MODE_PARAMETERS_CHANGED);
            }
            was_on && !next.wce
        };
        if cache_turned_off {
            // With WCE=0 every write acknowledged is on the medium, and an
            // initiator that sees write-through sends no SYNCHRONIZE CACHE
            // for what it wrote while the cache was on: that goes to the
            // medium before the change is acknowledged, as a disk empties
            // its cache when it is turned off.
            // A failed flush fails the command, and the cache stays off:
            // write-through is the safe side of the disagreement (turned
            // back on, it could hold writes another initiator has made
            // since, believing them on the medium).
            self.flush().map_err(|e| {
                warn!(error = %e, "flush on turning the write cache off failed");
                backstore_failure(&e, true, 0)
            })?;
        }
        Ok(Done::out(len as u64))
    }
}

/// The changeable pages a MODE SELECT parameter list holds.
#[derive(Default)]
struct SentPages {
    caching: bool,
    control: bool,
}

fn page_bytes(p: &ModePage) -> Vec<u8> {
    let mut v = Vec::new();
    p.encode_into(&mut v);
    v
}

/// INVALID FIELD IN PARAMETER LIST at the first byte where the page sent
/// differs from what may be set (a field that is not changeable).
fn first_diff(sent: &[u8], allowed: &[u8], base: usize) -> Failure {
    let i = sent
        .iter()
        .zip(allowed)
        .position(|(a, b)| a != b)
        .unwrap_or(0);
    let bit = sent
        .get(i)
        .zip(allowed.get(i))
        .map(|(a, b)| 7 - (a ^ b).leading_zeros() as u8);
    invalid_param((base + i) as u16, bit)
}
