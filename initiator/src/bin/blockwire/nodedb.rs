//! The node database of `blockwire iscsiadm -m node` / `-m session`: plain
//! `key = value` files, one per target portal, as open-iscsi keeps them.
//!
//! Layout under the config directory (`--config-dir`, `$BLOCKWIRE_CONFIG_DIR`,
//! default `$HOME/.config/blockwire`):
//!
//! ```text
//! nodes/<IQN>/<HOST>,<PORT>,<TPGT>      node record (node.name, address, auth)
//! sessions/<IQN>,<HOST>,<PORT>          session record (sid, tsih, login time)
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use blockwire_initiator::Portal;
use blockwire_pdu::keys::{check_peer_name, check_portal_host};

/// One node record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub target: String,
    pub portal: Portal,
    pub settings: BTreeMap<String, String>,
}

impl Node {
    pub fn new(target: &str, portal: &Portal) -> Node {
        let mut settings = BTreeMap::new();
        settings.insert("node.name".into(), target.to_owned());
        settings.insert("node.tpgt".into(), portal.tpgt.to_string());
        settings.insert("node.conn[0].address".into(), portal.host.clone());
        settings.insert("node.conn[0].port".into(), portal.port.to_string());
        settings.insert("node.startup".into(), "manual".into());
        settings.insert("node.session.auth.authmethod".into(), "None".into());
        Node {
            target: target.to_owned(),
            portal: portal.clone(),
            settings,
        }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.settings
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// A recorded login.
#[derive(Debug, Clone)]
pub struct SessionRecord {
    pub sid: u32,
    pub target: String,
    pub portal: Portal,
    #[allow(dead_code)]
    pub tsih: u16,
}

pub struct NodeDb {
    dir: PathBuf,
}

fn portal_file(p: &Portal) -> String {
    format!("{},{},{}", p.host, p.port, p.tpgt)
}

/// A target's name and portal host become file names here (and come from the
/// command line or from a discovery target's answer): only a name without `/` or
/// control characters and a domain name or address may, so that no record lands
/// outside the database.
fn check_record(target: &str, p: &Portal) -> Result<()> {
    check_peer_name(target).map_err(|why| anyhow!("not recording target {target:?}: {why}"))?;
    check_portal_host(&p.host).map_err(|why| anyhow!("not recording a portal of {target}: {why}"))
}

fn parse_kv(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// What the temporary file of a record being written has in its name (after
/// a leading '.'); the readers pass such files by.
const TMP_MARK: &str = ".tmp-";

fn is_temporary(entry: &std::fs::DirEntry) -> bool {
    let name = entry.file_name();
    let name = name.to_string_lossy();
    name.starts_with('.') && name.contains(TMP_MARK)
}

/// Why a record cannot keep `key = value` as given, if it cannot: a line is
/// read back as the key before the first '=' and the value after it, both
/// trimmed, and a line starting with '#' is a comment. So a line break would
/// write other keys, and a CHAP secret with a trailing space would come
/// back without it.
fn unkeepable(key: &str, value: &str) -> Option<String> {
    if key.contains(char::is_control) || value.contains(char::is_control) {
        return Some(format!("{key:?} = {value:?} holds a control character"));
    }
    if key.is_empty() || key.contains('=') || key.starts_with('#') || key != key.trim() {
        return Some(format!(
            "{key:?} is not a record key (keys are names such as node.session.auth.username: \
             no '=', no leading '#' or white space)"
        ));
    }
    if value != value.trim() {
        return Some(format!(
            "{key} = {value:?} starts or ends with white space, which a record reads back \
             without: give the value without it"
        ));
    }
    None
}

/// Writes a record owner-only (files 0600, directories 0700: node records
/// hold CHAP secrets), whole or not at all: a temporary file beside it,
/// renamed over it, so a record written before with other modes takes these.
fn write_kv(path: &Path, kv: &BTreeMap<String, String>) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(why) = kv.iter().find_map(|(k, v)| unkeepable(k, v)) {
        bail!("not writing {}: {why}", path.display());
    }
    if let Some(d) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(d)
            .with_context(|| format!("creating {}", d.display()))?;
    }
    let mut s = String::from("# blockwire node database (iscsiadm format)\n");
    for (k, v) in kv {
        s.push_str(&format!("{k} = {v}\n"));
    }
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}{TMP_MARK}{}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(s.as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("writing {}", path.display()))
}

impl NodeDb {
    pub fn open(dir: Option<PathBuf>) -> NodeDb {
        let dir = dir
            .or_else(|| std::env::var_os("BLOCKWIRE_CONFIG_DIR").map(PathBuf::from))
            .unwrap_or_else(|| {
                std::env::var_os("HOME")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from("/var/lib"))
                    .join(".config/blockwire")
            });
        NodeDb { dir }
    }

    fn node_path(&self, n: &Node) -> PathBuf {
        self.dir
            .join("nodes")
            .join(&n.target)
            .join(portal_file(&n.portal))
    }

    /// Adds or replaces a record, keeping the settings of an existing one.
    pub fn upsert(&self, target: &str, portal: &Portal) -> Result<Node> {
        check_record(target, portal)?;
        let mut n = Node::new(target, portal);
        if let Some(old) = self
            .nodes()?
            .into_iter()
            .find(|o| o.target == n.target && o.portal == n.portal)
        {
            n.settings.extend(old.settings);
        }
        write_kv(&self.node_path(&n), &n.settings)?;
        Ok(n)
    }

    pub fn save(&self, n: &Node) -> Result<()> {
        check_record(&n.target, &n.portal)?;
        write_kv(&self.node_path(n), &n.settings)
    }

    pub fn delete(&self, n: &Node) -> Result<()> {
        let p = self.node_path(n);
        std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
        if let Some(d) = p.parent() {
            let _ = std::fs::remove_dir(d);
        }
        Ok(())
    }

    pub fn nodes(&self) -> Result<Vec<Node>> {
        let mut out = Vec::new();
        let root = self.dir.join("nodes");
        let Ok(targets) = std::fs::read_dir(&root) else {
            return Ok(out);
        };
        for t in targets.flatten() {
            let Ok(portals) = std::fs::read_dir(t.path()) else {
                continue;
            };
            for p in portals.flatten().filter(|p| !is_temporary(p)) {
                let text = std::fs::read_to_string(p.path())
                    .with_context(|| format!("reading {}", p.path().display()))?;
                let settings = parse_kv(&text);
                let get = |k: &str| settings.get(k).cloned().unwrap_or_default();
                let portal = Portal {
                    host: get("node.conn[0].address"),
                    port: get("node.conn[0].port").parse().unwrap_or(3260),
                    tpgt: get("node.tpgt").parse().unwrap_or(1),
                };
                out.push(Node {
                    target: get("node.name"),
                    portal,
                    settings,
                });
            }
        }
        out.sort_by(|a, b| {
            (&a.target, portal_file(&a.portal)).cmp(&(&b.target, portal_file(&b.portal)))
        });
        Ok(out)
    }

    fn session_path(&self, target: &str, p: &Portal) -> PathBuf {
        self.dir
            .join("sessions")
            .join(format!("{target},{},{}", p.host, p.port))
    }

    pub fn sessions(&self) -> Result<Vec<SessionRecord>> {
        let mut out = Vec::new();
        let Ok(rd) = std::fs::read_dir(self.dir.join("sessions")) else {
            return Ok(out);
        };
        for e in rd.flatten().filter(|e| !is_temporary(e)) {
            let kv = parse_kv(&std::fs::read_to_string(e.path())?);
            let get = |k: &str| kv.get(k).cloned().unwrap_or_default();
            out.push(SessionRecord {
                sid: get("sid").parse().unwrap_or(0),
                target: get("target"),
                portal: Portal {
                    host: get("address"),
                    port: get("port").parse().unwrap_or(3260),
                    tpgt: get("tpgt").parse().unwrap_or(1),
                },
                tsih: get("tsih").parse().unwrap_or(0),
            });
        }
        out.sort_by_key(|s| s.sid);
        Ok(out)
    }

    pub fn add_session(&self, target: &str, p: &Portal, tsih: u16) -> Result<SessionRecord> {
        check_record(target, p)?;
        let sid = self.sessions()?.iter().map(|s| s.sid).max().unwrap_or(0) + 1;
        let mut kv = BTreeMap::new();
        kv.insert("sid".to_owned(), sid.to_string());
        kv.insert("target".to_owned(), target.to_owned());
        kv.insert("address".to_owned(), p.host.clone());
        kv.insert("port".to_owned(), p.port.to_string());
        kv.insert("tpgt".to_owned(), p.tpgt.to_string());
        kv.insert("tsih".to_owned(), tsih.to_string());
        write_kv(&self.session_path(target, p), &kv)?;
        Ok(SessionRecord {
            sid,
            target: target.to_owned(),
            portal: p.clone(),
            tsih,
        })
    }

    pub fn remove_session(&self, s: &SessionRecord) -> Result<()> {
        let p = self.session_path(&s.target, &s.portal);
        std::fs::remove_file(&p).map_err(|e| anyhow!("removing {}: {e}", p.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A record written is read back as it was; one that could not be
        /// is refused whole, and nothing is written.
        #[test]
        fn records_read_back_as_written_or_are_refused(
            kv in prop::collection::btree_map("(?s).{0,10}", "(?s).{0,10}", 0..5),
        ) {
            static CASE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = std::env::temp_dir()
                .join(format!("blockwire-nodedb-kv-{}-{n}", std::process::id()));
            let path = dir.join("node");
            let written = write_kv(&path, &kv);
            let read = std::fs::read_to_string(&path);
            let _ = std::fs::remove_dir_all(&dir);
            match written {
                Ok(()) => prop_assert_eq!(parse_kv(&read.unwrap()), kv),
                Err(e) => {
                    prop_assert!(kv.iter().any(|(k, v)| unkeepable(k, v).is_some()), "{}", e);
                    prop_assert!(read.is_err(), "a refused record was written");
                }
            }
        }

        /// Any text, hand-edited or damaged, reads without panicking.
        #[test]
        fn any_text_reads(text in "(?s).{0,200}") {
            let _ = parse_kv(&text);
        }
    }

    fn portal(host: &str) -> Portal {
        Portal {
            host: host.into(),
            port: 3260,
            tpgt: 1,
        }
    }

    /// What a discovery target answers, or a user types, becomes file names and
    /// lines here: none of it may write outside the database or another key.
    #[test]
    fn records_stay_inside_the_database() {
        let base = std::env::temp_dir().join(format!("blockwire-nodedb-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let db = NodeDb::open(Some(base.join("db")));
        let outside = base.join("outside");
        let ok = "iqn.2026-11.io.blockwire:ok";
        for target in [
            outside.to_str().unwrap(),
            "../../outside",
            "iqn.2026-11.io.x:a/b",
        ] {
            let e = db.upsert(target, &portal("127.0.0.1")).expect_err(target);
            assert!(e.to_string().contains("not recording target"), "{e}");
        }
        for host in ["../../outside", "h/x", "h\nnode.startup = automatic"] {
            let e = db.upsert(ok, &portal(host)).expect_err(host);
            assert!(e.to_string().contains("not recording a portal"), "{e}");
            assert!(db.add_session(ok, &portal(host), 1).is_err(), "{host:?}");
        }
        assert!(
            !outside.exists(),
            "a record was written outside the database"
        );

        let mut n = db.upsert(ok, &portal("fe80::1%eth0")).unwrap();
        let injected = "u\nnode.startup = automatic";
        n.settings
            .insert("node.session.auth.username".into(), injected.into());
        let e = db.save(&n).expect_err("a value with a line break");
        assert!(e.to_string().contains("control character"), "{e}");
        let back = db.nodes().unwrap();
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].get("node.startup"), Some("manual"));
        let _ = std::fs::remove_dir_all(&base);
    }

    /// Node records hold CHAP secrets (node.session.auth.password): only
    /// their owner may read them, as open-iscsi keeps /etc/iscsi/nodes, also
    /// when a record written before was readable by others.
    #[test]
    fn records_with_secrets_are_the_owners_alone() {
        use std::os::unix::fs::PermissionsExt;
        let base =
            std::env::temp_dir().join(format!("blockwire-nodedb-mode-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let db = NodeDb::open(Some(base.clone()));
        let mut n = db
            .upsert("iqn.2026-11.io.blockwire:t", &portal("127.0.0.1"))
            .unwrap();
        let path = db.node_path(&n);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        n.settings
            .insert("node.session.auth.password".into(), "s3cret-s3cret".into());
        db.save(&n).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600, "{}", path.display());
        for dir in [base.join("nodes"), path.parent().unwrap().to_path_buf()] {
            assert_eq!(mode(&dir) & 0o077, 0, "{}", dir.display());
        }
        db.add_session("iqn.2026-11.io.blockwire:t", &portal("127.0.0.1"), 1)
            .unwrap();
        for e in std::fs::read_dir(base.join("sessions")).unwrap() {
            assert_eq!(mode(&e.unwrap().path()), 0o600);
        }
        assert_eq!(
            db.nodes().unwrap()[0].get("node.session.auth.password"),
            Some("s3cret-s3cret")
        );
        let _ = std::fs::remove_dir_all(&base);
    }
}
