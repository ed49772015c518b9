//! `blockwire iscsiadm`: open-iscsi's command line (discovery, node, session modes)
//! over the node database in `nodedb`, for scripts written against iscsiadm.

use super::*;

fn node_config(cli: &Cli, n: &nodedb::Node) -> Result<InitiatorConfig> {
    let mut auth = AuthArgs::default();
    if n.get("node.session.auth.authmethod") == Some("CHAP") {
        auth.chap_user = n.get("node.session.auth.username").map(str::to_owned);
        auth.chap_secret = n.get("node.session.auth.password").map(str::to_owned);
        auth.mutual_user = n.get("node.session.auth.username_in").map(str::to_owned);
        auth.mutual_secret = n.get("node.session.auth.password_in").map(str::to_owned);
    }
    // The login check logs out at once: a one-shot session, which never
    // ends a held one (a mount, a ublk device) of the same node.
    Ok(as_role(
        config(cli, &auth)?,
        SessionRole::OneShot { end: 0 },
    ))
}

fn same_portal(p: &blockwire_initiator::Portal, spec: &str) -> bool {
    let want = blockwire_initiator::normalize_portal(spec);
    p.address() == want
}

pub(super) async fn iscsiadm(cli: &Cli, a: &IscsiadmArgs) -> Result<()> {
    let db = nodedb::NodeDb::open(a.config_dir.clone());
    match a.mode.as_str() {
        "discovery" | "discoverydb" => {
            let kind = a.kind.as_deref().unwrap_or("sendtargets");
            let isns = match kind {
                "sendtargets" | "st" => false,
                "isns" => true,
                _ => {
                    bail!("discovery type `{kind}` is not supported: use -t sendtargets or -t isns")
                }
            };
            let portal = a
                .portal
                .as_deref()
                .ok_or_else(|| anyhow!("-m discovery needs -p HOST[:PORT]"))?;
            let _ = (&a.interface, a.discover);
            let found = if isns {
                blockwire_initiator::isns::discover_isns(&config(cli, &a.auth)?, portal).await
            } else {
                discover_list(&config(cli, &a.auth)?, portal).await
            };
            let what = if isns { "iSNS server" } else { "SendTargets" };
            let targets = match found {
                Ok(list) => {
                    for why in &list.refused {
                        eprintln!("blockwire: {what} at {portal}: {why}");
                    }
                    list.targets
                }
                Err(e @ blockwire_initiator::Error::LoginRejected { .. }) => {
                    eprintln!("iscsiadm: Login failed to authenticate with target\nblockwire: {e}");
                    std::process::exit(24);
                }
                Err(e @ blockwire_initiator::Error::Chap { .. }) => {
                    eprintln!("iscsiadm: discovery login failed: {e}");
                    std::process::exit(19);
                }
                Err(e) if isns => return Err(e).context(format!("iSNS discovery at {portal}")),
                Err(e) => return Err(e).context(format!("SendTargets discovery at {portal}")),
            };
            if targets.is_empty() {
                eprintln!("iscsiadm: No portals found");
                std::process::exit(exit::NO_OBJS_FOUND);
            }
            for t in &targets {
                for p in &t.portals {
                    db.upsert(&t.name, p)?;
                }
            }
            print_iscsiadm(&targets);
            Ok(())
        }
        "node" => {
            let nodes: Vec<_> = db
                .nodes()?
                .into_iter()
                .filter(|n| a.targetname.as_ref().map_or(true, |t| *t == n.target))
                .filter(|n| {
                    a.portal
                        .as_ref()
                        .map_or(true, |p| same_portal(&n.portal, p))
                })
                .collect();
            if a.op.as_deref() == Some("new") {
                let (Some(t), Some(p)) = (&a.targetname, &a.portal) else {
                    bail!("-o new needs -T IQN and -p HOST[:PORT]");
                };
                let addr = blockwire_initiator::normalize_portal(p);
                let (host, port) = addr.rsplit_once(':').expect("normalized");
                let portal = blockwire_initiator::Portal {
                    host: host.trim_matches(['[', ']']).to_owned(),
                    port: port.parse().unwrap_or(3260),
                    tpgt: 1,
                };
                db.upsert(t, &portal)?;
                println!(
                    "New iSCSI node [tcp:[hw=,ip=,net_if=,iscsi_if=default] {},{} {}] added",
                    portal.address(),
                    portal.tpgt,
                    t
                );
                return Ok(());
            }
            if nodes.is_empty() && (a.targetname.is_some() || a.portal.is_some() || a.login) {
                eprintln!("iscsiadm: No records found");
                std::process::exit(21);
            }
            if a.login {
                let mut failed = 0;
                for n in &nodes {
                    let label = format!(
                        "[iface: default, target: {}, portal: {},{}]",
                        n.target, n.portal.host, n.portal.port
                    );
                    println!("Logging in to {label}");
                    let r = async {
                        let s =
                            Session::connect(node_config(cli, n)?, &n.portal.address(), &n.target)
                                .await?;
                        s.test_unit_ready(0).await.ok();
                        let tsih = s.tsih();
                        s.logout().await?;
                        db.add_session(&n.target, &n.portal, tsih)
                    }
                    .await;
                    match r {
                        Ok(_) => println!("Login to {label} successful."),
                        Err(e) => {
                            failed += 1;
                            eprintln!("iscsiadm: Could not login to {label}.\nblockwire: {e:#}");
                        }
                    }
                }
                if failed > 0 {
                    std::process::exit(24);
                }
                return Ok(());
            }
            if a.logout {
                let sessions: Vec<_> = db
                    .sessions()?
                    .into_iter()
                    .filter(|s| {
                        nodes.iter().any(|n| {
                            n.target == s.target && n.portal.address() == s.portal.address()
                        })
                    })
                    .collect();
                if sessions.is_empty() {
                    eprintln!("iscsiadm: No matching sessions found");
                    std::process::exit(21);
                }
                for s in sessions {
                    let label = format!(
                        "[sid: {}, target: {}, portal: {},{}]",
                        s.sid, s.target, s.portal.host, s.portal.port
                    );
                    println!("Logging out of session {label}");
                    db.remove_session(&s)?;
                    println!("Logout of {label} successful.");
                }
                return Ok(());
            }
            match a.op.as_deref() {
                Some("delete") => {
                    for n in &nodes {
                        db.delete(n)?;
                    }
                }
                Some("update") => {
                    let (Some(k), Some(v)) = (&a.name, &a.value) else {
                        bail!("-o update needs -n NAME -v VALUE");
                    };
                    for mut n in nodes {
                        n.settings.insert(k.clone(), v.clone());
                        db.save(&n)?;
                    }
                }
                Some("show") | None if a.targetname.is_some() => {
                    for n in &nodes {
                        println!("# BEGIN RECORD blockwire");
                        for (k, v) in &n.settings {
                            let v = if k.contains("password") {
                                "********"
                            } else {
                                v.as_str()
                            };
                            println!("{k} = {}", if v.is_empty() { "<empty>" } else { v });
                        }
                        println!("# END RECORD");
                    }
                }
                None | Some("show") => {
                    if nodes.is_empty() {
                        eprintln!("iscsiadm: No records found");
                        std::process::exit(21);
                    }
                    for n in &nodes {
                        println!("{},{} {}", n.portal.address(), n.portal.tpgt, n.target);
                    }
                }
                Some(other) => bail!("-o {other} is not supported (new, delete, update, show)"),
            }
            Ok(())
        }
        "session" => {
            let sessions = db.sessions()?;
            if sessions.is_empty() {
                eprintln!("iscsiadm: No active sessions.");
                std::process::exit(21);
            }
            for s in sessions {
                println!(
                    "tcp: [{}] {},{} {} (non-flash)",
                    s.sid,
                    s.portal.address(),
                    s.portal.tpgt,
                    s.target
                );
            }
            Ok(())
        }
        other => bail!("iscsiadm mode `{other}` is not supported (discovery, node, session)"),
    }
}
