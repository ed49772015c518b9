//! Stateful fuzzing of the soft RDMA provider's memory protection: registrations,
//! rkey invalidations (as the registration cache makes one per released I/O),
//! deregistrations one by one and in batches, local writes, and a peer's RDMA READs
//! and WRITEs with current, stale, local and made-up keys at any address.
//!
//! A model of the regions checks that a peer's access succeeds exactly when its key is
//! the current rkey of a registered region that grants the access and holds the whole
//! range, and that the check a WRITE's header gets before its payload agrees; that a
//! refused WRITE changes no byte; that READs return what was written; and that no slot
//! gives out a key again before it has issued 200 others, so a key made stale by
//! invalidation or deregistration cannot open the slot's next region.
#![no_main]

use std::collections::{HashMap, VecDeque};

use blockwire_transport::rdma::soft::fuzzing::{remote_read, remote_write, remote_write_allowed};
use blockwire_transport::rdma::soft::{SoftConfig, SoftMr, SoftPd, SoftProvider};
use blockwire_transport::rdma::{
    AccessFlags, AlignedBuf, MemoryRegion, ProtectionDomain, RdmaProvider, WcStatus,
};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

/// Live regions at most (each at most 16 KiB), to keep runs fast.
const MAX_LIVE: usize = 12;
/// Keys a slot must issue before one of its earlier keys may come back (the generation
/// is 8 bits; invalidation skips a value equal to the lkey, so leave room).
const FRESH: usize = 200;

#[derive(Arbitrary, Debug)]
enum KeyChoice {
    Current(u8),
    Stale(u16),
    Local(u8),
    MadeUp(u32),
}

#[derive(Arbitrary, Debug)]
enum Op {
    Register { len: u16, access: u8 },
    Deregister(u8),
    DeregisterBatch(u16),
    Invalidate(u8),
    LocalWrite { at: u8, offset: u16, len: u16, byte: u8 },
    RemoteWrite { key: KeyChoice, at: u8, offset: i32, len: u16, byte: u8 },
    RemoteRead { key: KeyChoice, at: u8, offset: i32, len: u16 },
}

struct Live {
    mr: SoftMr,
    bytes: Vec<u8>,
}

#[derive(Default)]
struct Model {
    live: Vec<Live>,
    stale: Vec<u32>,
    /// Keys each slot (key >> 8) issued, newest last.
    issued: HashMap<u32, VecDeque<u32>>,
}

impl Model {
    fn issued(&mut self, key: u32) {
        let history = self.issued.entry(key >> 8).or_default();
        assert!(
            !history.contains(&key),
            "slot {:#x} gave out key {key:#x} again within {FRESH} keys: {history:x?}",
            key >> 8
        );
        history.push_back(key);
        if history.len() > FRESH {
            history.pop_front();
        }
    }

    fn pick(&self, i: u8) -> Option<&Live> {
        (!self.live.is_empty()).then(|| &self.live[usize::from(i) % self.live.len()])
    }

    fn key(&self, choice: &KeyChoice) -> u32 {
        match *choice {
            KeyChoice::Current(i) => self.pick(i).map_or(0, |l| l.mr.rkey()),
            KeyChoice::Local(i) => self.pick(i).map_or(0, |l| l.mr.lkey()),
            KeyChoice::Stale(i) if !self.stale.is_empty() => {
                self.stale[usize::from(i) % self.stale.len()]
            }
            KeyChoice::Stale(i) => u32::from(i),
            KeyChoice::MadeUp(k) => k,
        }
    }

    /// The address `offset` bytes from region `at`'s start (or from 0x1000 without one).
    fn addr(&self, at: u8, offset: i32) -> u64 {
        let base = self.pick(at).map_or(0x1000, |l| l.mr.addr());
        base.wrapping_add_signed(i64::from(offset))
    }

    /// The region a peer's access with `key` to `addr..addr+len` must reach, and the
    /// offset there, or None when it must be refused.
    fn expect(&mut self, key: u32, addr: u64, len: usize, need: AccessFlags) -> Option<(usize, usize)> {
        let i = self.live.iter().position(|l| l.mr.rkey() == key)?;
        let mr = &self.live[i].mr;
        let off = usize::try_from(addr.checked_sub(mr.addr())?).ok()?;
        (mr.access().contains(need) && off.checked_add(len)? <= mr.len()).then_some((i, off))
    }

    fn retire(&mut self, l: Live) {
        self.stale.extend([l.mr.rkey(), l.mr.lkey()]);
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let provider = SoftProvider::new(SoftConfig {
        no_pin: true,
        ..SoftConfig::default()
    });
    let pd: SoftPd = provider.alloc_pd().unwrap();
    let mut m = Model::default();
    for op in ops.into_iter().take(256) {
        match op {
            Op::Register { len, access } => {
                if m.live.len() >= MAX_LIVE {
                    continue;
                }
                let len = usize::from(len % 16384) + 1;
                let access = AccessFlags::from_bits_truncate(u32::from(access));
                let refused = access.contains(AccessFlags::REMOTE_WRITE)
                    && !access.contains(AccessFlags::LOCAL_WRITE);
                match pd.register(AlignedBuf::new(len), access) {
                    Ok(mr) => {
                        assert!(!refused, "REMOTE_WRITE without LOCAL_WRITE was registered");
                        assert_ne!(mr.lkey(), mr.rkey());
                        m.issued(mr.lkey());
                        m.issued(mr.rkey());
                        m.live.push(Live { mr, bytes: vec![0; len] });
                    }
                    Err(e) => assert!(refused, "registration of {len} bytes failed: {e}"),
                }
            }
            Op::Deregister(i) if !m.live.is_empty() => {
                let l = m.live.swap_remove(usize::from(i) % m.live.len());
                m.retire(l);
            }
            Op::DeregisterBatch(mask) => {
                let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut m.live)
                    .into_iter()
                    .enumerate()
                    .partition(|(i, _)| mask & (1 << (i % 16)) != 0);
                m.live = kept.into_iter().map(|(_, l)| l).collect();
                let gone: Vec<Live> = gone.into_iter().map(|(_, l)| l).collect();
                m.stale.extend(gone.iter().flat_map(|l| [l.mr.rkey(), l.mr.lkey()]));
                pd.deregister_batch(gone.into_iter().map(|l| l.mr).collect()).unwrap();
            }
            Op::Invalidate(i) if !m.live.is_empty() => {
                let l = &m.live[usize::from(i) % m.live.len()];
                let old = l.mr.rkey();
                let new = l.mr.invalidate_rkey().unwrap();
                assert_eq!(new, l.mr.rkey());
                assert_ne!(new, l.mr.lkey());
                m.stale.push(old);
                m.issued(new);
            }
            Op::LocalWrite { at, offset, len, byte } if !m.live.is_empty() => {
                let i = usize::from(at) % m.live.len();
                let l = &mut m.live[i];
                let (off, n) = (usize::from(offset), usize::from(len % 4096));
                let fits = off + n <= l.bytes.len();
                assert_eq!(l.mr.write_at(off, &vec![byte; n]).is_ok(), fits);
                if fits {
                    l.bytes[off..off + n].fill(byte);
                }
            }
            Op::RemoteWrite { key, at, offset, len, byte } => {
                let (key, addr, n) = (m.key(&key), m.addr(at, offset), usize::from(len % 8192));
                let allowed = remote_write_allowed(&pd, key, addr, n);
                let status = remote_write(&pd, key, addr, &vec![byte; n]);
                let expected = m.expect(key, addr, n, AccessFlags::REMOTE_WRITE);
                assert_eq!(
                    allowed,
                    expected.is_some(),
                    "the header's check of WRITE {key:#x} at {addr:#x}+{n}"
                );
                match expected {
                    Some((i, off)) => {
                        assert_eq!(status, WcStatus::Success, "WRITE {key:#x} at {addr:#x}+{n}");
                        m.live[i].bytes[off..off + n].fill(byte);
                    }
                    None => assert_eq!(
                        status,
                        WcStatus::RemoteAccessError,
                        "WRITE {key:#x} at {addr:#x}+{n} must be refused"
                    ),
                }
            }
            Op::RemoteRead { key, at, offset, len } => {
                let (key, addr, n) = (m.key(&key), m.addr(at, offset), usize::from(len % 8192));
                let mut out = vec![0xee; n];
                let status = remote_read(&pd, key, addr, &mut out);
                match m.expect(key, addr, n, AccessFlags::REMOTE_READ) {
                    Some((i, off)) => {
                        assert_eq!(status, WcStatus::Success, "READ {key:#x} at {addr:#x}+{n}");
                        assert!(out == m.live[i].bytes[off..off + n], "READ returned other bytes");
                    }
                    None => assert_eq!(
                        status,
                        WcStatus::RemoteAccessError,
                        "READ {key:#x} at {addr:#x}+{n} must be refused"
                    ),
                }
            }
            _ => {}
        }
        if m.stale.len() > 4096 {
            m.stale.drain(..2048);
        }
    }
    // Every region still holds what the model says, read locally.
    for l in &m.live {
        let mut back = vec![0u8; l.bytes.len()];
        l.mr.read_at(0, &mut back).unwrap();
        assert!(back == l.bytes, "region {:#x} holds other bytes", l.mr.rkey());
    }
});
