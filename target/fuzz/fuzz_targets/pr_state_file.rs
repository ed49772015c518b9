//! The persistent reservations' APTPL file reader on arbitrary bytes: what
//! a crash, a bad disk or a hand edit may leave where a logical unit reads
//! its registrations back at start-up. Beyond "no panic", whatever the
//! reader accepts must be a state the device server could hold (no nexus
//! with two registrations, no more than a unit keeps, a reservation held by
//! one of them) and must be written back as it was read. The first input
//! byte picks whether the rest follows the file's first line (to reach the
//! records) or is the whole file.
#![no_main]

use blockwire_target::scsi::pr_state_fuzzing::read_pr_state_file;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    // A file that is not UTF-8 is never read as records (read_to_string
    // refuses it), so only text reaches the reader.
    let Ok(rest) = std::str::from_utf8(rest) else {
        return;
    };
    if mode & 1 == 1 {
        read_pr_state_file(&format!("blockwire-pr 1\n{rest}"));
    } else {
        read_pr_state_file(rest);
    }
});
