//! `verbs`: real RDMA hardware (InfiniBand, RoCE, iWARP, rxe/siw) through libibverbs and
//! librdmacm (`rdma-sys` 0.3: system rdma-core, rdma_cm, completion channels whose fd tokio
//! can wait on).
//!
//! Without a device, [`VerbsProvider::open`] fails with [`RdmaError::NoDevice`] naming what
//! is missing and how to fall back (soft backend, or plain iSCSI over TCP).
//!
//! All `unsafe` here is FFI into libibverbs/librdmacm; each block says why it holds.

mod cm;
mod cq;

use std::ffi::CStr;
use std::path::Path;
use std::sync::Arc;

use rdma_sys as sys;

pub use cm::{VerbsConnectRequest, VerbsListener, VerbsQp};
pub use cq::VerbsCq;

use super::{
    AccessFlags, AlignedBuf, MemoryRegion, ProtectionDomain, QpInit, RdmaError, RdmaProvider,
    Result, WcOpcode, WcStatus,
};

/// What the device probe found (for logging and the fallback decision).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Devices libibverbs lists.
    pub devices: Vec<String>,
    /// Whether /dev/infiniband exists (uverbs and rdma_cm character devices).
    pub dev_infiniband: bool,
}

impl Probe {
    /// Ask libibverbs which devices exist.
    pub fn run() -> Probe {
        let mut n: libc::c_int = 0;
        // SAFETY: ibv_get_device_list writes the count into `n` and returns NULL or an
        // array of `n` device pointers that we free with ibv_free_device_list.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        let mut devices = Vec::new();
        if !list.is_null() {
            for i in 0..n.max(0) as usize {
                // SAFETY: i < n, the array holds n valid device pointers.
                let dev = unsafe { *list.add(i) };
                // SAFETY: dev is a valid device; the name is a NUL-terminated C string
                // owned by libibverbs.
                let name = unsafe { CStr::from_ptr(sys::ibv_get_device_name(dev)) };
                devices.push(name.to_string_lossy().into_owned());
            }
            // SAFETY: list came from ibv_get_device_list and is freed once.
            unsafe { sys::ibv_free_device_list(list) };
        }
        Probe {
            devices,
            dev_infiniband: Path::new("/dev/infiniband").exists(),
        }
    }

    /// `Ok(())` if a device exists, else the "no RDMA device" error explaining why.
    pub fn require_device(&self) -> Result<()> {
        if !self.devices.is_empty() {
            return Ok(());
        }
        let missing = if self.dev_infiniband {
            "libibverbs lists 0 devices (is the provider library, e.g. ibverbs-providers, \
             installed?)"
                .to_string()
        } else {
            "libibverbs lists 0 devices and /dev/infiniband does not exist (no RDMA NIC, \
             and neither the rdma_rxe nor the siw kernel module is loaded)"
                .to_string()
        };
        Err(RdmaError::NoDevice { missing })
    }
}

/// A device context shared with librdmacm: the one `rdma_get_devices` hands out, so that
/// protection domains, CQs and the QPs `rdma_create_qp` makes on a connection's id all
/// belong to the same `ibv_context` (librdmacm opens its own contexts; objects of a context
/// opened with `ibv_open_device` cannot be used on its ids).
struct Context {
    ctx: *mut sys::ibv_context,
    /// The `rdma_get_devices` array `ctx` came from, released on drop (librdmacm owns the
    /// contexts themselves).
    list: *mut *mut sys::ibv_context,
    name: String,
}

// SAFETY: libibverbs contexts may be used from any thread (verbs are thread-safe).
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: list came from rdma_get_devices and is freed once; every object made
        // from ctx holds an Arc<Context>, so nothing uses it any more.
        unsafe { sys::rdma_free_devices(self.list) };
    }
}

/// A verbs device.
#[derive(Clone)]
pub struct VerbsProvider {
    ctx: Arc<Context>,
}

impl VerbsProvider {
    /// Open the first RDMA device, or `name` if given.
    pub fn open(name: Option<&str>) -> Result<VerbsProvider> {
        let probe = Probe::run();
        probe.require_device()?;
        let mut n: libc::c_int = 0;
        // SAFETY: rdma_get_devices writes the count and returns NULL or an array of n
        // contexts (NULL-terminated), released with rdma_free_devices.
        let list = unsafe { sys::rdma_get_devices(&mut n) };
        if list.is_null() || n <= 0 {
            if !list.is_null() {
                // SAFETY: freed once.
                unsafe { sys::rdma_free_devices(list) };
            }
            return Err(RdmaError::NoDevice {
                missing: format!(
                    "librdmacm lists no device although libibverbs lists {} \
                     (is /dev/infiniband/rdma_cm there? is rdma_cm loaded?)",
                    probe.devices.join(", ")
                ),
            });
        }
        let mut chosen = None;
        for i in 0..n as usize {
            // SAFETY: i < n, the array holds n valid contexts.
            let ctx = unsafe { *list.add(i) };
            // SAFETY: a valid context has a valid device with a NUL-terminated name.
            let dn = unsafe { CStr::from_ptr(sys::ibv_get_device_name((*ctx).device)) }
                .to_string_lossy()
                .into_owned();
            if name.is_none_or_eq(&dn) {
                chosen = Some((ctx, dn));
                break;
            }
        }
        match chosen {
            None => {
                // SAFETY: freed once; nothing of it is kept.
                unsafe { sys::rdma_free_devices(list) };
                Err(RdmaError::NoDevice {
                    missing: format!(
                        "no RDMA device named {:?} (have: {})",
                        name.unwrap_or(""),
                        probe.devices.join(", ")
                    ),
                })
            }
            Some((ctx, dn)) => Ok(VerbsProvider {
                ctx: Arc::new(Context {
                    ctx,
                    list,
                    name: dn,
                }),
            }),
        }
    }

    pub fn device_name(&self) -> &str {
        &self.ctx.name
    }
}

trait OptEq {
    fn is_none_or_eq(&self, s: &str) -> bool;
}
impl OptEq for Option<&str> {
    fn is_none_or_eq(&self, s: &str) -> bool {
        self.map_or(true, |n| n == s)
    }
}

pub(crate) fn last_err(call: &'static str) -> RdmaError {
    RdmaError::Verbs {
        call,
        source: std::io::Error::last_os_error(),
    }
}

pub(crate) fn rc_err(call: &'static str, rc: libc::c_int) -> RdmaError {
    // Verbs return either -1 with errno or a positive errno value.
    let source = if rc > 0 {
        std::io::Error::from_raw_os_error(rc)
    } else {
        std::io::Error::last_os_error()
    };
    RdmaError::Verbs { call, source }
}

impl RdmaProvider for VerbsProvider {
    type Pd = VerbsPd;
    type Cq = VerbsCq;
    type Qp = VerbsQp;
    type Listener = VerbsListener;

    fn name(&self) -> &'static str {
        "verbs"
    }

    fn alloc_pd(&self) -> Result<VerbsPd> {
        // SAFETY: ctx is an open device context.
        let pd = unsafe { sys::ibv_alloc_pd(self.ctx.ctx) };
        if pd.is_null() {
            return Err(last_err("ibv_alloc_pd"));
        }
        Ok(VerbsPd {
            inner: Arc::new(PdInner {
                pd,
                ctx: self.ctx.clone(),
            }),
        })
    }

    fn create_cq(&self, depth: usize) -> Result<VerbsCq> {
        VerbsCq::new(self.ctx.clone(), depth)
    }

    async fn listen(&self, addr: std::net::SocketAddr) -> Result<VerbsListener> {
        VerbsListener::bind(self.ctx.clone(), addr)
    }

    async fn connect(
        &self,
        addr: std::net::SocketAddr,
        init: QpInit<Self>,
        private_data: &[u8],
    ) -> Result<VerbsQp> {
        cm::connect(self.ctx.clone(), addr, init, private_data).await
    }
}

struct PdInner {
    pd: *mut sys::ibv_pd,
    ctx: Arc<Context>,
}

// SAFETY: protection domains are thread-safe verbs objects.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: every MR and QP holds an Arc<PdInner>, so the PD is unused now.
        unsafe { sys::ibv_dealloc_pd(self.pd) };
    }
}

#[derive(Clone)]
pub struct VerbsPd {
    inner: Arc<PdInner>,
}

impl VerbsPd {
    pub(crate) fn raw(&self) -> *mut sys::ibv_pd {
        self.inner.pd
    }
    pub(crate) fn context(&self) -> *mut sys::ibv_context {
        self.inner.ctx.ctx
    }
}

/// Map access flags to `IBV_ACCESS_*` (the values are the same by construction).
pub(crate) fn ibv_access(a: AccessFlags) -> libc::c_int {
    let mut v = 0;
    if a.contains(AccessFlags::LOCAL_WRITE) {
        v |= sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    }
    if a.contains(AccessFlags::REMOTE_WRITE) {
        v |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if a.contains(AccessFlags::REMOTE_READ) {
        v |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    v as libc::c_int
}

impl ProtectionDomain for VerbsPd {
    type Mr = VerbsMr;

    fn register(&self, buf: AlignedBuf, access: AccessFlags) -> Result<VerbsMr> {
        let (p, len) = (buf.as_ptr(), buf.len());
        // SAFETY: the MR owns the buffer, which therefore outlives the registration.
        let mut mr = unsafe { self.register_raw(p, len, access) }?;
        mr.owned = Some(buf);
        Ok(mr)
    }

    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<VerbsMr> {
        // SAFETY: the caller guarantees addr..addr+len stays allocated while registered;
        // the PD is alive.
        let mr = unsafe { sys::ibv_reg_mr(self.inner.pd, addr.cast(), len, ibv_access(access)) };
        if mr.is_null() {
            return Err(last_err("ibv_reg_mr"));
        }
        // SAFETY: ibv_reg_mr returned a valid region.
        let keys = unsafe { keys_of(mr) };
        Ok(VerbsMr {
            mr: std::sync::Mutex::new(mr),
            keys: std::sync::atomic::AtomicU64::new(keys),
            addr: addr as u64,
            len,
            access,
            owned: None,
            pd: self.inner.clone(),
        })
    }
}

/// The lkey (high half) and rkey (low half) of a registered region.
///
/// # Safety
/// `mr` must be a valid registered region.
unsafe fn keys_of(mr: *mut sys::ibv_mr) -> u64 {
    // SAFETY: the caller guarantees mr is valid.
    let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
    (u64::from(lkey) << 32) | u64::from(rkey)
}

/// A verbs memory region. Dropping it deregisters it.
///
/// [`MemoryRegion::invalidate_rkey`] registers the same memory again and
/// deregisters the old registration, so the old keys stop working (the
/// kernel refuses them as soon as `ibv_dereg_mr` returns); the keys are
/// kept in an atomic so readers never touch a deregistered `ibv_mr`.
pub struct VerbsMr {
    mr: std::sync::Mutex<*mut sys::ibv_mr>,
    keys: std::sync::atomic::AtomicU64,
    addr: u64,
    len: usize,
    access: AccessFlags,
    owned: Option<AlignedBuf>,
    pd: Arc<PdInner>,
}

// SAFETY: ibv_mr handles are thread-safe; the memory is accessed only through raw copies.
unsafe impl Send for VerbsMr {}
// SAFETY: as above.
unsafe impl Sync for VerbsMr {}

impl MemoryRegion for VerbsMr {
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        (self.keys.load(std::sync::atomic::Ordering::Acquire) >> 32) as u32
    }
    fn rkey(&self) -> u32 {
        self.keys.load(std::sync::atomic::Ordering::Acquire) as u32
    }
    fn invalidate_rkey(&self) -> Result<u32> {
        let mut mr = self.mr.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the memory is still registered (register_raw's contract keeps it
        // allocated until this region is dropped) and the PD is alive.
        let fresh = unsafe {
            sys::ibv_reg_mr(
                self.pd.pd,
                self.addr as *mut libc::c_void,
                self.len,
                ibv_access(self.access),
            )
        };
        if fresh.is_null() {
            return Err(last_err("ibv_reg_mr (rkey invalidation)"));
        }
        // SAFETY: fresh is a valid region.
        self.keys.store(
            unsafe { keys_of(fresh) },
            std::sync::atomic::Ordering::Release,
        );
        let old = std::mem::replace(&mut *mr, fresh);
        // SAFETY: old was registered by us and is deregistered exactly once; nothing
        // reads it any more (keys come from the atomic).
        let rc = unsafe { sys::ibv_dereg_mr(old) };
        if rc != 0 {
            return Err(rc_err("ibv_dereg_mr (rkey invalidation)", rc));
        }
        Ok(self.rkey())
    }
    fn access(&self) -> AccessFlags {
        self.access
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        if offset.checked_add(dst.len()).map_or(true, |e| e > self.len) {
            return Err(RdmaError::InvalidArgument("read outside the region".into()));
        }
        // SAFETY: bounds checked; the memory is registered, hence allocated (register_raw's
        // contract); the adapter's DMA is ordered by completions the caller waited for.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.addr as usize + offset) as *const u8,
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        Ok(())
    }
    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        if offset.checked_add(src.len()).map_or(true, |e| e > self.len) {
            return Err(RdmaError::InvalidArgument(
                "write outside the region".into(),
            ));
        }
        // SAFETY: as read_at.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.as_ptr(),
                (self.addr as usize + offset) as *mut u8,
                src.len(),
            )
        };
        Ok(())
    }
    fn deregister(self) -> Result<()> {
        drop(self);
        Ok(())
    }
}

impl Drop for VerbsMr {
    fn drop(&mut self) {
        let mr = *self.mr.get_mut().unwrap_or_else(|e| e.into_inner());
        // SAFETY: mr is valid and deregistered exactly once; the owned buffer (if any) is
        // freed after this, when the field drops.
        unsafe { sys::ibv_dereg_mr(mr) };
    }
}

/// `ibv_wc_status` → [`WcStatus`].
pub(crate) fn wc_status(s: sys::ibv_wc_status::Type) -> WcStatus {
    use sys::ibv_wc_status::*;
    match s {
        IBV_WC_SUCCESS => WcStatus::Success,
        IBV_WC_LOC_LEN_ERR => WcStatus::LocalLengthError,
        IBV_WC_LOC_PROT_ERR | IBV_WC_LOC_ACCESS_ERR => WcStatus::LocalProtectionError,
        IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccessError,
        IBV_WC_REM_INV_REQ_ERR | IBV_WC_REM_INV_RD_REQ_ERR => WcStatus::RemoteInvalidRequest,
        IBV_WC_REM_OP_ERR | IBV_WC_REM_ABORT_ERR => WcStatus::RemoteOperationError,
        IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushError,
        _ => WcStatus::TransportError,
    }
}

/// `ibv_wc_opcode` → [`WcOpcode`].
pub(crate) fn wc_opcode(o: sys::ibv_wc_opcode::Type) -> WcOpcode {
    use sys::ibv_wc_opcode::*;
    match o {
        IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        IBV_WC_RECV | IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::Recv,
        _ => WcOpcode::Send,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_device_here_is_reported_clearly() {
        let probe = Probe::run();
        if !probe.devices.is_empty() {
            // A machine with RDMA: the provider must open, not report none.
            if let Err(e) = VerbsProvider::open(None) {
                panic!("{} RDMA device(s) listed, yet: {e}", probe.devices.len());
            }
            return;
        }
        let err = VerbsProvider::open(None).err().expect("no device");
        let msg = err.to_string();
        assert!(msg.starts_with("no RDMA device"), "{msg}");
        assert!(msg.contains("libibverbs lists 0 devices"), "{msg}");
        assert!(msg.contains("soft RDMA backend"), "{msg}");
        assert!(matches!(err, RdmaError::NoDevice { .. }));
    }

    #[test]
    fn probe_diagnosis() {
        let p = Probe {
            devices: vec![],
            dev_infiniband: false,
        };
        let m = p.require_device().unwrap_err().to_string();
        assert!(m.contains("/dev/infiniband does not exist") && m.contains("rdma_rxe"));
        let p = Probe {
            devices: vec![],
            dev_infiniband: true,
        };
        assert!(p
            .require_device()
            .unwrap_err()
            .to_string()
            .contains("ibverbs-providers"));
        let p = Probe {
            devices: vec!["mlx5_0".into()],
            dev_infiniband: true,
        };
        assert!(p.require_device().is_ok());
    }

    #[test]
    fn flag_and_status_mapping() {
        assert_eq!(ibv_access(AccessFlags::ALL), 7);
        assert_eq!(ibv_access(AccessFlags::REMOTE_READ), 4);
        use sys::ibv_wc_status::*;
        assert_eq!(wc_status(IBV_WC_SUCCESS), WcStatus::Success);
        assert_eq!(
            wc_status(IBV_WC_REM_ACCESS_ERR),
            WcStatus::RemoteAccessError
        );
        assert_eq!(wc_status(IBV_WC_WR_FLUSH_ERR), WcStatus::WrFlushError);
        assert_eq!(wc_status(IBV_WC_RETRY_EXC_ERR), WcStatus::TransportError);
        assert_eq!(wc_opcode(sys::ibv_wc_opcode::IBV_WC_RECV), WcOpcode::Recv);
        assert_eq!(
            wc_opcode(sys::ibv_wc_opcode::IBV_WC_RDMA_READ),
            WcOpcode::RdmaRead
        );
    }
}
