//! `--check`: everything in a configuration that can be checked without side effects
//! and without building: iSCSI names, listen addresses, CHAP secrets, `[fabric]`, and
//! the backing files (by metadata and access(2) only; nothing is opened or created).

use super::*;

/// The longest TargetAlias a login can carry: a text value (RFC 7143 §6.1).
const MAX_ALIAS_BYTES: usize = 255;

/// Whether this process may write in (`dir = true`: create entries in)
/// `path`, by access(2): nothing is opened or created.
pub(super) fn writable(path: &Path, dir: bool) -> bool {
    use rustix::fs::Access;
    let how = if dir {
        Access::WRITE_OK | Access::EXEC_OK
    } else {
        Access::WRITE_OK
    };
    rustix::fs::access(path, how).is_ok()
}

/// Whether two listen addresses (port 0 aside: each listing of it binds a
/// port of its own) claim the same port for some connection: the same
/// address, or one under a wildcard of its family. An IPv4-mapped IPv6
/// address (`[::ffff:a.b.c.d]`) is that IPv4 address, and with
/// `dual_stack` (see
/// [`blockwire_target::iscsi::portal::ipv6_wildcard_takes_ipv4`]) the IPv6 wildcard `[::]`
/// also takes every IPv4 address of its port.
pub(super) fn listen_overlap(a: SocketAddr, b: SocketAddr, dual_stack: bool) -> bool {
    if a.port() != b.port() || a.port() == 0 {
        return false;
    }
    let (ia, ib) = (a.ip().to_canonical(), b.ip().to_canonical());
    if ia.is_ipv4() == ib.is_ipv4() {
        return ia == ib || ia.is_unspecified() || ib.is_unspecified();
    }
    let v6_wildcard = |ip: std::net::IpAddr| ip.is_ipv6() && ip.is_unspecified();
    dual_stack && (v6_wildcard(ia) || v6_wildcard(ib))
}

/// Why two listen addresses of different spellings claim one port, for
/// the error: the IPv6 wildcard bound dual-stack takes IPv4 too, and an
/// IPv4-mapped IPv6 address (RFC 4291 2.5.5.2) is its IPv4 address.
pub(super) fn overlap_reason(a: SocketAddr, b: SocketAddr) -> String {
    let v6_wildcard = |s: SocketAddr| match s.ip() {
        std::net::IpAddr::V6(ip) => ip.is_unspecified(),
        std::net::IpAddr::V4(_) => false,
    };
    let takes_v4 = |s: SocketAddr| s.ip().to_canonical().is_ipv4();
    let mapped = |s: SocketAddr| s.is_ipv6() && takes_v4(s);
    if (v6_wildcard(a) && takes_v4(b)) || (v6_wildcard(b) && takes_v4(a)) {
        format!(
            ": on this host an IPv6 wildcard also takes IPv4 connections \
             (net.ipv6.bindv6only = 0), so [::]:{} alone serves both",
            a.port()
        )
    } else if mapped(a) || mapped(b) {
        ": an IPv4-mapped IPv6 address (::ffff:a.b.c.d) is that IPv4 address".to_string()
    } else {
        String::new()
    }
}

/// The size and state of one backing file, checked by metadata and
/// access(2) only; errors and notices go to `report`.
fn check_backing_file(
    ctx: &Ctx<'_>,
    report: &mut CheckReport,
    line: std::ops::Range<usize>,
    field: &str,
    path: &Path,
    size: Option<u64>,
    read_only: bool,
) -> Option<u64> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            report.errors.push(ctx.err(
                line,
                field,
                format!("{shown} is a directory: name a file or block device in it"),
            ));
            None
        }
        Ok(m) if blockwire_target::backstore::unusable_kind(&m.file_type()).is_some() => {
            let kind = blockwire_target::backstore::unusable_kind(&m.file_type()).unwrap_or("");
            report.errors.push(ctx.err(
                line,
                field,
                format!("{shown} is {kind}: a LUN is backed by a regular file or a block device"),
            ));
            None
        }
        Ok(m) => {
            if !read_only && !writable(path, false) {
                report.errors.push(ctx.err(
                    line.clone(),
                    field,
                    format!(
                        "{shown} is not writable by this user: fix its permissions or set read_only = true"
                    ),
                ));
            }
            if !m.is_file() {
                // A block device: its size needs an open; the start reads it.
                return None;
            }
            let len = m.len();
            match size {
                Some(want) if len < want && !read_only => report.notices.push(ctx.err(
                    line,
                    field,
                    format!("{shown} is {len} bytes: it will be grown to {want} bytes"),
                )),
                Some(want) if len < want => report.notices.push(ctx.err(
                    line,
                    field,
                    format!(
                        "{shown} is {len} bytes, less than size ({want}); read_only: it is served at {len} bytes, not grown"
                    ),
                )),
                None if len == 0 => report.errors.push(ctx.err(
                    line,
                    field,
                    format!("{shown} is empty: give the LUN a size = \"...\""),
                )),
                _ => {}
            }
            Some(len)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            let pshown = parent.display();
            match std::fs::metadata(parent) {
                Err(_) => report.errors.push(ctx.err(
                    line,
                    field,
                    format!(
                        "the directory {pshown} of {shown} does not exist: create it (mkdir -p {pshown}) or fix the path"
                    ),
                )),
                Ok(m) if !m.is_dir() => report.errors.push(ctx.err(
                    line,
                    field,
                    format!("{pshown} (the directory of {shown}) is not a directory: fix the path"),
                )),
                Ok(_) if read_only => report.errors.push(ctx.err(
                    line,
                    field,
                    format!("{shown} does not exist and a read_only LUN is never created: fix the path or remove read_only"),
                )),
                Ok(_) if !writable(parent, true) => report.errors.push(ctx.err(
                    line,
                    field,
                    format!(
                        "{shown} does not exist and its directory {pshown} is not writable by this user: fix the permissions or the path"
                    ),
                )),
                Ok(_) => match size {
                    None => report.errors.push(ctx.err(
                        line,
                        field,
                        format!("{shown} does not exist: add size = \"...\" to create it, or fix the path"),
                    )),
                    Some(want) => report.notices.push(ctx.err(
                        line,
                        field,
                        format!("{shown} does not exist: it will be created ({want} bytes)"),
                    )),
                },
            }
            Some(0)
        }
        Err(e) => {
            report
                .errors
                .push(ctx.err(line, field, format!("cannot inspect {shown}: {e}")));
            None
        }
    }
}

/// The CHAP credentials of one section checked together: each secret's
/// length, each initiator's name, and no mutual secret equal to a one-way
/// one (RFC 7143 §9.2.1: a secret used to authenticate initiators must
/// not authenticate the target). [`check_secret_roles`] does the same
/// across sections.
fn check_auth(ctx: &Ctx<'_>, report: &mut CheckReport, a: &AuthConfig, section: &str) {
    let mut one_way = Vec::new();
    for c in &a.chap {
        if let Err(e) = secret(ctx, &c.secret, &format!("{section}.chap.secret")) {
            report.errors.push(e);
        }
        one_way.push(c.secret.get_ref());
    }
    for c in &a.initiator_chap {
        if let Err(why) = check_iscsi_name(c.initiator.get_ref().trim()) {
            report.errors.push(ctx.err(
                c.initiator.span(),
                &format!("{section}.initiator_chap.initiator"),
                why,
            ));
        }
        if let Err(e) = secret(ctx, &c.secret, &format!("{section}.initiator_chap.secret")) {
            report.errors.push(e);
        }
        one_way.push(c.secret.get_ref());
    }
    if let Some(m) = &a.mutual_chap {
        if let Err(e) = secret(ctx, &m.secret, &format!("{section}.mutual_chap.secret")) {
            report.errors.push(e);
        }
        if one_way.contains(&m.secret.get_ref()) {
            report.errors.push(ctx.err(
                m.secret.span(),
                &format!("{section}.mutual_chap.secret"),
                "the mutual CHAP secret equals a one-way CHAP secret of the same section; RFC 7143 (9.2.1) forbids using one secret in both directions: choose another",
            ));
        }
    }
}

/// No section's mutual CHAP secret (the target authenticating itself) is
/// another section's one-way secret (initiators authenticating), RFC 7143
/// §9.2.1. Across sections it is no safer than within one: an initiator
/// allowed into the first target sends the second target's challenge as its
/// own mutual challenge to the first, which answers it with the shared
/// secret, and that answer logs the initiator in to the second as an
/// account it does not know the secret of. Each login checks only its own
/// section, so this is the one place the pair is seen. `sections` are
/// each section's name and credentials.
fn check_secret_roles(ctx: &Ctx<'_>, report: &mut CheckReport, sections: &[(String, &AuthConfig)]) {
    for (name, a) in sections {
        let Some(m) = &a.mutual_chap else { continue };
        let mutual = m.secret.get_ref();
        let reused = sections.iter().find(|(other, o)| {
            other != name
                && (o.chap.iter().any(|c| c.secret.get_ref() == mutual)
                    || o.initiator_chap
                        .iter()
                        .any(|c| c.secret.get_ref() == mutual))
        });
        if let Some((other, _)) = reused {
            report.errors.push(ctx.err(
                m.secret.span(),
                &format!(
                    "{}.mutual_chap.secret",
                    if name == "[discovery]" {
                        "discovery"
                    } else {
                        "target"
                    }
                ),
                format!(
                    "the mutual CHAP secret of {name} is a one-way CHAP secret of {other}: \
                     an initiator of {name} could have it answer {other}'s challenges and \
                     log in there without that secret; RFC 7143 (9.2.1) forbids a secret \
                     in both roles: choose another"
                ),
            ));
        }
    }
}

impl TargetConfig {
    /// Checks everything that can be checked without side effects and
    /// without building: iSCSI names, listen addresses, CHAP secrets,
    /// `[fabric]`, and the backing files (metadata and access(2) only).
    pub(super) fn validate(&self, ctx: &Ctx<'_>) -> CheckReport {
        let mut report = CheckReport::default();
        if let Err(errors) = fabric_settings(&self.fabric, ctx) {
            report.errors.extend(errors);
        }
        if let Err(e) = ram_limit(&self.fabric, ctx) {
            report.errors.push(e);
        }
        if let Some(dir) = &self.fabric.state_dir {
            match std::fs::metadata(dir) {
                Ok(m) if !m.is_dir() => report.errors.push(
                    ctx.fabric_err("state_dir", format!("{} is not a directory", dir.display())),
                ),
                Ok(_) if !writable(dir, true) => report.errors.push(ctx.fabric_err(
                    "state_dir",
                    format!(
                        "{} is not writable by this user: fix its permissions",
                        dir.display()
                    ),
                )),
                Ok(_) => {}
                Err(_) => {
                    let existing = dir.ancestors().skip(1).find(|a| a.is_dir());
                    match existing {
                        Some(a) if writable(a, true) => report.notices.push(ctx.fabric_err(
                            "state_dir",
                            format!("{} does not exist: it will be created", dir.display()),
                        )),
                        _ => report.errors.push(ctx.fabric_err(
                            "state_dir",
                            format!(
                                "{} does not exist and cannot be created by this user: create it or fix the path",
                                dir.display()
                            ),
                        )),
                    }
                }
            }
        }
        // Each listen address is bound once: a repeat, or an address under
        // a wildcard of the same port, fails the start.
        let dual_stack = blockwire_target::iscsi::portal::ipv6_wildcard_takes_ipv4();
        let mut seen: Vec<(SocketAddr, u16)> = Vec::new();
        for g in &self.portal_groups {
            let tag = g.get_ref().tag;
            for a in &g.get_ref().listen {
                let Ok(addr) = a.get_ref().parse::<SocketAddr>() else {
                    continue; // build() reports it
                };
                // Port 0 (a port picked at start) may be listed in several
                // groups, each getting its own, but once per group.
                let clash = seen.iter().find(|(other, other_tag)| {
                    (*other == addr && *other_tag == tag)
                        || listen_overlap(*other, addr, dual_stack)
                });
                if let Some((_, other_tag)) = clash.filter(|_| addr.port() == 0) {
                    report.errors.push(ctx.err(
                        a.span(),
                        "portal_group.listen",
                        format!(
                            "{addr} is listed twice in portal group {other_tag}: port 0 picks one port per group; list it once"
                        ),
                    ));
                } else if let Some((other, other_tag)) = clash {
                    let what = if *other == addr {
                        format!("{addr} is listed already")
                    } else {
                        format!("{addr} overlaps {other}{}", overlap_reason(*other, addr))
                    };
                    report.errors.push(ctx.err(
                        a.span(),
                        "portal_group.listen",
                        format!(
                            "{what} (portal group {other_tag}): an address:port is bound once; remove it from one group (portal group {tag} here)"
                        ),
                    ));
                }
                seen.push((addr, tag));
            }
        }
        let mut claims = Claims::default();
        // Each target's credentials, for the check across sections.
        let mut sections: Vec<(String, AuthConfig)> = Vec::new();
        for t in &self.targets {
            let t = t.get_ref();
            if let Err(why) = check_iscsi_name(t.name.get_ref().trim()) {
                report
                    .errors
                    .push(ctx.err(t.name.span(), "target.name", why));
            }
            // TargetAlias goes out in every normal login's first answer: a
            // value past 255 bytes, or with a NUL, cannot be sent (RFC 7143
            // §6.1), and each such login would fail with TARGET ERROR.
            if let Some(alias) = t.alias.as_deref() {
                if alias.len() > MAX_ALIAS_BYTES || alias.contains('\0') {
                    report.errors.push(ctx.err(
                        t.name.span(),
                        "target.alias",
                        format!(
                            "an alias of {} bytes{}: TargetAlias is a text value of at most \
                             {MAX_ALIAS_BYTES} bytes without NUL (RFC 7143 §6.1), sent in every login; \
                             shorten it",
                            alias.len(),
                            if alias.contains('\0') { " with a NUL" } else { "" }
                        ),
                    ));
                }
            }
            for a in t.allow.iter().flatten() {
                if let Err(why) = check_iscsi_name(a.get_ref().trim()) {
                    report.errors.push(ctx.err(
                        a.span(),
                        "target.allow",
                        format!("{why}; allow lists InitiatorNames"),
                    ));
                }
            }
            let auth = AuthConfig {
                chap: t.chap.clone(),
                initiator_chap: t.initiator_chap.clone(),
                mutual_chap: t.mutual_chap.clone(),
                chap_algorithms: None,
            };
            check_auth(ctx, &mut report, &auth, "target");
            sections.push((format!("target {}", t.name.get_ref().trim()), auth));
            claim_units(
                ctx,
                &mut report,
                &mut claims,
                self.fabric.state_dir.as_deref(),
                t,
            );
            if ctx.no_disk {
                continue; // no backing file is touched at all
            }
            let lower = t.name.get_ref().trim().to_ascii_lowercase();
            for l in &t.luns {
                let l = l.get_ref();
                if ctx.keeps_unit(&lower, l.id) {
                    // A unit that keeps serving has its files open: the
                    // change neither opens, creates nor grows them (a
                    // resize goes through the unit), so what their paths
                    // hold now is not this change's to judge.
                    continue;
                }
                let size = l.size.as_ref().and_then(|s| parse_size(s.get_ref()));
                match l.backstore.get_ref().as_str() {
                    "file" => {
                        if let Some(p) = &l.path {
                            let len = check_backing_file(
                                ctx,
                                &mut report,
                                p.span(),
                                "target.lun.path",
                                p.get_ref(),
                                size,
                                l.read_only,
                            );
                            // Served at `size`, a longer file would hide its
                            // end from initiators whose file systems span it:
                            // what a LUN grown by `lun.resize` comes back as
                            // when its new size was never saved.
                            if let (Some(len), Some(want)) = (len, size) {
                                if len > want {
                                    report.errors.push(ctx.err(
                                        l.size.as_ref().map_or(p.span(), |s| s.span()),
                                        "target.lun.size",
                                        format!(
                                            "{} is {len} bytes, more than size ({want}): the LUN would \
                                             be served short of the data past {want} bytes (grown by \
                                             lun.resize, and the size not saved?); set size = \"{len}\" \
                                             or leave size out to serve the whole file",
                                            p.get_ref().display()
                                        ),
                                    ));
                                }
                            }
                        }
                    }
                    "striped" => {
                        let Some(paths) = &l.paths else { continue };
                        let n = paths.get_ref().len().max(1) as u64;
                        let member_size = size.map(|s| s.div_ceil(n));
                        let mut lens = Vec::new();
                        for p in paths.get_ref() {
                            let len = check_backing_file(
                                ctx,
                                &mut report,
                                paths.span(),
                                "target.lun.paths",
                                p,
                                member_size,
                                l.read_only,
                            );
                            if let Some(len) = len {
                                lens.push((p, len));
                            }
                        }
                        let with_data: Vec<_> = lens.iter().filter(|(_, n)| *n > 0).collect();
                        if let Some((first, flen)) = with_data.first() {
                            if let Some((p, n)) = lens.iter().find(|(_, n)| n != flen) {
                                report.errors.push(ctx.err(
                                    paths.span(),
                                    "target.lun.paths",
                                    format!(
                                        "striped member {} is {n} bytes but {} is {flen} bytes: the members of one set are equal in size; restore or grow the member, else fix paths",
                                        p.display(),
                                        first.display()
                                    ),
                                ));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        check_auth(ctx, &mut report, &self.discovery, "discovery");
        let mut roles: Vec<(String, &AuthConfig)> =
            sections.iter().map(|(n, a)| (n.clone(), a)).collect();
        roles.push(("[discovery]".to_owned(), &self.discovery));
        check_secret_roles(ctx, &mut report, &roles);
        report
    }
}
