//! START STOP UNIT, PREVENT ALLOW MEDIUM REMOVAL and READ DEFECT DATA: the
//! unit's medium state: fixed, or a removable medium that can be ejected
//! and loaded (`LuConfig::removable`). Path state, REPORT TARGET PORT
//! GROUPS, lives in `alua`.

use blockwire_pdu::scsi::Asc;

use super::logical_unit::LogicalUnit;
use super::outcome::{illegal, internal_failure, invalid_cdb, CmdResult, Done};
use super::ItNexus;

impl LogicalUnit {
    /// START STOP UNIT (SBC-3 5.25). Plain start/stop (LOEJ=0) changes
    /// nothing: a virtual disk has no spindle, and initiators expect it to
    /// stay ready.
    ///
    /// A fixed medium (RMB=0) cannot be ejected: LOEJ with START=0 is
    /// refused, with MEDIUM REMOVAL PREVENTED while a nexus prevents
    /// removal, otherwise as an invalid LOEJ field; power conditions other
    /// than the SBC-4 table 90 ones are an invalid field.
    ///
    /// A removable medium (RMB=1) is ejected (START=0) and loaded
    /// (START=1) by LOEJ=1; while any nexus prevents removal both are
    /// refused with MEDIUM REMOVAL PREVENTED (SBC-3 5.13, PREVENT ALLOW
    /// MEDIUM REMOVAL). Ejecting writes
    /// the cache back first unless NO_FLUSH is set; loading tells the
    /// other nexuses NOT READY TO READY CHANGE, MEDIUM MAY HAVE CHANGED
    /// (SAM-5 unit attention conditions). A non-zero POWER CONDITION makes the device server
    /// ignore LOEJ and START (SBC-3 5.25); with no power states to emulate
    /// a removable unit accepts every value there, as the MMC devices that
    /// usually carry removable media define values SBC-4 reserves.
    pub(crate) fn start_stop_unit(
        &self,
        nexus: &ItNexus,
        power_condition: u8,
        no_flush: bool,
        loej: bool,
        start: bool,
    ) -> CmdResult {
        if !self.cfg.removable {
            // SBC-3 table 90: 0 START_VALID, 1 ACTIVE, 2 IDLE, 3 STANDBY,
            // 7 LU_CONTROL, Ah FORCE_IDLE_0, Bh FORCE_STANDBY_0.
            if !matches!(power_condition, 0 | 1 | 2 | 3 | 7 | 0xa | 0xb) {
                return Err(invalid_cdb(4, Some(7)));
            }
            if power_condition == 0 && loej && !start {
                let prevented = !self.lock().prevent.is_empty();
                tracing::info!(initiator = %nexus.initiator_port, prevented, "eject refused");
                if prevented {
                    return Err(illegal(Asc::MEDIUM_REMOVAL_PREVENTED));
                }
                return Err(invalid_cdb(4, Some(1)));
            }
            return Ok(Done::none());
        }
        if power_condition != 0 || !loej {
            return Ok(Done::none());
        }
        if !self.lock().prevent.is_empty() {
            tracing::info!(initiator = %nexus.initiator_port, load = start, "medium removal prevented");
            return Err(illegal(Asc::MEDIUM_REMOVAL_PREVENTED));
        }
        if !start && !no_flush {
            self.flush().map_err(|e| {
                tracing::warn!(error = %e, "flush before eject failed");
                internal_failure()
            })?;
        }
        let mut st = self.lock();
        if !st.prevent.is_empty() {
            return Err(illegal(Asc::MEDIUM_REMOVAL_PREVENTED));
        }
        let was = st.medium_present;
        st.medium_present = start;
        if start && !was {
            st.ua
                .push_others(Some(nexus), Asc::NOT_READY_TO_READY_CHANGE);
        }
        if was != start {
            tracing::info!(initiator = %nexus.initiator_port, "medium {}", if start { "loaded" } else { "ejected" });
        }
        Ok(Done::none())
    }

    /// PREVENT ALLOW MEDIUM REMOVAL (SBC-3): kept per nexus (removal
    /// is prevented while any nexus prevents it; nexus loss, logical unit
    /// reset and target reset clear it); PREVENT values 2 and 3 are
    /// obsolete and refused. Works with the medium out too.
    pub(crate) fn prevent_allow(&self, nexus: &ItNexus, prevent: u8) -> CmdResult {
        let mut st = self.lock();
        match prevent {
            0 => {
                st.prevent.remove(nexus);
            }
            1 => {
                st.prevent.insert(nexus.clone());
            }
            _ => return Err(invalid_cdb(4, Some(1))),
        }
        Ok(Done::none())
    }
}

/// READ DEFECT DATA (10) opcode (SBC-3 5.13).
pub(crate) const READ_DEFECT_DATA_10: u8 = 0x37;
/// READ DEFECT DATA (12) opcode (SBC-3 5.14).
pub(crate) const READ_DEFECT_DATA_12: u8 = 0xb7;

impl LogicalUnit {
    /// READ DEFECT DATA (10/12) from the raw CDB (the PDU crate does not
    /// decode it). A virtual disk has no defects: both the primary and the
    /// grown list are reported valid and empty, in the format asked for
    /// (short block, extended bytes from index, extended physical sector,
    /// bytes from index, physical sector, vendor specific); reserved
    /// formats are an invalid field.
    pub(crate) fn read_defect_data(&self, cdb: &[u8]) -> CmdResult {
        let twelve = cdb.first() == Some(&READ_DEFECT_DATA_12);
        let need = if twelve { 12 } else { 10 };
        if cdb.len() < need {
            return Err(invalid_cdb(0, None));
        }
        let (flags_byte, alloc) = if twelve {
            (cdb[1], u32::from_be_bytes([cdb[6], cdb[7], cdb[8], cdb[9]]))
        } else {
            (cdb[2], u32::from(u16::from_be_bytes([cdb[7], cdb[8]])))
        };
        let req_plist = flags_byte & 0x10 != 0;
        let req_glist = flags_byte & 0x08 != 0;
        let format = flags_byte & 0x07;
        if matches!(format, 1 | 2 | 7) {
            return Err(invalid_cdb(if twelve { 1 } else { 2 }, Some(2)));
        }
        let flags = (u8::from(req_plist) << 4) | (u8::from(req_glist) << 3) | format;
        // Header only: DEFECT LIST LENGTH 0 (10: 2 bytes; 12: a generation
        // code, then 4 bytes).
        let data = if twelve {
            vec![0, flags, 0, 0, 0, 0, 0, 0]
        } else {
            vec![0, flags, 0, 0]
        };
        Ok(Done::data(data, alloc))
    }
}
