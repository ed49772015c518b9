//! The persistent reservations' APTPL file reader on arbitrary bytes: what
//! a crash, a bad disk or a hand edit may leave where a logical unit reads
//! its registrations back at start-up. Beyond "no panic", whatever the
//! reader accepts must be a state the device server could hold (no nexus
//! with two registrations, no more than a unit keeps, a reservation held by
//! one of them) and must be written back as it was read.
#![no_main]

use blockwire_target::scsi::pr_state_fuzzing::read_pr_state_file;
use libfuzzer_sys::fuzz_target;

#[path = "../common/saved_text.rs"]
mod saved_text;

fuzz_target!(|input: &[u8]| {
    // Both versions of the file: the first (no end line) is still read.
    let header = match input.first() {
        Some(mode) if mode & 2 == 2 => "blockwire-pr 2",
        _ => "blockwire-pr 1",
    };
    saved_text::as_saved_text(input, header, read_pr_state_file);
});
