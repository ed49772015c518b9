//! The fenced module of `blockwire attach`: the ioctls and the shared-area
//! mapping of /dev/blockwire-scsi (initiator/kmod/blockwire_scsi.h). The
//! only `unsafe` of the blockwire command; everything above it is safe.
//!
//! The shared area holds one descriptor slot and one data buffer per
//! block-layer tag. The driver hands a slot to the daemon with a COMMAND
//! event and does not touch it again until the daemon's reply for it; the
//! daemon in turn promises (by [`SharedArea::hold`]) that one command at a
//! time holds each slot. Together that makes the slices handed out here
//! exclusive while they live.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use blockwire_initiator::kernel_host::{
    AttachRequest, Attached, ATTACH_BYTES, IOC_ATTACH, IOC_DETACH, SLOT_BYTES,
};

/// An open /dev/blockwire-scsi: one SCSI host once attached.
pub struct Device {
    file: File,
}

impl AsRawFd for Device {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl Device {
    /// Opens the driver's character device (non-blocking: the daemon waits
    /// for events with poll).
    pub fn open(path: &str) -> std::io::Result<Device> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)?;
        Ok(Device { file })
    }

    /// Registers the device with tokio's reactor, to wait for events.
    pub fn into_async(self) -> std::io::Result<tokio::io::unix::AsyncFd<Device>> {
        // SAFETY: the Device owns its File for as long as the AsyncFd owns
        // the Device, and as_raw_fd always returns that File's descriptor.
        unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(self, tokio::io::Interest::READABLE)
        }
        .map_err(std::io::Error::from)
    }

    /// BW_SCSI_IOC_ATTACH: creates the SCSI host.
    pub fn attach(&self, req: &AttachRequest) -> std::io::Result<[u8; ATTACH_BYTES]> {
        let mut arg = req.encode();
        // SAFETY: BW_SCSI_IOC_ATTACH reads and writes exactly one struct
        // bw_scsi_attach (ATTACH_BYTES, checked against the header by the
        // library's tests) at the pointer, which is a live, writable array of
        // that size for the whole call.
        let r = unsafe { libc::ioctl(self.file.as_raw_fd(), IOC_ATTACH as _, arg.as_mut_ptr()) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(arg)
    }

    /// BW_SCSI_IOC_DETACH: removes the host; returns once the mid-layer has
    /// let go of it (the daemon must keep answering meanwhile).
    pub fn detach(&self) -> std::io::Result<()> {
        // SAFETY: BW_SCSI_IOC_DETACH takes no argument and touches no memory
        // of this process.
        let r = unsafe { libc::ioctl(self.file.as_raw_fd(), IOC_DETACH as _) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads whole events into `buf`; 0 bytes when the host is detached.
    pub fn read_events(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        (&self.file).read(buf)
    }

    /// Writes whole replies.
    pub fn write_replies(&self, bytes: &[u8]) -> std::io::Result<()> {
        (&self.file).write_all(bytes)
    }

    /// Maps the shared area the attach described.
    pub fn map(&self, attached: &Attached, req: &AttachRequest) -> std::io::Result<SharedArea> {
        let len = attached.area_bytes as usize;
        // SAFETY: a fresh shared mapping chosen by the kernel (no address
        // given), of the length the driver reported for this file; the
        // driver maps its vmalloc'd area there (remap_vmalloc_range). The
        // pointer is kept in SharedArea, which unmaps it once, on drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::Other, "mmap returned a null pointer")
        })?;
        Ok(SharedArea {
            ptr,
            len,
            data_offset: attached.data_offset as usize,
            max_io: req.max_io_bytes as usize,
            held: (0..req.queue_depth)
                .map(|_| AtomicBool::new(false))
                .collect(),
        })
    }
}

/// The mapped shared area.
pub struct SharedArea {
    ptr: NonNull<u8>,
    len: usize,
    data_offset: usize,
    max_io: usize,
    /// Which slots a command of this process holds.
    held: Box<[AtomicBool]>,
}

// SAFETY: the area is plain memory shared with the kernel; which thread
// touches a slot is governed by `held` (one holder per slot), not by the
// thread that mapped it.
unsafe impl Send for SharedArea {}
// SAFETY: as above; `&SharedArea` only hands out slots through `hold`.
unsafe impl Sync for SharedArea {}

impl SharedArea {
    /// Takes slot `tag` for the command the driver just placed there; None
    /// when the tag is out of range or another command of this process
    /// still holds it (the driver never does that).
    pub fn hold(self: &Arc<Self>, tag: u32) -> Option<SlotHold> {
        let flag = self.held.get(tag as usize)?;
        flag.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        Some(SlotHold {
            area: Arc::clone(self),
            tag: tag as usize,
        })
    }

    fn slot_range(&self, tag: usize) -> (usize, usize) {
        (tag * SLOT_BYTES, SLOT_BYTES)
    }

    fn data_range(&self, tag: usize) -> (usize, usize) {
        (self.data_offset + tag * self.max_io, self.max_io)
    }
}

impl Drop for SharedArea {
    fn drop(&mut self) {
        // SAFETY: the mapping made in Device::map, unmapped once; no SlotHold
        // outlives the area (each holds an Arc to it).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// One command's exclusive hold on its slot and data buffer.
pub struct SlotHold {
    area: Arc<SharedArea>,
    tag: usize,
}

impl SlotHold {
    fn bytes(&self, (at, len): (usize, usize)) -> &[u8] {
        assert!(at + len <= self.area.len, "slot range inside the area");
        // SAFETY: in bounds (asserted; Attached::decode checked that the
        // area holds every slot and buffer), and this hold is the only one
        // for its tag, whose slot and buffer the driver leaves alone until
        // the reply.
        unsafe { std::slice::from_raw_parts(self.area.ptr.as_ptr().add(at), len) }
    }

    fn bytes_mut(&mut self, (at, len): (usize, usize)) -> &mut [u8] {
        assert!(at + len <= self.area.len, "slot range inside the area");
        // SAFETY: as in `bytes`; `&mut self` makes this the only slice of
        // the range in this process.
        unsafe { std::slice::from_raw_parts_mut(self.area.ptr.as_ptr().add(at), len) }
    }

    /// The descriptor slot.
    pub fn slot(&self) -> &[u8] {
        self.bytes(self.area.slot_range(self.tag))
    }

    /// The descriptor slot, to write the answer.
    pub fn slot_mut(&mut self) -> &mut [u8] {
        let r = self.area.slot_range(self.tag);
        self.bytes_mut(r)
    }

    /// The data buffer.
    pub fn data(&self) -> &[u8] {
        self.bytes(self.area.data_range(self.tag))
    }

    /// The data buffer, to place Data-In.
    pub fn data_mut(&mut self) -> &mut [u8] {
        let r = self.area.data_range(self.tag);
        self.bytes_mut(r)
    }
}

impl Drop for SlotHold {
    fn drop(&mut self) {
        self.area.held[self.tag].store(false, Ordering::Release);
    }
}
