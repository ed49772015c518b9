/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * blockwire_scsi: the interface between the blockwire_scsi SCSI host driver
 * and the user-space daemon (`blockwire attach`) that runs its commands on
 * an iSCSI session.
 *
 * One open of /dev/blockwire-scsi is one SCSI host:
 *
 *  1. ioctl(BW_SCSI_IOC_ATTACH) creates the host and starts the LUN scan;
 *  2. mmap() of `area_bytes` maps the shared command area: `queue_depth`
 *     descriptor slots of `slot_bytes`, then `queue_depth` data buffers of
 *     `max_io_bytes` from `data_offset`. Slot N and data buffer N belong to
 *     the command with block-layer tag N;
 *  3. read() returns `struct bw_scsi_event`s: a command was placed in a slot
 *     (its Data-Out already copied into the data buffer), or the mid-layer's
 *     error handler asks for task management;
 *  4. write() takes `struct bw_scsi_reply`s: a command's status, sense and
 *     residual are in its slot (and its Data-In in the data buffer), or a
 *     task management function ended;
 *  5. ioctl(BW_SCSI_IOC_DETACH) removes the host while the daemon still
 *     answers (sd flushes its cache on the way out); close() after that, or
 *     a crash of the daemon, fails whatever is still outstanding.
 *
 * A slot belongs to the daemon from the COMMAND event to its reply, or until
 * a task management function that covered it succeeded: after that the
 * daemon never touches it again.
 *
 * The Rust side mirrors this file in initiator/src/kernel_host.rs; a unit
 * test there reads this file and checks the two agree.
 */
#ifndef _UAPI_BLOCKWIRE_SCSI_H
#define _UAPI_BLOCKWIRE_SCSI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define BW_SCSI_ABI_VERSION 1

#define BW_SCSI_MAX_CDB 16
#define BW_SCSI_MAX_SENSE 96
#define BW_SCSI_SLOT_BYTES 256
#define BW_SCSI_MAX_QUEUE_DEPTH 256
#define BW_SCSI_MIN_IO_BYTES 4096
#define BW_SCSI_MAX_IO_BYTES (1024 * 1024)
#define BW_SCSI_MAX_AREA_BYTES (64 * 1024 * 1024)

struct bw_scsi_attach {
	__u32 abi_version;	/* in: BW_SCSI_ABI_VERSION */
	__u32 queue_depth;	/* in: commands in flight, 1..BW_SCSI_MAX_QUEUE_DEPTH */
	__u32 max_io_bytes;	/* in: largest transfer, a multiple of 4096 */
	__u32 host_no;		/* out: the SCSI host number */
	__u32 area_bytes;	/* out: length to mmap */
	__u32 slot_bytes;	/* out: BW_SCSI_SLOT_BYTES */
	__u32 data_offset;	/* out: where data buffer 0 starts in the area */
	__u32 reserved;
	char target[224];	/* in: the iSCSI target name, shown in sysfs */
};

/* Directions of a command's data. */
#define BW_SCSI_DIR_NONE 0
#define BW_SCSI_DIR_TO_DEVICE 1	/* WRITE: Data-Out is in the data buffer */
#define BW_SCSI_DIR_FROM_DEVICE 2	/* READ: the daemon fills the data buffer */

/* How the transport ended a command (the reply's host_status). */
#define BW_SCSI_HOST_OK 0	/* the target answered: status and sense are valid */
#define BW_SCSI_HOST_RETRY 1	/* the session is recovering: the mid-layer retries */
#define BW_SCSI_HOST_NO_CONNECT 2	/* the session is gone: fail the command */
#define BW_SCSI_HOST_ERROR 3	/* a protocol failure for this command */

/* One descriptor slot of the shared area (BW_SCSI_SLOT_BYTES apart). */
struct bw_scsi_slot {
	/* written by the driver before the COMMAND event */
	__u64 lun;		/* the mid-layer's LUN (scsilun_to_int form) */
	__u32 data_len;		/* bytes to move, <= max_io_bytes */
	__u8 dir;		/* BW_SCSI_DIR_* */
	__u8 cdb_len;		/* 1..BW_SCSI_MAX_CDB */
	__u8 reserved0[2];
	__u8 cdb[BW_SCSI_MAX_CDB];
	__u32 seq;		/* this command's number in the slot */
	__u32 reserved1;
	/* written by the daemon before the COMMAND reply */
	__u8 status;		/* SCSI status (SAM-5) */
	__u8 host_status;	/* BW_SCSI_HOST_* */
	__u16 sense_len;	/* bytes of sense, <= BW_SCSI_MAX_SENSE */
	__u32 resid;		/* bytes of data_len not transferred */
	__u8 sense[BW_SCSI_MAX_SENSE];
};

/* Events (read()). */
#define BW_SCSI_EV_COMMAND 1	/* a command is in slot `tag` */
#define BW_SCSI_EV_ABORT 2	/* ABORT TASK for the command in slot `tag` */
#define BW_SCSI_EV_LUN_RESET 3	/* LOGICAL UNIT RESET of `lun` */
#define BW_SCSI_EV_TARGET_RESET 4	/* TARGET WARM RESET */
#define BW_SCSI_EV_HOST_RESET 5	/* end every command the daemon holds */

struct bw_scsi_event {
	__u32 kind;		/* BW_SCSI_EV_* */
	__u32 tag;		/* the slot (COMMAND, ABORT) */
	__u32 seq;		/* the slot's command number (COMMAND, ABORT) */
	__u32 tmf_id;		/* task management only: quote it in the reply */
	__u64 lun;		/* the LUN (ABORT, LUN_RESET) */
};

/* Replies (write()). */
#define BW_SCSI_RE_COMMAND 1	/* the command in slot `tag` (number `seq`) ended */
#define BW_SCSI_RE_TMF 2	/* the task management `seq` (its tmf_id) ended */

#define BW_SCSI_TMF_DONE 0	/* every command it covered has ended */
#define BW_SCSI_TMF_FAILED 1	/* the mid-layer escalates */

struct bw_scsi_reply {
	__u32 kind;		/* BW_SCSI_RE_* */
	__u32 tag;
	__u32 seq;
	__u32 result;		/* BW_SCSI_TMF_* for RE_TMF; 0 for RE_COMMAND */
};

#define BW_SCSI_IOC_MAGIC 0xb7
#define BW_SCSI_IOC_ATTACH _IOWR(BW_SCSI_IOC_MAGIC, 1, struct bw_scsi_attach)
#define BW_SCSI_IOC_DETACH _IO(BW_SCSI_IOC_MAGIC, 2)

#endif /* _UAPI_BLOCKWIRE_SCSI_H */
