//! Reservations: SPC-2 RESERVE/RELEASE and SPC-4 persistent reservations.

use std::path::Path;

use blockwire_pdu::scsi::{Asc, Cdb, PrInAction, PrOutAction};

use super::logical_unit::LogicalUnit;
use super::outcome::{illegal, CmdResult, Done, Failure};
use super::ItNexus;

/// Reservation state of one logical unit.
#[derive(Debug, Default)]
pub(crate) struct Reservations {
    /// SPC-2 reservation holder.
    spc2: Option<ItNexus>,
}

impl Reservations {
    /// State at start-up, with persisted APTPL state from `path`.
    pub fn load(_path: Option<&Path>) -> Reservations {
        Reservations::default()
    }

    /// Logical unit reset: SPC-2 reservations go.
    pub fn reset(&mut self) {
        self.spc2 = None;
    }

    /// I_T nexus loss.
    pub fn nexus_lost(&mut self, nexus: &ItNexus) {
        if self.spc2.as_ref() == Some(nexus) {
            self.spc2 = None;
        }
    }
}

impl LogicalUnit {
    pub(crate) fn reservation_check(&self, nexus: &ItNexus, cdb: &Cdb) -> Result<(), Failure> {
        let st = self.lock();
        if let Some(holder) = &st.res.spc2 {
            if holder != nexus
                && !matches!(
                    cdb,
                    Cdb::Inquiry { .. }
                        | Cdb::ReportLuns { .. }
                        | Cdb::RequestSense { .. }
                        | Cdb::Release6
                        | Cdb::Release10 { .. }
                )
            {
                return Err(Failure::Conflict);
            }
        }
        Ok(())
    }

    pub(crate) fn reserve_spc2(&self, nexus: &ItNexus) -> CmdResult {
        let mut st = self.lock();
        match &st.res.spc2 {
            Some(h) if h != nexus => Err(Failure::Conflict),
            _ => {
                st.res.spc2 = Some(nexus.clone());
                Ok(Done::none())
            }
        }
    }

    pub(crate) fn release_spc2(&self, nexus: &ItNexus) -> CmdResult {
        let mut st = self.lock();
        if st.res.spc2.as_ref() == Some(nexus) {
            st.res.spc2 = None;
        }
        Ok(Done::none())
    }

    pub(crate) fn pr_in(&self, _sa: PrInAction, _alloc: u16) -> CmdResult {
        Err(illegal(Asc::INVALID_COMMAND_OPERATION_CODE))
    }

    pub(crate) fn pr_out(
        &self,
        _nexus: &ItNexus,
        _sa: PrOutAction,
        _scope: u8,
        _ty: u8,
        _len: u32,
        _data: &[u8],
    ) -> CmdResult {
        Err(illegal(Asc::INVALID_COMMAND_OPERATION_CODE))
    }
}
