//! The kernel host driver's shared-area records (`blockwire_initiator::kernel_host`):
//! whatever bytes sit in a slot or an event, decoding never panics, never
//! accepts a CDB outside 1..=16 bytes or data beyond the host's largest
//! transfer, and an answer written into a decoded slot leaves the command's
//! fields as they were.
#![no_main]

use blockwire_initiator::kernel_host::{
    Direction, Event, HostStatus, SlotAnswer, SlotCommand, MAX_CDB, SLOT_BYTES,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let max_io = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) % (2 << 20);
    let rest = &data[4..];
    let _ = Event::decode(rest);
    let Ok(cmd) = SlotCommand::decode(rest, max_io) else {
        return;
    };
    assert!((1..=MAX_CDB).contains(&cmd.cdb.len()));
    assert!(cmd.data_len <= max_io);
    assert!(cmd.dir != Direction::None || cmd.data_len == 0);
    let mut slot = vec![0u8; SLOT_BYTES];
    let n = rest.len().min(SLOT_BYTES);
    slot[..n].copy_from_slice(&rest[..n]);
    let answer = SlotAnswer {
        host: HostStatus::Ok,
        status: 2,
        sense: rest.to_vec(),
        resid: cmd.data_len,
    };
    answer.write_into(&mut slot);
    assert_eq!(SlotCommand::decode(&slot, max_io), Ok(cmd));
    assert_eq!(SlotAnswer::read_from(&slot).sense.len(), rest.len().min(96));
});
