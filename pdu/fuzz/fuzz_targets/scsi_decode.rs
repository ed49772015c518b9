//! Feeds arbitrary bytes to every SCSI decoder: CDBs (which must re-encode
//! to a CDB that decodes to the same command), sense data, the iSCSI sense
//! segment, INQUIRY and VPD data, capacity data, mode parameters, log pages,
//! UNMAP and PERSISTENT RESERVE OUT parameter lists.
#![no_main]

use blockwire_pdu::scsi::*;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(cdb) = Cdb::decode(bytes) {
        let again = cdb.encode();
        assert_eq!(Cdb::decode(&again).expect("re-encoded CDB must decode"), cdb);
        let _ = cdb.transfer_length();
        let _ = cdb.data_direction();
    }
    let _ = Sense::decode(bytes);
    let _ = parse_sense_segment(bytes);
    let _ = StandardInquiry::decode(bytes);
    let _ = Vpd::decode(bytes);
    let _ = ReadCapacity10::decode(bytes);
    let _ = ReadCapacity16::decode(bytes);
    let _ = ReportLuns::decode(bytes);
    let _ = ModeParameters::decode6(bytes);
    let _ = ModeParameters::decode10(bytes);
    let _ = UnmapList::decode(bytes);
    if let Ok(page) = LogPage::decode(bytes) {
        // What decodes re-encodes to bytes that decode to the same page.
        assert_eq!(LogPage::decode(&page.encode()), Ok(page.clone()));
        for p in page.parameter(1).into_iter().chain(page.parameter(2)) {
            let _ = ResourceCount::from_parameter(p);
        }
    }
    if let Some((&action, rest)) = bytes.split_first() {
        if let Some(action) = PrOutAction::from_code(action & 0x1f) {
            let _ = PrOutData::decode(action, rest);
        }
        let _ = PrOutParameters::transport_id_offsets(rest);
    }
});
