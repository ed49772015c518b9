//! The reader of a target's saved ALUA states (the groups initiators set
//! with SET TARGET PORT GROUPS, put back at start-up) on arbitrary bytes:
//! what a crash, a bad disk or a hand edit may leave in the file. Beyond
//! "no panic", whatever it accepts names each group once and is written
//! back as it was read.
#![no_main]

use blockwire_target::scsi::alua_state_fuzzing::read_alua_state_file;
use libfuzzer_sys::fuzz_target;

#[path = "../common/saved_text.rs"]
mod saved_text;

fuzz_target!(|input: &[u8]| {
    saved_text::as_saved_text(input, "blockwire-alua 1", read_alua_state_file);
});
