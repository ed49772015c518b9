//! The buffers the initiator advertised in each command's iSER header (RFC 7145 §5.1: a
//! write STag and a read STag, each with a base offset), kept by ITT until the command is
//! answered.
//!
//! Some commands are never answered on the connection: a task management function aborted
//! them (SAM-5: an aborted task gets no response), or their CmdSN fell outside the window and
//! the command was dropped (RFC 7143 §4.2.2.1). Their entries would stay for the connection's
//! life, so an initiator that keeps aborting, or a peer that sends commands out of the window,
//! would grow the table without end. Past a limit the table forgets the entries of commands
//! that are no longer tasks of the session, except the newest ones: those may still be on
//! their way to becoming tasks (held in the CmdSN window, or gathering WRITE data).

use std::collections::HashMap;

use blockwire_pdu::iser::RemoteBuffer;

/// A buffer the initiator advertised for one command, and how far it reaches (the command's
/// Expected Data Transfer Length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Advertised {
    pub buf: RemoteBuffer,
    pub len: u64,
    /// Writes: the BufferOffset the advertised buffer starts at (the first R2T's).
    ///
    /// The write buffer's base offset points at the first byte the initiator did not send
    /// unsolicited (Linux's initiator advertises its buffer's address plus the unsolicited
    /// length), so solicited data at BufferOffset B is read from the base plus B minus the
    /// offset of the command's first R2T, which is where the unsolicited data ended.
    pub solicited_from: Option<u64>,
}

#[derive(Debug)]
struct Entry {
    write: Option<Advertised>,
    read: Option<Advertised>,
    /// The order the command arrived in.
    arrival: u64,
}

/// The advertised buffers of one connection's commands, by ITT.
#[derive(Debug)]
pub(super) struct CommandBuffers {
    by_itt: HashMap<u32, Entry>,
    arrivals: u64,
    /// Entries kept whatever the session says: the newest this many.
    keep_newest: u64,
}

impl CommandBuffers {
    /// A table for a connection whose CmdSN window holds `queue_depth` commands.
    pub fn new(queue_depth: u32) -> CommandBuffers {
        CommandBuffers {
            by_itt: HashMap::new(),
            arrivals: 0,
            // Every command that can be in flight at once, and room for immediate ones.
            keep_newest: u64::from(queue_depth) + 64,
        }
    }

    /// A SCSI Command arrived advertising `write` and `read` for `len` bytes (its EDTL).
    /// `tag_running` says whether its ITT already names a running task of the session: the
    /// session refuses such a command (a tag names one task while it lives, RFC 7143
    /// §11.2.1.8), and the running task keeps the buffers it advertised, so its Data-In and
    /// RDMA Reads do not go to the buffers of a command that never runs. `is_task` says
    /// whether an ITT is still a task of the session; it is asked only when the table has
    /// grown past twice what it keeps.
    pub fn advertise(
        &mut self,
        itt: u32,
        len: u64,
        write: Option<RemoteBuffer>,
        read: Option<RemoteBuffer>,
        tag_running: bool,
        is_task: impl Fn(u32) -> bool,
    ) {
        if tag_running && self.by_itt.contains_key(&itt) {
            return;
        }
        let adv = |b: Option<RemoteBuffer>| {
            b.map(|buf| Advertised {
                buf,
                len,
                solicited_from: None,
            })
        };
        self.arrivals += 1;
        self.by_itt.insert(
            itt,
            Entry {
                write: adv(write),
                read: adv(read),
                arrival: self.arrivals,
            },
        );
        if self.by_itt.len() as u64 > 2 * self.keep_newest {
            let oldest_kept = self.arrivals.saturating_sub(self.keep_newest);
            self.by_itt
                .retain(|itt, e| e.arrival > oldest_kept || is_task(*itt));
        }
    }

    /// The read buffer of `itt`, for its Data-In.
    pub fn read(&self, itt: u32) -> Option<Advertised> {
        self.by_itt.get(&itt).and_then(|e| e.read)
    }

    /// The write buffer of `itt`, for an R2T at `buffer_offset`; the first R2T fixes where
    /// the solicited data start.
    pub fn solicit(&mut self, itt: u32, buffer_offset: u32) -> Option<Advertised> {
        let w = self.by_itt.get_mut(&itt)?.write.as_mut()?;
        w.solicited_from.get_or_insert(u64::from(buffer_offset));
        Some(*w)
    }

    /// The command was answered (its status went out): its buffers are the initiator's again.
    pub fn answered(&mut self, itt: u32) {
        self.by_itt.remove(&itt);
    }

    /// Commands with buffers on record.
    pub fn len(&self) -> usize {
        self.by_itt.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(stag: u32) -> Option<RemoteBuffer> {
        Some(RemoteBuffer {
            stag,
            base_offset: 0x1000,
        })
    }

    #[test]
    fn unanswered_commands_do_not_grow_the_table_without_end() {
        let mut t = CommandBuffers::new(32);
        // A peer whose commands are all dropped or aborted: none is a task.
        for itt in 0..100_000u32 {
            t.advertise(itt, 4096, None, buf(itt), false, |_| false);
            assert!(t.len() <= 2 * (32 + 64), "{} entries after {itt}", t.len());
        }
        // The newest are still there, for a command held in the window.
        assert!(t.read(99_999).is_some());
        assert!(t.read(99_999 - 95).is_some());
    }

    #[test]
    fn live_tasks_keep_their_buffers_however_old() {
        let mut t = CommandBuffers::new(1);
        t.advertise(7, 8192, buf(70), None, false, |_| false);
        assert_eq!(t.solicit(7, 0).map(|a| a.solicited_from), Some(Some(0)));
        for itt in 100..10_000u32 {
            t.advertise(itt, 512, None, buf(itt), false, |i| i == 7);
        }
        let w = t
            .solicit(7, 4096)
            .expect("a live WRITE keeps its write STag");
        assert_eq!((w.buf.stag, w.solicited_from), (70, Some(0)));
        assert!(t.len() <= 2 * 65);
    }

    #[test]
    fn an_answer_frees_the_entry() {
        let mut t = CommandBuffers::new(4);
        t.advertise(1, 512, buf(1), buf(2), false, |_| true);
        assert_eq!(t.read(1).map(|a| a.buf.stag), Some(2));
        t.answered(1);
        assert_eq!((t.read(1), t.solicit(1, 0), t.len()), (None, None, 0));
    }

    #[test]
    fn a_command_under_a_running_tasks_tag_leaves_that_tasks_buffers() {
        let mut t = CommandBuffers::new(4);
        t.advertise(5, 8192, buf(50), buf(51), false, |_| true);
        // A second command under the tag while the first runs: refused by the session.
        t.advertise(5, 512, buf(60), buf(61), true, |_| true);
        assert_eq!(t.read(5).map(|a| (a.buf.stag, a.len)), Some((51, 8192)));
        assert_eq!(t.solicit(5, 0).map(|a| a.buf.stag), Some(50));
        // Once the first is answered the tag is free, and a new command's buffers count.
        t.answered(5);
        t.advertise(5, 512, buf(60), buf(61), false, |_| true);
        assert_eq!(t.read(5).map(|a| (a.buf.stag, a.len)), Some((61, 512)));
    }
}
