//! Edits of the configuration document behind the control API's methods:
//! each one changes the TOML document the way an operator would edit the
//! file, names what it could not find, and leaves checking the result to
//! the same validation a start runs.

use toml::{Table, Value};

use super::LiveError;

/// A JSON parameter as TOML (no nulls in TOML: a null is refused).
pub fn json_to_toml(v: serde_json::Value) -> Result<Value, LiveError> {
    Ok(match v {
        serde_json::Value::Null => {
            return Err(LiveError::Invalid(
                "null has no TOML form: leave the field out instead".into(),
            ))
        }
        serde_json::Value::Bool(b) => Value::Boolean(b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Integer(i),
            None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => Value::String(s),
        serde_json::Value::Array(a) => {
            Value::Array(a.into_iter().map(json_to_toml).collect::<Result<_, _>>()?)
        }
        serde_json::Value::Object(o) => Value::Table(
            o.into_iter()
                .map(|(k, v)| Ok((k, json_to_toml(v)?)))
                .collect::<Result<_, LiveError>>()?,
        ),
    })
}

fn array<'a>(t: &'a mut Table, key: &str) -> &'a mut Vec<Value> {
    let v = t
        .entry(key.to_owned())
        .or_insert_with(|| Value::Array(Vec::new()));
    if !v.is_array() {
        *v = Value::Array(Vec::new());
    }
    v.as_array_mut().expect("made an array above")
}

fn name_of(t: &Table) -> &str {
    t.get("name").and_then(Value::as_str).unwrap_or("").trim()
}

fn target_names(doc: &Table) -> String {
    let names: Vec<&str> = super::tables(doc, "target").map(name_of).collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// The `[[target]]` table named `name` (iSCSI names compare case-insensitively).
pub fn target_mut<'a>(doc: &'a mut Table, name: &str) -> Result<&'a mut Table, LiveError> {
    let known = target_names(doc);
    array(doc, "target")
        .iter_mut()
        .filter_map(Value::as_table_mut)
        .find(|t| name_of(t).eq_ignore_ascii_case(name.trim()))
        .ok_or_else(|| LiveError::NotFound(format!("no target {name}; targets are {known}")))
}

/// Adds a target (its table as the file would have it, LUNs included).
pub fn add_target(doc: &mut Table, target: Table) -> Result<(), LiveError> {
    let name = name_of(&target).to_owned();
    if name.is_empty() {
        return Err(LiveError::Invalid(
            "a target needs a name, e.g. \"iqn.2026-11.com.example:disk1\"".into(),
        ));
    }
    if target_mut(doc, &name).is_ok() {
        return Err(LiveError::Invalid(format!("target {name} exists already")));
    }
    array(doc, "target").push(Value::Table(target));
    Ok(())
}

/// Adds targets of another configuration document `from` (a saved file or
/// one of its backups), their tables as written there: the target `name`,
/// or every target of `from` the running document lacks. A target that
/// runs already is left to the operator (remove it first, or edit it).
/// Returns the names restored.
pub fn restore_targets(
    doc: &mut Table,
    from: &Table,
    name: Option<&str>,
    from_name: &str,
) -> Result<Vec<String>, LiveError> {
    let chosen: Vec<&Table> = match name {
        Some(n) => {
            let t = super::tables(from, "target")
                .find(|t| name_of(t).eq_ignore_ascii_case(n.trim()))
                .ok_or_else(|| {
                    LiveError::NotFound(format!(
                        "no target {n} in {from_name}; its targets are {}",
                        target_names(from)
                    ))
                })?;
            if target_mut(doc, n).is_ok() {
                return Err(LiveError::Invalid(format!(
                    "target {n} runs already: remove it first (target.remove) to put back the \
                     definition in {from_name}, or change it in place"
                )));
            }
            vec![t]
        }
        None => super::tables(from, "target")
            .filter(|t| target_mut(doc, name_of(t)).is_err())
            .collect(),
    };
    if chosen.is_empty() {
        return Err(LiveError::NotFound(format!(
            "every target of {from_name} runs already ({}): nothing to restore",
            target_names(from)
        )));
    }
    let names = chosen.iter().map(|t| name_of(t).to_owned()).collect();
    for t in chosen {
        add_target(doc, t.clone())?;
    }
    Ok(names)
}

/// Removes the target `name`.
pub fn remove_target(doc: &mut Table, name: &str) -> Result<(), LiveError> {
    target_mut(doc, name)?;
    array(doc, "target").retain(|t| {
        !t.as_table()
            .is_some_and(|t| name_of(t).eq_ignore_ascii_case(name.trim()))
    });
    Ok(())
}

fn lun_id(t: &Table) -> Option<i64> {
    t.get("id").and_then(Value::as_integer)
}

fn lun_ids(t: &Table) -> String {
    let ids: Vec<String> = super::tables(t, "lun")
        .filter_map(lun_id)
        .map(|i| i.to_string())
        .collect();
    if ids.is_empty() {
        "none".into()
    } else {
        ids.join(", ")
    }
}

/// Adds a LUN (its table as the file would have it) to `target`.
pub fn add_lun(doc: &mut Table, target: &str, lun: Table) -> Result<(), LiveError> {
    let t = target_mut(doc, target)?;
    let Some(id) = lun_id(&lun) else {
        return Err(LiveError::Invalid(
            "a LUN needs an id (0..16383), e.g. {\"id\": 1, \"backstore\": \"ram\", \"size\": \"1G\"}".into(),
        ));
    };
    if super::tables(t, "lun").any(|l| lun_id(l) == Some(id)) {
        return Err(LiveError::Invalid(format!(
            "LUN {id} exists in {target} already (LUNs are {}); remove it first or pick another id",
            lun_ids(t)
        )));
    }
    array(t, "lun").push(Value::Table(lun));
    Ok(())
}

fn lun_mut<'a>(t: &'a mut Table, target: &str, id: u16) -> Result<&'a mut Table, LiveError> {
    let known = lun_ids(t);
    array(t, "lun")
        .iter_mut()
        .filter_map(Value::as_table_mut)
        .find(|l| lun_id(l) == Some(i64::from(id)))
        .ok_or_else(|| {
            LiveError::NotFound(format!("no LUN {id} in target {target}; LUNs are {known}"))
        })
}

/// Removes LUN `id` of `target`.
pub fn remove_lun(doc: &mut Table, target: &str, id: u16) -> Result<(), LiveError> {
    let t = target_mut(doc, target)?;
    lun_mut(t, target, id)?;
    array(t, "lun").retain(|l| {
        !l.as_table()
            .is_some_and(|l| lun_id(l) == Some(i64::from(id)))
    });
    Ok(())
}

/// Sets the size of LUN `id` of `target`.
pub fn resize_lun(doc: &mut Table, target: &str, id: u16, size: &str) -> Result<(), LiveError> {
    let t = target_mut(doc, target)?;
    let l = lun_mut(t, target, id)?;
    l.insert("size".into(), Value::String(size.to_owned()));
    Ok(())
}

/// A change of a LUN's QoS ceilings: `None` leaves one as it is, an IOPS
/// ceiling of 0 and a bandwidth of "0" or "none" lift it.
#[derive(Debug, Clone, Default)]
pub struct LimitEdit<'a> {
    /// The LUN's media commands per second (`iops_limit`).
    pub iops: Option<u64>,
    /// The LUN's bytes per second (`bandwidth_limit`).
    pub bandwidth: Option<&'a str>,
    /// Each initiator's commands per second (`initiator_iops_limit`).
    pub initiator_iops: Option<u64>,
    /// Each initiator's bytes per second (`initiator_bandwidth_limit`).
    pub initiator_bandwidth: Option<&'a str>,
}

/// Sets or lifts the QoS ceilings of LUN `id` of `target` (see
/// [`LimitEdit`]).
pub fn limit_lun(
    doc: &mut Table,
    target: &str,
    id: u16,
    edit: &LimitEdit<'_>,
) -> Result<(), LiveError> {
    if edit.iops.is_none()
        && edit.bandwidth.is_none()
        && edit.initiator_iops.is_none()
        && edit.initiator_bandwidth.is_none()
    {
        return Err(LiveError::Invalid(
            "lun.limit needs \"iops\" (0: no limit), \"bandwidth\" (e.g. \"100M\"; \"none\": no limit), \
             \"initiator_iops\" or \"initiator_bandwidth\" (the same, for each initiator)"
                .into(),
        ));
    }
    let t = target_mut(doc, target)?;
    let l = lun_mut(t, target, id)?;
    set_iops_ceiling(l, "iops_limit", edit.iops)?;
    set_bandwidth_ceiling(l, "bandwidth_limit", edit.bandwidth);
    set_iops_ceiling(l, "initiator_iops_limit", edit.initiator_iops)?;
    set_bandwidth_ceiling(l, "initiator_bandwidth_limit", edit.initiator_bandwidth);
    Ok(())
}

/// Sets (or with 0 lifts) the commands-per-second ceiling `key` of LUN `l`.
fn set_iops_ceiling(l: &mut Table, key: &str, iops: Option<u64>) -> Result<(), LiveError> {
    match iops {
        Some(0) => {
            l.remove(key);
        }
        Some(n) => {
            let n = i64::try_from(n).map_err(|_| {
                LiveError::Invalid(format!("{n} IOPS is more than a LUN can be limited to"))
            })?;
            l.insert(key.into(), Value::Integer(n));
        }
        None => {}
    }
    Ok(())
}

/// Sets (or with "0" or "none" lifts) the bytes-per-second ceiling `key`
/// of LUN `l`.
fn set_bandwidth_ceiling(l: &mut Table, key: &str, bandwidth: Option<&str>) {
    match bandwidth.map(str::trim) {
        Some("0" | "none") => {
            l.remove(key);
        }
        Some(b) => {
            l.insert(key.into(), Value::String(b.to_owned()));
        }
        None => {}
    }
}

/// Adds `initiator` to the access list of `target`. A target without one
/// admits every initiator; the first entry restricts it to the list.
pub fn acl_add(doc: &mut Table, target: &str, initiator: &str) -> Result<(), LiveError> {
    // An iSCSI name has no spaces (RFC 3722): spaces around one pasted in
    // are not part of it, and kept they would match no login.
    let initiator = initiator.trim();
    let t = target_mut(doc, target)?;
    let allow = array(t, "allow");
    if allow.iter().any(|a| {
        a.as_str()
            .is_some_and(|a| a.trim().eq_ignore_ascii_case(initiator))
    }) {
        return Err(LiveError::Invalid(format!(
            "{initiator} is in the access list of {target} already"
        )));
    }
    allow.push(Value::String(initiator.to_owned()));
    Ok(())
}

/// Removes `initiator` from the access list of `target` (its sessions end).
pub fn acl_remove(doc: &mut Table, target: &str, initiator: &str) -> Result<(), LiveError> {
    let initiator = initiator.trim();
    let t = target_mut(doc, target)?;
    let Some(allow) = t.get_mut("allow").and_then(Value::as_array_mut) else {
        return Err(LiveError::NotFound(format!(
            "target {target} has no access list (every initiator may log in); add entries with acl.add"
        )));
    };
    let before = allow.len();
    allow.retain(|a| {
        !a.as_str()
            .is_some_and(|a| a.trim().eq_ignore_ascii_case(initiator))
    });
    if allow.len() == before {
        let list: Vec<&str> = allow.iter().filter_map(Value::as_str).collect();
        return Err(LiveError::NotFound(format!(
            "{initiator} is not in the access list of {target}; it lists {}",
            if list.is_empty() {
                "nobody".to_string()
            } else {
                list.join(", ")
            }
        )));
    }
    Ok(())
}

/// The table CHAP settings live in: a target's, or `[discovery]`.
fn auth_table<'a>(doc: &'a mut Table, target: Option<&str>) -> Result<&'a mut Table, LiveError> {
    match target {
        Some(t) => target_mut(doc, t),
        None => {
            let d = doc
                .entry("discovery".to_owned())
                .or_insert_with(|| Value::Table(Table::new()));
            d.as_table_mut()
                .ok_or_else(|| LiveError::Invalid("[discovery] is not a table".into()))
        }
    }
}

/// The CHAP accounts of a target (or of discovery): those any initiator
/// may use (`chap`), or, with `initiator`, the per-initiator ones.
fn chap_list<'a>(
    doc: &'a mut Table,
    target: Option<&str>,
    initiator: Option<&str>,
) -> Result<&'a mut Vec<Value>, LiveError> {
    let t = auth_table(doc, target)?;
    let key = if initiator.is_some() {
        "initiator_chap"
    } else {
        "chap"
    };
    Ok(array(t, key))
}

/// Whether `c` is the account of `user` (for `initiator`).
fn is_account(c: &Value, user: &str, initiator: Option<&str>) -> bool {
    // iSCSI names compare case-insensitively, as logins match them.
    c.as_table().is_some_and(|c| {
        let theirs = c.get("initiator").and_then(Value::as_str).map(str::trim);
        c.get("user").and_then(Value::as_str) == Some(user)
            && match (theirs, initiator) {
                (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
                (a, b) => a == b,
            }
    })
}

/// Adds a CHAP account: one any initiator may use, or, with `initiator`,
/// one for that initiator only. With `replace`, an account of that user
/// there already gets the new secret in place: a secret is rotated in one
/// change, never by a removal that would leave the target without CHAP.
pub fn chap_add(
    doc: &mut Table,
    target: Option<&str>,
    user: &str,
    secret: &str,
    initiator: Option<&str>,
    replace: bool,
) -> Result<(), LiveError> {
    let initiator = initiator.map(str::trim);
    let list = chap_list(doc, target, initiator)?;
    if let Some(c) = list.iter_mut().find(|c| is_account(c, user, initiator)) {
        if !replace {
            return Err(LiveError::Invalid(format!(
                "CHAP user {user} exists already there; to change its secret, pass \"replace\": true"
            )));
        }
        if let Some(c) = c.as_table_mut() {
            c.insert("secret".into(), Value::String(secret.to_owned()));
        }
        return Ok(());
    }
    let mut c = Table::new();
    if let Some(i) = initiator {
        c.insert("initiator".into(), Value::String(i.to_owned()));
    }
    c.insert("user".into(), Value::String(user.to_owned()));
    c.insert("secret".into(), Value::String(secret.to_owned()));
    list.push(Value::Table(c));
    Ok(())
}

/// Removes a CHAP account (sessions that logged in with it keep running).
/// CHAP is required while a target (or discovery) has any account, so the
/// last one goes only with `force`: without it, initiators would log in
/// with AuthMethod=None, admitted by the access list alone.
pub fn chap_remove(
    doc: &mut Table,
    target: Option<&str>,
    user: &str,
    initiator: Option<&str>,
    force: bool,
) -> Result<(), LiveError> {
    let initiator = initiator.map(str::trim);
    let accounts = |doc: &mut Table| -> usize {
        ["chap", "initiator_chap"]
            .iter()
            .map(|key| {
                auth_table(doc, target)
                    .ok()
                    .and_then(|t| t.get(*key))
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len)
            })
            .sum()
    };
    let all = accounts(doc);
    let list = chap_list(doc, target, initiator)?;
    let Some(at) = list.iter().position(|c| is_account(c, user, initiator)) else {
        return Err(LiveError::NotFound(format!(
            "no CHAP user {user}{} there",
            initiator.map_or(String::new(), |i| format!(" for {i}"))
        )));
    };
    if all == 1 && !force {
        let scope = target.map_or_else(|| "discovery".to_owned(), str::to_owned);
        return Err(LiveError::Invalid(format!(
            "CHAP user {user} is the last CHAP account of {scope}: without it, initiators log in \
             to {scope} without authentication (AuthMethod=None). To change its secret, use \
             chap.add with \"replace\": true; to turn CHAP off for {scope}, pass \"force\": true"
        )));
    }
    list.remove(at);
    Ok(())
}

/// Adds `listen` to portal group `tag`, creating the group if needed.
pub fn portal_add(doc: &mut Table, tag: u16, listen: &str) -> Result<(), LiveError> {
    let groups = array(doc, "portal_group");
    let group = groups
        .iter_mut()
        .filter_map(Value::as_table_mut)
        .find(|g| g.get("tag").and_then(Value::as_integer) == Some(i64::from(tag)));
    match group {
        Some(g) => {
            let l = array(g, "listen");
            if l.iter().any(|a| a.as_str() == Some(listen)) {
                return Err(LiveError::Invalid(format!(
                    "portal group {tag} listens on {listen} already"
                )));
            }
            l.push(Value::String(listen.to_owned()));
        }
        None => {
            let mut g = Table::new();
            g.insert("tag".into(), Value::Integer(i64::from(tag)));
            g.insert(
                "listen".into(),
                Value::Array(vec![Value::String(listen.to_owned())]),
            );
            groups.push(Value::Table(g));
        }
    }
    Ok(())
}

/// Removes `listen` from the portal group that has it (group `tag` when
/// several list it, as with port 0); a group left without addresses goes
/// too, and with it the targets' `alua_state` entries for it (recorded
/// there after an initiator's SET TARGET PORT GROUPS, they would name a
/// group that is no more, and no request could take them away).
pub fn portal_remove(doc: &mut Table, listen: &str, tag: Option<u16>) -> Result<(), LiveError> {
    let groups = array(doc, "portal_group");
    let tag_of = |g: &Table| g.get("tag").and_then(Value::as_integer);
    let listed: Vec<i64> = groups
        .iter()
        .filter_map(Value::as_table)
        .filter(|g| {
            super::strings(g, "listen").any(|a| a == listen)
                && tag.is_none_or(|t| tag_of(g) == Some(i64::from(t)))
        })
        .filter_map(tag_of)
        .collect();
    match listed.len() {
        0 => {
            return Err(LiveError::NotFound(format!(
                "no portal group{} listens on {listen} (see portal.list)",
                tag.map_or(String::new(), |t| format!(" with tag {t}"))
            )))
        }
        1 => {}
        _ => {
            let tags: Vec<String> = listed.iter().map(|t| t.to_string()).collect();
            return Err(LiveError::Invalid(format!(
                "{listen} is in portal groups {}: give the group's tag",
                tags.join(", ")
            )));
        }
    }
    for g in groups
        .iter_mut()
        .filter_map(Value::as_table_mut)
        .filter(|g| tag_of(g) == Some(listed[0]))
    {
        array(g, "listen").retain(|a| a.as_str() != Some(listen));
    }
    groups.retain(|g| {
        g.as_table()
            .and_then(|g| g.get("listen"))
            .and_then(Value::as_array)
            .is_some_and(|l| !l.is_empty())
    });
    let gone = !groups
        .iter()
        .filter_map(Value::as_table)
        .any(|g| tag_of(g) == Some(listed[0]));
    if gone {
        let key = listed[0].to_string();
        for t in array(doc, "target")
            .iter_mut()
            .filter_map(Value::as_table_mut)
        {
            let Some(states) = t.get_mut("alua_state").and_then(Value::as_table_mut) else {
                continue;
            };
            states.remove(&key);
            if states.is_empty() {
                t.remove("alua_state");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"
[[portal_group]]
tag = 1
listen = ["127.0.0.1:3260"]

[[target]]
name = "iqn.2026-11.io.blockwire:a"

[[target.lun]]
id = 0
backstore = "ram"
size = "64M"
"#;

    fn doc() -> Table {
        DOC.parse().unwrap()
    }

    #[test]
    fn luns_are_added_resized_and_removed_by_id() {
        let mut d = doc();
        let lun: Table = "id = 1\nbackstore = \"ram\"\nsize = \"8M\""
            .parse()
            .unwrap();
        add_lun(&mut d, "IQN.2026-11.io.blockwire:a", lun.clone()).unwrap();
        let e = add_lun(&mut d, "iqn.2026-11.io.blockwire:a", lun).unwrap_err();
        assert!(e.to_string().contains("LUN 1 exists"), "{e}");
        resize_lun(&mut d, "iqn.2026-11.io.blockwire:a", 1, "16M").unwrap();
        let text = toml::to_string(&d).unwrap();
        assert!(text.contains("size = \"16M\""), "{text}");
        remove_lun(&mut d, "iqn.2026-11.io.blockwire:a", 1).unwrap();
        let e = remove_lun(&mut d, "iqn.2026-11.io.blockwire:a", 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no LUN 1 in target iqn.2026-11.io.blockwire:a; LUNs are 0"
        );
        let e = remove_lun(&mut d, "iqn.x:y", 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no target iqn.x:y; targets are iqn.2026-11.io.blockwire:a"
        );
    }

    #[test]
    fn targets_are_restored_from_another_document_by_name_or_all_missing() {
        let mut d = doc();
        let saved: Table = "[[target]]\nname = \"iqn.2026-11.io.blockwire:a\"\n\
             [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n\
             [[target]]\nname = \"iqn.2026-11.io.blockwire:u\"\nalias = \"kept\"\n\
             [[target.lun]]\nid = 3\nbackstore = \"null\"\nsize = \"2M\"\n\
             [[target]]\nname = \"iqn.2026-11.io.blockwire:v\"\n\
             [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n"
            .parse()
            .unwrap();
        let e = restore_targets(
            &mut d,
            &saved,
            Some("iqn.2026-11.io.blockwire:A"),
            "saved.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("runs already: remove it first"), "{e}");
        let e = restore_targets(&mut d, &saved, Some("iqn.x:none"), "saved.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "no target iqn.x:none in saved.toml; its targets are iqn.2026-11.io.blockwire:a, "
            ),
            "{e}"
        );
        let names = restore_targets(
            &mut d,
            &saved,
            Some("IQN.2026-11.io.blockwire:u"),
            "saved.toml",
        )
        .unwrap();
        assert_eq!(names, ["iqn.2026-11.io.blockwire:u"]);
        let u = target_mut(&mut d, "iqn.2026-11.io.blockwire:u").unwrap();
        assert_eq!(u.get("alias").and_then(Value::as_str), Some("kept"));
        // All that is missing: only v now.
        let names = restore_targets(&mut d, &saved, None, "saved.toml").unwrap();
        assert_eq!(names, ["iqn.2026-11.io.blockwire:v"]);
        let e = restore_targets(&mut d, &saved, None, "saved.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("nothing to restore"), "{e}");
    }

    #[test]
    fn access_lists_and_chap_accounts() {
        let mut d = doc();
        let t = "iqn.2026-11.io.blockwire:a";
        assert!(acl_remove(&mut d, t, "iqn.i:1").is_err(), "no list yet");
        acl_add(&mut d, t, "iqn.i:1").unwrap();
        acl_add(&mut d, t, "iqn.i:2").unwrap();
        assert!(
            acl_add(&mut d, t, "IQN.i:1").is_err(),
            "names compare case-insensitively"
        );
        acl_remove(&mut d, t, "iqn.i:1").unwrap();
        let e = acl_remove(&mut d, t, "iqn.i:1").unwrap_err().to_string();
        assert!(e.ends_with("it lists iqn.i:2"), "{e}");
        // Spaces pasted around a name are not kept: the entry matches the
        // name, and the name removes it.
        acl_add(&mut d, t, " iqn.i:3 \n").unwrap();
        assert!(acl_add(&mut d, t, "iqn.i:3").is_err(), "listed once");
        acl_remove(&mut d, t, "iqn.i:3").unwrap();
        chap_add(&mut d, Some(t), "u", "secret-of-16-chars", None, false).unwrap();
        chap_add(&mut d, None, "disc", "secret-of-16-chars", None, false).unwrap();
        chap_add(
            &mut d,
            Some(t),
            "u",
            "secret-of-16-chars",
            Some("iqn.i:2"),
            false,
        )
        .unwrap();
        assert!(chap_add(&mut d, Some(t), "u", "x", None, false).is_err());
        chap_remove(&mut d, Some(t), "u", None, false).unwrap();
        assert!(chap_remove(&mut d, Some(t), "u", None, false).is_err());
        chap_remove(&mut d, Some(t), "u", Some("iqn.i:2"), true).unwrap();
        chap_remove(&mut d, None, "disc", None, true).unwrap();
    }

    /// CHAP is required while a target has any account: removing its last
    /// one would let every initiator the access list admits in with
    /// AuthMethod=None, so it takes `force`; a secret is rotated in place.
    #[test]
    fn the_last_chap_account_goes_only_when_forced() {
        let mut d = doc();
        let t = "iqn.2026-11.io.blockwire:a";
        chap_add(&mut d, Some(t), "u", "secret-of-16-chars", None, false).unwrap();
        let e = chap_remove(&mut d, Some(t), "u", None, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("last CHAP account of iqn.2026-11.io.blockwire:a"),
            "{e}"
        );
        assert!(e.contains("\"force\": true"), "{e}");
        chap_add(&mut d, Some(t), "u", "another-secret-16", None, true).unwrap();
        let accounts = target_mut(&mut d, t).unwrap()["chap"]
            .as_array()
            .unwrap()
            .clone();
        assert_eq!(accounts.len(), 1, "replaced in place: {accounts:?}");
        assert_eq!(accounts[0]["secret"].as_str(), Some("another-secret-16"));
        // A per-initiator account keeps CHAP required: the shared one may go.
        chap_add(
            &mut d,
            Some(t),
            "v",
            "secret-of-16-chars",
            Some("iqn.i:2"),
            false,
        )
        .unwrap();
        // The initiator's name in another case is that initiator's account.
        chap_add(
            &mut d,
            Some(t),
            "v",
            "another-secret-16",
            Some("IQN.i:2"),
            true,
        )
        .unwrap();
        let own = target_mut(&mut d, t).unwrap()["initiator_chap"]
            .as_array()
            .unwrap()
            .clone();
        assert_eq!(own.len(), 1, "replaced, not added: {own:?}");
        chap_remove(&mut d, Some(t), "u", None, false).unwrap();
        assert!(chap_remove(&mut d, Some(t), "v", Some("iqn.i:2"), false).is_err());
        chap_remove(&mut d, Some(t), "v", Some("iqn.i:2"), true).unwrap();
        chap_add(&mut d, None, "disc", "secret-of-16-chars", None, false).unwrap();
        assert!(
            chap_remove(&mut d, None, "disc", None, false).is_err(),
            "discovery too"
        );
    }

    #[test]
    fn portals_join_and_leave_groups() {
        let mut d = doc();
        portal_add(&mut d, 1, "127.0.0.1:3261").unwrap();
        portal_add(&mut d, 2, "127.0.0.2:3260").unwrap();
        assert!(portal_add(&mut d, 1, "127.0.0.1:3261").is_err());
        portal_remove(&mut d, "127.0.0.2:3260", None).unwrap();
        assert_eq!(
            super::super::tables(&d, "portal_group").count(),
            1,
            "empty group dropped"
        );
        assert!(portal_remove(&mut d, "127.0.0.2:3260", None).is_err());
        portal_add(&mut d, 4, "127.0.0.1:3261").unwrap();
        let e = portal_remove(&mut d, "127.0.0.1:3261", None)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "127.0.0.1:3261 is in portal groups 1, 4: give the group's tag"
        );
        portal_remove(&mut d, "127.0.0.1:3261", Some(4)).unwrap();
        // A group that goes takes the ALUA states recorded for it.
        portal_add(&mut d, 2, "127.0.0.2:3260").unwrap();
        let t = array(&mut d, "target")[0].as_table_mut().unwrap();
        t.insert(
            "alua_state".into(),
            Value::Table(
                [("1", "standby"), ("2", "active_optimized")]
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), Value::String(v.to_owned())))
                    .collect(),
            ),
        );
        portal_remove(&mut d, "127.0.0.2:3260", None).unwrap();
        let states = array(&mut d, "target")[0]
            .get("alua_state")
            .and_then(Value::as_table)
            .cloned()
            .unwrap();
        assert_eq!(states.keys().collect::<Vec<_>>(), ["1"]);
    }

    #[test]
    fn json_parameters_become_toml_and_nulls_are_refused() {
        let v = json_to_toml(serde_json::json!({"id": 2, "backstore": "ram", "read_only": true}))
            .unwrap();
        assert_eq!(v.get("id").and_then(Value::as_integer), Some(2));
        assert!(json_to_toml(serde_json::json!({"path": null})).is_err());
    }
}
