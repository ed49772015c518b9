//! The reader of a target's saved ALUA states (the groups initiators set
//! with SET TARGET PORT GROUPS, put back at start-up) on arbitrary bytes:
//! what a crash, a bad disk or a hand edit may leave in the file. Beyond
//! "no panic", whatever it accepts names each group once and is written
//! back as it was read. The first input byte picks whether the rest
//! follows the file's first line (to reach the records) or is the whole
//! file.
#![no_main]

use blockwire_target::scsi::alua_state_fuzzing::read_alua_state_file;
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
        read_alua_state_file(&format!("blockwire-alua 1\n{rest}"));
    } else {
        read_alua_state_file(rest);
    }
});
