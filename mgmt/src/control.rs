//! The daemon's runtime control API: JSON-RPC 2.0 over a Unix stream
//! socket, one JSON object (or batch array) per line in each direction.
//!
//! The socket is created owner-only (0600) at the path `--control` or
//! `[control] socket` names; see docs/control.md for the methods and
//! their errors. Every method is one entry of [`METHODS`] and one arm of
//! [`Control::call`]; its parameters are a serde struct that refuses
//! unknown fields, so a typo is an error, not a no-op. Errors are JSON-RPC
//! error objects whose message names what was not found and what there is
//! (e.g. "no LUN 3 in target iqn...; LUNs are 0, 1").

use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use blockwire_target::iscsi::portal::{PortalError, PortalSet};
use blockwire_target::iscsi::Fabric;
use blockwire_target::scsi::stats::Direction;
use blockwire_target::scsi::LunTable;

use crate::live::{edits, parse_doc, ChangeMode, Live, LiveError};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, info, warn};

/// One method of the API, as `--help` and docs/control.md list it.
#[derive(Debug, Clone, Copy)]
pub struct Method {
    /// Its name, e.g. "lun.stall".
    pub name: &'static str,
    /// Its parameters, as a JSON example ("" for none).
    pub params: &'static str,
    /// What it does.
    pub summary: &'static str,
}

/// Where `blockwire-target ctl` calls when not told (`--control`), and where the
/// packaged systemd unit (`packaging/blockwire-target.service`) opens the socket.
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/blockwire/control.sock";

/// Every method the control socket answers.
pub const METHODS: &[Method] = &[
    Method {
        name: "lun.list",
        params: "",
        summary: "targets, their LUNs (stalled or not, commands held, QoS ceilings and what they delayed) and ALUA port groups",
    },
    Method {
        name: "lun.stall",
        params: r#"{"target": "iqn...", "lun": 0, "stalled": true}"#,
        summary: "stall (true) or release (false) a LUN: its media commands wait before the backstore; TMFs and other commands are answered",
    },
    Method {
        name: "session.list",
        params: "",
        summary: "sessions: initiator, ISID, TSIH, target, portal, TPGT, negotiated parameters, and the initiator's READ/WRITE totals on the target",
    },
    Method {
        name: "isns.status",
        params: "",
        summary: "the iSNS registration ([isns]): server, entity, state, targets and portals registered, period granted, last error",
    },
    Method {
        name: "portal.list",
        params: "",
        summary: "portals: listen address, TPGT, open or closed, connections",
    },
    Method {
        name: "portal.close",
        params: r#"{"listen": "127.0.0.1:3260"}"#,
        summary: "close a portal and cut every connection that came in through it",
    },
    Method {
        name: "portal.open",
        params: r#"{"listen": "127.0.0.1:3260"}"#,
        summary: "re-open a closed portal",
    },
    Method {
        name: "session.close",
        params: r#"{"tsih": 1}"#,
        summary: "end a session's connection (the initiator may log in again if the access list admits it)",
    },
    Method {
        name: "target.add",
        params: r#"{"target": {"name": "iqn...", "allow": ["iqn..."], "lun": [{"id": 0, "backstore": "ram", "size": "1G"}]}}"#,
        summary: "add a target, its table written as in the configuration file",
    },
    Method {
        name: "target.restore",
        params: r#"{"from": "/etc/blockwire/backup/target.toml.2026-...Z", "target": "iqn... (optional)"}"#,
        summary: "add a target back as another configuration file (a saved one, or one of its backups) defines it; no target: every target of the file that is not running",
    },
    Method {
        name: "target.remove",
        params: r#"{"target": "iqn...", "force": false}"#,
        summary: "remove a target; refused while sessions are logged in to it unless forced (they are then closed)",
    },
    Method {
        name: "lun.add",
        params: r#"{"target": "iqn...", "lun": {"id": 1, "backstore": "file", "path": "/srv/disk1.img", "size": "10G"}}"#,
        summary: "add a LUN, its table written as in the configuration file, or a list of such tables in one change (all or none); initiators hear REPORTED LUNS DATA HAS CHANGED",
    },
    Method {
        name: "lun.remove",
        params: r#"{"target": "iqn...", "lun": 1, "force": false}"#,
        summary: "remove a LUN; refused while in use (commands running, or a READ or WRITE in the last 10 s) unless forced",
    },
    Method {
        name: "lun.resize",
        params: r#"{"target": "iqn...", "lun": 1, "size": "20G"}"#,
        summary: "change a LUN's capacity (files only grow; a block device's LUN follows the grown device up to its size); initiators hear CAPACITY DATA HAS CHANGED",
    },
    Method {
        name: "lun.limit",
        params: r#"{"target": "iqn...", "lun": 1, "iops": 500, "bandwidth": "100M", "initiator_iops": 200, "initiator_bandwidth": "50M"}"#,
        summary: "set a LUN's QoS ceilings while it serves, the LUN's and each initiator's (any of them; 0 or \"none\" lifts one); media commands over them wait their turn",
    },
    Method {
        name: "acl.add",
        params: r#"{"target": "iqn...", "initiator": "iqn..."}"#,
        summary: "admit an initiator (the first entry restricts the target to its list)",
    },
    Method {
        name: "acl.remove",
        params: r#"{"target": "iqn...", "initiator": "iqn..."}"#,
        summary: "stop admitting an initiator; its sessions to the target are closed",
    },
    Method {
        name: "chap.add",
        params: r#"{"target": "iqn...", "user": "name", "secret": "12 to 255 chars", "initiator": "iqn... (optional)", "replace": false}"#,
        summary: "add a CHAP account for logins from now on (no target: discovery); \"replace\": true gives an existing account the new secret",
    },
    Method {
        name: "chap.remove",
        params: r#"{"target": "iqn...", "user": "name", "initiator": "iqn... (optional)", "force": false}"#,
        summary: "remove a CHAP account (sessions already logged in keep running); the last one of a target or of discovery only when forced: CHAP is then off there",
    },
    Method {
        name: "portal.add",
        params: r#"{"tag": 1, "listen": "0.0.0.0:3261"}"#,
        summary: "listen on another address in a portal group (created if new)",
    },
    Method {
        name: "portal.remove",
        params: r#"{"listen": "0.0.0.0:3261", "tag": 1}"#,
        summary: "stop listening on an address for good (tag: only when several groups list it); connections through it are cut",
    },
    Method {
        name: "config.show",
        params: "",
        summary: "the running configuration, as TOML",
    },
    Method {
        name: "config.reload",
        params: "",
        summary: "read the configuration file again and apply the difference (what SIGHUP does); with \"dry_run\": true, as every method that changes the configuration, only say what it would change",
    },
    Method {
        name: "config.save",
        params: r#"{"path": "/etc/blockwire/target.toml (optional)"}"#,
        summary: "write the running configuration atomically (default: the file it came from), keeping 10 backups in backup/",
    },
];

/// The methods that change the configuration: each takes `"dry_run": true`.
pub const CHANGES: &[&str] = &[
    "target.add",
    "target.remove",
    "target.restore",
    "lun.add",
    "lun.remove",
    "lun.resize",
    "lun.limit",
    "acl.add",
    "acl.remove",
    "chap.add",
    "chap.remove",
    "portal.add",
    "portal.remove",
    "config.reload",
];

/// The method list as `--help` prints it.
pub fn methods_help() -> String {
    METHODS
        .iter()
        .map(|m| {
            let params = if m.params.is_empty() {
                String::new()
            } else {
                format!(" '{}'", m.params)
            };
            format!("  {}{params}\n      {}", m.name, m.summary)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// JSON-RPC 2.0 error codes used here.
pub mod code {
    /// The line is not JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// JSON, but not a JSON-RPC 2.0 request.
    pub const INVALID_REQUEST: i64 = -32600;
    /// No such method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Missing, unknown or mistyped parameters.
    pub const INVALID_PARAMS: i64 = -32602;
    /// A target, LUN or portal the request names does not exist.
    pub const NOT_FOUND: i64 = -32001;
    /// The request conflicts with the current state (e.g. closing a
    /// closed portal).
    pub const CONFLICT: i64 = -32002;
    /// The daemon tried and failed (e.g. re-binding a portal).
    pub const FAILED: i64 = -32003;
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (error {code})")]
pub struct RpcError {
    /// One of [`code`].
    pub code: i64,
    /// What went wrong and what to do.
    pub message: String,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }

    fn to_json(&self) -> Value {
        json!({"code": self.code, "message": self.message})
    }
}

/// Lists names for an error message ("a, b" or "none").
fn listing<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let v: Vec<String> = items.into_iter().map(|i| i.to_string()).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StallParams {
    target: String,
    lun: u16,
    stalled: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PortalParams {
    listen: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoParams {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TsihParams {
    tsih: u16,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TargetAddParams {
    target: serde_json::Map<String, Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TargetRemoveParams {
    target: String,
    #[serde(default)]
    force: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TargetRestoreParams {
    from: PathBuf,
    target: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LunAddParams {
    target: String,
    lun: OneOrMany,
}

/// One LUN's table, or a list of them added in one change: each change checks and builds
/// the whole configuration, so a thousand LUNs added one call each cost a thousand such
/// passes, and a list costs one.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(serde_json::Map<String, Value>),
    Many(Vec<serde_json::Map<String, Value>>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LunRemoveParams {
    target: String,
    lun: u16,
    #[serde(default)]
    force: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LunLimitParams {
    target: String,
    lun: u16,
    iops: Option<u64>,
    bandwidth: Option<String>,
    initiator_iops: Option<u64>,
    initiator_bandwidth: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LunResizeParams {
    target: String,
    lun: u16,
    size: String,
    #[serde(default)]
    force: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AclParams {
    target: String,
    initiator: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChapParams {
    target: Option<String>,
    user: String,
    secret: Option<String>,
    initiator: Option<String>,
    /// chap.add: give an existing account the new secret.
    #[serde(default)]
    replace: bool,
    /// chap.remove: remove the last account, which turns CHAP off.
    #[serde(default)]
    force: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PortalAddParams {
    tag: u16,
    listen: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PortalRemoveParams {
    listen: String,
    tag: Option<u16>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SaveParams {
    path: Option<PathBuf>,
}

/// What the control API acts on.
#[derive(Debug)]
pub struct Control {
    fabric: Arc<Fabric>,
    portals: Arc<PortalSet>,
    /// The running configuration (None: a fabric without one, in tests).
    live: Option<Arc<Live>>,
}

/// A LUN's counters in one direction, as lun.list shows them.
fn counted(lu: &blockwire_target::scsi::LogicalUnit, d: Direction) -> Value {
    use std::sync::atomic::Ordering::Relaxed;
    let s = lu.stats().direction(d);
    json!({
        "commands": s.commands.load(Relaxed),
        "errors": s.errors.load(Relaxed),
        "bytes": s.bytes.load(Relaxed),
    })
}

fn live_error(e: LiveError) -> RpcError {
    let code = match e {
        LiveError::Invalid(_) => code::INVALID_PARAMS,
        LiveError::NotFound(_) => code::NOT_FOUND,
        LiveError::InUse(_) => code::CONFLICT,
        LiveError::Failed(_) => code::FAILED,
    };
    RpcError::new(code, e.to_string())
}

fn table(v: serde_json::Map<String, Value>) -> Result<toml::Table, RpcError> {
    match edits::json_to_toml(Value::Object(v)).map_err(live_error)? {
        toml::Value::Table(t) => Ok(t),
        _ => Err(RpcError::new(code::INVALID_PARAMS, "expected an object")),
    }
}

impl Control {
    /// The API over a running fabric, its portals and its configuration.
    pub fn new(fabric: Arc<Fabric>, portals: Arc<PortalSet>, live: Option<Arc<Live>>) -> Control {
        Control {
            fabric,
            portals,
            live,
        }
    }

    fn live(&self) -> Result<&Live, RpcError> {
        self.live.as_deref().ok_or_else(|| {
            RpcError::new(
                code::FAILED,
                "this daemon has no running configuration to change",
            )
        })
    }

    async fn edit(
        &self,
        mode: ChangeMode,
        f: impl FnOnce(&mut toml::Table) -> Result<(), LiveError>,
    ) -> Result<Value, RpcError> {
        let applied = self.live()?.edit(mode, f).await.map_err(live_error)?;
        Ok(serde_json::to_value(applied).unwrap_or(Value::Null))
    }

    /// The methods that change the configuration. Each takes `"dry_run":
    /// true` besides its own parameters: the change is checked and what it
    /// would do is answered, in the words it would use, and nothing changes.
    async fn call_edit(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let (params, dry_run) = if CHANGES.contains(&method) {
            take_dry_run(method, params)?
        } else {
            (params, false)
        };
        let mode = |force: bool| ChangeMode { force, dry_run };
        match method {
            "target.add" => {
                let p: TargetAddParams = parse(method, params)?;
                let t = table(p.target)?;
                self.edit(mode(false), |d| edits::add_target(d, t)).await
            }
            "target.remove" => {
                let p: TargetRemoveParams = parse(method, params)?;
                self.edit(mode(p.force), |d| edits::remove_target(d, &p.target))
                    .await
            }
            "target.restore" => {
                let p: TargetRestoreParams = parse(method, params)?;
                let shown = p.from.display().to_string();
                let text = read_configuration(&p.from).map_err(|e| {
                    RpcError::new(code::NOT_FOUND, format!("cannot read {shown}: {e}"))
                })?;
                let from = parse_doc(&shown, &text).map_err(live_error)?;
                self.edit(mode(false), |d| {
                    edits::restore_targets(d, &from, p.target.as_deref(), &shown).map(|_| ())
                })
                .await
            }
            "lun.add" => {
                let p: LunAddParams = parse(method, params)?;
                let luns = match p.lun {
                    OneOrMany::One(l) => vec![table(l)?],
                    OneOrMany::Many(ls) => ls.into_iter().map(table).collect::<Result<_, _>>()?,
                };
                if luns.is_empty() {
                    return Err(RpcError::new(
                        code::INVALID_PARAMS,
                        "lun.add: the list of LUNs is empty; give one LUN's table or a list of them",
                    ));
                }
                self.edit(mode(false), |d| {
                    luns.into_iter()
                        .try_for_each(|l| edits::add_lun(d, &p.target, l))
                })
                .await
            }
            "lun.remove" => {
                let p: LunRemoveParams = parse(method, params)?;
                self.edit(mode(p.force), |d| edits::remove_lun(d, &p.target, p.lun))
                    .await
            }
            "lun.resize" => {
                let p: LunResizeParams = parse(method, params)?;
                self.edit(mode(p.force), |d| {
                    edits::resize_lun(d, &p.target, p.lun, &p.size)
                })
                .await
            }
            "lun.limit" => {
                let p: LunLimitParams = parse(method, params)?;
                self.edit(mode(false), |d| {
                    let edit = edits::LimitEdit {
                        iops: p.iops,
                        bandwidth: p.bandwidth.as_deref(),
                        initiator_iops: p.initiator_iops,
                        initiator_bandwidth: p.initiator_bandwidth.as_deref(),
                    };
                    edits::limit_lun(d, &p.target, p.lun, &edit)
                })
                .await
            }
            "acl.add" => {
                let p: AclParams = parse(method, params)?;
                self.edit(mode(false), |d| edits::acl_add(d, &p.target, &p.initiator))
                    .await
            }
            "acl.remove" => {
                let p: AclParams = parse(method, params)?;
                self.edit(mode(false), |d| {
                    edits::acl_remove(d, &p.target, &p.initiator)
                })
                .await
            }
            "chap.add" => {
                let p: ChapParams = parse(method, params)?;
                let secret = p.secret.ok_or_else(|| {
                    RpcError::new(
                        code::INVALID_PARAMS,
                        "chap.add needs a \"secret\" (12 to 255 characters)",
                    )
                })?;
                self.edit(mode(false), |d| {
                    edits::chap_add(
                        d,
                        p.target.as_deref(),
                        &p.user,
                        &secret,
                        p.initiator.as_deref(),
                        p.replace,
                    )
                })
                .await
            }
            "chap.remove" => {
                let p: ChapParams = parse(method, params)?;
                self.edit(mode(false), |d| {
                    edits::chap_remove(
                        d,
                        p.target.as_deref(),
                        &p.user,
                        p.initiator.as_deref(),
                        p.force,
                    )
                })
                .await
            }
            "portal.add" => {
                let p: PortalAddParams = parse(method, params)?;
                self.edit(mode(false), |d| edits::portal_add(d, p.tag, &p.listen))
                    .await
            }
            "portal.remove" => {
                let p: PortalRemoveParams = parse(method, params)?;
                self.edit(mode(false), |d| edits::portal_remove(d, &p.listen, p.tag))
                    .await
            }
            "config.show" => {
                let NoParams {} = parse(method, params)?;
                Ok(json!({"toml": self.live()?.text().await}))
            }
            "config.reload" => {
                let NoParams {} = parse(method, params)?;
                let a = self.live()?.reload(mode(false)).await.map_err(live_error)?;
                Ok(serde_json::to_value(a).unwrap_or(Value::Null))
            }
            "config.save" => {
                let p: SaveParams = parse(method, params)?;
                let saved = self
                    .live()?
                    .save(p.path.as_deref())
                    .await
                    .map_err(live_error)?;
                Ok(serde_json::to_value(saved).unwrap_or(Value::Null))
            }
            _ => Err(RpcError::new(
                code::METHOD_NOT_FOUND,
                format!(
                    "no method {method:?}; methods are {}",
                    listing(METHODS.iter().map(|m| m.name))
                ),
            )),
        }
    }

    fn session_close(&self, p: TsihParams) -> Result<Value, RpcError> {
        let sessions = self.fabric.sessions.all();
        let s = sessions.iter().find(|s| s.tsih == p.tsih).ok_or_else(|| {
            RpcError::new(
                code::NOT_FOUND,
                format!(
                    "no session with TSIH {}; sessions are {}",
                    p.tsih,
                    listing(sessions.iter().map(|s| s.tsih))
                ),
            )
        })?;
        warn!(tsih = s.tsih, initiator = %s.initiator_name, "session closed by the control socket");
        self.fabric.sessions.close(s);
        Ok(json!({"tsih": s.tsih, "initiator": s.initiator_name, "closed": true}))
    }

    /// Runs one method.
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let known = METHODS.iter().any(|m| m.name == method);
        if known && !CHANGES.contains(&method) && params.get("dry_run").is_some() {
            return Err(RpcError::new(
                code::INVALID_PARAMS,
                format!(
                    "{method} changes no configuration, so it takes no \"dry_run\"; the methods \
                     that do are {}",
                    CHANGES.join(", ")
                ),
            ));
        }
        match method {
            "lun.list" => {
                let NoParams {} = parse(method, params)?;
                Ok(self.lun_list())
            }
            "lun.stall" => self.lun_stall(parse(method, params)?),
            "session.list" => {
                let NoParams {} = parse(method, params)?;
                Ok(self.session_list())
            }
            "portal.list" => {
                let NoParams {} = parse(method, params)?;
                Ok(self.portal_list())
            }
            "portal.close" => {
                let p: PortalParams = parse(method, params)?;
                let addr = self.portal_addr(&p.listen)?;
                let cut = self.portals.close(addr).await.map_err(portal_error)?;
                Ok(json!({"listen": addr.to_string(), "open": false, "connections_cut": cut}))
            }
            "portal.open" => {
                let p: PortalParams = parse(method, params)?;
                let addr = self.portal_addr(&p.listen)?;
                self.portals.reopen(addr).await.map_err(portal_error)?;
                Ok(json!({"listen": addr.to_string(), "open": true}))
            }
            "session.close" => self.session_close(parse(method, params)?),
            "isns.status" => {
                let NoParams {} = parse(method, params)?;
                let client = self.live()?.isns().ok_or_else(|| {
                    RpcError::new(
                        code::NOT_FOUND,
                        "no iSNS registration: the configuration has no [isns] server (see docs/isns.md)",
                    )
                })?;
                let mut v = serde_json::to_value(client.status())
                    .map_err(|e| RpcError::new(code::FAILED, e.to_string()))?;
                v["server"] = json!(client.server());
                v["entity"] = json!(client.entity());
                Ok(v)
            }
            other => self.call_edit(other, params).await,
        }
    }

    fn target_luns(&self, name: &str) -> Result<(String, Arc<LunTable>), RpcError> {
        let catalog = self.fabric.catalog();
        catalog
            .target(name)
            .map(|t| (t.name.clone(), t.luns.clone()))
            .ok_or_else(|| {
                RpcError::new(
                    code::NOT_FOUND,
                    format!(
                        "no target {name}; targets are {}",
                        listing(catalog.targets.iter().map(|t| &t.name))
                    ),
                )
            })
    }

    fn lun_stall(&self, p: StallParams) -> Result<Value, RpcError> {
        let (name, luns) = self.target_luns(&p.target)?;
        let span = tracing::warn_span!("control", target = %name);
        let change = span
            .in_scope(|| luns.set_stalled(p.lun, p.stalled))
            .map_err(|e| {
                RpcError::new(
                    code::NOT_FOUND,
                    format!(
                        "no LUN {} in target {name}; LUNs are {}",
                        e.lun,
                        listing(&e.existing)
                    ),
                )
            })?;
        Ok(json!({
            "target": name,
            "lun": p.lun,
            "stalled": p.stalled,
            "was_stalled": change.was_stalled,
            "held": change.held,
        }))
    }

    fn lun_list(&self) -> Value {
        let targets: Vec<Value> = self
            .fabric
            .catalog()
            .targets
            .iter()
            .map(|t| {
                let luns: Vec<Value> = t
                    .luns
                    .units()
                    .into_iter()
                    .map(|(id, lu)| {
                        let activity = lu.activity();
                        let limits = lu.qos().limits();
                        let throttled = lu.qos().counters();
                        // Thin units only (sparse files, RAM); an error
                        // looking now leaves it out too.
                        let space = lu.space().ok().flatten().map(|s| {
                                json!({
                                    "used": s.used,
                                    "available": s.available,
                                    "low_space_threshold": lu.low_space_threshold(),
                                })
                            });
                        // Units formatted with T10 protection information.
                        let protection = lu.protected().then(|| {
                            let f = lu.pi_check_failures();
                            json!({
                                "type": "type1",
                                "guard_check_failures": f.guard,
                                "reference_tag_check_failures": f.reference,
                            })
                        });
                        json!({
                            "lun": id,
                            "stalled": lu.is_stalled(),
                            "protection": protection,
                            "held": lu.held_commands(),
                            "size": lu.config().backstore.size(),
                            "commands_running": activity.in_flight,
                            "counters": {
                                "reads": counted(&lu, Direction::Read),
                                "writes": counted(&lu, Direction::Write),
                            },
                            "last_io_secs_ago": activity.last_media.map(|d| d.as_secs_f64()),
                            "backstore": lu.config().backstore.describe(),
                            "space": space,
                            "qos": {
                                "iops_limit": limits.iops,
                                "bandwidth_limit": limits.bytes_per_sec,
                                "initiator_iops_limit": limits.initiator_iops,
                                "initiator_bandwidth_limit": limits.initiator_bytes_per_sec,
                                "delayed_commands": throttled.delayed,
                                "delay_secs": throttled.delay_ns as f64 / 1e9,
                                "waiting": throttled.waiting,
                            },
                        })
                    })
                    .collect();
                let by_initiator = t.luns.port_groups_set_by_command();
                let groups: Vec<Value> = t
                    .luns
                    .target_port_groups()
                    .iter()
                    .map(|g| {
                        json!({
                            "id": g.id,
                            "state": g.state.name(),
                            "ports": g.ports,
                            // Who set the state last: the configuration, or an
                            // initiator's SET TARGET PORT GROUPS.
                            "set_by": if by_initiator.contains(&g.id) { "initiator" } else { "configuration" },
                        })
                    })
                    .collect();
                json!({
                    "name": t.name,
                    "luns": luns,
                    "explicit_alua": t.luns.explicit_alua(),
                    "port_groups": groups,
                })
            })
            .collect();
        json!({ "targets": targets })
    }

    fn session_list(&self) -> Value {
        let mut sessions = self.fabric.sessions.all();
        sessions.sort_by_key(|s| s.tsih);
        let list: Vec<Value> = sessions
            .iter()
            .map(|s| {
                json!({
                    "initiator": s.initiator_name,
                    "isid": s.isid.iter().map(|b| format!("{b:02x}")).collect::<String>(),
                    "tsih": s.tsih,
                    "target": s.target.as_ref().map(|t| t.name.as_str()),
                    "portal": s.portal().to_string(),
                    "tpgt": s.tpgt,
                    "params": {
                        "header_digest": format!("{:?}", s.params.header_digest),
                        "data_digest": format!("{:?}", s.params.data_digest),
                        "initial_r2t": s.params.initial_r2t,
                        "immediate_data": s.params.immediate_data,
                        "max_recv_data_segment_length": s.params.initiator_max_recv_data_segment_length,
                        "target_max_recv_data_segment_length": s.params.target_max_recv_data_segment_length,
                        "max_burst_length": s.params.max_burst_length,
                        "first_burst_length": s.params.first_burst_length,
                        "max_outstanding_r2t": s.params.max_outstanding_r2t,
                        "data_pdu_in_order": s.params.data_pdu_in_order,
                        "error_recovery_level": s.params.error_recovery_level,
                        "rdma_extensions": s.params.rdma_extensions,
                    },
                    "initiator_io": s.initiator_io.as_deref().map(io_totals),
                })
            })
            .collect();
        json!({ "sessions": list })
    }

    fn portal_list(&self) -> Value {
        let list: Vec<Value> = self
            .portals
            .list()
            .iter()
            .map(|p| {
                json!({
                    "listen": p.addr.to_string(),
                    "tpgt": p.tpgt,
                    "open": p.open,
                    "connections": p.connections,
                })
            })
            .collect();
        json!({ "portals": list })
    }

    fn portal_addr(&self, listen: &str) -> Result<SocketAddr, RpcError> {
        listen.parse().map_err(|_| {
            RpcError::new(
                code::INVALID_PARAMS,
                format!(
                    "{listen:?} is not an ADDR:PORT; portals are {}",
                    listing(self.portals.list().iter().map(|p| p.addr))
                ),
            )
        })
    }

    /// Answers one line of the socket: a request, or a batch of them.
    /// `None` when nothing is to be sent back (only notifications).
    pub async fn handle_line(&self, line: &str) -> Option<String> {
        let reply = match serde_json::from_str::<Value>(line) {
            Err(e) => Some(error_reply(
                Value::Null,
                &RpcError::new(
                    code::PARSE_ERROR,
                    format!("not JSON ({e}); send one JSON-RPC 2.0 object per line"),
                ),
            )),
            Ok(Value::Array(batch)) if batch.is_empty() => Some(error_reply(
                Value::Null,
                &RpcError::new(code::INVALID_REQUEST, "empty batch"),
            )),
            Ok(Value::Array(batch)) if batch.len() > MAX_BATCH => Some(error_reply(
                Value::Null,
                &RpcError::new(
                    code::INVALID_REQUEST,
                    format!(
                        "a batch of {} requests; one holds at most {MAX_BATCH}: send the rest in further lines",
                        batch.len()
                    ),
                ),
            )),
            Ok(Value::Array(batch)) => {
                let mut out = Vec::new();
                for req in batch {
                    out.extend(self.handle_request(req).await);
                }
                (!out.is_empty()).then_some(Value::Array(out))
            }
            Ok(req) => self.handle_request(req).await,
        };
        reply.map(|v| v.to_string())
    }

    async fn handle_request(&self, req: Value) -> Option<Value> {
        let Value::Object(mut obj) = req else {
            return Some(error_reply(
                Value::Null,
                &RpcError::new(
                    code::INVALID_REQUEST,
                    "a request is a JSON object with \"jsonrpc\": \"2.0\", \"method\", \"params\" and \"id\"",
                ),
            ));
        };
        let id = obj.remove("id");
        let reply_id = id.clone().unwrap_or(Value::Null);
        if obj.get("jsonrpc") != Some(&Value::String("2.0".into())) {
            return Some(error_reply(
                reply_id,
                &RpcError::new(code::INVALID_REQUEST, "\"jsonrpc\" must be \"2.0\""),
            ));
        }
        let Some(Value::String(method)) = obj.remove("method") else {
            return Some(error_reply(
                reply_id,
                &RpcError::new(
                    code::INVALID_REQUEST,
                    format!(
                        "\"method\" (a string) is missing; methods are {}",
                        listing(METHODS.iter().map(|m| m.name))
                    ),
                ),
            ));
        };
        let params = obj.remove("params").unwrap_or(Value::Null);
        let result = self.call(&method, params).await;
        match &result {
            Ok(_) => debug!(method, "control request done"),
            Err(e) => info!(method, error = %e.message, "control request failed"),
        }
        // A request without an id is a notification: no reply.
        let id = id?;
        Some(match result {
            Ok(v) => json!({"jsonrpc": "2.0", "id": id, "result": v}),
            Err(e) => error_reply(id, &e),
        })
    }
}

/// Takes `"dry_run"` out of a changing method's parameters: the rest are
/// the method's own.
fn take_dry_run(method: &str, params: Value) -> Result<(Value, bool), RpcError> {
    let Value::Object(mut map) = params else {
        return Ok((params, false));
    };
    let dry_run = match map.remove("dry_run") {
        None => false,
        Some(Value::Bool(b)) => b,
        Some(other) => {
            return Err(RpcError::new(
                code::INVALID_PARAMS,
                format!("{method}: \"dry_run\" is true or false, not {other}"),
            ))
        }
    };
    Ok((Value::Object(map), dry_run))
}

fn error_reply(id: Value, e: &RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": e.to_json()})
}

fn portal_error(e: PortalError) -> RpcError {
    let code = match e {
        PortalError::Unknown { .. } => code::NOT_FOUND,
        PortalError::AlreadyClosed(_) | PortalError::AlreadyOpen(_) => code::CONFLICT,
        PortalError::Bind(_) => code::FAILED,
    };
    RpcError::new(code, e.to_string())
}

/// The parameters of `method`: absent or null count as `{}`.
fn parse<T: DeserializeOwned>(method: &str, params: Value) -> Result<T, RpcError> {
    let params = match params {
        Value::Null => Value::Object(Default::default()),
        p => p,
    };
    serde_json::from_value(params).map_err(|e| {
        let want = METHODS
            .iter()
            .find(|m| m.name == method)
            .map_or("", |m| m.params);
        let want = if want.is_empty() {
            "no parameters".to_string()
        } else {
            format!("parameters like {want}")
        };
        RpcError::new(
            code::INVALID_PARAMS,
            format!("bad parameters for {method}: {e}; it takes {want}"),
        )
    })
}

/// Longest request line accepted (a request is a few hundred bytes).
const MAX_LINE: u64 = 1 << 20;

/// Most requests one batch holds. Their replies are built whole before the
/// line goes out: a line of tens of thousands of `session.list` calls, each
/// answered with every session, would otherwise take memory without bound.
const MAX_BATCH: usize = 256;

/// The largest configuration file `target.restore` reads: a path naming a
/// device, /dev/zero or a huge file would otherwise fill the daemon's memory.
const MAX_CONFIGURATION_BYTES: u64 = 16 << 20;

/// Reads a configuration file to restore from: a regular file of at most
/// [`MAX_CONFIGURATION_BYTES`].
fn read_configuration(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    // Looked at before opening it: opening a FIFO would wait for a writer.
    if !std::fs::metadata(path)?.is_file() {
        return Err(std::io::Error::other(
            "not a regular file (name the saved configuration file)",
        ));
    }
    let f = std::fs::File::open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other(
            "not a regular file (name the saved configuration file)",
        ));
    }
    let mut text = String::new();
    f.take(MAX_CONFIGURATION_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_CONFIGURATION_BYTES {
        return Err(std::io::Error::other(format!(
            "longer than {MAX_CONFIGURATION_BYTES} bytes, more than any configuration \
             (name the saved configuration file)"
        )));
    }
    Ok(text)
}

/// Creates the control socket at `path`, owner-only (0600): bound under a
/// temporary name, restricted, then renamed into place, so it is never
/// reachable with wider permissions. A stale socket (nobody listening) is
/// replaced; a live one, or another kind of file, is an error.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    let fail =
        |what: String| io::Error::other(format!("control socket {}: {what}", path.display()));
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(fail(
                    "another process is serving it (stop that daemon, or pick another --control path)".into(),
                ));
            }
            std::fs::remove_file(path)
                .map_err(|e| fail(format!("cannot remove the stale socket: {e}")))?;
        }
        Ok(_) => {
            return Err(fail(
                "exists and is not a socket (remove it, or pick another --control path)".into(),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e.to_string())),
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let std_listener = std::os::unix::net::UnixListener::bind(&tmp).map_err(|e| {
        let hint = if e.kind() == io::ErrorKind::NotFound {
            " (does its directory exist?)"
        } else {
            ""
        };
        fail(format!("cannot create it: {e}{hint}"))
    })?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(format!("cannot put it in place: {e}")));
    }
    std_listener.set_nonblocking(true)?;
    UnixListener::from_std(std_listener)
}

/// Serves the control socket until the fabric shuts down, then removes
/// the socket file.
pub async fn serve(listener: UnixListener, path: PathBuf, control: Arc<Control>) {
    let mut shutdown = control.fabric.shutdown.clone();
    let mut clients = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    clients.spawn(serve_client(stream, control.clone()));
                }
                Err(e) => {
                    warn!(error = %e, "control socket: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = shutdown.changed() => {
                if *shutdown.borrow() {
                    break;
                }
            }
            Some(_) = clients.join_next(), if !clients.is_empty() => {}
        }
    }
    drop(listener);
    clients.abort_all();
    let _ = std::fs::remove_file(&path);
}

async fn serve_client(stream: UnixStream, control: Arc<Control>) {
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = match (&mut rd)
            .take(MAX_LINE + 1)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if n as u64 > MAX_LINE {
            let e = RpcError::new(
                code::INVALID_REQUEST,
                format!("request longer than {MAX_LINE} bytes"),
            );
            let _ = wr
                .write_all(format!("{}\n", error_reply(Value::Null, &e)).as_bytes())
                .await;
            return;
        }
        let text = String::from_utf8_lossy(&line);
        if text.trim().is_empty() {
            continue;
        }
        if let Some(reply) = control.handle_line(text.trim()).await {
            if wr.write_all(format!("{reply}\n").as_bytes()).await.is_err() {
                return;
            }
        }
    }
}

/// Why `blockwire-target ctl` got no result.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// The socket could not be reached.
    #[error("cannot connect to the control socket {path}: {source} (is blockwire-target running with --control {path}?)")]
    Connect {
        /// The socket path.
        path: String,
        /// Why.
        source: io::Error,
    },
    /// The exchange failed half-way.
    #[error("control socket: {0}")]
    Io(#[from] io::Error),
    /// No answer in time.
    #[error("no answer from the control socket within {0:?}")]
    Timeout(Duration),
    /// The answer is not a JSON-RPC response.
    #[error("unexpected answer from the control socket: {0}")]
    BadReply(String),
    /// The daemon answered with an error.
    #[error("{0}")]
    Rpc(RpcError),
}

/// Calls `method` with `params` on the control socket at `path`: the
/// result, or why there is none.
pub async fn ctl(
    path: &Path,
    method: &str,
    params: Value,
    timeout: Duration,
) -> Result<Value, CtlError> {
    let exchange = async {
        let mut stream = UnixStream::connect(path)
            .await
            .map_err(|source| CtlError::Connect {
                path: path.display().to_string(),
                source,
            })?;
        let req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        stream.write_all(format!("{req}\n").as_bytes()).await?;
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).await?;
        let reply: Value =
            serde_json::from_str(&line).map_err(|_| CtlError::BadReply(line.clone()))?;
        if let Some(r) = reply.get("result") {
            return Ok(r.clone());
        }
        let err = reply
            .get("error")
            .ok_or_else(|| CtlError::BadReply(line.clone()))?;
        Err(CtlError::Rpc(RpcError {
            code: err.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: err
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
        }))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| CtlError::Timeout(timeout))?
}

/// READ and WRITE totals of `io` (commands, of those not GOOD, data bytes).
fn io_totals(io: &blockwire_target::scsi::stats::IoStats) -> Value {
    use blockwire_target::scsi::stats::Direction;
    let mut totals = serde_json::Map::new();
    for d in Direction::ALL {
        let s = io.direction(d);
        totals.insert(
            d.name().to_owned(),
            json!({
                "commands": s.commands.load(std::sync::atomic::Ordering::Relaxed),
                "errors": s.errors.load(std::sync::atomic::Ordering::Relaxed),
                "bytes": s.bytes.load(std::sync::atomic::Ordering::Relaxed),
            }),
        );
    }
    Value::Object(totals)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TargetConfig;

    const T: &str = "iqn.2026-11.io.blockwire:ctl";

    fn control() -> (Control, tokio::sync::watch::Sender<bool>) {
        let text = format!(
            "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:0\"]\n\n\
             [[portal_group]]\ntag = 2\nlisten = [\"127.0.0.1:0\"]\nalua_state = \"standby\"\n\n\
             [[target]]\nname = \"{T}\"\n\n\
             [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n\n\
             [[target.lun]]\nid = 1\nbackstore = \"ram\"\nsize = \"1M\"\nstalled = true\n"
        );
        let built = TargetConfig::from_str("t.toml", &text).unwrap_or_else(|e| panic!("{e}"));
        let (stop, rx) = tokio::sync::watch::channel(false);
        let fabric = Fabric::new(built.catalog, built.settings, rx);
        let portals = Arc::new(PortalSet::new(fabric.clone()));
        (Control::new(fabric, portals, None), stop)
    }

    /// target.restore reads a regular file of at most 16 MiB: a device or a
    /// huge file named by mistake is refused, not read into memory.
    #[tokio::test]
    async fn restoring_from_what_is_no_configuration_file_reads_no_more_than_a_file() {
        let (c, _stop) = control();
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.toml");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        for (from, said) in [
            (big.as_path(), "longer than 16777216 bytes"),
            (Path::new("/dev/zero"), "not a regular file"),
        ] {
            let e = c
                .call("target.restore", json!({ "from": from }))
                .await
                .unwrap_err();
            assert!(e.message.contains(said), "{from:?}: {}", e.message);
        }
    }

    async fn rpc(c: &Control, line: &str) -> Value {
        let reply = c.handle_line(line).await.expect("a reply");
        serde_json::from_str(&reply).unwrap()
    }

    fn error_of(v: &Value) -> (i64, String) {
        let e = &v["error"];
        (
            e["code"].as_i64().unwrap(),
            e["message"].as_str().unwrap().to_owned(),
        )
    }

    #[tokio::test]
    async fn lun_stall_switches_the_unit_and_reports_what_it_changed() {
        let (c, _stop) = control();
        let v = rpc(
            &c,
            &format!(r#"{{"jsonrpc":"2.0","id":1,"method":"lun.stall","params":{{"target":"{T}","lun":0,"stalled":true}}}}"#),
        )
        .await;
        assert_eq!(v["id"], 1);
        assert_eq!(
            v["result"],
            json!({"target": T, "lun": 0, "stalled": true, "was_stalled": false, "held": 0})
        );
        let list = c.call("lun.list", Value::Null).await.unwrap();
        let luns = &list["targets"][0]["luns"];
        assert_eq!(luns[0]["stalled"], true);
        // A RAM LUN is thin: nothing written yet, no threshold.
        assert_eq!(luns[0]["space"]["used"], 0, "{list}");
        assert!(
            luns[0]["space"]["available"]
                .as_u64()
                .is_some_and(|a| a > 0),
            "{list}"
        );
        assert_eq!(
            luns[0]["space"]["low_space_threshold"],
            Value::Null,
            "{list}"
        );
        assert_eq!(
            luns[1]["stalled"], true,
            "stalled = true in the configuration"
        );
        let groups = &list["targets"][0]["port_groups"];
        assert_eq!(
            groups[0],
            json!({"id": 1, "state": "active_optimized", "ports": [1], "set_by": "configuration"})
        );
        assert_eq!(
            groups[1],
            json!({"id": 2, "state": "standby", "ports": [2], "set_by": "configuration"})
        );
        // Target names compare case-insensitively, as iSCSI names do.
        let r = c
            .call(
                "lun.stall",
                json!({"target": T.to_uppercase(), "lun": 1, "stalled": false}),
            )
            .await
            .unwrap();
        assert_eq!(
            (r["was_stalled"].clone(), r["target"].clone()),
            (json!(true), json!(T))
        );
    }

    #[tokio::test]
    async fn errors_name_what_is_missing_and_what_there_is() {
        let (c, _stop) = control();
        let call = |m: &'static str, p: Value| {
            let c = &c;
            async move { c.call(m, p).await.unwrap_err() }
        };
        let e = call("lun.stall", json!({"target": T, "lun": 3, "stalled": true})).await;
        assert_eq!(e.code, code::NOT_FOUND);
        assert_eq!(e.message, format!("no LUN 3 in target {T}; LUNs are 0, 1"));
        let e = call(
            "lun.stall",
            json!({"target": "iqn.x", "lun": 0, "stalled": true}),
        )
        .await;
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                code::NOT_FOUND,
                format!("no target iqn.x; targets are {T}").as_str()
            )
        );
        let e = call("lun.stall", json!({"target": T, "lun": 0})).await;
        assert_eq!(e.code, code::INVALID_PARAMS);
        assert!(
            e.message.contains("missing field `stalled`"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains(r#""stalled": true"#),
            "names the form: {}",
            e.message
        );
        let e = call(
            "lun.stall",
            json!({"target": T, "lun": 0, "stalled": true, "x": 1}),
        )
        .await;
        assert!(e.message.contains("unknown field `x`"), "{}", e.message);
        let e = call(
            "lun.stall",
            json!({"target": T, "lun": "zero", "stalled": true}),
        )
        .await;
        assert_eq!(e.code, code::INVALID_PARAMS);
        let e = call("lun.list", json!({"target": T})).await;
        assert!(
            e.message.contains("it takes no parameters"),
            "{}",
            e.message
        );
        let e = call("lun.reset", Value::Null).await;
        assert_eq!(e.code, code::METHOD_NOT_FOUND);
        assert!(
            e.message.contains("methods are lun.list, lun.stall"),
            "{}",
            e.message
        );
        let e = call("portal.close", json!({"listen": "somewhere"})).await;
        assert_eq!(e.code, code::INVALID_PARAMS);
        let e = call("portal.close", json!({"listen": "127.0.0.1:9"})).await;
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                code::NOT_FOUND,
                "no portal listens on 127.0.0.1:9; portals are none"
            )
        );
    }

    #[tokio::test]
    async fn the_envelope_follows_json_rpc_2() {
        let (c, _stop) = control();
        let v = rpc(&c, "{not json").await;
        assert_eq!(v["id"], Value::Null);
        assert_eq!(error_of(&v).0, code::PARSE_ERROR);
        let v = rpc(&c, r#"{"id":3,"method":"lun.list"}"#).await;
        assert_eq!(
            (v["id"].clone(), error_of(&v).0),
            (json!(3), code::INVALID_REQUEST)
        );
        let v = rpc(&c, r#"{"jsonrpc":"2.0","id":"a"}"#).await;
        assert_eq!(
            (v["id"].clone(), error_of(&v).0),
            (json!("a"), code::INVALID_REQUEST)
        );
        let v = rpc(&c, "42").await;
        assert_eq!(error_of(&v).0, code::INVALID_REQUEST);
        let v = rpc(&c, "[]").await;
        assert_eq!(error_of(&v).0, code::INVALID_REQUEST);
        // A notification (no id) gets no reply, even when it fails.
        assert_eq!(
            c.handle_line(r#"{"jsonrpc":"2.0","method":"lun.list"}"#)
                .await,
            None
        );
        assert_eq!(
            c.handle_line(r#"{"jsonrpc":"2.0","method":"nope"}"#).await,
            None
        );
        // A batch answers its requests, in order, without its notifications.
        let v = rpc(
            &c,
            r#"[{"jsonrpc":"2.0","id":1,"method":"session.list"},{"jsonrpc":"2.0","method":"lun.list"},{"jsonrpc":"2.0","id":2,"method":"portal.list"}]"#,
        )
        .await;
        let ids: Vec<Value> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].clone())
            .collect();
        assert_eq!(ids, [json!(1), json!(2)]);
        assert_eq!(v[0]["result"], json!({"sessions": []}));
        assert_eq!(v[1]["result"], json!({"portals": []}));
        // A batch past the bound is refused whole, saying the bound.
        let batch = |n: usize| {
            let reqs: Vec<String> = (0..n)
                .map(|i| format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"portal.list"}}"#))
                .collect();
            format!("[{}]", reqs.join(","))
        };
        let v = rpc(&c, &batch(MAX_BATCH)).await;
        assert_eq!(v.as_array().map(Vec::len), Some(MAX_BATCH));
        let v = rpc(&c, &batch(MAX_BATCH + 1)).await;
        let (code, message) = error_of(&v);
        assert_eq!(code, code::INVALID_REQUEST, "{v}");
        assert!(message.contains("at most 256"), "{message}");
    }

    #[tokio::test]
    async fn the_socket_is_owner_only_and_a_live_one_is_not_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let listener = bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        let e = bind(&path).unwrap_err().to_string();
        assert!(e.contains("another process is serving it"), "{e}");
        // A stale socket (nobody listening) is replaced.
        drop(listener);
        let again = bind(&path).unwrap();
        drop(again);
        let file = dir.path().join("plain");
        std::fs::write(&file, "x").unwrap();
        let e = bind(&file).unwrap_err().to_string();
        assert!(e.contains("is not a socket"), "{e}");
        let e = bind(&dir.path().join("no/such/dir.sock"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does its directory exist"), "{e}");
    }

    #[tokio::test]
    async fn ctl_calls_a_served_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let (c, stop) = control();
        let served = tokio::spawn(serve(bind(&path).unwrap(), path.clone(), Arc::new(c)));
        let t = Duration::from_secs(5);
        let r = ctl(&path, "lun.list", Value::Null, t).await.unwrap();
        assert_eq!(r["targets"][0]["name"], T);
        let e = ctl(
            &path,
            "lun.stall",
            json!({"target": T, "lun": 7, "stalled": true}),
            t,
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&e, CtlError::Rpc(r) if r.code == code::NOT_FOUND),
            "{e}"
        );
        stop.send(true).unwrap();
        served.await.unwrap();
        assert!(!path.exists(), "the socket is removed at shutdown");
        let e = ctl(&path, "lun.list", Value::Null, t).await.unwrap_err();
        assert!(e.to_string().contains("cannot connect"), "{e}");
    }
}
