//! The control API's configuration edits as a state machine. Each input is
//! a sequence of JSON-RPC calls (targets, LUNs, access lists, CHAP
//! accounts and portals added and removed, LUNs resized, stalled and
//! given QoS ceilings, the
//! configuration saved, targets restored from the saved file, and the file
//! edited by hand and reloaded) against a running fabric with RAM,
//! null and file LUNs, drawn from small pools so that names, files and
//! identities meet: targets whose names differ only in case or in
//! characters a file name cannot hold, LUNs over the same file, uuids and
//! serials given twice, bad names and sizes. After every call:
//!
//! - the answer is a JSON-RPC 2.0 response to the call, a result or an error;
//! - a refused call changed nothing: the same document, the same catalog,
//!   the same units and the same portals;
//! - the running document passes the start-up check, and the catalog that
//!   serves is the one a fresh start from that document would build (names,
//!   access lists, CHAP, portal groups, LUN ids, sizes, identities);
//! - every portal of the document listens, and no other;
//! - a LUN whose definition the call left alone (size, the stall switch and
//!   the QoS ceilings aside) is the same unit with its data, and a new RAM LUN holds none of
//!   another unit's data;
//! - saving, then reloading, changes nothing.
#![no_main]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use blockwire_mgmt::config::{parse_size, LoadOptions, TargetConfig};
use blockwire_mgmt::control::Control;
use blockwire_mgmt::live::{parse_doc, tables, Live, Source};
use blockwire_target::iscsi::catalog::Catalog;
use blockwire_target::iscsi::portal::PortalSet;
use blockwire_target::iscsi::Fabric;
use blockwire_target::scsi::LogicalUnit;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

const TARGETS: &[&str] = &[
    "iqn.2026-11.io.blockwire:a",
    "IQN.2026-11.IO.BLOCKWIRE:A",
    "iqn.2026-11.io.blockwire:b",
    "iqn.2026-11.io.blockwire:é",
    "iqn.2026-11.io.blockwire:ü",
    "not-an-iscsi-name",
];
const INITIATORS: &[&str] = &[
    "iqn.2026-11.io.example:h1",
    "IQN.2026-11.IO.EXAMPLE:H1",
    "iqn.2026-11.io.example:h2",
    "host with spaces",
];
const USERS: &[&str] = &["alice", "bob"];
const SECRETS: &[&str] = &["0123456789abcdef", "short"];
const LISTEN: &[&str] = &["127.0.0.1:0", "127.0.0.2:0", "127.0.0.3:0", "[::1]:0", "nowhere"];
const SIZES: &[&str] = &["64K", "1M", "2M", "0", "1Q", "96K"];
const UUIDS: &[&str] = &[
    "3f2504e0-4f89-11d3-9a0c-0305e82c3301",
    "3F2504E0-4F89-11D3-9A0C-0305E82C3301",
    "6b1f3c2e-0d4a-4c55-9a31-2f0e4b7d9c10",
];
const SERIALS: &[&str] = &["disk-1", "DISK-1", "disk-2"];
const LUN_IDS: &[i64] = &[0, 1, 2, 16383, 16384];
const IOPS: &[i64] = &[0, 1, 500, 1_000_000];
const BANDWIDTHS: &[&str] = &["1M", "100M", "64K", "none", "0", "fast"];
const THRESHOLDS: &[&str] = &["1M", "100M", "1T", "0", "low"];
const FILES: &[&str] = &["f0.img", "f1.img", "sub/../f0.img", "f1.img.atomic-journal"];

const SCRATCH_PREFIX: &str = "blockwire-fuzz-live-";

/// The scratch directory of this process: LUN files, the state directory
/// and the saved configuration. libFuzzer ends the process without
/// unwinding, so those of processes gone are removed here.
fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = std::env::temp_dir();
        for entry in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(SCRATCH_PREFIX)) else {
                continue;
            };
            if !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let d = tmp.join(format!("{SCRATCH_PREFIX}{}", std::process::id()));
        std::fs::create_dir_all(d.join("sub")).expect("scratch directory");
        d
    })
}

/// Reads choices from the fuzzer's bytes (zeros once they run out).
struct Choices<'a>(&'a [u8]);

impl Choices<'_> {
    fn byte(&mut self) -> u8 {
        let (&b, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        b
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[usize::from(self.byte()) % items.len()]
    }
    fn flag(&mut self) -> bool {
        self.byte() & 1 == 1
    }
}

fn lun_json(c: &mut Choices<'_>) -> Value {
    let mut lun = serde_json::Map::new();
    lun.insert("id".into(), json!(c.pick(LUN_IDS)));
    match c.byte() % 4 {
        0 | 1 => {
            lun.insert("backstore".into(), json!("ram"));
        }
        2 => {
            lun.insert("backstore".into(), json!("null"));
        }
        _ => {
            lun.insert("backstore".into(), json!("file"));
            let file = scratch().join(c.pick(FILES));
            lun.insert("path".into(), json!(file.to_str().expect("utf-8 scratch path")));
            if c.flag() {
                let journal = scratch().join(c.pick(FILES));
                lun.insert("atomic_journal".into(), json!(journal.to_str()));
            }
        }
    }
    lun.insert("size".into(), json!(c.pick(SIZES)));
    let extra = c.byte();
    if extra & 1 != 0 {
        lun.insert("uuid".into(), json!(c.pick(UUIDS)));
    }
    if extra & 2 != 0 {
        lun.insert("serial".into(), json!(c.pick(SERIALS)));
    }
    if extra & 4 != 0 {
        lun.insert("block_size".into(), json!(4096));
    }
    Value::Object(lun)
}

/// One call: its method and parameters.
fn call(c: &mut Choices<'_>) -> (&'static str, Value) {
    let target = c.pick(TARGETS);
    match c.byte() % 17 {
        0 => {
            let mut t = json!({"name": target, "lun": [lun_json(c)]});
            if c.flag() {
                t["lun"].as_array_mut().expect("array").push(lun_json(c));
            }
            if c.flag() {
                t["allow"] = json!([c.pick(INITIATORS)]);
            }
            ("target.add", json!({ "target": t }))
        }
        1 => ("target.remove", json!({"target": target, "force": c.flag()})),
        2 => ("lun.add", json!({"target": target, "lun": lun_json(c)})),
        // A list is one change: all its LUNs or none (ids and files may repeat in it).
        3 => {
            let luns: Vec<_> = (0..c.pick(&[0usize, 1, 2, 3])).map(|_| lun_json(c)).collect();
            ("lun.add", json!({"target": target, "lun": luns}))
        }
        4 => ("lun.remove", json!({"target": target, "lun": c.pick(LUN_IDS), "force": c.flag()})),
        5 => ("lun.resize", json!({"target": target, "lun": c.pick(LUN_IDS), "size": c.pick(SIZES)})),
        6 => ("acl.add", json!({"target": target, "initiator": c.pick(INITIATORS)})),
        7 => ("acl.remove", json!({"target": target, "initiator": c.pick(INITIATORS)})),
        8 => {
            let mut p = json!({"user": c.pick(USERS), "secret": c.pick(SECRETS)});
            if c.flag() {
                p["target"] = json!(target);
            }
            if c.flag() {
                p["initiator"] = json!(c.pick(INITIATORS));
            }
            if c.flag() {
                p["replace"] = json!(true);
            }
            ("chap.add", p)
        }
        9 => {
            let mut p = json!({"user": c.pick(USERS), "force": c.flag()});
            if c.flag() {
                p["target"] = json!(target);
            }
            if c.flag() {
                p["initiator"] = json!(c.pick(INITIATORS));
            }
            ("chap.remove", p)
        }
        10 => ("portal.add", json!({"tag": c.byte() % 3 + 1, "listen": c.pick(LISTEN)})),
        11 => {
            let mut p = json!({"listen": c.pick(LISTEN)});
            if c.flag() {
                p["tag"] = json!(c.byte() % 3 + 1);
            }
            ("portal.remove", p)
        }
        // QoS ceilings: set, lifted, or bad (0 IOPS in a file, 64K, a word).
        15 => {
            let mut p = json!({"target": target, "lun": c.pick(LUN_IDS)});
            if c.flag() {
                p["iops"] = json!(c.pick(IOPS));
            }
            if c.flag() {
                p["bandwidth"] = json!(c.pick(BANDWIDTHS));
            }
            if c.flag() {
                p["initiator_iops"] = json!(c.pick(IOPS));
            }
            if c.flag() {
                p["initiator_bandwidth"] = json!(c.pick(BANDWIDTHS));
            }
            ("lun.limit", p)
        }
        12 => ("lun.stall", json!({"target": target, "lun": c.pick(LUN_IDS), "stalled": c.flag()})),
        13 => ("config.save", json!({})),
        // Back from the saved file: one target by name, or all it has that is not running.
        14 => {
            let from = scratch().join("target.toml");
            let mut p = json!({"from": from.to_str().expect("utf-8 scratch path")});
            if c.flag() {
                p["target"] = json!(target);
            }
            ("target.restore", p)
        }
        _ => ("config.reload", json!({})),
    }
}

/// An operator's edit of the configuration file before a reload: one
/// field of one LUN or target of the running document changed, added or
/// taken out.
fn edit_file(c: &mut Choices<'_>, doc: &mut toml::Table) {
    use toml::Value as V;
    let Some(targets) = doc.get_mut("target").and_then(V::as_array_mut) else {
        return;
    };
    if targets.is_empty() {
        return;
    }
    let n = targets.len();
    let Some(t) = targets[usize::from(c.byte()) % n].as_table_mut() else {
        return;
    };
    if c.byte() % 4 == 0 {
        // The target itself: its name's case, its alias, its access list.
        match c.byte() % 3 {
            0 => {
                let name = t.get("name").and_then(V::as_str).unwrap_or("").to_owned();
                let flipped = if name.chars().any(|ch| ch.is_ascii_lowercase()) {
                    name.to_ascii_uppercase()
                } else {
                    name.to_ascii_lowercase()
                };
                t.insert("name".into(), V::String(flipped));
            }
            1 => {
                t.insert("alias".into(), V::String("edited".into()));
            }
            _ => {
                t.insert("allow".into(), V::Array(vec![V::String(c.pick(INITIATORS).into())]));
            }
        }
        return;
    }
    let Some(luns) = t.get_mut("lun").and_then(V::as_array_mut) else {
        return;
    };
    if luns.is_empty() {
        return;
    }
    let n = luns.len();
    let Some(l) = luns[usize::from(c.byte()) % n].as_table_mut() else {
        return;
    };
    let (key, value) = match c.byte() % 14 {
        0 => ("size", Some(V::String(c.pick(SIZES).into()))),
        1 => ("serial", c.flag().then(|| V::String(c.pick(SERIALS).into()))),
        2 => ("uuid", c.flag().then(|| V::String(c.pick(UUIDS).into()))),
        3 => ("block_size", Some(V::Integer(if c.flag() { 512 } else { 4096 }))),
        4 => ("read_only", Some(V::Boolean(c.flag()))),
        5 => ("stalled", Some(V::Boolean(c.flag()))),
        6 => ("backstore", Some(V::String(c.pick(&["ram", "null", "file"]).into()))),
        7 => ("removable", Some(V::Boolean(c.flag()))),
        8 => ("iops_limit", c.flag().then(|| V::Integer(c.pick(IOPS)))),
        9 => ("bandwidth_limit", c.flag().then(|| V::String(c.pick(BANDWIDTHS).into()))),
        10 => ("initiator_iops_limit", c.flag().then(|| V::Integer(c.pick(IOPS)))),
        11 => (
            "initiator_bandwidth_limit",
            c.flag().then(|| V::String(c.pick(BANDWIDTHS).into())),
        ),
        12 => (
            "low_space_threshold",
            c.flag().then(|| V::String(c.pick(THRESHOLDS).into())),
        ),
        _ => ("id", Some(V::Integer(c.pick(LUN_IDS)))),
    };
    match value {
        Some(v) => l.insert(key.into(), v),
        None => l.remove(key),
    };
}

/// What a catalog serves, as a start from a document would build it.
#[derive(Debug, PartialEq)]
struct Served {
    portal_groups: String,
    discovery_auth: String,
    targets: Vec<String>,
}

fn served(c: &Catalog) -> Served {
    Served {
        portal_groups: format!("{:?}", c.portal_groups),
        discovery_auth: format!("{:?}", c.discovery_auth),
        targets: c
            .targets
            .iter()
            .map(|t| {
                let luns: Vec<String> = t
                    .luns
                    .units()
                    .iter()
                    .map(|(id, lu)| {
                        let cfg = lu.config();
                        format!(
                            "{id}: {} blocks of {}, serial {:?}, naa {:x}, pr {:?}, qos {}",
                            lu.blocks(),
                            lu.block_size(),
                            cfg.serial,
                            cfg.naa_id,
                            cfg.pr_state_path,
                            lu.qos().limits()
                        )
                    })
                    .collect();
                format!(
                    "{} {:?} groups {:?} acl {:?} auth {:?} luns {luns:?} tpgs {:?}",
                    t.name,
                    t.alias,
                    t.portal_groups,
                    t.acl,
                    t.auth,
                    t.luns.target_port_groups()
                )
            })
            .collect(),
    }
}

/// The units that serve, by lower-case target name and LUN.
fn units(c: &Catalog) -> HashMap<(String, u16), Arc<LogicalUnit>> {
    let mut out = HashMap::new();
    for t in &c.targets {
        for (id, lu) in t.luns.units() {
            out.insert((t.name.to_ascii_lowercase(), id), lu);
        }
    }
    out
}

/// Each LUN's definition in the document, size, stall switch, QoS ceilings
/// and low-space threshold aside.
fn definitions(doc: &toml::Table) -> HashMap<(String, u16), toml::Table> {
    let mut out = HashMap::new();
    for t in tables(doc, "target") {
        let name = t.get("name").and_then(toml::Value::as_str).unwrap_or("");
        for l in tables(t, "lun") {
            let id = l.get("id").and_then(toml::Value::as_integer).unwrap_or(-1);
            let mut def = l.clone();
            def.remove("size");
            def.remove("stalled");
            for key in [
                "iops_limit",
                "bandwidth_limit",
                "initiator_iops_limit",
                "initiator_bandwidth_limit",
                "low_space_threshold",
            ] {
                def.remove(key);
            }
            out.insert((name.trim().to_ascii_lowercase(), id as u16), def);
        }
    }
    out
}

/// The stamp a unit's first bytes hold: its key and when it was stamped.
fn stamp(key: &(String, u16), round: usize) -> Vec<u8> {
    format!("{}/{}@{round}", key.0, key.1).into_bytes()
}

fn read_stamp(lu: &LogicalUnit, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    lu.config().backstore.read_at(0, &mut buf).expect("read a unit's stamp");
    buf
}

/// Writes each unit's stamp (null units drop writes and read-only file
/// units are opened read-only: they get none).
fn restamp(round: usize, catalog: &Catalog, stamps: &mut HashMap<(String, u16), (Arc<LogicalUnit>, Vec<u8>)>) {
    stamps.clear();
    for (key, lu) in units(catalog) {
        if lu.config().read_only || lu.config().backstore.describe().starts_with("null") {
            continue;
        }
        let s = stamp(&key, round);
        lu.config().backstore.write_at(0, &s).expect("stamp a unit");
        stamps.insert(key, (lu, s));
    }
}

/// Listening addresses the document asks for, and how many there are.
fn listen_count(doc: &toml::Table) -> usize {
    tables(doc, "portal_group")
        .map(|g| g.get("listen").and_then(toml::Value::as_array).map_or(0, Vec::len))
        .sum()
}

const START: &str = "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:0\"]\n\n\
    [[target]]\nname = \"iqn.2026-11.io.blockwire:a\"\n\n\
    [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"64K\"\n";

async fn run(input: &[u8]) {
    let dir = scratch();
    for entry in std::fs::read_dir(dir).expect("scratch").flatten() {
        let p = entry.path();
        if p.is_file() {
            let _ = std::fs::remove_file(p);
        } else if p.file_name().is_some_and(|n| n == "state") {
            let _ = std::fs::remove_dir_all(p);
        }
    }
    let saved = dir.join("target.toml");
    let state = dir.join("state");
    let text = format!("[fabric]\nstate_dir = {:?}\n\n{START}", state.to_str().expect("utf-8"));
    std::fs::write(&saved, &text).expect("write the start document");
    let opts = LoadOptions::default();
    let built = TargetConfig::from_str_with("fuzz.toml", &text, opts).expect("the start document");
    let doc = parse_doc("fuzz.toml", &text).expect("the start document parses");
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    let fabric = Fabric::new(built.catalog, built.settings, stop_rx);
    let portals = Arc::new(PortalSet::new(fabric.clone()));
    let mut bound = HashMap::new();
    for g in &fabric.catalog().portal_groups {
        for a in &g.addresses {
            let portal = blockwire_target::iscsi::portal::Portal::bind(*a, g.tag)
                .await
                .expect("bind the start portal");
            bound.insert((*a, g.tag), portals.start(portal).await.expect("start the portal"));
        }
    }
    let source = Source {
        file: Some(saved.clone()),
        listen_override: None,
    };
    let live = Arc::new(Live::new(
        fabric.clone(),
        portals.clone(),
        opts,
        source,
        doc,
        bound,
        built.ram_lun_bytes,
    ));
    let control = Control::new(fabric.clone(), portals.clone(), Some(live.clone()));

    let mut c = Choices(input);
    let mut stamps: HashMap<(String, u16), (Arc<LogicalUnit>, Vec<u8>)> = HashMap::new();
    restamp(0, &fabric.catalog(), &mut stamps);

    for round in 1..=24 {
        if c.0.is_empty() {
            break;
        }
        let before_text = live.text().await;
        let before_doc = parse_doc("before", &before_text).expect("the running document parses");
        let (method, params) = if c.byte() % 4 == 0 {
            // The operator edits the file and reloads.
            let mut edited = before_doc.clone();
            edit_file(&mut c, &mut edited);
            std::fs::write(&saved, toml::to_string(&edited).expect("TOML")).expect("write");
            ("config.reload", json!({}))
        } else {
            call(&mut c)
        };
        let before = fabric.catalog();
        let before_units = units(&before);
        // The same call as a dry run first: it changes nothing, and says
        // what the call then does.
        let dry = if matches!(method, "lun.stall" | "config.save") {
            None
        } else {
            Some(dry_run(&control, &live, &fabric, &portals, method, &params, round).await)
        };
        let request = json!({"jsonrpc": "2.0", "id": round, "method": method, "params": params});
        let reply = control
            .handle_line(&request.to_string())
            .await
            .expect("a call with an id is answered");
        let reply: Value = serde_json::from_str(&reply).expect("the answer is JSON");
        assert_eq!(reply["jsonrpc"], "2.0", "{reply}");
        assert_eq!(reply["id"], json!(round), "{reply}");
        let ok = match (reply.get("result"), reply.get("error")) {
            (Some(_), None) => true,
            (None, Some(e)) => {
                assert!(e["code"].is_i64() && e["message"].is_string(), "{reply}");
                false
            }
            _ => panic!("neither a result nor an error: {reply}"),
        };

        if let Some(dry) = dry {
            same_outcome(method, &params, &dry, &reply);
        }

        let after_text = live.text().await;
        let after_doc = parse_doc("after", &after_text).expect("the running document parses");
        let after = fabric.catalog();
        let after_units = units(&after);
        if !ok {
            assert_eq!(after_text, before_text, "{method} {params} failed ({reply}) but changed the document");
            assert_eq!(served(&after), served(&before), "{method} {params} failed ({reply}) but changed the catalog");
            for (key, lu) in &before_units {
                assert!(
                    after_units.get(key).is_some_and(|a| Arc::ptr_eq(a, lu)),
                    "{method} {params} failed ({reply}) but replaced or removed LUN {key:?}"
                );
            }
        }

        let report = TargetConfig::check_str("running.toml", &after_text, LoadOptions { no_disk: true });
        assert!(
            report.errors.is_empty(),
            "after {method} {params} ({reply}) the running document fails its check: {:?}\n{after_text}",
            report.errors
        );
        let fresh = TargetConfig::from_str_with("running.toml", &after_text, LoadOptions { no_disk: true })
            .unwrap_or_else(|e| panic!("after {method} {params}: a start from the running document fails: {e}\n{after_text}"));
        assert_eq!(
            served(&after),
            served(&fresh.catalog),
            "after {method} {params} ({reply}) the catalog is not what a start would serve\n{after_text}"
        );
        let listening = portals.list().len();
        assert_eq!(
            listening,
            listen_count(&after_doc),
            "after {method} {params} ({reply}): {listening} portals listen: {:?}\n{after_text}",
            portals.list()
        );

        // Units: kept with their data where the definition stayed.
        let (old_defs, new_defs) = (definitions(&before_doc), definitions(&after_doc));
        for (key, lu) in &after_units {
            let kept = old_defs.get(key).is_some_and(|d| new_defs.get(key) == Some(d));
            match stamps.get(key) {
                Some((old, s)) if kept => {
                    assert!(
                        Arc::ptr_eq(old, lu),
                        "{method} {params} left LUN {key:?}'s definition alone but replaced its unit"
                    );
                    assert_eq!(&read_stamp(lu, s.len()), s, "{method} {params}: LUN {key:?} lost its data");
                }
                _ if kept => {}
                _ => {
                    if lu.config().backstore.describe().starts_with("ram")
                        && !before_units.values().any(|b| Arc::ptr_eq(b, lu))
                    {
                        let held = read_stamp(lu, 64);
                        assert!(
                            held.iter().all(|&b| b == 0),
                            "{method} {params}: new RAM LUN {key:?} holds {:?}",
                            String::from_utf8_lossy(&held)
                        );
                    }
                }
            }
        }
        restamp(round, &after, &mut stamps);

        // Low-space thresholds: the fresh start above stands in for every
        // store (--no-disk), so each serving unit is held to its document
        // instead: the threshold written there, in whole 1 MiB sets.
        for (key, lu) in &after_units {
            let written = tables(&after_doc, "target")
                .filter(|t| {
                    t.get("name")
                        .and_then(toml::Value::as_str)
                        .is_some_and(|n| n.trim().eq_ignore_ascii_case(&key.0))
                })
                .flat_map(|t| tables(t, "lun"))
                .find(|l| l.get("id").and_then(toml::Value::as_integer) == Some(i64::from(key.1)))
                .and_then(|l| l.get("low_space_threshold"))
                .and_then(toml::Value::as_str)
                .and_then(parse_size);
            let want = written
                .filter(|_| lu.reports_space())
                .map(|b| ((b + (1 << 19)) >> 20).max(1) << 20);
            assert_eq!(
                lu.low_space_threshold(),
                want,
                "after {method} {params} ({reply}): LUN {key:?}'s low-space threshold is not its document's\n{after_text}"
            );
        }

        if method == "config.save" && ok {
            let again = json!({"jsonrpc": "2.0", "id": 0, "method": "config.reload", "params": {}});
            let reply = control.handle_line(&again.to_string()).await.expect("answered");
            let reply: Value = serde_json::from_str(&reply).expect("JSON");
            assert_eq!(
                reply["result"]["changes"],
                json!([]),
                "reloading what was just saved changed something: {reply}\n{after_text}"
            );
            assert_eq!(live.text().await, after_text, "reloading what was just saved changed the document");
        }
    }
}

/// The scratch directory's files and their sizes, and the state directory's.
fn on_disk() -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut dirs = vec![scratch().to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            match e.metadata() {
                Ok(m) if m.is_dir() => {
                    out.push((p.clone(), 0));
                    dirs.push(p);
                }
                Ok(m) => out.push((p, m.len())),
                Err(_) => {}
            }
        }
    }
    out.sort();
    out
}

/// Calls `method` with `"dry_run": true` and checks that nothing changed:
/// the document, the catalog and every unit in it (size too), the portals,
/// the files. Returns the answer.
async fn dry_run(
    control: &Control,
    live: &Live,
    fabric: &Fabric,
    portals: &PortalSet,
    method: &str,
    params: &Value,
    round: usize,
) -> Value {
    let mut params = params.clone();
    params["dry_run"] = json!(true);
    let text = live.text().await;
    let catalog = fabric.catalog();
    let served_before = served(&catalog);
    let listening: Vec<_> = portals.list().iter().map(|p| p.addr).collect();
    let files = on_disk();
    let request = json!({"jsonrpc": "2.0", "id": round, "method": method, "params": params});
    let reply = control.handle_line(&request.to_string()).await.expect("a dry run is answered");
    let reply: Value = serde_json::from_str(&reply).expect("the answer is JSON");
    if let Some(r) = reply.get("result") {
        assert_eq!(r["dry_run"], json!(true), "{method} {params}: {reply}");
    }
    assert_eq!(live.text().await, text, "{method} {params} ({reply}) changed the document");
    assert!(Arc::ptr_eq(&fabric.catalog(), &catalog), "{method} {params} ({reply}) replaced the catalog");
    assert_eq!(served(&catalog), served_before, "{method} {params} ({reply}) changed what serves");
    let now: Vec<_> = portals.list().iter().map(|p| p.addr).collect();
    assert_eq!(now, listening, "{method} {params} ({reply}) changed the portals");
    assert_eq!(on_disk(), files, "{method} {params} ({reply}) changed files");
    reply
}

/// A change's line in words a dry run can know: a port 0 portal's port,
/// and what opening a file tells (an atomic-write journal's size), left out.
fn comparable(line: &str) -> String {
    let mut line = line.to_owned();
    if let Some(rest) = line.strip_prefix("portal ") {
        if let Some((addr, tail)) = rest.split_once(" (portal group") {
            let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
            line = format!("portal {host}:* (portal group{tail}");
        }
    }
    if let Some(at) = line.find(", atomic writes up to ") {
        let end = line[at..].find(')').map_or(line.len(), |e| at + e);
        line.replace_range(at..end, "");
    }
    line
}

/// The lines of a change's answer: for a dry run without the notices of
/// what opening files does on disk ("target.lun.path: ..."), for the change
/// without its data paths' starts ("LUN 1 of ...: READ engine: ...").
fn lines(result: &Value, dry: bool) -> Vec<String> {
    result["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .map(|l| l.as_str().expect("a line").to_owned())
        .filter(|l| {
            if dry {
                !l.split(' ').next().is_some_and(|w| w.ends_with(':'))
            } else {
                !l.contains(": READ engine: ") && !l.contains(": WRITE engine: ")
            }
        })
        .map(|l| comparable(&l))
        .collect()
}

/// A dry run's answer and the call's agree: the same error, or the same
/// lines and sections needing a restart; a dry run that passes may meet a
/// failure only doing can find (a portal that cannot bind, a file that
/// cannot be opened or grown).
fn same_outcome(method: &str, params: &Value, dry: &Value, done: &Value) {
    match (dry.get("result"), done.get("result")) {
        (Some(d), Some(r)) => {
            assert_eq!(lines(d, true), lines(r, false), "{method} {params}: dry run {dry}, done {done}");
            assert_eq!(d["restart_needed"], r["restart_needed"], "{method} {params}: {dry} / {done}");
        }
        (None, None) => assert_eq!(dry["error"], done["error"], "{method} {params}"),
        (Some(_), None) => {
            let e = &done["error"];
            assert!(
                e["code"] == json!(-32003),
                "{method} {params}: the dry run passed ({dry}) but the call was refused: {done}"
            );
        }
        (None, Some(_)) => panic!("{method} {params}: the dry run was refused ({dry}) but the call passed: {done}"),
    }
}

fuzz_target!(|input: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(run(input));
});
