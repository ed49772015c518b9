// SPDX-License-Identifier: GPL-2.0
/*
 * blockwire_scsi: a SCSI low-level driver whose commands are run by the
 * blockwire initiator in user space.
 *
 * Each open of /dev/blockwire-scsi that attaches becomes one SCSI host with
 * one target (channel 0, id 0); the mid-layer scans its LUNs with REPORT
 * LUNS like any other host. The driver is deliberately dumb: it copies each
 * command's CDB and Data-Out into a slot of a memory area it shares with
 * the daemon, says so through read(), and completes the command when the
 * daemon's write() says its status, sense and Data-In are in the slot. The
 * iSCSI protocol, session recovery and RDMA live in the daemon.
 *
 * The mid-layer's error handling becomes task management requests to the
 * daemon (ABORT TASK, LOGICAL UNIT RESET, TARGET WARM RESET, and a host
 * reset that ends everything the daemon holds); the handler waits, bounded,
 * for the daemon's answer. When the daemon goes away (close or crash),
 * every outstanding command fails with DID_NO_CONNECT and the host is
 * removed: nothing waits on a process that no longer exists.
 *
 * The interface is in blockwire_scsi.h.
 */
#include <linux/completion.h>
#include <linux/fs.h>
#include <linux/kfifo.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/poll.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>
#include <linux/wait.h>
#include <linux/workqueue.h>
#include <scsi/scsi.h>
#include <scsi/scsi_cmnd.h>
#include <scsi/scsi_device.h>
#include <scsi/scsi_host.h>

#include "blockwire_scsi.h"

#define BW_NAME "blockwire_scsi"

/* How long an error handler waits for the daemon's task management answer. */
static unsigned int tmf_timeout_secs = 30;
module_param(tmf_timeout_secs, uint, 0644);
MODULE_PARM_DESC(tmf_timeout_secs,
		 "seconds an error handler waits for the daemon's task management answer (default 30)");

struct bw_host {
	struct Scsi_Host *shost;
	spinlock_t lock;		/* inflight, held, seqs, events, dead, tmf_* */
	wait_queue_head_t readq;
	DECLARE_KFIFO_PTR(events, struct bw_scsi_event);
	void *area;
	u32 area_bytes;
	u32 depth;
	u32 max_io;
	u32 data_offset;
	struct scsi_cmnd **inflight;	/* per slot: the command the daemon holds */
	/*
	 * Per slot: the daemon has it, from the command's event to its answer
	 * (or a task management answer that covered it). Apart from inflight:
	 * when error handling fails the mid-layer ends the command itself,
	 * but the daemon may still write its answer into the slot.
	 */
	bool *held;
	u32 *seqs;			/* per slot: the last command number */
	bool dead;			/* the daemon is gone or detached */
	bool removed;			/* scsi_remove_host done */
	struct mutex tmf_mutex;		/* one task management request at a time */
	u32 tmf_id;
	bool tmf_pending;
	u32 tmf_result;
	struct completion tmf_done;
	struct work_struct scan_work;
	char target[224];
};

/* What an open file of /dev/blockwire-scsi holds. */
struct bw_file {
	struct mutex lock;	/* attach, detach and mmap against each other */
	struct bw_host *host;
};

static struct bw_host *bw_of(struct Scsi_Host *shost)
{
	return *(struct bw_host **)shost_priv(shost);
}

static struct bw_scsi_slot *bw_slot(struct bw_host *h, u32 tag)
{
	return h->area + (size_t)tag * BW_SCSI_SLOT_BYTES;
}

static void *bw_data(struct bw_host *h, u32 tag)
{
	return h->area + h->data_offset + (size_t)tag * h->max_io;
}

static void bw_fail_now(struct scsi_cmnd *cmd, int host_byte)
{
	cmd->result = host_byte << 16;
	scsi_done(cmd);
}

static int bw_queuecommand(struct Scsi_Host *shost, struct scsi_cmnd *cmd)
{
	struct bw_host *h = bw_of(shost);
	u32 tag = scsi_cmd_to_rq(cmd)->tag;
	u32 len = scsi_bufflen(cmd);
	struct bw_scsi_event ev = { .kind = BW_SCSI_EV_COMMAND, .tag = tag };
	struct bw_scsi_slot *slot;
	unsigned long flags;
	u8 dir;

	if (READ_ONCE(h->dead)) {
		bw_fail_now(cmd, DID_NO_CONNECT);
		return 0;
	}
	if (tag >= h->depth || len > h->max_io) {
		scmd_printk(KERN_WARNING, cmd, "tag %u or length %u beyond the host's limits\n",
			    tag, len);
		bw_fail_now(cmd, DID_ERROR);
		return 0;
	}
	if (cmd->cmd_len == 0 || cmd->cmd_len > BW_SCSI_MAX_CDB) {
		/* iSCSI carries longer CDBs in an AHS; the daemon does not. */
		scsi_build_sense(cmd, 0, ILLEGAL_REQUEST, 0x20, 0x00);
		scsi_done(cmd);
		return 0;
	}
	switch (cmd->sc_data_direction) {
	case DMA_NONE:
		dir = BW_SCSI_DIR_NONE;
		break;
	case DMA_TO_DEVICE:
		dir = BW_SCSI_DIR_TO_DEVICE;
		break;
	case DMA_FROM_DEVICE:
		dir = BW_SCSI_DIR_FROM_DEVICE;
		break;
	default:
		/* Bidirectional commands (SBC XDWRITEREAD) are not offered. */
		scsi_build_sense(cmd, 0, ILLEGAL_REQUEST, 0x20, 0x00);
		scsi_done(cmd);
		return 0;
	}

	/*
	 * The slot is ours once the daemon has let go of it: the block layer
	 * gives no other command this tag, but the mid-layer may have given
	 * up on the previous one (its error handling failed) while the daemon
	 * still runs it and will write its answer, and read its data, here.
	 */
	spin_lock_irqsave(&h->lock, flags);
	if (h->held[tag]) {
		spin_unlock_irqrestore(&h->lock, flags);
		return SCSI_MLQUEUE_HOST_BUSY;
	}
	spin_unlock_irqrestore(&h->lock, flags);
	slot = bw_slot(h, tag);
	slot->lun = cmd->device->lun;
	slot->data_len = len;
	slot->dir = dir;
	slot->cdb_len = cmd->cmd_len;
	memset(slot->cdb, 0, sizeof(slot->cdb));
	memcpy(slot->cdb, cmd->cmnd, cmd->cmd_len);
	slot->status = 0;
	slot->host_status = 0;
	slot->sense_len = 0;
	slot->resid = 0;
	if (dir == BW_SCSI_DIR_TO_DEVICE && len)
		scsi_sg_copy_to_buffer(cmd, bw_data(h, tag), len);

	spin_lock_irqsave(&h->lock, flags);
	if (h->dead) {
		spin_unlock_irqrestore(&h->lock, flags);
		bw_fail_now(cmd, DID_NO_CONNECT);
		return 0;
	}
	ev.seq = ++h->seqs[tag];
	slot->seq = ev.seq;
	ev.lun = slot->lun;
	if (!kfifo_put(&h->events, ev)) {
		/* Cannot happen: the queue holds more than queue_depth events. */
		spin_unlock_irqrestore(&h->lock, flags);
		bw_fail_now(cmd, DID_ERROR);
		return 0;
	}
	h->inflight[tag] = cmd;
	h->held[tag] = true;
	spin_unlock_irqrestore(&h->lock, flags);
	wake_up_interruptible(&h->readq);
	return 0;
}

/* The daemon's answer for slot `tag`: complete the command it names. */
static void bw_complete(struct bw_host *h, const struct bw_scsi_reply *r)
{
	struct bw_scsi_slot *slot;
	struct scsi_cmnd *cmd;
	unsigned long flags;
	u32 len, resid, sense_len;
	int host;

	if (r->tag >= h->depth)
		return;
	spin_lock_irqsave(&h->lock, flags);
	if (h->seqs[r->tag] != r->seq) {
		spin_unlock_irqrestore(&h->lock, flags);
		return;
	}
	/* With its answer the daemon lets go of the slot. */
	h->held[r->tag] = false;
	cmd = h->inflight[r->tag];
	if (!cmd) {
		/*
		 * Already ended by task management, by the daemon's going, or
		 * by the mid-layer after its error handling failed.
		 */
		spin_unlock_irqrestore(&h->lock, flags);
		return;
	}
	h->inflight[r->tag] = NULL;
	spin_unlock_irqrestore(&h->lock, flags);

	/* The slot is the driver's again: the daemon is done with it. */
	slot = bw_slot(h, r->tag);
	len = scsi_bufflen(cmd);
	resid = min_t(u32, READ_ONCE(slot->resid), len);
	sense_len = min_t(u32, READ_ONCE(slot->sense_len), BW_SCSI_MAX_SENSE);
	sense_len = min_t(u32, sense_len, SCSI_SENSE_BUFFERSIZE);
	switch (READ_ONCE(slot->host_status)) {
	case BW_SCSI_HOST_OK:
		host = DID_OK;
		break;
	case BW_SCSI_HOST_RETRY:
		host = DID_TRANSPORT_DISRUPTED;
		break;
	case BW_SCSI_HOST_NO_CONNECT:
		host = DID_NO_CONNECT;
		break;
	default:
		host = DID_ERROR;
		break;
	}
	if (host == DID_OK && cmd->sc_data_direction == DMA_FROM_DEVICE && len > resid)
		scsi_sg_copy_from_buffer(cmd, bw_data(h, r->tag), len - resid);
	scsi_set_resid(cmd, resid);
	if (host == DID_OK && sense_len)
		memcpy(cmd->sense_buffer, slot->sense, sense_len);
	cmd->result = (host << 16) | READ_ONCE(slot->status);
	scsi_done(cmd);
}

static void bw_tmf_answered(struct bw_host *h, const struct bw_scsi_reply *r)
{
	unsigned long flags;

	spin_lock_irqsave(&h->lock, flags);
	if (h->tmf_pending && r->seq == h->tmf_id) {
		h->tmf_result = r->result;
		h->tmf_pending = false;
		complete(&h->tmf_done);
	}
	spin_unlock_irqrestore(&h->lock, flags);
}

/*
 * Asks the daemon for a task management function and waits for its answer.
 * SUCCESS means every command it covered has ended at the target and the
 * daemon has let go of their slots.
 */
static int bw_tmf(struct bw_host *h, u32 kind, u32 tag, u32 seq, u64 lun)
{
	struct bw_scsi_event ev = { .kind = kind, .tag = tag, .seq = seq, .lun = lun };
	unsigned long left;
	bool ok;

	mutex_lock(&h->tmf_mutex);
	spin_lock_irq(&h->lock);
	if (h->dead) {
		spin_unlock_irq(&h->lock);
		mutex_unlock(&h->tmf_mutex);
		return FAILED;
	}
	ev.tmf_id = ++h->tmf_id;
	h->tmf_pending = true;
	h->tmf_result = BW_SCSI_TMF_FAILED;
	reinit_completion(&h->tmf_done);
	if (!kfifo_put(&h->events, ev)) {
		h->tmf_pending = false;
		spin_unlock_irq(&h->lock);
		mutex_unlock(&h->tmf_mutex);
		return FAILED;
	}
	spin_unlock_irq(&h->lock);
	wake_up_interruptible(&h->readq);

	left = wait_for_completion_timeout(&h->tmf_done, READ_ONCE(tmf_timeout_secs) * HZ);
	spin_lock_irq(&h->lock);
	ok = left && !h->tmf_pending && h->tmf_result == BW_SCSI_TMF_DONE;
	h->tmf_pending = false;
	spin_unlock_irq(&h->lock);
	mutex_unlock(&h->tmf_mutex);
	if (!left)
		shost_printk(KERN_WARNING, h->shost,
			     "no task management answer from the daemon in %u s\n",
			     tmf_timeout_secs);
	return ok ? SUCCESS : FAILED;
}

/*
 * Forgets the commands a successful task management function ended (of
 * `sdev`, or all when NULL); the daemon has let go of their slots.
 */
static void bw_forget(struct bw_host *h, struct scsi_device *sdev)
{
	unsigned long flags;
	u32 i;

	spin_lock_irqsave(&h->lock, flags);
	for (i = 0; i < h->depth; i++) {
		if (!sdev)
			h->held[i] = false;
		if (h->inflight[i] && (!sdev || h->inflight[i]->device == sdev)) {
			h->inflight[i] = NULL;
			h->held[i] = false;
		}
	}
	spin_unlock_irqrestore(&h->lock, flags);
}

/*
 * Error handling failed: the mid-layer ends every command itself, so none
 * may be completed here any more; their slots stay held until the daemon
 * answers them.
 */
static void bw_give_up(struct bw_host *h)
{
	unsigned long flags;
	u32 i;

	spin_lock_irqsave(&h->lock, flags);
	for (i = 0; i < h->depth; i++)
		h->inflight[i] = NULL;
	spin_unlock_irqrestore(&h->lock, flags);
}

static int bw_eh_abort(struct scsi_cmnd *cmd)
{
	struct bw_host *h = bw_of(cmd->device->host);
	u32 tag = scsi_cmd_to_rq(cmd)->tag;
	u32 seq;
	int ret;

	if (tag >= h->depth)
		return FAILED;
	spin_lock_irq(&h->lock);
	if (h->inflight[tag] != cmd) {
		/* The daemon answered it already. */
		spin_unlock_irq(&h->lock);
		return SUCCESS;
	}
	seq = h->seqs[tag];
	spin_unlock_irq(&h->lock);

	ret = bw_tmf(h, BW_SCSI_EV_ABORT, tag, seq, cmd->device->lun);
	if (ret == SUCCESS) {
		spin_lock_irq(&h->lock);
		if (h->inflight[tag] == cmd)
			h->inflight[tag] = NULL;
		if (h->seqs[tag] == seq)
			h->held[tag] = false;
		spin_unlock_irq(&h->lock);
	}
	return ret;
}

/*
 * A reset the daemon carries out as task management: on success every
 * command it covered (those of `only`, or all when NULL) has ended.
 */
static int bw_reset(struct scsi_cmnd *cmd, u32 kind, u64 lun, struct scsi_device *only)
{
	struct bw_host *h = bw_of(cmd->device->host);
	int ret = bw_tmf(h, kind, 0, 0, lun);

	if (ret == SUCCESS)
		bw_forget(h, only);
	return ret;
}

static int bw_eh_device_reset(struct scsi_cmnd *cmd)
{
	return bw_reset(cmd, BW_SCSI_EV_LUN_RESET, cmd->device->lun, cmd->device);
}

static int bw_eh_target_reset(struct scsi_cmnd *cmd)
{
	return bw_reset(cmd, BW_SCSI_EV_TARGET_RESET, 0, NULL);
}

static int bw_eh_host_reset(struct scsi_cmnd *cmd)
{
	int ret = bw_reset(cmd, BW_SCSI_EV_HOST_RESET, 0, NULL);

	/* The last step of error handling: after it fails, the mid-layer
	 * takes the devices offline and ends their commands itself. */
	if (ret != SUCCESS)
		bw_give_up(bw_of(cmd->device->host));
	return ret;
}

static ssize_t blockwire_target_show(struct device *dev, struct device_attribute *attr,
				     char *buf)
{
	struct bw_host *h = bw_of(class_to_shost(dev));

	return sysfs_emit(buf, "%s\n", h->target);
}
static DEVICE_ATTR_RO(blockwire_target);

static struct attribute *bw_host_attrs[] = {
	&dev_attr_blockwire_target.attr,
	NULL,
};
ATTRIBUTE_GROUPS(bw_host);

static const struct scsi_host_template bw_template = {
	.module = THIS_MODULE,
	.name = "blockwire iSCSI initiator (user-space session)",
	.proc_name = BW_NAME,
	.queuecommand = bw_queuecommand,
	.eh_abort_handler = bw_eh_abort,
	.eh_device_reset_handler = bw_eh_device_reset,
	.eh_target_reset_handler = bw_eh_target_reset,
	.eh_host_reset_handler = bw_eh_host_reset,
	.this_id = -1,
	.can_queue = 1,		/* the attach sets the real depth */
	.sg_tablesize = SG_ALL,
	.max_sectors = BW_SCSI_MAX_IO_BYTES >> SECTOR_SHIFT,
	.shost_groups = bw_host_groups,
};

static void bw_scan(struct work_struct *work)
{
	struct bw_host *h = container_of(work, struct bw_host, scan_work);

	scsi_scan_host(h->shost);
}

static void bw_free(struct bw_host *h)
{
	kfifo_free(&h->events);
	kvfree(h->inflight);
	kvfree(h->held);
	kvfree(h->seqs);
	vfree(h->area);
	kfree(h);
}

static long bw_attach(struct bw_file *f, struct bw_scsi_attach __user *uarg)
{
	struct bw_scsi_attach a;
	struct Scsi_Host *shost;
	struct bw_host *h;
	u64 area;
	int ret;

	if (copy_from_user(&a, uarg, sizeof(a)))
		return -EFAULT;
	if (a.abi_version != BW_SCSI_ABI_VERSION)
		return -EPROTO;
	if (!a.queue_depth || a.queue_depth > BW_SCSI_MAX_QUEUE_DEPTH)
		return -EINVAL;
	if (a.max_io_bytes < BW_SCSI_MIN_IO_BYTES || a.max_io_bytes > BW_SCSI_MAX_IO_BYTES ||
	    a.max_io_bytes % BW_SCSI_MIN_IO_BYTES)
		return -EINVAL;
	area = PAGE_ALIGN((u64)a.queue_depth * BW_SCSI_SLOT_BYTES) +
	       (u64)a.queue_depth * a.max_io_bytes;
	if (area > BW_SCSI_MAX_AREA_BYTES)
		return -E2BIG;
	if (f->host)
		return -EBUSY;

	h = kzalloc(sizeof(*h), GFP_KERNEL);
	if (!h)
		return -ENOMEM;
	spin_lock_init(&h->lock);
	init_waitqueue_head(&h->readq);
	mutex_init(&h->tmf_mutex);
	init_completion(&h->tmf_done);
	INIT_WORK(&h->scan_work, bw_scan);
	h->depth = a.queue_depth;
	h->max_io = a.max_io_bytes;
	h->data_offset = PAGE_ALIGN(a.queue_depth * BW_SCSI_SLOT_BYTES);
	h->area_bytes = area;
	memcpy(h->target, a.target, sizeof(h->target));
	h->target[sizeof(h->target) - 1] = 0;
	ret = -ENOMEM;
	/* Every command's event plus the one task management request. */
	if (kfifo_alloc(&h->events, roundup_pow_of_two(h->depth + 2), GFP_KERNEL))
		goto free_host;
	h->inflight = kvcalloc(h->depth, sizeof(*h->inflight), GFP_KERNEL);
	h->held = kvcalloc(h->depth, sizeof(*h->held), GFP_KERNEL);
	h->seqs = kvcalloc(h->depth, sizeof(*h->seqs), GFP_KERNEL);
	h->area = vmalloc_user(area);
	if (!h->inflight || !h->held || !h->seqs || !h->area)
		goto free_host;

	shost = scsi_host_alloc(&bw_template, sizeof(struct bw_host *));
	if (!shost)
		goto free_host;
	*(struct bw_host **)shost_priv(shost) = h;
	h->shost = shost;
	shost->can_queue = h->depth;
	shost->cmd_per_lun = h->depth;
	shost->max_sectors = h->max_io >> SECTOR_SHIFT;
	shost->max_id = 1;
	shost->max_channel = 0;
	/*
	 * The daemon speaks LUNs below 16384; the mid-layer numbers those
	 * from 256 up in flat addressing, 0x4000 + LUN (scsilun_to_int).
	 */
	shost->max_lun = 0x8000;
	shost->max_cmd_len = BW_SCSI_MAX_CDB;
	ret = scsi_add_host(shost, NULL);
	if (ret) {
		scsi_host_put(shost);
		goto free_host;
	}
	f->host = h;
	a.host_no = shost->host_no;
	a.area_bytes = h->area_bytes;
	a.slot_bytes = BW_SCSI_SLOT_BYTES;
	a.data_offset = h->data_offset;
	if (copy_to_user(uarg, &a, sizeof(a)))
		return -EFAULT;	/* the host stays; close() removes it */
	/* The scan's INQUIRYs need the daemon, which is still in this ioctl. */
	schedule_work(&h->scan_work);
	shost_printk(KERN_INFO, shost, "attached: %s, queue depth %u, %u KiB per command\n",
		     h->target, h->depth, h->max_io >> 10);
	return 0;

free_host:
	bw_free(h);
	return ret;
}

/* Ends every command the daemon holds: it is gone or will never answer. */
static void bw_fail_outstanding(struct bw_host *h)
{
	struct scsi_cmnd *cmd;
	u32 i;

	for (i = 0; i < h->depth; i++) {
		spin_lock_irq(&h->lock);
		cmd = h->inflight[i];
		h->inflight[i] = NULL;
		spin_unlock_irq(&h->lock);
		if (cmd)
			bw_fail_now(cmd, DID_NO_CONNECT);
	}
}

static void bw_remove(struct bw_host *h)
{
	if (h->removed)
		return;
	flush_work(&h->scan_work);
	scsi_remove_host(h->shost);
	h->removed = true;
}

static long bw_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct bw_file *f = file->private_data;
	long ret;

	mutex_lock(&f->lock);
	switch (cmd) {
	case BW_SCSI_IOC_ATTACH:
		ret = bw_attach(f, (struct bw_scsi_attach __user *)arg);
		break;
	case BW_SCSI_IOC_DETACH:
		if (!f->host) {
			ret = -ENODEV;
			break;
		}
		/* The daemon still answers: sd's last SYNCHRONIZE CACHE gets through. */
		bw_remove(f->host);
		spin_lock_irq(&f->host->lock);
		f->host->dead = true;
		spin_unlock_irq(&f->host->lock);
		wake_up_interruptible(&f->host->readq);
		ret = 0;
		break;
	default:
		ret = -ENOTTY;
	}
	mutex_unlock(&f->lock);
	return ret;
}

static ssize_t bw_read(struct file *file, char __user *buf, size_t count, loff_t *ppos)
{
	struct bw_file *f = file->private_data;
	struct bw_host *h = f->host;
	struct bw_scsi_event evs[16];
	size_t want = min_t(size_t, count / sizeof(evs[0]), ARRAY_SIZE(evs));
	unsigned int got;
	int ret;

	if (!h)
		return -ENODEV;
	if (!want)
		return -EINVAL;
	for (;;) {
		spin_lock_irq(&h->lock);
		got = kfifo_out(&h->events, evs, want);
		spin_unlock_irq(&h->lock);
		if (got)
			break;
		if (READ_ONCE(h->dead))
			return 0;	/* detached: end of file */
		if (file->f_flags & O_NONBLOCK)
			return -EAGAIN;
		ret = wait_event_interruptible(h->readq,
					       !kfifo_is_empty(&h->events) || READ_ONCE(h->dead));
		if (ret)
			return ret;
	}
	if (copy_to_user(buf, evs, got * sizeof(evs[0])))
		return -EFAULT;
	return got * sizeof(evs[0]);
}

static ssize_t bw_write(struct file *file, const char __user *buf, size_t count, loff_t *ppos)
{
	struct bw_file *f = file->private_data;
	struct bw_host *h = f->host;
	struct bw_scsi_reply rs[16];
	size_t done = 0;
	unsigned int i, n;

	if (!h)
		return -ENODEV;
	if (count % sizeof(rs[0]))
		return -EINVAL;
	while (done < count) {
		n = min_t(size_t, (count - done) / sizeof(rs[0]), ARRAY_SIZE(rs));
		if (copy_from_user(rs, buf + done, n * sizeof(rs[0])))
			return done ? done : -EFAULT;
		for (i = 0; i < n; i++) {
			if (rs[i].kind == BW_SCSI_RE_COMMAND)
				bw_complete(h, &rs[i]);
			else if (rs[i].kind == BW_SCSI_RE_TMF)
				bw_tmf_answered(h, &rs[i]);
		}
		done += n * sizeof(rs[0]);
	}
	return done;
}

static __poll_t bw_poll(struct file *file, poll_table *wait)
{
	struct bw_file *f = file->private_data;
	struct bw_host *h = f->host;
	__poll_t mask = EPOLLOUT | EPOLLWRNORM;

	if (!h)
		return EPOLLERR;
	poll_wait(file, &h->readq, wait);
	if (!kfifo_is_empty(&h->events) || READ_ONCE(h->dead))
		mask |= EPOLLIN | EPOLLRDNORM;
	return mask;
}

static int bw_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct bw_file *f = file->private_data;
	int ret;

	mutex_lock(&f->lock);
	if (!f->host) {
		ret = -ENODEV;
	} else if (vma->vm_pgoff || vma->vm_end - vma->vm_start > f->host->area_bytes) {
		ret = -EINVAL;
	} else {
		ret = remap_vmalloc_range(vma, f->host->area, 0);
	}
	mutex_unlock(&f->lock);
	return ret;
}

static int bw_open(struct inode *inode, struct file *file)
{
	struct bw_file *f = kzalloc(sizeof(*f), GFP_KERNEL);

	if (!f)
		return -ENOMEM;
	mutex_init(&f->lock);
	file->private_data = f;
	return nonseekable_open(inode, file);
}

static int bw_release(struct inode *inode, struct file *file)
{
	struct bw_file *f = file->private_data;
	struct bw_host *h = f->host;

	if (h) {
		spin_lock_irq(&h->lock);
		h->dead = true;
		if (h->tmf_pending) {
			/* An error handler waits for the daemon: it will not answer. */
			h->tmf_pending = false;
			h->tmf_result = BW_SCSI_TMF_FAILED;
			complete(&h->tmf_done);
		}
		spin_unlock_irq(&h->lock);
		wake_up_interruptible(&h->readq);
		bw_fail_outstanding(h);
		bw_remove(h);
		/* Commands queued while the host went away failed on sight. */
		bw_fail_outstanding(h);
		shost_printk(KERN_INFO, h->shost, "detached: %s\n", h->target);
		scsi_host_put(h->shost);
		bw_free(h);
	}
	kfree(f);
	return 0;
}

static const struct file_operations bw_fops = {
	.owner = THIS_MODULE,
	.open = bw_open,
	.release = bw_release,
	.read = bw_read,
	.write = bw_write,
	.poll = bw_poll,
	.mmap = bw_mmap,
	.unlocked_ioctl = bw_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static struct miscdevice bw_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "blockwire-scsi",
	.fops = &bw_fops,
	.mode = 0600,
};

static int __init bw_init(void)
{
	return misc_register(&bw_misc);
}

static void __exit bw_exit(void)
{
	misc_deregister(&bw_misc);
}

module_init(bw_init);
module_exit(bw_exit);
MODULE_DESCRIPTION("blockwire: SCSI hosts whose commands run on a user-space iSCSI session");
MODULE_AUTHOR("blockwire");
MODULE_LICENSE("GPL");
