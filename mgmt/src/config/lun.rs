//! One `[[target.lun]]` table: its fields checked against its backstore kind, its
//! storage opened (or, for `--check` and `--no-disk`, stood in for), and the data path
//! the operator asked of it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::located::Located;
use blockwire_target::backstore::{
    ram_size_refusal, striped::check_stripe, Backstore, FileBackstore, FileMode, NullBackstore,
    RamBackstore, StripedBackstore,
};
use blockwire_target::iscsi::catalog::DataPathPolicy;
use blockwire_target::scsi::{LogicalUnit, LuConfig, QosLimits};

use super::{
    file_atomic_journal, parse_size, pr_state_file_name, unit_identity, ConfigError, Ctx, LunDef,
    DRY_RUN_SIZE,
};

/// Builds LUN `l` of target `name` (its span `lspan`): the logical unit (the running
/// one when the configuration is reloaded and the LUN is kept), and its data path
/// when it asks for one other than the default copy path. `state_dir` keeps the
/// persistent-reservation state of units that persist through power loss (APTPL).
pub(super) fn build_lun(
    ctx: &Ctx<'_>,
    state_dir: Option<&Path>,
    name: &str,
    l: &LunDef,
    lspan: std::ops::Range<usize>,
) -> Result<(Arc<LogicalUnit>, Option<DataPathPolicy>, QosLimits), ConfigError> {
    if let Some(why) = l.serial.as_deref().and_then(serial_refusal) {
        return Err(ctx.err(lspan, "target.lun.serial", why));
    }
    let limits = qos_limits(ctx, l)?;
    let size = match &l.size {
        Some(s) => Some(parse_size(s.get_ref()).filter(|&n| n > 0).ok_or_else(|| {
            ctx.err(
                s.span(),
                "target.lun.size",
                format!(
                    "{:?} is not a size (write e.g. \"1G\", \"512M\" or bytes)",
                    s.get_ref()
                ),
            )
        })?),
        None => None,
    };
    let block_size = match &l.block_size {
        Some(b) if *b.get_ref() != 512 && *b.get_ref() != 4096 => {
            return Err(ctx.err(b.span(), "target.lun.block_size", "must be 512 or 4096"));
        }
        Some(b) => *b.get_ref(),
        None => 512,
    };
    let kind = l.backstore.get_ref().as_str();
    let mode = match &l.mode {
        None => FileMode::Cached,
        Some(m) if kind != "file" && kind != "striped" => {
            return Err(ctx.err(
                m.span(),
                "target.lun.mode",
                format!("only file and striped LUNs have a mode; remove it from this {kind} LUN"),
            ));
        }
        Some(m) => match m.get_ref().as_str() {
            "cached" => FileMode::Cached,
            "direct" => FileMode::Direct,
            other => {
                return Err(ctx.err(
                    m.span(),
                    "target.lun.mode",
                    format!("{other:?} is not a mode (use \"cached\" or \"direct\")"),
                ));
            }
        },
    };
    let physical_block_exponent = match &l.physical_block_size {
        None => 0,
        Some(p) => {
            let v = *p.get_ref();
            let ratio = v / block_size;
            if v < block_size || v % block_size != 0 || !ratio.is_power_of_two() || ratio > 1 << 15
            {
                return Err(ctx.err(
                    p.span(),
                    "target.lun.physical_block_size",
                    format!("must be block_size ({block_size}) times a power of two, e.g. 4096"),
                ));
            }
            ratio.trailing_zeros() as u8
        }
    };
    let sync_chunk = match &l.sync_chunk {
        None => 64 << 10,
        Some(c) => match parse_size(c.get_ref()) {
            Some(n) if (4096..=1 << 20).contains(&n) && n % 4096 == 0 => n as usize,
            _ => {
                return Err(ctx.err(
                    c.span(),
                    "target.lun.sync_chunk",
                    format!(
                        "{:?} is not a chunk size (a multiple of 4K from \"4K\" to \"1M\", e.g. \"64K\")",
                        c.get_ref()
                    ),
                ));
            }
        },
    };
    let sync_send = l.sync_send.as_ref().is_some_and(|s| *s.get_ref());
    if let Some(s) = l
        .sync_send
        .as_ref()
        .filter(|_| kind != "file" && kind != "striped")
    {
        return Err(ctx.err(
            s.span(),
            "target.lun.sync_send",
            format!("only file and striped LUNs have synchronized sends; remove it from this {kind} LUN"),
        ));
    }
    let engine_mode = if sync_send {
        blockwire_target::datapath::Mode::Synchronized
    } else {
        blockwire_target::datapath::Mode::Serial
    };
    // Striped LUNs, like file LUNs, read through the engine when
    // direct (serial unless sync_send) or with sync_send.
    let engine_path = sync_send || mode == FileMode::Direct;
    if let Some(p) = l.path.as_ref().filter(|_| matches!(kind, "ram" | "null")) {
        let keeps = if kind == "ram" {
            "keeps its blocks in memory, lost at a restart"
        } else {
            "keeps no data"
        };
        return Err(ctx.err(
            p.span(),
            "target.lun.path",
            format!(
                "a {kind} LUN {keeps}: remove path, or use backstore = \"file\" to keep the \
                 blocks in {}",
                p.get_ref().display()
            ),
        ));
    }
    if let Some(p) = l.paths.as_ref().filter(|_| kind != "striped") {
        return Err(ctx.err(
            p.span(),
            "target.lun.paths",
            format!("only striped LUNs have member paths; use path = \"...\" for this {kind} LUN"),
        ));
    }
    if let Some(c) = l.stripe_chunk.as_ref().filter(|_| kind != "striped") {
        return Err(ctx.err(
            c.span(),
            "target.lun.stripe_chunk",
            format!("only striped LUNs have a stripe chunk; remove it from this {kind} LUN"),
        ));
    }
    if let Some(z) = l.zero_copy.as_ref().filter(|_| kind != "file") {
        return Err(ctx.err(
            z.span(),
            "target.lun.zero_copy",
            format!(
                "only file LUNs have zero_copy (sendfile) reads; remove it from this {kind} LUN"
            ),
        ));
    }
    let zero_copy = l.zero_copy.as_ref().is_none_or(|z| *z.get_ref());
    if let Some(w) = l.sync_write.as_ref().filter(|_| kind != "file") {
        return Err(ctx.err(
            w.span(),
            "target.lun.sync_write",
            format!("only file LUNs have double-buffered writes; remove sync_write from this {kind} LUN"),
        ));
    }
    let sync_write = l.sync_write.as_ref().is_some_and(|w| *w.get_ref());
    if let Some(j) = l.atomic_journal.as_ref().filter(|_| kind != "file") {
        return Err(ctx.err(
            j.span(),
            "target.lun.atomic_journal",
            format!("only file LUNs keep an atomic-write journal; remove it from this {kind} LUN"),
        ));
    }
    if let Some(u) = l.atomic_unit.as_ref() {
        let why = if kind != "file" {
            Some(format!("only file LUNs on a block device have an atomic_unit; remove it from this {kind} LUN"))
        } else if l.read_only {
            Some("a read-only LUN takes no writes; remove atomic_unit".to_owned())
        } else if l.atomic_journal.is_some() {
            Some("atomic_unit is the size of the kernel's untorn writes, which a LUN with atomic_journal does not use (its journal takes any whole blocks): remove one of them".to_owned())
        } else {
            None
        };
        if let Some(why) = why {
            return Err(ctx.err(u.span(), "target.lun.atomic_unit", why));
        }
    }
    let protected = protection_asked(ctx, l, kind)?;
    // A protected LUN's tuples are written beside its blocks, not in the
    // same atomic write: WRITE ATOMIC is not offered there.
    let atomic_writes = if protected {
        Some(false)
    } else {
        l.atomic_writes.as_ref().map(|a| *a.get_ref())
    };
    if let Some(a) = l.atomic_writes.as_ref().filter(|a| *a.get_ref()) {
        let why = match kind {
            "striped" => Some("a striped LUN cannot write atomically (one write may span members); remove atomic_writes"),
            _ if l.read_only => Some("a read-only LUN takes no writes; remove atomic_writes"),
            _ => None,
        };
        if let Some(why) = why {
            return Err(ctx.err(a.span(), "target.lun.atomic_writes", why));
        }
    }
    let pr_state_path = state_dir.map(|d| d.join(pr_state_file_name(name, l.id)));
    let kept = ctx
        .reuse
        .and_then(|r| r.get(&(name.to_ascii_lowercase(), l.id)).cloned());
    // Checked here and not only by the store, so that --check and
    // --no-disk (which build no RAM store) refuse it too.
    if let Some(why) = size.filter(|_| kind == "ram").and_then(ram_size_refusal) {
        let span = l.size.as_ref().map_or(lspan.clone(), Located::span);
        return Err(ctx.err(
            span,
            "target.lun.size",
            format!("{why}: a larger thin LUN belongs on a sparse file (backstore = \"file\")"),
        ));
    }
    let backstore: Arc<dyn Backstore> = match kind {
        _ if kept.is_some() => kept
            .as_ref()
            .map(|u| u.config().backstore.clone())
            .expect("checked is_some"),
        "null" | "ram" if ctx.no_disk => {
            let size = size.ok_or_else(|| {
                ctx.err(
                    lspan.clone(),
                    "target.lun.size",
                    format!("a {kind} LUN needs a size"),
                )
            })?;
            Arc::new(NullBackstore::pattern(size))
        }
        "null" => {
            let size = size.ok_or_else(|| {
                ctx.err(lspan.clone(), "target.lun.size", "a null LUN needs a size")
            })?;
            Arc::new(NullBackstore::new(size))
        }
        "ram" => {
            let size = size.ok_or_else(|| {
                ctx.err(lspan.clone(), "target.lun.size", "a ram LUN needs a size")
            })?;
            Arc::new(RamBackstore::new(size))
        }
        "file" if ctx.no_disk || ctx.dry_run => {
            let path = l.path.as_ref().map(Located::get_ref).ok_or_else(|| {
                ctx.err(lspan.clone(), "target.lun.path", "a file LUN needs a path")
            })?;
            // --no-disk and --check: the file is neither opened
            // nor created; its length (metadata only) stands in
            // for a size. A dry run opens an existing one as the
            // change would (and closes it), so it sees what only an
            // open tells, a block device's size among it.
            let device = if ctx.probe_files {
                super::probe::existing_backstore(path, l.read_only)
                    .map_err(|m| ctx.err(lspan.clone(), "target.lun.path", m))?
            } else {
                None
            };
            let size = match (size, std::fs::metadata(path), ctx.dry_run) {
                (Some(s), _, _) => device.map_or(s, |d| d.min(s)),
                (None, _, true) if device.is_some() => device.unwrap_or_default(),
                (None, Ok(m), true) if m.is_file() && m.len() > 0 => m.len(),
                // validate() reports the missing, empty or
                // special file; a stand-in lets the rest be checked.
                (None, _, true) => DRY_RUN_SIZE,
                (None, Ok(m), false) => m.len(),
                (None, Err(e), false) => {
                    return Err(ctx.err(
                        lspan.clone(),
                        "target.lun.size",
                        format!(
                            "--no-disk needs a size for {} ({e}): add size = \"...\"",
                            path.display()
                        ),
                    ))
                }
            };
            // A live change's dry run opens what the change would (--check
            // opens nothing: it may run where the devices are not).
            if ctx.dry_run && ctx.probe_files {
                super::dry_run_atomic_writes(
                    ctx,
                    l,
                    lspan.clone(),
                    path,
                    size,
                    mode == FileMode::Direct,
                    atomic_writes,
                )?;
            }
            Arc::new(stand_in(
                ctx,
                size,
                || format!("file {}", path.display()),
                mode,
            ))
        }
        "striped" => {
            let paths = l.paths.as_ref().ok_or_else(|| {
                ctx.err(
                    lspan.clone(),
                    "target.lun.paths",
                    "a striped LUN needs paths = [\"a.img\", \"b.img\", ...] (at least 2)",
                )
            })?;
            if paths.get_ref().len() < 2 {
                return Err(ctx.err(
                    paths.span(),
                    "target.lun.paths",
                    format!("a striped LUN needs at least 2 member paths ({} given); use backstore = \"file\" for one", paths.get_ref().len()),
                ));
            }
            if l.path.is_some() {
                return Err(ctx.err(
                    lspan.clone(),
                    "target.lun.path",
                    "a striped LUN takes its members from paths = [...]; remove path",
                ));
            }
            let stripe = match &l.stripe_chunk {
                None => 64 << 10,
                Some(c) => {
                    let n = parse_size(c.get_ref()).ok_or_else(|| {
                        ctx.err(
                            c.span(),
                            "target.lun.stripe_chunk",
                            format!("{:?} is not a size (write e.g. \"64K\")", c.get_ref()),
                        )
                    })?;
                    check_stripe(n, mode)
                        .map_err(|m| ctx.err(c.span(), "target.lun.stripe_chunk", m))?;
                    if n < u64::from(block_size) {
                        return Err(ctx.err(
                            c.span(),
                            "target.lun.stripe_chunk",
                            format!("the stripe chunk ({n} bytes) must hold at least one {block_size}-byte block"),
                        ));
                    }
                    n
                }
            };
            if ctx.no_disk || ctx.dry_run {
                let mut devices = Vec::new();
                if ctx.probe_files {
                    for p in paths.get_ref() {
                        let device = super::probe::existing_backstore(p, l.read_only)
                            .map_err(|m| ctx.err(paths.span(), "target.lun.paths", m))?;
                        devices.push(device);
                    }
                }
                let size = match size {
                    Some(s) => s,
                    None => {
                        let mut least = u64::MAX;
                        for (i, p) in paths.get_ref().iter().enumerate() {
                            let device = devices.get(i).copied().flatten();
                            let len = match (std::fs::metadata(p), ctx.dry_run) {
                                _ if device.is_some() => device.unwrap_or_default(),
                                (Ok(m), _) => m.len(),
                                // validate() reports the missing member.
                                (Err(_), true) => DRY_RUN_SIZE,
                                (Err(e), false) => {
                                    return Err(ctx.err(
                                        lspan.clone(),
                                        "target.lun.size",
                                        format!(
                                        "--no-disk needs a size for {} ({e}): add size = \"...\"",
                                        p.display()
                                    ),
                                    ))
                                }
                            };
                            least = least.min(len);
                        }
                        let size = least / stripe * stripe * paths.get_ref().len() as u64;
                        if ctx.dry_run && size == 0 {
                            stripe * paths.get_ref().len() as u64
                        } else {
                            size
                        }
                    }
                };
                let members = paths.get_ref();
                let what = || {
                    let names: Vec<String> =
                        members.iter().map(|p| p.display().to_string()).collect();
                    let chunk = match stripe {
                        s if s >= 1024 => format!("{} KiB", s >> 10),
                        s => format!("{s} B"),
                    };
                    format!(
                        "striped {} x {chunk} over {}",
                        members.len(),
                        names.join(", ")
                    )
                };
                Arc::new(stand_in(ctx, size, what, mode))
            } else {
                let sb = StripedBackstore::open(paths.get_ref(), stripe, size, l.read_only, mode)
                    .map_err(|e| ctx.err(paths.span(), "target.lun.paths", e.to_string()))?;
                Arc::new(sb)
            }
        }
        "file" => {
            let path = l.path.as_ref().map(Located::get_ref).ok_or_else(|| {
                ctx.err(lspan.clone(), "target.lun.path", "a file LUN needs a path")
            })?;
            let fb = FileBackstore::open_with(path, size, l.read_only, mode)
                .map_err(|e| ctx.err(lspan.clone(), "target.lun.path", e.to_string()))?;
            Arc::new(file_atomic_journal(
                ctx,
                l,
                lspan.clone(),
                path,
                fb,
                atomic_writes,
            )?)
        }
        other => {
            return Err(ctx.err(
                l.backstore.span(),
                "target.lun.backstore",
                format!(
                    "{other:?} is not a backstore (use \"ram\", \"file\", \"striped\" or \"null\")"
                ),
            ));
        }
    };
    if !backstore.size().is_multiple_of(u64::from(block_size))
        || backstore.size() < u64::from(block_size)
    {
        return Err(ctx.err(
            lspan,
            "target.lun.size",
            format!(
                "{} bytes is not a whole number of {block_size}-byte blocks",
                backstore.size()
            ),
        ));
    }
    let (serial, naa) = unit_identity(name, l).ok_or_else(|| {
        let u = l.uuid.as_ref().expect("only a uuid can be no identity");
        ctx.err(
            u.span(),
            "target.lun.uuid",
            format!(
                "{:?} is not a UUID (32 hex digits, e.g. from uuidgen)",
                u.get_ref()
            ),
        )
    })?;
    let pi_store = match kept {
        Some(_) => None,
        None if protected => Some(protection_store(
            ctx,
            l,
            lspan.clone(),
            &backstore,
            block_size,
        )?),
        None => None,
    };
    let mut lu = LuConfig::new(backstore);
    lu.pi_store = pi_store;
    lu.block_size = block_size;
    lu.physical_block_exponent = physical_block_exponent;
    lu.read_only = l.read_only;
    lu.removable = l.removable;
    lu.atomic_writes = atomic_writes != Some(false);
    if let Some(secs) = &l.sanitize_min_seconds {
        if *secs.get_ref() > 86_400 {
            return Err(ctx.err(
                secs.span(),
                "target.lun.sanitize_min_seconds",
                format!("{} seconds is more than a day", secs.get_ref()),
            ));
        }
        lu.sanitize_min_duration = std::time::Duration::from_secs(*secs.get_ref());
    }
    let low_space = low_space_threshold(ctx, l, kind)?;
    let stalled = l.stalled;
    lu.serial = serial;
    lu.naa_id = naa;
    lu.pr_state_path = pr_state_path;
    lu.qos = limits;
    // Stand-ins (every store under --no-disk; files and striped members
    // under --check and for a dry run's new units) have no space to watch,
    // and say nothing about whether what they stand for has.
    let on_files = kind == "file" || kind == "striped";
    let unit = match kept {
        // A kept unit stays as it runs (its stall switch too); the change
        // gives it its new QoS ceilings and low-space threshold.
        Some(unit) => {
            let stand_in = ctx.no_disk;
            if let Some((span, _)) = low_space.as_ref() {
                if !unit.reports_space() && !stand_in {
                    return Err(no_threshold_here(ctx, span.clone(), &unit));
                }
            }
            unit
        }
        None => {
            let stand_in = ctx.no_disk || (ctx.dry_run && on_files);
            let unit = Arc::new(LogicalUnit::new(lu));
            if stalled {
                unit.set_stalled(true);
            }
            if let Some((span, bytes)) = low_space {
                if unit.reports_space() {
                    unit.set_low_space_threshold(Some(bytes)).map_err(|e| {
                        ctx.err(span, "target.lun.low_space_threshold", e.to_string())
                    })?;
                } else if !stand_in {
                    return Err(no_threshold_here(ctx, span, &unit));
                }
            }
            unit
        }
    };
    // What the operator asked of the LUN's data; the fabric
    // maps it onto what the storage can do when it starts.
    // File and striped LUNs read through the engine when direct
    // (serial unless sync_send) or with sync_send; cached file
    // LUNs otherwise send READ payloads by sendfile unless
    // zero_copy = false.
    let policy = DataPathPolicy {
        engine_reads: (engine_path && (kind == "file" || kind == "striped")).then_some(engine_mode),
        sendfile: kind == "file" && !sync_send && mode == FileMode::Cached && zero_copy,
        // --no-disk drops every WRITE: nothing to double-buffer.
        double_buffered_writes: sync_write && !ctx.no_disk,
        chunk: sync_chunk,
    };
    let asked = !protected
        && (policy.engine_reads.is_some() || policy.sendfile || policy.double_buffered_writes);
    Ok((unit, asked.then_some(policy), limits))
}

/// `low_space_threshold` of LUN `l` (a `kind` LUN) with its place: a size
/// of at least one byte; refused for the null store outright (other stores
/// are asked when they open).
fn low_space_threshold(
    ctx: &Ctx<'_>,
    l: &LunDef,
    kind: &str,
) -> Result<Option<(std::ops::Range<usize>, u64)>, ConfigError> {
    let Some(t) = &l.low_space_threshold else {
        return Ok(None);
    };
    let key = "target.lun.low_space_threshold";
    let Some(bytes) = parse_size(t.get_ref()).filter(|&n| n > 0) else {
        return Err(ctx.err(
            t.span(),
            key,
            format!(
                "{:?} is not a size (write e.g. \"2G\" or \"500M\": the free space below which initiators are warned)",
                t.get_ref()
            ),
        ));
    };
    if kind == "null" {
        return Err(ctx.err(
            t.span(),
            key,
            "a null LUN takes no space; remove low_space_threshold",
        ));
    }
    Ok(Some((t.span(), bytes)))
}

fn no_threshold_here(
    ctx: &Ctx<'_>,
    span: std::ops::Range<usize>,
    unit: &LogicalUnit,
) -> ConfigError {
    ctx.err(
        span,
        "target.lun.low_space_threshold",
        format!(
            "{} does not take space as it is written (a block device, or a LUN without thin \
             provisioning), so it cannot run low; remove low_space_threshold",
            unit.config().backstore.describe()
        ),
    )
}

/// The least `bandwidth_limit`: below it a single large command would wait
/// for seconds (a 1 MiB WRITE takes a second at 1 MiB/s).
const LEAST_BANDWIDTH: u64 = 1 << 20;

/// The QoS ceilings of LUN `l`: `iops_limit` and `bandwidth_limit` for the
/// LUN, `initiator_iops_limit` and `initiator_bandwidth_limit` for each
/// initiator.
fn qos_limits(ctx: &Ctx<'_>, l: &LunDef) -> Result<QosLimits, ConfigError> {
    Ok(QosLimits {
        iops: iops_ceiling(ctx, &l.iops_limit, "iops_limit")?,
        bytes_per_sec: bandwidth_ceiling(ctx, &l.bandwidth_limit, "bandwidth_limit")?,
        initiator_iops: iops_ceiling(ctx, &l.initiator_iops_limit, "initiator_iops_limit")?,
        initiator_bytes_per_sec: bandwidth_ceiling(
            ctx,
            &l.initiator_bandwidth_limit,
            "initiator_bandwidth_limit",
        )?,
    })
}

/// A ceiling on commands per second, the LUN's key `key`.
fn iops_ceiling(
    ctx: &Ctx<'_>,
    value: &Option<Located<u64>>,
    key: &str,
) -> Result<Option<u64>, ConfigError> {
    match value {
        None => Ok(None),
        Some(i) if *i.get_ref() == 0 => Err(ctx.err(
            i.span(),
            &format!("target.lun.{key}"),
            format!("0 would stop every command; remove {key} for no limit"),
        )),
        Some(i) => Ok(Some(*i.get_ref())),
    }
}

/// A ceiling on bytes per second, the LUN's key `key` ("100M").
fn bandwidth_ceiling(
    ctx: &Ctx<'_>,
    value: &Option<Located<String>>,
    key: &str,
) -> Result<Option<u64>, ConfigError> {
    let Some(b) = value else { return Ok(None) };
    match parse_size(b.get_ref()) {
        Some(n) if n >= LEAST_BANDWIDTH => Ok(Some(n)),
        Some(n) => Err(ctx.err(
            b.span(),
            &format!("target.lun.{key}"),
            format!(
                "{n} bytes per second is below the least, \"1M\" (a 1 MiB command \
                 would wait over a second); remove {key} for no limit"
            ),
        )),
        None => Err(ctx.err(
            b.span(),
            &format!("target.lun.{key}"),
            format!("{:?} is not a size per second (e.g. \"100M\")", b.get_ref()),
        )),
    }
}

/// Whether LUN `l` (a `kind` LUN) is formatted with protection
/// information: `protection` is "type1", on a store and with a data path
/// where the SCSI core sees every block.
fn protection_asked(ctx: &Ctx<'_>, l: &LunDef, kind: &str) -> Result<bool, ConfigError> {
    if let Some(f) = l.protection_file.as_ref().filter(|_| kind != "file") {
        return Err(ctx.err(
            f.span(),
            "target.lun.protection_file",
            format!("only file LUNs keep their protection information in a file; remove protection_file from this {kind} LUN"),
        ));
    }
    let Some(p) = &l.protection else {
        if let Some(f) = &l.protection_file {
            return Err(ctx.err(
                f.span(),
                "target.lun.protection_file",
                "protection_file without protection = \"type1\": add protection or remove protection_file",
            ));
        }
        return Ok(false);
    };
    let key = "target.lun.protection";
    match p.get_ref().as_str() {
        "none" => return Ok(false),
        "type1" => {}
        other => {
            return Err(ctx.err(
                p.span(),
                key,
                format!("{other:?} is not a protection type (use \"type1\" or \"none\")"),
            ))
        }
    }
    let why = match kind {
        "null" => Some("a null LUN keeps no data to protect"),
        "striped" => Some("striped LUNs cannot keep protection information yet; use a file LUN"),
        _ if l.sync_send.as_ref().is_some_and(|s| *s.get_ref()) => {
            Some("protection information is checked by the SCSI core, which sync_send bypasses; remove sync_send")
        }
        _ if l.sync_write.as_ref().is_some_and(|s| *s.get_ref()) => {
            Some("protection information is generated by the SCSI core, which sync_write bypasses; remove sync_write")
        }
        _ if l.atomic_writes.as_ref().is_some_and(|a| *a.get_ref()) => {
            Some("a protected LUN writes its tuples beside its blocks, so it cannot write atomically; remove atomic_writes")
        }
        _ => None,
    };
    match why {
        Some(why) => Err(ctx.err(p.span(), key, format!("{why} (or protection = \"none\")"))),
        None => Ok(true),
    }
}

/// The store of a protected LUN's tuples, 8 bytes per block: in memory
/// for a RAM LUN, `protection_file` (by default the backing file's path
/// with `.protection` appended) for a file LUN, created sparse; a stand-in
/// that reads as "unwritten" wherever the data are stood in for.
fn protection_store(
    ctx: &Ctx<'_>,
    l: &LunDef,
    lspan: std::ops::Range<usize>,
    backstore: &Arc<dyn Backstore>,
    block_size: u32,
) -> Result<Arc<dyn Backstore>, ConfigError> {
    let size = backstore.size() / u64::from(block_size) * 8;
    let kind = l.backstore.get_ref().as_str();
    if ctx.no_disk {
        return Ok(Arc::new(NullBackstore::new(size)));
    }
    if kind == "ram" {
        return Ok(Arc::new(RamBackstore::new(size)));
    }
    let path = l
        .path
        .as_ref()
        .map(Located::get_ref)
        .ok_or_else(|| ctx.err(lspan.clone(), "target.lun.path", "a file LUN needs a path"))?;
    let (file, field, span) = match &l.protection_file {
        Some(f) => (f.get_ref().clone(), "target.lun.protection_file", f.span()),
        // Beside a device node would be in /dev, gone at the next boot.
        None if std::fs::metadata(path).is_ok_and(|m| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_block_device()
        }) =>
        {
            return Err(ctx.err(
                l.protection.as_ref().map_or(lspan, Located::span),
                "target.lun.protection",
                format!(
                    "{} is a block device: name the file that keeps its protection information, \
                     e.g. protection_file = \"/var/lib/blockwire/{}.protection\"",
                    path.display(),
                    path.file_name()
                        .map_or("lun".into(), |n| n.to_string_lossy())
                ),
            ));
        }
        None => (
            default_protection_file(path),
            "target.lun.protection",
            l.protection.as_ref().map_or(lspan, Located::span),
        ),
    };
    if file == *path {
        return Err(ctx.err(
            span,
            field,
            "the protection file must not be the backing file itself",
        ));
    }
    // A check or dry run has found what a start would refuse; it opens
    // and creates nothing.
    if ctx.dry_run {
        return Ok(Arc::new(NullBackstore::new(size)));
    }
    // Cached whatever the data's mode: tuples are 8-byte writes, and
    // FUA and SYNCHRONIZE CACHE make them durable with the data.
    let store = FileBackstore::open_with(&file, Some(size), l.read_only, FileMode::Cached)
        .map_err(|e| {
            ctx.err(
                span,
                field,
                format!("{e} (the protection information of {})", path.display()),
            )
        })?;
    Ok(Arc::new(store))
}

/// Where a file LUN's protection information is kept when `protection_file`
/// names no other file: beside its data.
pub(super) fn default_protection_file(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".protection");
    p.into()
}

/// The store a check or dry run builds in place of files it does not open:
/// the no-disk pattern, named (outside `--no-disk`) for what a real build
/// would open, `what` followed by the size and mode as its `describe` says.
fn stand_in(
    ctx: &Ctx<'_>,
    size: u64,
    what: impl FnOnce() -> String,
    mode: FileMode,
) -> NullBackstore {
    if ctx.no_disk {
        return NullBackstore::pattern(size);
    }
    let mode = match mode {
        FileMode::Direct => "direct",
        FileMode::Cached => "cached",
    };
    NullBackstore::stand_in(size, format!("{} ({} MiB, {mode})", what(), size >> 20))
}

/// Most bytes of a unit serial number: VPD 83h carries it in a T10 vendor ID
/// designator after the 8-byte vendor, and a designator holds 255 bytes.
const MAX_SERIAL_BYTES: usize = 255 - 8;

/// Why `serial` cannot be a unit serial number, if it cannot. Past the
/// bound it would be cut on the wire, where two serials alike in their
/// first 247 bytes would name one unit to multipath; and VPD 80h is ASCII
/// (SPC-4 4.3.1), printable.
fn serial_refusal(serial: &str) -> Option<String> {
    if serial.is_empty() {
        return Some("an empty serial number: remove serial to derive one (from uuid, or the target and LUN)".into());
    }
    if serial.len() > MAX_SERIAL_BYTES {
        return Some(format!(
            "a serial number of {} bytes; one takes at most {MAX_SERIAL_BYTES} (VPD 83h holds it after the 8-byte vendor in 255 bytes)",
            serial.len()
        ));
    }
    serial
        .char_indices()
        .find(|(_, c)| !(' '..='~').contains(c))
        .map(|(i, c)| {
            format!("{c:?} at byte {i} of the serial number: serial numbers are printable ASCII (SPC-4 4.3.1)")
        })
}
