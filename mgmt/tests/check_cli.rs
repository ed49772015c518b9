//! `blockwire-target --check` validates without side effects, and
//! `--print-example-config` prints a configuration that parses.

use std::process::Command;

use blockwire_mgmt::config::{LoadOptions, TargetConfig};

fn daemon() -> Command {
    Command::new(env!("CARGO_BIN_EXE_blockwire-target"))
}

#[test]
fn check_creates_no_backing_file() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("lun0.img");
    let missing_dir = dir.path().join("absent").join("lun1.img");
    let config = dir.path().join("t.toml");
    let text = format!(
        "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n\
         [[target]]\nname = \"iqn.2026-11.io.blockwire:check\"\n\n\
         [[target.lun]]\nid = 0\nbackstore = \"file\"\npath = {img:?}\nsize = \"1M\"\n"
    );
    std::fs::write(&config, &text).unwrap();
    let out = daemon()
        .arg("--check")
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("it will be created"), "{stdout}");
    assert!(
        stdout.contains("configuration is valid: 1 target(s)"),
        "{stdout}"
    );
    assert!(!img.exists(), "--check created {}", img.display());

    // Two problems: both reported, exit 1, still nothing created.
    let bad = format!(
        "{text}\n[[target.lun]]\nid = 1\nbackstore = \"file\"\npath = {missing_dir:?}\nsize = \"1M\"\n\n\
         [[target]]\nname = \"not-an-iqn\"\n\n[[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n"
    );
    std::fs::write(&config, bad).unwrap();
    let out = daemon()
        .arg("--check")
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(":17: target.lun.path: the directory"),
        "{stderr}"
    );
    assert!(stderr.contains(":21: target.name:"), "{stderr}");
    assert!(stderr.contains("2 problem(s) found"), "{stderr}");
    assert!(!img.exists() && !missing_dir.parent().unwrap().exists());
}

#[test]
fn printed_example_config_parses() {
    let out = daemon().arg("--print-example-config").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("[[target]]"), "{text}");
    let report = TargetConfig::check_str("printed", &text, LoadOptions::default());
    assert!(report.is_valid(), "{:?}", report.errors);
    TargetConfig::from_str("printed", &text).unwrap_or_else(|e| panic!("{e}"));
}

/// With `--listen`, the file's addresses are replaced where they are written, so a start
/// that fails names the line of the file (a rendering of the document would have dropped
/// its comments and blank lines and joined its listen array).
#[test]
fn a_start_with_listen_names_the_files_own_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("t.toml");
    let text = "# blockwire\n\n[[portal_group]]\ntag = 1\nlisten = [\n  \"127.0.0.9:3260\",\n]\n\n\
                # disks\n[[target]]\nname = \"iqn.2026-11.io.blockwire:listen\"\n\n\
                [[target.lun]]\nid = 0\nbackstore = \"file\"\n\
                path = \"/nonexistent-blockwire-dir/disk.img\"\nsize = \"1M\"\n";
    std::fs::write(&config, text).unwrap();
    let out = daemon()
        .arg("--config")
        .arg(&config)
        .arg("--listen")
        .arg("127.0.0.1:0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let at = format!("{}:16: target.lun.path: the directory", config.display());
    assert!(stderr.contains(&at), "{stderr}");
}
