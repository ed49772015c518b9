//! The configuration checker on arbitrary text: what `blockwire-target
//! --check` runs, and the first step of every start and every live change
//! (`config.reload`, the control API's edits). A configuration file is
//! written by people and by tools, so no text may panic the daemon or make
//! it allocate in proportion to a number in it; every problem it reports
//! must point at a line of the text and say, on one line, what to fix. The first byte
//! picks `--no-disk` (every LUN a pattern) or the real backstore kinds,
//! whose dry run still sizes RAM LUNs' chunk tables, and whether the text
//! follows a valid portal group, target and LUN header, so that mutations
//! reach the LUN's own fields (backstore, size, block size, modes, paths)
//! without having to invent the rest. Files named in the text are only
//! looked at (metadata), never opened for writing: the check has no side
//! effects. `--listen` replaces the text's addresses where it writes them:
//! the text keeps its lines and reads as the document with the override.
#![no_main]

use blockwire_mgmt::config::{LoadOptions, TargetConfig};
use blockwire_mgmt::live::{override_listen, override_listen_text, parse_doc};
use libfuzzer_sys::fuzz_target;

/// A portal group, a target and the start of its LUN 0.
const LUN_PREFIX: &str = "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n\
    [[target]]\nname = \"iqn.2026-11.io.blockwire:fuzz\"\n\n[[target.lun]]\nid = 0\n";

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else {
        return;
    };
    let Ok(rest) = std::str::from_utf8(rest) else {
        return;
    };
    let text = if mode & 2 == 2 {
        format!("{LUN_PREFIX}{rest}")
    } else {
        rest.to_owned()
    };
    let text = text.as_str();
    let opts = LoadOptions {
        no_disk: mode & 1 == 1,
    };
    let report = TargetConfig::check_str("fuzz.toml", text, opts);
    // A file of n lines ends on line n, or n + 1 after a final newline.
    let last_line = text.split('\n').count();
    for e in report.errors.iter().chain(&report.notices) {
        assert_eq!(e.file, "fuzz.toml");
        assert!(e.line <= last_line, "line {} of {last_line}: {e}", e.line);
        assert!(!e.field.is_empty() && !e.message.is_empty(), "{e:?}");
        assert!(!e.message.contains('\n'), "a message on one line: {e:?}");
    }
    let listen = "127.0.0.3:3261".parse().expect("an address");
    if let Some(out) = override_listen_text(text, listen) {
        assert_eq!(out.matches('\n').count(), text.matches('\n').count(), "{text:?} became {out:?}");
        let mut doc = parse_doc("fuzz.toml", text).expect("text whose portal groups were read parses");
        override_listen(&mut doc, listen);
        // Compared as rendered: a NaN in the text is not equal to itself.
        let read = parse_doc("fuzz.toml", &out).expect("the text with the override parses");
        assert_eq!(toml::to_string(&read).ok(), toml::to_string(&doc).ok(), "{text:?} became {out:?}");
    }
});
