//! The configuration's parsing, checks and build, against TOML texts.

use super::check::writable;
use super::*;
use blockwire_target::iscsi::catalog::DataPathPolicy;

#[test]
fn sizes() {
    assert_eq!(parse_size("1G"), Some(1 << 30));
    assert_eq!(parse_size("512m"), Some(512 << 20));
    assert_eq!(parse_size("4096"), Some(4096));
    assert_eq!(parse_size("x"), None);
}

#[test]
fn a_ram_lun_past_a_pebibyte_is_refused_by_name_before_anything_is_built() {
    let text = |size: &str| {
        format!(
            "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n[[target]]\n\
             name = \"iqn.2026-11.io.blockwire:t\"\n\n[[target.lun]]\nid = 0\n\
             backstore = \"ram\"\nsize = \"{size}\"\n"
        )
    };
    // A typo's worth of digits used to build a chunk table of its size
    // (and abort when that could not be had).
    for size in ["1025T", "16000000T", "18446744073709551615"] {
        let e = TargetConfig::from_str("t.toml", &text(size)).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (11, "target.lun.size"), "{e}");
        assert!(e.message.contains("at most 1 PiB"), "{e}");
        assert_eq!(fields(&check(&text(size))), vec![(11, "target.lun.size")]);
    }
    // The largest one is thin: its check and its start allocate no data.
    assert!(check(&text("1024T")).errors.is_empty());
    let b = TargetConfig::from_str("t.toml", &text("1024T")).unwrap();
    let lu = b.catalog.targets[0].luns.get(0).unwrap();
    assert_eq!(lu.config().backstore.size(), 1 << 50);
}

#[test]
fn every_syntax_error_says_what_is_wrong_on_one_line() {
    // A control character in a comment: the parser's words (toml 1; toml
    // 0.8 had none, and the error then named what stands at its column).
    let e = TargetConfig::from_str("t.toml", "[fabric]\n# a note\u{e}\n").unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (2, "syntax"));
    assert!(
        e.message.contains("comment character") && !e.message.contains('\n'),
        "{e}"
    );
    // Where the parser has several lines of words, one line joins them.
    let e = TargetConfig::from_str("t.toml", "[fabric]\n[fabric]\n").unwrap_err();
    assert_eq!(e.line, 2);
    assert!(!e.message.is_empty() && !e.message.contains('\n'), "{e:?}");
    let e = TargetConfig::from_str("t.toml", "[fabric]\nqueue_depth = ").unwrap_err();
    assert!(!e.message.is_empty() && !e.message.contains('\n'), "{e:?}");
}

#[test]
fn errors_name_file_line_and_field() {
    let text = "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n[[target]]\nname = \"iqn.2026-11.io.blockwire:t\"\n\n[[target.lun]]\nid = 0\nbackstore = \"tape\"\nsize = \"1M\"\n";
    let e = TargetConfig::from_str("t.toml", text).unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (10, "target.lun.backstore"));
    assert!(
        e.to_string()
            .starts_with("t.toml:10: target.lun.backstore:"),
        "{e}"
    );

    let e = TargetConfig::from_str(
        "t.toml",
        "[[portal_group]]\ntag = 1\nlisten = [\"nowhere\"]\n",
    )
    .unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (3, "portal_group.listen"));

    let e = TargetConfig::from_str("t.toml", "[fabric]\nqueue_dpth = 3\n").unwrap_err();
    assert_eq!(e.line, 2);
    assert!(e.message.contains("queue_dpth"), "{e}");
}

fn one_lun(lun: &str) -> String {
    format!("[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n[[target]]\nname = \"iqn.2026-11.io.blockwire:t\"\n\n[[target.lun]]\nid = 0\n{lun}")
}

/// The data path policy of LUN `lun` of the first target, if it has one.
fn policy(b: &Built, lun: u16) -> Option<DataPathPolicy> {
    b.catalog.targets[0]
        .data_paths
        .iter()
        .find(|(l, _)| *l == lun)
        .map(|(_, p)| *p)
}

#[test]
fn zero_copy_sendfile_on_cached_file_luns_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("z.img");
    let lun = |extra: &str| {
        one_lun(&format!(
            "backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\n{extra}"
        ))
    };
    let sendfiles = |extra: &str| {
        TargetConfig::from_str("t.toml", &lun(extra))
            .map(|b| usize::from(policy(&b, 0).is_some_and(|p| p.sendfile)))
            .unwrap_or_else(|e| panic!("{e}"))
    };
    assert_eq!(sendfiles(""), 1, "cached file LUNs use sendfile by default");
    assert_eq!(sendfiles("zero_copy = true\n"), 1);
    assert_eq!(sendfiles("zero_copy = false\n"), 0, "the copy path");
    assert_eq!(sendfiles("sync_send = true\n"), 0, "the engine path");
    assert_eq!(sendfiles("mode = \"direct\"\n"), 0, "the engine path");
    let e = TargetConfig::from_str(
        "t.toml",
        &one_lun("backstore = \"ram\"\nsize = \"1M\"\nzero_copy = true\n"),
    )
    .unwrap_err();
    assert_eq!(e.field, "target.lun.zero_copy", "{e}");
    let b = TargetConfig::from_str(
        "t.toml",
        &format!("[fabric]\nzero_copy_send = false\n{}", lun("")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(!b.settings.zero_copy_send);
    let b = TargetConfig::from_str("t.toml", &lun("")).unwrap();
    assert!(b.settings.zero_copy_send, "zero-copy sends on by default");
    assert!(
        b.settings.local_copy_sends,
        "copying sends to local initiators by default"
    );
    let b = TargetConfig::from_str(
        "t.toml",
        &format!("[fabric]\nlocal_copy_sends = false\n{}", lun("")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(!b.settings.local_copy_sends);
}

/// A configuration of one RAM LUN with `fabric` (a `[fabric]` table or
/// nothing) before it.
fn with_fabric(fabric: &str) -> Result<Built, ConfigError> {
    TargetConfig::from_str(
        "t.toml",
        &format!(
            "{fabric}{}",
            one_lun("backstore = \"ram\"\nsize = \"1M\"\n")
        ),
    )
}

#[test]
fn busy_polling_is_on_by_default_off_at_zero_and_bounded() {
    let b = with_fabric("").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        b.settings.busy_poll,
        Some(std::time::Duration::from_micros(50)),
        "50 us by default"
    );
    let b = with_fabric("[fabric]\nbusy_poll_us = 0\n").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(b.settings.busy_poll, None, "0 is off");
    let b = with_fabric("[fabric]\nbusy_poll_us = 200\n").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        b.settings.busy_poll,
        Some(std::time::Duration::from_micros(200))
    );
    let e = with_fabric("[fabric]\nbusy_poll_us = 5000\n").unwrap_err();
    assert_eq!(e.field, "fabric.busy_poll_us", "{e}");
    assert!(e.to_string().contains("more than 1000"), "{e}");
}

#[test]
fn connections_get_a_thread_per_cpu_by_default_the_shared_workers_at_zero() {
    let cpus = std::thread::available_parallelism().unwrap().get();
    let b = with_fabric("").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        b.settings.connection_threads, cpus,
        "one per CPU by default"
    );
    let b = with_fabric("[fabric]\nconnection_threads = 0\n").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(b.settings.connection_threads, 0, "0: the shared workers");
    let b = with_fabric("[fabric]\nconnection_threads = 3\n").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(b.settings.connection_threads, 3);
    let e = with_fabric("[fabric]\nconnection_threads = 5000\n").unwrap_err();
    assert_eq!(e.field, "fabric.connection_threads", "{e}");
    assert!(e.to_string().contains("one per CPU"), "{e}");
}

#[test]
fn sync_send_only_on_file_luns_with_a_valid_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("s.img");
    let b = TargetConfig::from_str(
        "t.toml",
        &one_lun(&format!("backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\nmode = \"direct\"\nsync_send = true\nsync_chunk = \"128K\"\n")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let p = policy(&b, 0).expect("a data path policy");
    assert_eq!(p.chunk, 128 << 10);
    assert_eq!(
        p.engine_reads,
        Some(blockwire_target::datapath::Mode::Synchronized)
    );
    let off = TargetConfig::from_str(
        "t.toml",
        &one_lun(&format!(
            "backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\n"
        )),
    )
    .unwrap();
    assert!(
        policy(&off, 0).is_none_or(|p| p.engine_reads.is_none()),
        "off by default on cached LUNs"
    );
    // A direct LUN always reads through the engine: serial without
    // sync_send (the baseline on registered buffers).
    let direct = TargetConfig::from_str(
        "t.toml",
        &one_lun(&format!(
            "backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\nmode = \"direct\"\n"
        )),
    )
    .unwrap();
    assert_eq!(
        policy(&direct, 0).and_then(|p| p.engine_reads),
        Some(blockwire_target::datapath::Mode::Serial)
    );
    let e = TargetConfig::from_str(
        "t.toml",
        &one_lun("backstore = \"ram\"\nsize = \"1M\"\nsync_send = true\n"),
    )
    .unwrap_err();
    assert_eq!(e.field, "target.lun.sync_send", "{e}");
    let e = TargetConfig::from_str(
        "t.toml",
        &one_lun(&format!(
            "backstore = \"file\"\npath = {img:?}\nsync_send = true\nsync_chunk = \"3K\"\n"
        )),
    )
    .unwrap_err();
    assert_eq!(e.field, "target.lun.sync_chunk", "{e}");
}

#[test]
fn striped_luns_and_their_errors() {
    use blockwire_target::datapath::{Mode, Source};
    let dir = tempfile::tempdir().unwrap();
    let m = |i: usize| dir.path().join(format!("m{i}.img"));
    let members = format!("paths = [{:?}, {:?}, {:?}]\n", m(0), m(1), m(2));
    // Cached, default 64K stripe, no sync_send: the core path.
    let b = TargetConfig::from_str(
        "t.toml",
        &one_lun(&format!(
            "backstore = \"striped\"\n{members}size = \"3M\"\n"
        )),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(policy(&b, 0), None, "the core path");
    let lu = b.catalog.targets[0].luns.get(0).unwrap().config().clone();
    assert_eq!(lu.backstore.size(), 3 << 20);
    assert!(lu.backstore.describe().starts_with("striped 3 x 64 KiB"));
    assert_eq!(std::fs::metadata(m(2)).unwrap().len(), 1 << 20);
    // Direct with sync_send: engine path, one stream per member.
    let b = TargetConfig::from_str(
        "t.toml",
        &one_lun(&format!("backstore = \"striped\"\n{members}size = \"3M\"\nmode = \"direct\"\nstripe_chunk = \"128K\"\nsync_send = true\nsync_chunk = \"256K\"\n")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let p = policy(&b, 0).expect("a data path policy");
    assert_eq!(
        (p.chunk, p.engine_reads),
        (256 << 10, Some(Mode::Synchronized))
    );
    let store = b.catalog.targets[0]
        .luns
        .get(0)
        .unwrap()
        .config()
        .backstore
        .clone();
    let (source, _) = store.engine_source().unwrap().expect("the engine reads it");
    match &source {
        Source::Striped { files, layout } => {
            assert_eq!((files.len(), layout.stripe), (3, 128 << 10))
        }
        other => panic!("{other:?}"),
    }
    // Direct without sync_send: the engine's serial baseline.
    let b = TargetConfig::from_str(
        "t.toml",
        &one_lun(&format!(
            "backstore = \"striped\"\n{members}mode = \"direct\"\nstripe_chunk = \"128K\"\n"
        )),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        policy(&b, 0).and_then(|p| p.engine_reads),
        Some(Mode::Serial)
    );
    assert_eq!(
        b.catalog.targets[0]
            .luns
            .get(0)
            .unwrap()
            .config()
            .backstore
            .size(),
        3 << 20,
        "size from the members"
    );

    let bad = |lun: String| TargetConfig::from_str("t.toml", &one_lun(&lun)).expect_err(&lun);
    let e = bad(format!(
        "backstore = \"striped\"\npaths = [{:?}]\nsize = \"1M\"\n",
        m(0)
    ));
    assert_eq!((e.line, e.field.as_str()), (11, "target.lun.paths"), "{e}");
    assert!(e.message.contains("at least 2"), "{e}");
    let e = bad("backstore = \"striped\"\nsize = \"1M\"\n".into());
    assert_eq!(e.field, "target.lun.paths", "{e}");
    for (chunk, why) in [
        ("3K", "power of two"),
        ("1K\"\nmode = \"direct", "at least 4K"),
        ("64M", "power of two"),
        ("lots", "not a size"),
    ] {
        let e = bad(format!(
            "backstore = \"striped\"\n{members}size = \"3M\"\nstripe_chunk = \"{chunk}\"\n"
        ));
        assert_eq!(
            (e.line, e.field.as_str()),
            (13, "target.lun.stripe_chunk"),
            "{e}"
        );
        assert!(e.message.contains(why), "{chunk}: {e}");
    }
    let e = bad(format!("backstore = \"striped\"\n{members}size = \"3M\"\nblock_size = 4096\nstripe_chunk = \"2K\"\n"));
    assert_eq!(e.field, "target.lun.stripe_chunk", "{e}");
    assert!(e.message.contains("4096-byte block"), "{e}");
    let e = bad(format!(
        "backstore = \"file\"\npath = {:?}\n{members}",
        m(0)
    ));
    assert_eq!((e.line, e.field.as_str()), (12, "target.lun.paths"), "{e}");
    let e = bad(format!(
        "backstore = \"file\"\npath = {:?}\nstripe_chunk = \"64K\"\n",
        m(0)
    ));
    assert_eq!(e.field, "target.lun.stripe_chunk", "{e}");
    // A member of another size: refused, naming it.
    std::fs::OpenOptions::new()
        .write(true)
        .open(m(1))
        .unwrap()
        .set_len(4096)
        .unwrap();
    let e = bad(format!("backstore = \"striped\"\n{members}size = \"3M\"\n"));
    assert_eq!((e.line, e.field.as_str()), (11, "target.lun.paths"), "{e}");
    assert!(e.message.contains("m1.img is 4096 bytes"), "{e}");
}

#[test]
fn no_disk_serves_the_pattern_and_opens_no_file() {
    use blockwire_target::datapath::source::pattern_byte;
    use blockwire_target::datapath::Source;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("never.img");
    let m = |i: usize| dir.path().join(format!("s{i}.img"));
    let text = format!(
        "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n[[target]]\nname = \"iqn.2026-11.io.blockwire:t\"\n\n\
         [[target.lun]]\nid = 0\nbackstore = \"file\"\npath = {img:?}\nsize = \"1M\"\nmode = \"direct\"\n\n\
         [[target.lun]]\nid = 1\nbackstore = \"ram\"\nsize = \"1M\"\n\n\
         [[target.lun]]\nid = 2\nbackstore = \"striped\"\npaths = [{:?}, {:?}]\nsize = \"1M\"\nsync_send = true\n",
        m(0),
        m(1)
    );
    let b = TargetConfig::from_str_with("t.toml", &text, LoadOptions { no_disk: true })
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(b.no_disk);
    assert!(
        !img.exists() && !m(0).exists(),
        "no backstore file is created"
    );
    let paths = &b.catalog.targets[0].data_paths;
    assert!(paths
        .iter()
        .all(|(_, p)| !p.sendfile && !p.double_buffered_writes));
    let engine: Vec<u16> = paths
        .iter()
        .filter(|(_, p)| p.engine_reads.is_some())
        .map(|(l, _)| *l)
        .collect();
    assert_eq!(engine, [0, 2], "the engine-path LUNs");
    for lun in engine {
        let store = b.catalog.targets[0]
            .luns
            .get(lun)
            .unwrap()
            .config()
            .backstore
            .clone();
        let source = store.engine_source().unwrap().map(|(s, _)| s);
        assert!(matches!(source, Some(Source::Pattern)), "LUN {lun}");
    }
    for lun in 0..3 {
        let store = b.catalog.targets[0]
            .luns
            .get(lun)
            .unwrap()
            .config()
            .backstore
            .clone();
        assert_eq!(store.size(), 1 << 20);
        store.write_at(4096, &[0u8; 512]).unwrap();
        let mut back = [0u8; 512];
        store.read_at(4096, &mut back).unwrap();
        assert!(
            back.iter()
                .enumerate()
                .all(|(i, &v)| v == pattern_byte(4096 + i as u64)),
            "LUN {lun}"
        );
    }
    // Without the option the same text creates the files.
    TargetConfig::from_str("t.toml", &text).unwrap_or_else(|e| panic!("{e}"));
    assert!(img.exists() && m(1).exists());
}

#[test]
fn sync_write_only_on_file_luns() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("w.img");
    let b = TargetConfig::from_str(
        "t.toml",
        &one_lun(&format!("backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\nsync_write = true\nsync_chunk = \"256K\"\n")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let p = policy(&b, 0).expect("a data path policy");
    assert!(p.double_buffered_writes);
    assert_eq!(p.chunk, 256 << 10);
    let store = b.catalog.targets[0]
        .luns
        .get(0)
        .unwrap()
        .config()
        .backstore
        .clone();
    assert_eq!(
        store.capabilities().file,
        Some(blockwire_target::backstore::StoreFile {
            path: img.clone(),
            direct: false
        }),
        "the double-buffered path writes the store's own file"
    );
    let off = TargetConfig::from_str(
        "t.toml",
        &one_lun(&format!(
            "backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\nsync_write = false\n"
        )),
    )
    .unwrap();
    assert!(policy(&off, 0).is_none_or(|p| !p.double_buffered_writes));
    for kind in [
        "backstore = \"ram\"\nsize = \"1M\"\n",
        "backstore = \"null\"\nsize = \"1M\"\n",
    ] {
        let e = TargetConfig::from_str("t.toml", &one_lun(&format!("{kind}sync_write = true\n")))
            .unwrap_err();
        assert_eq!(e.field, "target.lun.sync_write", "{e}");
        assert!(e.message.contains("only file LUNs"), "{e}");
    }
}

#[test]
fn lun_backstores_modes_and_uuid() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("d.img");
    // null, file direct (or its announced fallback), file cached.
    for lun in [
        "backstore = \"null\"\nsize = \"1G\"\n".to_string(),
        format!("backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\nmode = \"direct\"\n"),
        format!(
            "backstore = \"file\"\npath = {img:?}\nmode = \"cached\"\nphysical_block_size = 4096\n"
        ),
    ] {
        TargetConfig::from_str("t.toml", &one_lun(&lun)).unwrap_or_else(|e| panic!("{e}"));
    }
    let e = TargetConfig::from_str(
        "t.toml",
        &one_lun("backstore = \"ram\"\nsize = \"1M\"\nmode = \"direct\"\n"),
    )
    .unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (12, "target.lun.mode"), "{e}");
    let e = TargetConfig::from_str(
        "t.toml",
        &one_lun(&format!(
            "backstore = \"file\"\npath = {img:?}\nmode = \"fast\"\n"
        )),
    )
    .unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (12, "target.lun.mode"), "{e}");
    let e = TargetConfig::from_str(
        "t.toml",
        &one_lun("backstore = \"null\"\nsize = \"1M\"\nuuid = \"nope\"\n"),
    )
    .unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (12, "target.lun.uuid"), "{e}");
    let e = TargetConfig::from_str(
        "t.toml",
        &one_lun("backstore = \"null\"\nsize = \"1M\"\nphysical_block_size = 1000\n"),
    )
    .unwrap_err();
    assert_eq!(e.field, "target.lun.physical_block_size", "{e}");
    // The UUID, not the target name, decides the identity.
    let uuid = "uuid = \"3f2504e0-4f89-11d3-9a0c-0305e82c3301\"\n";
    let lun = format!("backstore = \"null\"\nsize = \"1M\"\n{uuid}");
    let a = TargetConfig::from_str("t.toml", &one_lun(&lun)).unwrap();
    let b = TargetConfig::from_str(
        "t.toml",
        &one_lun(&lun).replace("blockwire:t", "blockwire:renamed"),
    )
    .unwrap();
    let cfg = |b: &Built| {
        let lu = b.catalog.targets[0].luns.get(0).unwrap().config().clone();
        (lu.serial, lu.naa_id)
    };
    assert_eq!(cfg(&a), cfg(&b));
    assert_eq!(cfg(&a).0, "3f2504e04f8911d39a0c0305e82c3301");
}

#[test]
fn a_path_with_a_line_break_is_reported_on_one_line() {
    let lun = "backstore = \"file\"\npath = \"/nonexistent\\nfake: line/a.img\"\nsize = \"1M\"\n";
    let r = check(&one_lun(lun));
    assert!(!r.errors.is_empty());
    for e in &r.errors {
        assert!(!e.message.contains('\n'), "{e:?}");
        assert!(e.message.contains("/nonexistent\\nfake: line"), "{e:?}");
    }
}

#[test]
fn each_unit_holds_its_files_and_identity_alone() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("a.img");
    let other = dir.path().join("b.img");
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let dotted = dir.path().join("sub/../a.img");
    let two =
        |first: &str, second: &str| format!("{}\n[[target.lun]]\nid = 1\n{second}", one_lun(first));
    let file = |p: &std::path::Path, more: &str| {
        format!("backstore = \"file\"\npath = {p:?}\nsize = \"1M\"\n{more}")
    };
    // Line 17 is LUN 1's path (or journal), 14 its header.
    let refused = [
        (two(&file(&img, ""), &file(&dotted, "")), 17, "target.lun.path", "data file of LUN 0"),
        (
            two(&file(&img, ""), &file(&other, &format!("atomic_journal = {img:?}\n"))),
            19,
            "target.lun.atomic_journal",
            "data file of LUN 0",
        ),
        (
            two(
                &file(&img, ""),
                &format!("backstore = \"striped\"\npaths = [{other:?}, {img:?}]\nsize = \"1M\"\n"),
            ),
            17,
            "target.lun.paths",
            "data file of LUN 0",
        ),
        // A protected LUN writes its tuples into its protection file: another
        // LUN's data file there would be overwritten, and two LUNs' tuples
        // in one file would fail each other's guard checks.
        (
            two(
                &file(&img, ""),
                &file(&other, &format!("protection = \"type1\"\nprotection_file = {img:?}\n")),
            ),
            20,
            "target.lun.protection_file",
            "protection information file of LUN 1 of iqn.2026-11.io.blockwire:t and also the data file of LUN 0",
        ),
        (
            two(
                &file(&img, &format!("protection = \"type1\"\nprotection_file = {:?}\n", dir.path().join("pi"))),
                &file(&other, &format!("protection = \"type1\"\nprotection_file = {:?}\n", dir.path().join("sub/../pi"))),
            ),
            22,
            "target.lun.protection_file",
            "tuples would overwrite",
        ),
        (
            two(
                "backstore = \"ram\"\nsize = \"1M\"\nuuid = \"3f2504e0-4f89-11d3-9a0c-0305e82c3301\"\n",
                "backstore = \"ram\"\nsize = \"1M\"\nuuid = \"3F2504E0-4F89-11D3-9A0C-0305E82C3301\"\n",
            ),
            18,
            "target.lun.uuid",
            "same identity",
        ),
        (
            two(
                "backstore = \"ram\"\nsize = \"1M\"\nserial = \"disk7\"\n",
                "backstore = \"ram\"\nsize = \"1M\"\nserial = \"disk7\"\n",
            ),
            14,
            "target.lun.serial",
            "serial number \"disk7\" of LUN 0",
        ),
    ];
    for (text, line, field, said) in refused {
        let e = TargetConfig::from_str("t.toml", &text).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (line, field), "{e}\n{text}");
        assert!(e.message.contains(said), "{e}");
        // --check finds a problem there too (its own check of the
        // file may come first: it reports one problem per field).
        let r = check(&text);
        assert!(fields(&r).contains(&(line, field)), "{:?}", r.errors);
    }
    // Journals apart (or off), LUNs over their own files are fine.
    let apart = two(&file(&img, ""), &file(&other, ""));
    TargetConfig::from_str("t.toml", &apart).unwrap_or_else(|e| panic!("{e}"));
    let journal_off = two(
        &file(&img, "atomic_writes = false\n"),
        &file(
            &other,
            &format!(
                "atomic_journal = {:?}\n",
                dir.path().join("a.img.atomic-journal")
            ),
        ),
    );
    TargetConfig::from_str("t.toml", &journal_off).unwrap_or_else(|e| panic!("{e}"));

    // Saved reservations and ALUA states are named after the target: two
    // names that differ only in characters a file name holds as '_' (here
    // 'é' and 'ü') would share them.
    let state = dir.path().join("state");
    let two_targets = format!(
        "[fabric]\nstate_dir = {state:?}\n\n[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n\
         [[target]]\nname = \"iqn.2026-11.io.blockwire:é\"\n[[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n\n\
         [[target]]\nname = \"iqn.2026-11.io.blockwire:ü\"\n[[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n"
    );
    let e = TargetConfig::from_str("t.toml", &two_targets).unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (16, "target.name"), "{e}");
    assert!(
        e.message
            .contains("saved ALUA states of target iqn.2026-11.io.blockwire:ü"),
        "{e}"
    );
    assert!(e.message.contains("rename one of the targets"), "{e}");
    // --check says the LUNs' reservations would be shared too.
    let said = |r: &CheckReport, what: &str| r.errors.iter().any(|e| e.message.contains(what));
    let lun0 = "saved reservations of LUN 0 of iqn.2026-11.io.blockwire:ü";
    let r = check(&two_targets);
    assert!(said(&r, lun0), "{:?}", r.errors);
    // LUNs of other numbers share no reservations, but the targets would
    // still share their ALUA states.
    let other_luns = two_targets.replacen("id = 0", "id = 1", 1);
    let r = check(&other_luns);
    assert!(!said(&r, "saved reservations"), "{:?}", r.errors);
    assert!(said(&r, "saved ALUA states of target"), "{:?}", r.errors);
    let apart = two_targets.replace("blockwire:ü", "blockwire:u");
    TargetConfig::from_str("t.toml", &apart).unwrap_or_else(|e| panic!("{e}"));
}

fn two_groups(second: &str, target_groups: &str) -> String {
    format!(
        "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n\
         [[portal_group]]\ntag = 2\nlisten = [\"127.0.0.1:3261\"]\n{second}\n\
         [[target]]\nname = \"iqn.2026-11.io.blockwire:t\"\n{target_groups}\n\
         [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n"
    )
}

#[test]
fn iser_portals_are_the_flagged_groups_addresses_with_their_tags() {
    let verbs = format!(
        "[fabric]\nrdma_backend = \"verbs\"\n{}",
        two_groups("iser = true\n", "")
    );
    let b = TargetConfig::from_str("t.toml", &verbs).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        b.iser_portals,
        vec![("127.0.0.1:3261".parse().unwrap(), 2)],
        "only group 2 asked for iSER"
    );
    let b = TargetConfig::from_str("t.toml", &two_groups("iser = \"yes\"\n", ""));
    assert!(b.is_err(), "iser takes true or false");
    // With the soft provider (RDMA over TCP) the iSER listener needs its own port.
    let soft = |second: &str| {
        TargetConfig::from_str(
            "t.toml",
            &format!(
                "[fabric]\nrdma_backend = \"soft\"\n{}",
                two_groups(second, "")
            ),
        )
    };
    let e = soft("iser = true\n").unwrap_err().to_string();
    assert!(e.contains("iser_listen") && e.contains("verbs"), "{e}");
    let e = soft("iser_listen = [\"127.0.0.1:3261\"]\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("127.0.0.1:3261"), "{e}");
    let b = soft("iser_listen = [\"127.0.0.1:3262\"]\n").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(b.iser_portals, vec![("127.0.0.1:3262".parse().unwrap(), 2)]);
}

#[test]
fn alua_one_target_port_group_per_portal_group_of_the_target() {
    let groups = |b: &Built| b.catalog.targets[0].luns.target_port_groups();
    let b = TargetConfig::from_str("t.toml", &two_groups("", "portal_groups = [2, 1]\n"))
        .unwrap_or_else(|e| panic!("{e}"));
    let g = groups(&b);
    assert_eq!(
        g.iter()
            .map(|g| (g.id, g.state, g.ports.clone()))
            .collect::<Vec<_>>(),
        vec![
            (2, AluaState::ActiveOptimized, vec![2]),
            (1, AluaState::ActiveOptimized, vec![1])
        ],
        "in the target's order (the first is preferred), relative port = TPGT"
    );
    for (state, want) in [
        ("active_optimized", AluaState::ActiveOptimized),
        ("active_non_optimized", AluaState::ActiveNonOptimized),
        ("standby", AluaState::Standby),
    ] {
        let b = TargetConfig::from_str(
            "t.toml",
            &two_groups(&format!("alua_state = \"{state}\"\n"), ""),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(groups(&b)[1].state, want);
        assert_eq!(
            groups(&b)[0].state,
            AluaState::ActiveOptimized,
            "the default"
        );
    }
    let b = TargetConfig::from_str("t.toml", &two_groups("", "portal_groups = [1]\n")).unwrap();
    assert_eq!(groups(&b).len(), 1, "only the target's own groups");
}

#[test]
fn alua_and_portal_group_errors() {
    let e = TargetConfig::from_str("t.toml", &two_groups("alua_state = \"offline\"\n", ""))
        .unwrap_err();
    assert_eq!(
        (e.line, e.field.as_str()),
        (8, "portal_group.alua_state"),
        "{e}"
    );
    assert!(
        e.message.contains("\"standby\""),
        "says what is allowed: {e}"
    );
    let e =
        TargetConfig::from_str("t.toml", &two_groups("", "portal_groups = [1, 3]\n")).unwrap_err();
    assert_eq!(
        (e.line, e.field.as_str()),
        (11, "target.portal_groups"),
        "{e}"
    );
    assert_eq!(e.message, "portal group 3 is not defined (defined: 1, 2)");
    let e =
        TargetConfig::from_str("t.toml", &two_groups("", "portal_groups = [2, 2]\n")).unwrap_err();
    assert_eq!(e.message, "portal group 2 is listed twice", "{e}");
    // No group at all: the login took that for every group.
    let e = TargetConfig::from_str("t.toml", &two_groups("", "portal_groups = []\n")).unwrap_err();
    assert_eq!(e.field, "target.portal_groups", "{e}");
    assert!(e.message.contains("lists no portal group"), "{e}");
    let e = TargetConfig::from_str("t.toml", &two_groups("alua = 1\n", "")).unwrap_err();
    assert!(e.message.contains("unknown field `alua`"), "{e}");
}

#[test]
fn a_targets_own_alua_state_comes_before_its_portal_groups_and_explicit_is_opt_in() {
    let table = |b: &Built| b.catalog.targets[0].luns.clone();
    let b = TargetConfig::from_str("t.toml", &two_groups("alua_state = \"standby\"\n", ""))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!table(&b).explicit_alua(), "implicit only by default");
    let b = TargetConfig::from_str(
        "t.toml",
        &two_groups(
            "alua_state = \"standby\"\n",
            "explicit_alua = true\n[target.alua_state]\n1 = \"standby\"\n2 = \"active_optimized\"\n",
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let t = table(&b);
    assert!(t.explicit_alua());
    assert_eq!(
        t.target_port_groups()
            .iter()
            .map(|g| (g.id, g.state))
            .collect::<Vec<_>>(),
        vec![(1, AluaState::Standby), (2, AluaState::ActiveOptimized)]
    );
    assert!(
        t.port_groups_set_by_command().is_empty(),
        "states from the configuration are implicit"
    );
}

#[test]
fn a_targets_alua_state_names_its_own_portal_groups_and_real_states() {
    let e = TargetConfig::from_str(
        "t.toml",
        &two_groups(
            "",
            "portal_groups = [1]\n[target.alua_state]\n2 = \"standby\"\n",
        ),
    )
    .unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (13, "target.alua_state"), "{e}");
    assert_eq!(
        e.message,
        "\"2\" is not a portal group of target iqn.2026-11.io.blockwire:t (its groups: 1); \
         the keys of [target.alua_state] are portal group tags"
    );
    let e = TargetConfig::from_str(
        "t.toml",
        &two_groups("", "[target.alua_state]\nfirst = \"standby\"\n"),
    )
    .unwrap_err();
    assert!(
        e.message.starts_with("\"first\" is not a portal group"),
        "{e}"
    );
    let e = TargetConfig::from_str(
        "t.toml",
        &two_groups("", "[target.alua_state]\n1 = \"passive\"\n"),
    )
    .unwrap_err();
    assert_eq!(e.field, "target.alua_state", "{e}");
    assert!(e.message.contains("\"active_non_optimized\""), "{e}");
}

#[test]
fn metrics_listen_address_is_opt_in_and_checked() {
    let lun = || one_lun("backstore = \"ram\"\nsize = \"1M\"\n");
    let b = TargetConfig::from_str(
        "t.toml",
        &format!("[metrics]\nlisten = \"127.0.0.1:9450\"\n\n{}", lun()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(b.metrics_listen, Some("127.0.0.1:9450".parse().unwrap()));
    let b = TargetConfig::from_str("t.toml", &lun()).unwrap();
    assert_eq!(b.metrics_listen, None, "no endpoint unless asked for");
    let e = TargetConfig::from_str(
        "t.toml",
        &format!("[metrics]\nlisten = \"localhost\"\n\n{}", lun()),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("t.toml:2") && e.contains("metrics.listen") && e.contains("127.0.0.1:9450"),
        "{e}"
    );
}

#[test]
fn isns_registration_is_opt_in_and_checked() {
    let lun = || one_lun("backstore = \"ram\"\nsize = \"1M\"\n");
    let with = |isns: &str| TargetConfig::from_str("t.toml", &format!("[isns]\n{isns}\n{}", lun()));
    assert_eq!(TargetConfig::from_str("t.toml", &lun()).unwrap().isns, None);
    let b = with("server = \"192.0.2.1\"\nentity = \"rack-3\"\nregistration_period_secs = 60\n")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        b.isns,
        Some(crate::config::IsnsSettings {
            server: "192.0.2.1:3205".into(),
            entity: "rack-3".into(),
            period_secs: 60,
        })
    );
    let b = with("server = \"isns.example:13205\"\n").unwrap();
    let i = b.isns.unwrap();
    assert_eq!(
        (i.server.as_str(), i.period_secs),
        ("isns.example:13205", 900)
    );
    assert!(!i.entity.is_empty(), "the host name by default");
    for (isns, field, line) in [
        ("server = \"host:0\"\n", "isns.server", "t.toml:2"),
        ("entity = \"x\"\n", "isns.entity", "t.toml:2"),
        (
            "registration_period_secs = 60\n",
            "isns.registration_period_secs",
            "t.toml:2",
        ),
        ("server = \"h\"\nentity = \"\"\n", "isns.entity", "t.toml:3"),
        (
            "server = \"h\"\nregistration_period_secs = 5\n",
            "isns.registration_period_secs",
            "t.toml:3",
        ),
    ] {
        let e = with(isns).unwrap_err().to_string();
        assert!(e.contains(field) && e.contains(line), "{isns:?}: {e}");
    }
    let e = with("sever = \"h\"\n").unwrap_err().to_string();
    assert!(e.contains("unknown field `sever`"), "{e}");
}

#[test]
fn ram_limit_is_a_size_and_ram_luns_are_added_up() {
    let luns = "[[target]]\nname = \"iqn.2026-11.io.blockwire:t\"\n\n\
                [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1G\"\n\n\
                [[target.lun]]\nid = 1\nbackstore = \"ram\"\nsize = \"512M\"\n\n\
                [[target.lun]]\nid = 2\nbackstore = \"null\"\nsize = \"8G\"\n";
    let config = |fabric: &str| {
        format!(
            "[fabric]\n{fabric}\n[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:0\"]\n\n{luns}"
        )
    };
    let b = TargetConfig::from_str("t.toml", &config("ram_limit = \"16G\"\n"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(b.ram_limit, Some(16 << 30));
    assert_eq!(b.ram_lun_bytes, (1 << 30) + (512 << 20));
    let b = TargetConfig::from_str("t.toml", &config("")).unwrap();
    assert_eq!(b.ram_limit, None, "unset: the budget's default");
    for bad in ["\"lots\"", "\"512K\""] {
        let text = config(&format!("ram_limit = {bad}\n"));
        let e = TargetConfig::from_str("t.toml", &text)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("t.toml:2") && e.contains("ram_limit") && e.contains("16G"),
            "{e}"
        );
        let report = TargetConfig::check_str("t.toml", &text, LoadOptions::default());
        assert!(
            report.errors.iter().any(|e| e.field == "fabric.ram_limit"),
            "{report:?}"
        );
    }
}

#[test]
fn removable_and_sanitize_min_seconds() {
    let b = TargetConfig::from_str(
        "t.toml",
        &one_lun(
            "backstore = \"ram\"\nsize = \"1M\"\nremovable = true\nsanitize_min_seconds = 10\n",
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let lu = b.catalog.targets[0].luns.get(0).unwrap();
    assert!(lu.config().removable);
    assert_eq!(
        lu.config().sanitize_min_duration,
        std::time::Duration::from_secs(10)
    );
    let b =
        TargetConfig::from_str("t.toml", &one_lun("backstore = \"ram\"\nsize = \"1M\"\n")).unwrap();
    let lu = b.catalog.targets[0].luns.get(0).unwrap();
    assert!(!lu.config().removable, "fixed unless asked for");
    assert!(lu.config().sanitize_min_duration.is_zero());
    let e = TargetConfig::from_str(
        "t.toml",
        &one_lun("backstore = \"ram\"\nsize = \"1M\"\nsanitize_min_seconds = 100000\n"),
    )
    .unwrap_err();
    assert_eq!(e.field, "target.lun.sanitize_min_seconds", "{e}");
}

#[test]
fn atomic_writes_where_honest() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("a.img");
    let build = |extra: &str| TargetConfig::from_str("t.toml", &one_lun(extra));
    let atomic_max = |b: &Built| {
        let lu = b.catalog.targets[0].luns.get(0).unwrap();
        (
            lu.config().atomic_writes,
            lu.config().backstore.atomic_write_max(),
        )
    };
    // RAM: on by default, off when asked.
    let b = build("backstore = \"ram\"\nsize = \"1M\"\n").unwrap();
    assert_eq!(atomic_max(&b), (true, 1 << 20));
    let b = build("backstore = \"ram\"\nsize = \"1M\"\natomic_writes = false\n").unwrap();
    assert!(!atomic_max(&b).0);
    // A file: a journal next to it, by default.
    let file = format!("backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\n");
    let b = build(&file).unwrap();
    assert_eq!(atomic_max(&b), (true, 128 << 10));
    assert!(dir.path().join("a.img.atomic-journal").is_file());
    drop(b);
    // Off: no journal opened.
    let img2 = dir.path().join("b.img");
    let b = build(&format!(
        "backstore = \"file\"\npath = {img2:?}\nsize = \"1M\"\natomic_writes = false\n"
    ))
    .unwrap();
    assert_eq!(atomic_max(&b), (false, 0));
    assert!(!dir.path().join("b.img.atomic-journal").exists());
    // Elsewhere.
    let j = dir.path().join("journals").join("c.journal");
    std::fs::create_dir(dir.path().join("journals")).unwrap();
    let b = build(&format!("{file}atomic_journal = {j:?}\n")).unwrap();
    assert_eq!(atomic_max(&b).1, 128 << 10);
    assert!(j.is_file());
    drop(b);
    // Read-only: no atomic writes, and asking for them is an error.
    let b = build(&format!("{file}read_only = true\n")).unwrap();
    assert_eq!(atomic_max(&b).1, 0);
    let e = build(&format!("{file}read_only = true\natomic_writes = true\n")).unwrap_err();
    assert_eq!(e.field, "target.lun.atomic_writes", "{e}");
    let e = build("backstore = \"ram\"\nsize = \"1M\"\natomic_journal = \"/tmp/x\"\n").unwrap_err();
    assert_eq!(e.field, "target.lun.atomic_journal", "{e}");
    // A read-only LUN does not serve a file its journal holds an
    // unfinished atomic write for.
    let g = blockwire_target::backstore::journal::Geometry::DEFAULT;
    let jpath = dir.path().join("a.img.atomic-journal");
    let mut image = std::fs::read(&jpath).unwrap();
    let rec = blockwire_target::backstore::journal::encode_record(9, 0, &[1; 512]);
    let at = g.slot_offset(1) as usize;
    image[at..at + rec.len()].copy_from_slice(&rec);
    std::fs::write(&jpath, &image).unwrap();
    let e = build(&format!("{file}read_only = true\n")).unwrap_err();
    assert!(e.message.contains("unfinished atomic write"), "{e}");
    // Nor does one with its atomic writes off, or formatted with protection
    // information (which has none): the torn blocks would be served, and a
    // later start with the journal would replay them over newer data.
    for off in ["atomic_writes = false\n", "protection = \"type1\"\n"] {
        let e = build(&format!("{file}{off}")).unwrap_err();
        assert!(
            e.message.contains("unfinished atomic write") && e.message.contains("atomic writes on"),
            "{off}: {e}"
        );
    }
    // Opened writable, it replays it.
    let b = build(&file).unwrap();
    let lu = b.catalog.targets[0].luns.get(0).unwrap();
    let mut got = [0u8; 512];
    lu.config().backstore.read_at(0, &mut got).unwrap();
    assert_eq!(got, [1; 512]);
    drop(b);
    // A journal must be a regular file: a device node read as an empty
    // journal would be replaced by a file on /dev's tmpfs.
    let e = build(&format!("{file}atomic_journal = \"/dev/null\"\n")).unwrap_err();
    assert!(e.message.contains("not a regular file"), "{e}");
    use std::os::unix::fs::FileTypeExt;
    assert!(std::path::Path::new("/dev/null")
        .metadata()
        .unwrap()
        .file_type()
        .is_char_device());
}

#[test]
fn control_socket_and_stalled_luns() {
    let b = TargetConfig::from_str(
        "t.toml",
        &format!(
            "[control]\nsocket = \"/run/bw.sock\"\n\n{}",
            one_lun("backstore = \"ram\"\nsize = \"1M\"\nstalled = true\n")
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(b.control_socket.as_deref(), Some(Path::new("/run/bw.sock")));
    assert!(b.catalog.targets[0].luns.get(0).unwrap().is_stalled());
    let b =
        TargetConfig::from_str("t.toml", &one_lun("backstore = \"ram\"\nsize = \"1M\"\n")).unwrap();
    assert_eq!(b.control_socket, None, "no socket unless asked for");
    assert!(!b.catalog.targets[0].luns.get(0).unwrap().is_stalled());
    let e = TargetConfig::from_str("t.toml", "[control]\npath = \"/x\"\n").unwrap_err();
    assert!(e.message.contains("unknown field `path`"), "{e}");
}

fn check(text: &str) -> CheckReport {
    TargetConfig::check_str("t.toml", text, LoadOptions::default())
}

fn fields(r: &CheckReport) -> Vec<(usize, &str)> {
    r.errors
        .iter()
        .map(|e| (e.line, e.field.as_str()))
        .collect()
}

#[test]
fn check_reports_every_bad_name_with_its_line() {
    let text = "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n\
                [[target]]\nname = \"iqn.2026-11.io.blockwire:t\"\n\
                allow = [\"iqn.2026-01.org.example:ok\",\n         \"host1\"]\n\
                initiator_chap = [{ initiator = \"my_host\", user = \"u\", secret = \"0123456789abcdef\" }]\n\n\
                [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n\n\
                [[target]]\nname = \"disk2\"\n\n\
                [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n";
    let r = check(text);
    assert_eq!(
        fields(&r),
        [
            (8, "target.allow"),
            (9, "target.initiator_chap.initiator"),
            (17, "target.name")
        ],
        "{:?}",
        r.errors
    );
    assert!(r.errors[0].message.contains("\"host1\""), "{}", r.errors[0]);
    // A normal start refuses the first one.
    let e = TargetConfig::from_str("t.toml", text).unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (8, "target.allow"));
}

#[test]
fn check_refuses_a_listen_address_bound_twice() {
    let text = "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\", \"[::1]:3260\"]\n\n\
                [[portal_group]]\ntag = 2\nlisten = [\"127.0.0.1:3260\",\n  \"0.0.0.0:3261\",\n  \"127.0.0.2:3261\",\n  \"127.0.0.1:0\", \"127.0.0.1:0\"]\n\n\
                [[target]]\nname = \"iqn.2026-11.io.blockwire:t\"\n\n\
                [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n";
    let r = check(text);
    assert_eq!(
        fields(&r),
        [
            (7, "portal_group.listen"),
            (9, "portal_group.listen"),
            (10, "portal_group.listen")
        ],
        "{:?}",
        r.errors
    );
    assert!(
        r.errors[0]
            .message
            .contains("listed already (portal group 1)"),
        "{}",
        r.errors[0]
    );
    assert!(
        r.errors[1].message.contains("overlaps 0.0.0.0:3261"),
        "{}",
        r.errors[1]
    );
    // Port 0 may be in several groups (each gets a port), once in each.
    assert!(
        r.errors[2]
            .message
            .contains("listed twice in portal group 2"),
        "{}",
        r.errors[2]
    );
    assert!(TargetConfig::from_str("t.toml", text).is_err());
}

/// Whether two listen addresses claim one port: an IPv4-mapped IPv6
/// address is its IPv4 address, and where the IPv6 wildcard is bound
/// dual-stack (Linux's default) `[::]` takes IPv4 too, so a start with both
/// `[::]:3260` and `0.0.0.0:3260` failed on the second bind, blaming
/// "another target".
#[test]
fn listen_addresses_overlap_across_families_where_the_host_binds_dual_stack() {
    use super::check::listen_overlap;
    let a = |s: &str| s.parse::<SocketAddr>().unwrap();
    for dual in [false, true] {
        assert!(listen_overlap(a("127.0.0.1:3260"), a("0.0.0.0:3260"), dual));
        assert!(listen_overlap(a("[::1]:3260"), a("[::]:3260"), dual));
        assert!(listen_overlap(
            a("[::ffff:127.0.0.1]:3260"),
            a("127.0.0.1:3260"),
            dual
        ));
        assert!(listen_overlap(
            a("[::ffff:10.0.0.1]:3260"),
            a("0.0.0.0:3260"),
            dual
        ));
        assert!(!listen_overlap(
            a("127.0.0.1:3260"),
            a("127.0.0.2:3260"),
            dual
        ));
        assert!(!listen_overlap(a("0.0.0.0:3260"), a("0.0.0.0:3261"), dual));
        assert!(!listen_overlap(a("[::1]:3260"), a("127.0.0.1:3260"), dual));
        assert!(!listen_overlap(a("0.0.0.0:0"), a("0.0.0.0:0"), dual));
        for v4 in ["0.0.0.0:3260", "127.0.0.1:3260"] {
            assert_eq!(
                listen_overlap(a("[::]:3260"), a(v4), dual),
                dual,
                "{v4}, dual-stack {dual}"
            );
            assert_eq!(
                listen_overlap(a(v4), a("[::]:3260"), dual),
                dual,
                "{v4}, dual-stack {dual}"
            );
        }
    }
    // The configuration check says which two, and how to serve both families.
    let text =
        "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\", \"[::ffff:127.0.0.1]:3260\"]\n\n\
                [[target]]\nname = \"iqn.2026-11.io.blockwire:t\"\n\n\
                [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n";
    let r = check(text);
    assert_eq!(fields(&r), [(3, "portal_group.listen")], "{:?}", r.errors);
    assert!(
        r.errors[0]
            .message
            .contains("[::ffff:127.0.0.1]:3260 overlaps 127.0.0.1:3260"),
        "{}",
        r.errors[0]
    );
    // An IPv4-mapped address beside the IPv4 wildcard is named as mapped,
    // not as the dual-stack IPv6 wildcard, which neither is.
    use super::check::overlap_reason;
    let mapped = overlap_reason(a("0.0.0.0:3260"), a("[::ffff:10.0.0.1]:3260"));
    assert!(
        mapped.contains("IPv4-mapped") && !mapped.contains("wildcard"),
        "{mapped}"
    );
    assert!(overlap_reason(a("[::]:3260"), a("0.0.0.0:3260")).contains("bindv6only"));
    assert!(overlap_reason(a("127.0.0.1:3260"), a("[::]:3260")).contains("bindv6only"));
    assert_eq!(overlap_reason(a("[::1]:3260"), a("[::]:3260")), "");
    assert!(
        r.errors[0].message.contains("IPv4-mapped"),
        "{}",
        r.errors[0]
    );
    let dual =
        std::fs::read_to_string("/proc/sys/net/ipv6/bindv6only").map_or(true, |v| v.trim() == "0");
    let text = "[[portal_group]]\ntag = 1\nlisten = [\"0.0.0.0:3260\", \"[::]:3260\"]\n\n\
                [[target]]\nname = \"iqn.2026-11.io.blockwire:t\"\n\n\
                [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n";
    let r = check(text);
    if dual {
        assert_eq!(fields(&r), [(3, "portal_group.listen")], "{:?}", r.errors);
        assert!(
            r.errors[0].message.contains("bindv6only = 0")
                && r.errors[0].message.contains("[::]:3260 alone serves both"),
            "{}",
            r.errors[0]
        );
    } else {
        assert!(r.errors.is_empty(), "{:?}", r.errors);
    }
}

#[test]
fn check_chap_secret_lengths_and_mutual_secret_reuse() {
    let lun = "\n[[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n";
    let head = "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n[[target]]\nname = \"iqn.2026-11.io.blockwire:t\"\n";
    let text = format!(
        "{head}chap = [{{ user = \"a\", secret = \"short\" }},\n  {{ user = \"b\", secret = \"0123456789abcdef\" }}]\n\
         mutual_chap = {{ user = \"t\", secret = \"0123456789abcdef\" }}\n{lun}\n\
         [discovery]\nchap = [{{ user = \"d\", secret = \"eleven-char\" }}]\n"
    );
    let r = check(&text);
    assert_eq!(
        fields(&r),
        [
            (7, "target.chap.secret"),
            (9, "target.mutual_chap.secret"),
            (17, "discovery.chap.secret")
        ],
        "{:?}",
        r.errors
    );
    assert!(r.errors[0].message.contains("(5 given)"), "{}", r.errors[0]);
    assert!(r.errors[1].message.contains("RFC 7143"), "{}", r.errors[1]);
    // Distinct secrets of 12 characters or more pass.
    let ok = format!(
        "{head}chap = [{{ user = \"a\", secret = \"0123456789ab\" }}]\n\
         mutual_chap = {{ user = \"t\", secret = \"another-secret-1\" }}\n{lun}"
    );
    assert!(check(&ok).is_valid(), "{:?}", check(&ok).errors);
    // The same secret in per-initiator CHAP counts as one-way too.
    let reuse = format!(
        "{head}initiator_chap = [{{ initiator = \"iqn.2026-01.org.example:i\", user = \"a\", secret = \"0123456789ab\" }}]\n\
         mutual_chap = {{ user = \"t\", secret = \"0123456789ab\" }}\n{lun}"
    );
    assert_eq!(fields(&check(&reuse)), [(8, "target.mutual_chap.secret")]);
}

/// A target's mutual CHAP secret that another target (or discovery) takes
/// from initiators is refused as within one section: an initiator allowed
/// into the first could send the second's challenge as its mutual challenge
/// and log in to the second with the first's answer (RFC 7143 §9.2.1).
/// Each section alone was checked, so this passed.
#[test]
fn a_mutual_chap_secret_is_no_other_sections_one_way_secret() {
    let refused = |text: &str, at: (usize, &str), says: &str| {
        let r = check(text);
        assert_eq!(fields(&r), [at], "{:?}", r.errors);
        assert!(r.errors[0].message.contains(says), "{}", r.errors[0]);
    };
    let lun = "\n[[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n";
    let pg = "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n";
    let target = |name: &str, auth: &str| {
        format!("\n[[target]]\nname = \"iqn.2026-11.io.blockwire:{name}\"\n{auth}{lun}")
    };
    // Mutual CHAP needs one-way CHAP beside it (line 7); line 8: A's mutual
    // secret, which B takes from initiators.
    let a_mutual = |secret: &str| {
        format!("chap = [{{ user = \"ua\", secret = \"a-own-secret\" }}]\nmutual_chap = {{ user = \"ta\", secret = \"{secret}\" }}\n")
    };
    let text = format!(
        "{pg}{}{}",
        target("a", &a_mutual("shared-secret-1")),
        target(
            "b",
            "chap = [{ user = \"u\", secret = \"shared-secret-1\" }]\n"
        )
    );
    refused(
        &text,
        (8, "target.mutual_chap.secret"),
        "of target iqn.2026-11.io.blockwire:a is a one-way CHAP secret of target iqn.2026-11.io.blockwire:b",
    );
    // Discovery's one-way secret, or a per-initiator one, counts too; and
    // discovery's mutual secret against a target's.
    let text = format!(
        "{pg}{}\n[discovery]\nchap = [{{ user = \"d\", secret = \"shared-secret-1\" }}]\n",
        target("a", &a_mutual("shared-secret-1"))
    );
    refused(&text, (8, "target.mutual_chap.secret"), "of [discovery]");
    let text = format!(
        "{pg}{}\n[discovery]\nchap = [{{ user = \"d\", secret = \"discovery-secret\" }}]\nmutual_chap = {{ user = \"td\", secret = \"shared-secret-2\" }}\n",
        target("a", "initiator_chap = [{ initiator = \"iqn.2026-01.org.example:i\", user = \"u\", secret = \"shared-secret-2\" }]\n")
    );
    refused(
        &text,
        (16, "discovery.mutual_chap.secret"),
        "of target iqn.2026-11.io.blockwire:a",
    ); // One mutual secret for two targets, and a one-way secret two targets
       // share, are each in one role only: allowed.
    let text = format!(
        "{pg}{}{}",
        target("a", "chap = [{ user = \"u\", secret = \"one-way-secret\" }]\nmutual_chap = { user = \"t\", secret = \"mutual-secret-1\" }\n"),
        target("b", "chap = [{ user = \"u\", secret = \"one-way-secret\" }]\nmutual_chap = { user = \"t\", secret = \"mutual-secret-1\" }\n")
    );
    assert!(check(&text).is_valid(), "{:?}", check(&text).errors);
}

#[test]
fn fabric_errors_name_their_line_and_all_are_reported() {
    let text = format!(
        "# comment\n[fabric]\nqueue_depth = 0\nnop_interval_secs = 5\nheader_digest = \"sometimes\"\nwrite_budget = \"1K\"\n\n{}",
        one_lun("backstore = \"ram\"\nsize = \"1M\"\n")
    );
    let r = check(&text);
    assert_eq!(
        fields(&r),
        [
            (3, "fabric.queue_depth"),
            (5, "fabric.header_digest"),
            (6, "fabric.write_budget")
        ],
        "{:?}",
        r.errors
    );
    let e = TargetConfig::from_str("t.toml", &text).unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (3, "fabric.queue_depth"));
    assert_eq!(key_line("[fabric]\nx = 1\n", "fabric", "queue_depth"), 1);
    assert_eq!(key_line("a = 1\n", "fabric", "queue_depth"), 1);
    assert_eq!(
        key_line(
            "[[target]]\nqueue_depth = 1\n[ fabric ] # tunables\n  queue_depth= 0\n",
            "fabric",
            "queue_depth"
        ),
        4
    );
}

#[test]
fn check_backing_files_without_touching_them() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let lun = |path: &Path, extra: &str| {
        one_lun(&format!("backstore = \"file\"\npath = {path:?}\n{extra}"))
    };
    // Absent, in a writable directory: it would be created.
    let new = dir.path().join("new.img");
    let r = check(&lun(&new, "size = \"1M\"\n"));
    assert!(r.is_valid(), "{:?}", r.errors);
    assert_eq!(r.notices.len(), 1);
    assert_eq!(
        (r.notices[0].line, r.notices[0].field.as_str()),
        (11, "target.lun.path")
    );
    assert!(r.notices[0].message.contains("it will be created"));
    assert!(!new.exists(), "--check creates nothing");
    // Absent without a size, or read-only: an error.
    let r = check(&lun(&new, ""));
    assert_eq!(fields(&r), [(11, "target.lun.path")], "{:?}", r.errors);
    assert!(r.errors[0].message.contains("add size"));
    let r = check(&lun(&new, "size = \"1M\"\nread_only = true\n"));
    assert!(r.errors[0].message.contains("read_only"), "{:?}", r.errors);
    // Its directory missing.
    let r = check(&lun(&dir.path().join("nodir/x.img"), "size = \"1M\"\n"));
    assert_eq!(fields(&r), [(11, "target.lun.path")], "{:?}", r.errors);
    assert!(r.errors[0].message.contains("mkdir -p"), "{}", r.errors[0]);
    assert!(!dir.path().join("nodir").exists());
    // Smaller than size: reported as grown, left alone.
    let small = dir.path().join("small.img");
    std::fs::write(&small, vec![0u8; 4096]).unwrap();
    let r = check(&lun(&small, "size = \"1M\"\n"));
    assert!(r.is_valid(), "{:?}", r.errors);
    assert!(
        r.notices[0]
            .message
            .contains("is 4096 bytes: it will be grown to 1048576 bytes"),
        "{}",
        r.notices[0]
    );
    assert_eq!(std::fs::metadata(&small).unwrap().len(), 4096);
    // Larger than size (a LUN grown by lun.resize whose size was not
    // saved): refused, naming both sizes. It was served short of its end,
    // under a file system that spans it.
    let large = dir.path().join("large.img");
    std::fs::write(&large, vec![0u8; 2 << 20]).unwrap();
    let r = check(&lun(&large, "size = \"1M\"\n"));
    assert_eq!(fields(&r), [(12, "target.lun.size")], "{:?}", r.errors);
    assert!(
        r.errors[0]
            .message
            .contains("is 2097152 bytes, more than size (1048576)"),
        "{}",
        r.errors[0]
    );
    assert!(
        check(&lun(&large, "")).is_valid(),
        "no size: the whole file"
    );
    // A directory is not a backing file; an empty file needs a size.
    let r = check(&lun(dir.path(), "size = \"1M\"\n"));
    assert!(
        r.errors[0].message.contains("is a directory"),
        "{:?}",
        r.errors
    );
    let empty = dir.path().join("empty.img");
    std::fs::write(&empty, b"").unwrap();
    assert!(check(&lun(&empty, "")).errors[0]
        .message
        .contains("is empty"));
    // Nor is a FIFO: opening it read-only waits for a writer, and a live
    // change or its dry run held every later change behind it for good.
    let fifo = dir.path().join("lun.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    let r = check(&lun(&fifo, "read_only = true\n"));
    assert!(
        r.errors.iter().any(|e| e.message.contains("is a FIFO")),
        "{:?}",
        r.errors
    );
    let probed = super::probe::existing_backstore(&fifo, true).unwrap_err();
    assert!(probed.contains("is a FIFO"), "{probed}");
    let opened = blockwire_target::backstore::FileBackstore::open(&fifo, None, true)
        .err()
        .expect("a FIFO backs no LUN");
    assert!(opened.to_string().contains("is a FIFO"), "{opened}");
    // Not writable (unless root, whom access(2) lets write anyway).
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    if !writable(&ro, true) {
        let r = check(&lun(&ro.join("x.img"), "size = \"1M\"\n"));
        assert!(
            r.errors[0].message.contains("not writable"),
            "{:?}",
            r.errors
        );
    }
    // A state_dir to create is a notice, and is not created.
    let state = dir.path().join("state/sub");
    let r = check(&format!(
        "[fabric]\nstate_dir = {state:?}\n\n{}",
        one_lun("backstore = \"ram\"\nsize = \"1M\"\n")
    ));
    assert!(r.is_valid(), "{:?}", r.errors);
    assert_eq!(
        (r.notices[0].line, r.notices[0].field.as_str()),
        (2, "fabric.state_dir")
    );
    assert!(!state.exists());
    // Striped members: one absent while another holds data.
    let m0 = dir.path().join("m0.img");
    std::fs::write(&m0, vec![0u8; 1 << 20]).unwrap();
    let r = check(&one_lun(&format!(
        "backstore = \"striped\"\npaths = [{m0:?}, {:?}]\nsize = \"2M\"\n",
        dir.path().join("m1.img")
    )));
    assert_eq!(fields(&r), [(11, "target.lun.paths")], "{:?}", r.errors);
    assert!(!dir.path().join("m1.img").exists());
}

#[test]
fn example_config_parses() {
    let r = TargetConfig::check_str("example", EXAMPLE_CONFIG, LoadOptions::default());
    assert!(r.is_valid(), "{:?}", r.errors);
    assert!(EXAMPLE_CONFIG.starts_with("# "), "commented");
}

#[test]
fn embedded_default_and_examples_load() {
    let b = TargetConfig::embedded_default("127.0.0.1:3260".parse().unwrap());
    assert_eq!(b.catalog.targets.len(), 1);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    // The two-portal-group example (ALUA, control socket, a stalled LUN)
    // loads as its comments say.
    let ha =
        TargetConfig::load(&dir.join("two-portal-groups.toml")).unwrap_or_else(|e| panic!("{e}"));
    let t = &ha.catalog.targets[0];
    let states: Vec<(u16, AluaState)> = t
        .luns
        .target_port_groups()
        .iter()
        .map(|g| (g.id, g.state))
        .collect();
    assert_eq!(
        states,
        [
            (1, AluaState::ActiveOptimized),
            (2, AluaState::ActiveNonOptimized)
        ]
    );
    assert!(!t.luns.get(0).unwrap().is_stalled() && t.luns.get(1).unwrap().is_stalled());
    assert_eq!(
        ha.control_socket.as_deref(),
        Some(Path::new("/run/blockwire/control.sock"))
    );
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            // File LUNs in examples point at /var/lib; load only those
            // whose backstores are RAM, check the others parse.
            let text = std::fs::read_to_string(&path).unwrap();
            if !text.contains("backstore = \"file\"") {
                TargetConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
            } else {
                toml::from_str::<TargetConfig>(&text)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            }
        }
    }
}

#[test]
fn the_line_index_numbers_lines_as_counting_newlines_does() {
    for text in [
        "",
        "\n",
        "a",
        "a\n",
        "\n\nb",
        "[x]\nk = 1\n\n[[y]]\nz = \"\\n\"\n",
        "é\nü\n\n",
    ] {
        let ctx = Ctx {
            file: "t.toml",
            text,
            line_starts: line_starts(text),
            no_disk: true,
            dry_run: true,
            probe_files: false,
            reuse: None,
            known_files: None,
            rendered: false,
        };
        for offset in 0..=text.len() + 2 {
            assert_eq!(
                ctx.line(offset),
                line_of(text, offset),
                "{text:?} at {offset}"
            );
        }
    }
}

#[test]
fn a_target_or_lun_defined_twice_is_refused_on_its_second_definition() {
    let lun = |id: u16| format!("[[target.lun]]\nid = {id}\nbackstore = \"ram\"\nsize = \"1M\"\n");
    let head = "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n";
    // iSCSI names compare without regard to case (RFC 3722).
    let text = format!(
        "{head}[[target]]\nname = \"iqn.2026-11.io.blockwire:a\"\n{}{}\
         [[target]]\nname = \"iqn.2026-11.io.blockwire:b\"\n{}\
         [[target]]\nname = \"IQN.2026-11.io.blockwire:A\"\n{}",
        lun(0),
        lun(1),
        lun(0),
        lun(0)
    );
    let e = TargetConfig::from_str("t.toml", &text).unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (21, "target.name"), "{e}");
    assert!(e.message.contains("defined twice"), "{e}");
    let text = format!(
        "{head}[[target]]\nname = \"iqn.2026-11.io.blockwire:a\"\n{}{}{}",
        lun(0),
        lun(7),
        lun(7)
    );
    let e = TargetConfig::from_str("t.toml", &text).unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (14, "target.lun.id"), "{e}");
    assert!(e.message.contains("LUN 7 is defined twice"), "{e}");
}

#[test]
fn qos_ceilings_are_built_into_the_unit_and_bad_ones_named() {
    let b = TargetConfig::from_str(
        "t.toml",
        &one_lun(
            "backstore = \"ram\"\nsize = \"1M\"\niops_limit = 500\nbandwidth_limit = \"100M\"\n",
        ),
    )
    .unwrap();
    let t = &b.catalog.targets[0];
    let want = blockwire_target::scsi::QosLimits {
        iops: Some(500),
        bytes_per_sec: Some(100 << 20),
        ..Default::default()
    };
    assert_eq!(t.qos_of(0), want);
    assert_eq!(t.luns.get(0).unwrap().qos().limits(), want);
    let shared = TargetConfig::from_str(
        "t.toml",
        &one_lun(
            "backstore = \"ram\"\nsize = \"1M\"\ninitiator_iops_limit = 200\n\
             initiator_bandwidth_limit = \"50M\"\n",
        ),
    )
    .unwrap();
    let each = blockwire_target::scsi::QosLimits {
        initiator_iops: Some(200),
        initiator_bytes_per_sec: Some(50 << 20),
        ..Default::default()
    };
    assert_eq!(shared.catalog.targets[0].qos_of(0), each);
    assert_eq!(each.to_string(), "each initiator 200 IOPS and 50 MiB/s");
    let plain =
        TargetConfig::from_str("t.toml", &one_lun("backstore = \"ram\"\nsize = \"1M\"\n")).unwrap();
    assert!(plain.catalog.targets[0].qos.is_empty());
    assert!(!plain.catalog.targets[0]
        .luns
        .get(0)
        .unwrap()
        .qos()
        .limits()
        .is_limited());
    for (keys, field, says) in [
        (
            "iops_limit = 0\n",
            "target.lun.iops_limit",
            "remove iops_limit for no limit",
        ),
        ("iops_limit = -5\n", "syntax", "expected u64"),
        (
            "bandwidth_limit = \"64K\"\n",
            "target.lun.bandwidth_limit",
            "65536 bytes per second is below the least, \"1M\"",
        ),
        (
            "bandwidth_limit = \"fast\"\n",
            "target.lun.bandwidth_limit",
            "\"fast\" is not a size per second",
        ),
        (
            "initiator_iops_limit = 0\n",
            "target.lun.initiator_iops_limit",
            "remove initiator_iops_limit for no limit",
        ),
        (
            "initiator_bandwidth_limit = \"512K\"\n",
            "target.lun.initiator_bandwidth_limit",
            "524288 bytes per second is below the least",
        ),
    ] {
        let text = one_lun(&format!("backstore = \"ram\"\nsize = \"1M\"\n{keys}"));
        let e = TargetConfig::from_str("t.toml", &text).unwrap_err();
        assert_eq!(e.line, 12, "{keys}: {e}");
        assert!(
            e.field.contains(field) || e.message.contains(field),
            "{keys}: {e}"
        );
        assert!(e.message.contains(says), "{keys}: {e}");
    }
}

/// What a built configuration serves, in words that compare.
fn served(b: &Built) -> Vec<String> {
    let mut out = vec![
        format!("{:?}", b.settings),
        format!("mrdsl {}", b.max_recv_data_segment_length),
        format!(
            "rdma {:?} {:?} {:?}",
            b.rdma_listen, b.rdma_backend, b.rdma_device
        ),
        format!("iser {:?}, ram {}", b.iser_portals, b.ram_lun_bytes),
        format!(
            "control {:?}, metrics {:?}",
            b.control_socket, b.metrics_listen
        ),
    ];
    for g in &b.catalog.portal_groups {
        out.push(format!("group {} {:?}", g.tag, g.addresses));
    }
    for t in &b.catalog.targets {
        out.push(format!(
            "target {} {:?} {:?} {:?}",
            t.name, t.portal_groups, t.alias, t.data_paths
        ));
        for (id, unit) in t.luns.units() {
            out.push(format!(
                "lun {id} {} bytes, qos {}",
                unit.config().backstore.size(),
                t.qos_of(id),
            ));
        }
        for g in t.luns.target_port_groups() {
            out.push(format!("alua {} {:?}", g.id, g.state));
        }
    }
    out
}

#[test]
fn a_control_change_read_from_its_document_is_read_as_its_rendering_would_be() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.img");
    std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
    let path = file.display();
    let head = "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n";
    let mut texts: Vec<String> = [
        "target.toml",
        "chap.toml",
        "file-luns.toml",
        "two-portal-groups.toml",
    ]
    .iter()
    .map(|f| {
        std::fs::read_to_string(format!("{}/../examples/{f}", env!("CARGO_MANIFEST_DIR"))).unwrap()
    })
    .collect();
    for lun in [
        "backstore = \"ram\"\nsize = \"1M\"\n".to_owned(),
        format!("backstore = \"file\"\npath = \"{path}\"\n"),
        format!("backstore = \"file\"\npath = \"{path}\"\nsize = \"2M\"\nread_only = true\n"),
        "backstore = \"ram\"\nsize = \"ten\"\n".to_owned(),
        "backstore = \"ram\"\n".to_owned(),
        "backstore = \"ram\"\nsize = \"1M\"\nblock_size = 1000\n".to_owned(),
        "backstore = \"ram\"\nsize = \"1M\"\nshade = 1\n".to_owned(),
        "backstore = 7\nsize = \"1M\"\n".to_owned(),
        "backstore = \"ram\"\nsize = \"1M\"\niops_limit = 500\nuuid = \"not-a-uuid\"\n".to_owned(),
        "backstore = \"ram\"\nsize = \"1M\"\niops_limit = 500\ninitiator_bandwidth_limit = \"1M\"\n".to_owned(),
        format!("backstore = \"file\"\npath = \"{}/missing/d.img\"\nsize = \"1M\"\n", dir.path().display()),
    ] {
        texts.push(one_lun(&lun));
    }
    texts.push(format!(
        "{head}[[target]]\nname = \"iqn.2026-11.io.blockwire:a\"\n\
         [[target.lun]]\nid = 0\nbackstore = \"file\"\npath = \"{path}\"\n\
         [[target.lun]]\nid = 1\nbackstore = \"file\"\npath = \"{path}\"\n"
    ));
    texts.push(format!("{head}[[target]]\nname = \"disk\"\n[[target.lun]]\nid = 0\nbackstore = \"null\"\nsize = \"1M\"\n"));
    texts.push(format!("{head}[fabric]\nbusy_poll_us = 5000000\n"));
    texts.push("[fabric]\nfirst_burst_length = 1\n".into());
    let (mut built, mut refused) = (0, 0);
    for text in &texts {
        let doc: toml::Table = text.parse().unwrap();
        let rendering = toml::to_string(&doc).unwrap();
        for no_disk in [false, true] {
            let opts = LoadOptions { no_disk };
            let how = Rebuild {
                rendered: true,
                dry_run: true,
                ..Rebuild::default()
            };
            let from_doc = TargetConfig::from_doc_reusing("t", &doc, opts, how);
            let from_text = TargetConfig::from_str_reusing("t", &rendering, opts, how);
            match (&from_doc, &from_text) {
                (Some((a, _)), Ok((b, _))) => {
                    assert_eq!(served(a), served(b), "{text}");
                    built += 1;
                }
                (None, Err(_)) => refused += 1,
                _ => panic!(
                    "read from the document: {}, from its rendering: {:?}\n{text}",
                    if from_doc.is_some() {
                        "built"
                    } else {
                        "refused"
                    },
                    from_text.as_ref().err()
                ),
            }
        }
    }
    assert!(
        built >= 10 && refused >= 10,
        "{built} built, {refused} refused"
    );
}

#[test]
fn a_low_space_threshold_is_a_size_on_a_store_that_takes_space_as_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("thin.img");
    let b = TargetConfig::from_str(
        "t.toml",
        &one_lun(&format!(
            "backstore = \"file\"\npath = {file:?}\nsize = \"8M\"\nlow_space_threshold = \"3M\"\n"
        )),
    )
    .unwrap();
    let unit = b.catalog.targets[0].luns.get(0).unwrap();
    assert_eq!(unit.low_space_threshold(), Some(3 << 20));
    let b = TargetConfig::from_str(
        "t.toml",
        &one_lun("backstore = \"ram\"\nsize = \"8M\"\nlow_space_threshold = \"1536K\"\n"),
    )
    .unwrap();
    // Rounded to whole 1 MiB threshold sets.
    assert_eq!(
        b.catalog.targets[0]
            .luns
            .get(0)
            .unwrap()
            .low_space_threshold(),
        Some(2 << 20)
    );

    let bad = |lun: &str| TargetConfig::from_str("t.toml", &one_lun(lun)).expect_err(lun);
    for (value, why) in [("0", "not a size"), ("plenty", "not a size")] {
        let e = bad(&format!(
            "backstore = \"ram\"\nsize = \"8M\"\nlow_space_threshold = \"{value}\"\n"
        ));
        assert_eq!(
            (e.line, e.field.as_str()),
            (12, "target.lun.low_space_threshold"),
            "{e}"
        );
        assert!(e.message.contains(why), "{value}: {e}");
    }
    let e = bad("backstore = \"null\"\nsize = \"8M\"\nlow_space_threshold = \"1M\"\n");
    assert_eq!(e.field, "target.lun.low_space_threshold", "{e}");
    assert!(e.message.contains("a null LUN takes no space"), "{e}");
    // --check stands in for the file and accepts the threshold.
    let missing = dir.path().join("later.img");
    let report = TargetConfig::check_str(
        "t.toml",
        &one_lun(&format!(
            "backstore = \"file\"\npath = {missing:?}\nsize = \"8M\"\nlow_space_threshold = \"1M\"\n"
        )),
        LoadOptions::default(),
    );
    assert!(report.errors.is_empty(), "{:?}", report.errors);
}

#[test]
fn protection_keeps_a_tuple_per_block_in_memory_or_beside_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pi.img");
    let b = TargetConfig::from_str(
        "t.toml",
        &one_lun(&format!(
            "backstore = \"file\"\npath = {file:?}\nsize = \"8M\"\nprotection = \"type1\"\n"
        )),
    )
    .unwrap();
    let unit = b.catalog.targets[0].luns.get(0).unwrap();
    assert!(unit.protected());
    // 16 384 blocks, 8 bytes each, in a sparse file beside the data; no
    // sendfile READs (the core checks every block), no atomic writes.
    let tuples = dir.path().join("pi.img.protection");
    assert_eq!(std::fs::metadata(&tuples).unwrap().len(), 16_384 * 8);
    assert_eq!(policy(&b, 0), None);
    assert!(!unit.config().atomic_writes);
    let named = dir.path().join("elsewhere.pi");
    let b = TargetConfig::from_str(
        "t.toml",
        &one_lun(&format!(
            "backstore = \"file\"\npath = {file:?}\nsize = \"8M\"\nprotection = \"type1\"\nprotection_file = {named:?}\n"
        )),
    )
    .unwrap();
    assert!(b.catalog.targets[0].luns.get(0).unwrap().protected());
    assert_eq!(std::fs::metadata(&named).unwrap().len(), 16_384 * 8);
    let ram = TargetConfig::from_str(
        "t.toml",
        &one_lun("backstore = \"ram\"\nsize = \"8M\"\nprotection = \"type1\"\n"),
    )
    .unwrap();
    assert!(ram.catalog.targets[0].luns.get(0).unwrap().protected());
    let none = TargetConfig::from_str(
        "t.toml",
        &one_lun("backstore = \"ram\"\nsize = \"8M\"\nprotection = \"none\"\n"),
    )
    .unwrap();
    assert!(!none.catalog.targets[0].luns.get(0).unwrap().protected());

    let bad = |lun: &str| TargetConfig::from_str("t.toml", &one_lun(lun)).expect_err(lun);
    let f = format!("backstore = \"file\"\npath = {file:?}\nsize = \"8M\"\n");
    for (lun, field, why) in [
        ("backstore = \"ram\"\nsize = \"8M\"\nprotection = \"type2\"\n".to_owned(), "target.lun.protection", "not a protection type"),
        ("backstore = \"null\"\nsize = \"8M\"\nprotection = \"type1\"\n".to_owned(), "target.lun.protection", "keeps no data"),
        (format!("{f}protection = \"type1\"\nsync_send = true\n"), "target.lun.protection", "remove sync_send"),
        (format!("{f}protection = \"type1\"\nsync_write = true\n"), "target.lun.protection", "remove sync_write"),
        (format!("{f}protection = \"type1\"\natomic_writes = true\n"), "target.lun.protection", "remove atomic_writes"),
        (format!("{f}protection_file = \"x.pi\"\n"), "target.lun.protection_file", "without protection"),
        ("backstore = \"ram\"\nsize = \"8M\"\nprotection = \"type1\"\nprotection_file = \"x.pi\"\n".to_owned(), "target.lun.protection_file", "only file LUNs"),
        (format!("{f}protection = \"type1\"\nprotection_file = {file:?}\n"), "target.lun.protection_file", "as its data file and as its protection information file"),
    ] {
        let e = bad(&lun);
        assert_eq!(e.field, field, "{lun}: {e}");
        assert!(e.message.contains(why), "{lun}: {e}");
    }
    // --check neither opens nor creates the tuples' file.
    let later = dir.path().join("later.img");
    let report = TargetConfig::check_str(
        "t.toml",
        &one_lun(&format!(
            "backstore = \"file\"\npath = {later:?}\nsize = \"8M\"\nprotection = \"type1\"\n"
        )),
        LoadOptions::default(),
    );
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(!dir.path().join("later.img.protection").exists());
}

/// The loop device helper the target crate's tests share.
mod loop_device {
    include!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/tests/support/loop_device.rs"
    ));
}

/// A block device without a journal: atomic writes by the kernel where it
/// offers untorn writes; a loop device offers none, so nothing is offered
/// unless asked for, and asking is an error that names the way out.
#[test]
fn a_block_device_without_untorn_writes_offers_no_atomic_writes() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("device.img");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let dev = loop_device::LoopDevice::over(&backing);
    let build = |extra: &str| {
        TargetConfig::from_str(
            "t.toml",
            &one_lun(&format!(
                "backstore = \"file\"\npath = {:?}\nmode = \"direct\"\n{extra}",
                dev.0
            )),
        )
    };
    let b = build("").unwrap();
    let store = b.catalog.targets[0]
        .luns
        .get(0)
        .unwrap()
        .config()
        .backstore
        .clone();
    assert_eq!(store.atomic_write_max(), 0, "{}", store.describe());
    drop(b);
    let e = build("atomic_writes = true\n").unwrap_err();
    assert_eq!(e.field, "target.lun.atomic_writes", "{e}");
    assert!(e.message.contains("STATX_WRITE_ATOMIC"), "{e}");
    assert!(e.message.contains("atomic_journal"), "{e}");
    let e = build("atomic_unit = \"16K\"\n").unwrap_err();
    assert_eq!(e.field, "target.lun.atomic_unit", "{e}");
    // atomic_unit goes with neither a journal, nor atomic_writes = false,
    // nor another kind of LUN.
    let j = dir.path().join("j");
    let e = build(&format!("atomic_unit = \"16K\"\natomic_journal = {j:?}\n")).unwrap_err();
    assert_eq!(e.field, "target.lun.atomic_unit", "{e}");
    let e = build("atomic_unit = \"16K\"\natomic_writes = false\n").unwrap_err();
    assert_eq!(e.field, "target.lun.atomic_unit", "{e}");
    let e = TargetConfig::from_str(
        "t.toml",
        &one_lun("backstore = \"ram\"\nsize = \"1M\"\natomic_unit = \"16K\"\n"),
    )
    .unwrap_err();
    assert_eq!(e.field, "target.lun.atomic_unit", "{e}");
    // With the journal placed elsewhere, as before.
    let b = build(&format!("atomic_journal = {j:?}\n")).unwrap();
    let lu = b.catalog.targets[0].luns.get(0).unwrap();
    assert_eq!(lu.config().backstore.atomic_write_max(), 128 << 10);
}

/// Names are checked trimmed, so they are kept trimmed: an access list or
/// per-initiator CHAP entry with spaces around a name (pasted in) admits
/// that initiator, where kept as written it matched no login.
#[test]
fn names_with_spaces_around_them_match_the_initiator() {
    let text = "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n[[target]]\n\
        name = \"iqn.2026-11.io.blockwire:t\"\nallow = [\"iqn.2024-01.test:h1 \"]\n\
        initiator_chap = [{ initiator = \" iqn.2024-01.test:h1\", user = \"u\", secret = \"secret-of-16-chars\" }]\n\n\
        [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n";
    let b = TargetConfig::from_str("t.toml", text).unwrap();
    let t = &b.catalog.targets[0];
    assert!(t.acl.allows("iqn.2024-01.test:h1"), "{:?}", t.acl);
    let own: Vec<_> = t.auth.credentials_for("iqn.2024-01.test:h1").collect();
    assert_eq!(own.len(), 1, "the initiator's own account: {:?}", t.auth);
}

/// A path on a LUN that keeps its blocks in memory, or none, would have the
/// user believe the data live in that file.
#[test]
fn a_path_on_a_ram_or_null_lun_is_refused() {
    for kind in ["ram", "null"] {
        let text = one_lun(&format!(
            "backstore = \"{kind}\"\nsize = \"1M\"\npath = \"/tmp/x.img\"\n"
        ));
        let r = check(&text);
        assert_eq!(fields(&r), [(12, "target.lun.path")], "{kind}: {r:?}");
        assert!(
            r.errors[0].message.contains("backstore = \"file\""),
            "{}",
            r.errors[0].message
        );
    }
}

/// A serial number the wire cannot carry whole, or that is not printable
/// ASCII, is refused: past 247 bytes it was cut in VPD 83h, so two serials
/// alike in their first 247 bytes named one unit.
#[test]
fn a_serial_number_the_wire_cannot_carry_is_refused() {
    let long = "s".repeat(248);
    for (serial, said) in [
        (long.as_str(), "248 bytes"),
        ("", "empty serial"),
        ("disk\u{e9}", "printable ASCII"),
        ("disk\t7", "printable ASCII"),
    ] {
        let text = one_lun(&format!(
            "backstore = \"ram\"\nsize = \"1M\"\nserial = \"{serial}\"\n"
        ));
        let r = check(&text);
        assert_eq!(
            r.errors
                .iter()
                .map(|e| e.field.as_str())
                .collect::<Vec<_>>(),
            ["target.lun.serial"],
            "{serial:?}: {r:?}"
        );
        assert!(
            r.errors[0].message.contains(said),
            "{}",
            r.errors[0].message
        );
    }
    let fits = one_lun(&format!(
        "backstore = \"ram\"\nsize = \"1M\"\nserial = \"{}\"\n",
        &long[..247]
    ));
    assert!(check(&fits).errors.is_empty(), "247 bytes fit");
}

/// nop_timeout_secs = 0 is not "never" (it was made 1 s without a word), and
/// timers past a day are refused before they can overflow the clock.
#[test]
fn fabric_timers_out_of_range_are_refused() {
    let lun = one_lun("backstore = \"ram\"\nsize = \"1M\"\n");
    for (key, value) in [
        ("nop_timeout_secs", "0"),
        ("nop_timeout_secs", "86401"),
        ("nop_interval_secs", "9223372036854775807"),
        ("logout_grace_secs", "9223372036854775807"),
    ] {
        let r = check(&format!("[fabric]\n{key} = {value}\n\n{lun}"));
        assert_eq!(
            fields(&r),
            [(2, format!("fabric.{key}").as_str())],
            "{key} = {value}: {r:?}"
        );
    }
    let r = check(&format!(
        "[fabric]\nnop_timeout_secs = 1\nnop_interval_secs = 0\n\n{lun}"
    ));
    assert!(r.errors.is_empty(), "{r:?}");
}

/// A TargetAlias the login could not carry (past 255 bytes, or with a
/// NUL) is refused by the check, naming the target's line; before, the
/// configuration loaded and every normal login to the target ended with
/// TARGET ERROR.
#[test]
fn an_alias_a_login_cannot_carry_is_refused() {
    let with_alias = |alias: &str| {
        format!(
            "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n\
             [[target]]\nname = \"iqn.2026-11.io.blockwire:disk\"\nalias = {}\n\n\
             [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n",
            toml::Value::String(alias.to_owned())
        )
    };
    TargetConfig::from_str("t.toml", &with_alias(&"a".repeat(255)))
        .unwrap_or_else(|e| panic!("{e}"));
    for (alias, said) in [
        ("a".repeat(256), "an alias of 256 bytes: "),
        ("a\0b".to_owned(), "an alias of 3 bytes with a NUL: "),
    ] {
        let e = TargetConfig::from_str("t.toml", &with_alias(&alias)).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (6, "target.alias"), "{e}");
        assert!(e.message.starts_with(said), "{e}");
    }
}

/// The login phase's bounds are set in `[fabric]`: defaults as the target's
/// own, each key taken, and values that would turn a bound off, or a share
/// larger than the whole, refused naming the key.
#[test]
fn the_login_bounds_are_set_in_the_fabric_section() {
    use std::time::Duration;
    let bounds = |s: &blockwire_target::iscsi::FabricSettings| {
        (
            s.login_timeout,
            s.login_deadline,
            s.max_logins_in_progress,
            s.max_logins_in_progress_per_address,
            s.max_discovery_sessions,
            s.max_discovery_sessions_per_address,
        )
    };
    let b = with_fabric("").unwrap_or_else(|e| panic!("{e}"));
    let d = blockwire_target::iscsi::FabricSettings::default();
    assert_eq!(bounds(&b.settings), bounds(&d));
    let b = with_fabric(
        "[fabric]\nlogin_timeout_secs = 5\nlogin_deadline_secs = 20\nmax_logins_in_progress = 64\n\
         max_logins_in_progress_per_address = 8\nmax_discovery_sessions = 16\n\
         max_discovery_sessions_per_address = 4\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        bounds(&b.settings),
        (
            Duration::from_secs(5),
            Duration::from_secs(20),
            64,
            8,
            16,
            4
        )
    );
    for (fabric, field) in [
        ("login_timeout_secs = 0", "login_timeout_secs"),
        ("login_timeout_secs = 3601", "login_timeout_secs"),
        ("login_deadline_secs = 0", "login_deadline_secs"),
        ("login_deadline_secs = 86401", "login_deadline_secs"),
        ("max_logins_in_progress = 0", "max_logins_in_progress"),
        (
            "max_logins_in_progress = 4\nmax_logins_in_progress_per_address = 5",
            "max_logins_in_progress_per_address",
        ),
        (
            "max_logins_in_progress_per_address = 0",
            "max_logins_in_progress_per_address",
        ),
        ("max_discovery_sessions = 0", "max_discovery_sessions"),
        ("max_discovery_sessions = 65536", "max_discovery_sessions"),
        (
            "max_discovery_sessions = 4\nmax_discovery_sessions_per_address = 0",
            "max_discovery_sessions_per_address",
        ),
        (
            "max_discovery_sessions = 4\nmax_discovery_sessions_per_address = 5",
            "max_discovery_sessions_per_address",
        ),
    ] {
        let e = with_fabric(&format!("[fabric]\n{fabric}\n")).unwrap_err();
        assert_eq!(e.field, format!("fabric.{field}"), "{fabric}: {e}");
    }
    // A total set below its share's default, the share left unset: the
    // share is the whole, where the load failed naming a key never set.
    let b = with_fabric("[fabric]\nmax_logins_in_progress = 100\nmax_discovery_sessions = 8\n")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (
            b.settings.max_logins_in_progress_per_address,
            b.settings.max_discovery_sessions_per_address
        ),
        (100, 8)
    );
}

/// `[fabric] write_budget_total` and `read_budget_total` bound the WRITE
/// and READ data of all connections together: unset, an eighth of the
/// daemon's memory and at least one connection's budget; a size when set,
/// refused (naming the key) below one connection's budget, which no
/// connection could then hold, and reported once when it does not parse.
#[test]
fn the_fabrics_budget_totals_are_set_and_checked() {
    let totals = |s: &blockwire_target::iscsi::FabricSettings| {
        (s.write_budget_total_bytes, s.read_budget_total_bytes)
    };
    let b = with_fabric("").unwrap_or_else(|e| panic!("{e}"));
    let unset = blockwire_target::iscsi::default_budget_total(256 << 20);
    assert_eq!(totals(&b.settings), (unset, unset));
    assert!(unset >= 256 << 20);
    // Unset beside a larger share: the share.
    let b = with_fabric("[fabric]\nwrite_budget = \"1T\"\n").unwrap_or_else(|e| panic!("{e}"));
    assert!(b.settings.write_budget_total_bytes >= 1 << 40);
    let b = with_fabric("[fabric]\nwrite_budget_total = \"512M\"\nread_budget_total = \"1G\"\n")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(totals(&b.settings), (512 << 20, 1 << 30));
    for (fabric, field) in [
        ("write_budget_total = \"128M\"", "write_budget_total"),
        (
            "write_budget = \"4G\"\nwrite_budget_total = \"2G\"",
            "write_budget_total",
        ),
        ("write_budget_total = \"lots\"", "write_budget_total"),
        ("read_budget_total = \"128M\"", "read_budget_total"),
        (
            "read_budget = \"4G\"\nread_budget_total = \"2G\"",
            "read_budget_total",
        ),
    ] {
        let e = with_fabric(&format!("[fabric]\n{fabric}\n")).unwrap_err();
        assert_eq!(e.field, format!("fabric.{field}"), "{fabric}: {e}");
    }
}
