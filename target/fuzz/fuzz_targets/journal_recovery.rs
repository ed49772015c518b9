//! The atomic-write journal's recovery parser on arbitrary bytes: what a
//! crash, a bad disk or anyone with write access may leave in the sidecar
//! file. Beyond "no panic", every record recovery would replay must be
//! whole: its data as long as its header says, within the slot and the
//! backing file, with a matching checksum. The first input byte picks
//! whether the rest follows a valid file header (to reach the slots) or is
//! the whole file.
#![no_main]

use blockwire_pdu::digest::crc32c_digest;
use blockwire_target::backstore::journal::{
    encode_file_header, parse_slot, pending_records, Geometry, Slot,
};
use libfuzzer_sys::fuzz_target;

fn check(slot: &Slot<'_>, slot_data: u32, capacity: u64) {
    if let Slot::Pending { header, data } = slot {
        assert_eq!(data.len(), header.len as usize);
        assert!(header.len > 0 && header.len <= slot_data);
        assert_eq!(crc32c_digest(data), header.data_crc);
        assert!(header
            .offset
            .checked_add(u64::from(header.len))
            .is_some_and(|e| e <= capacity));
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let capacity = u64::from(mode) << 12;
    // One slot's bytes alone.
    check(&parse_slot(rest, 1024, capacity), 1024, capacity);
    let g = Geometry {
        slots: u32::from(mode & 3) + 1,
        slot_data: 512,
    };
    let image = if mode & 0x80 != 0 {
        let mut image = encode_file_header(g);
        image.extend_from_slice(rest);
        image
    } else {
        rest.to_vec()
    };
    if let Ok((pending, _)) = pending_records(&image, capacity) {
        let mut last = 0;
        for (i, s) in &pending {
            assert!(*i < 64);
            if let Slot::Pending { header, .. } | Slot::OutOfRange(header) = s {
                assert!(header.seq >= last, "replayed out of order");
                last = header.seq;
            }
            // The geometry recovery used is the one in the header.
            if mode & 0x80 != 0 {
                check(s, g.slot_data, capacity);
            }
        }
    }
});
