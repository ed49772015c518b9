//! Decode and encode time per PDU: `cargo bench -p blockwire-pdu --bench codec`.
//!
//! A plain timing loop (no criterion) so the bench builds quickly in CI; it
//! prints nanoseconds per operation and the decode/encode ratio for a few
//! representative PDUs, with and without CRC32C digests.

use blockwire_pdu::pdu::codes::TaskAttr;
use blockwire_pdu::pdu::{DataIn, NopOut, ScsiCommand, RESERVED_TAG};
use blockwire_pdu::{Bhs, Digests, Frame, FrameDecoder, Lun, Pdu};
use std::hint::black_box;
use std::time::Instant;

fn time_per_op(iterations: u32, mut op: impl FnMut()) -> f64 {
    for _ in 0..iterations / 10 {
        op();
    }
    let start = Instant::now();
    for _ in 0..iterations {
        op();
    }
    start.elapsed().as_nanos() as f64 / f64::from(iterations)
}

fn main() {
    let read10 = Pdu::new(Bhs::ScsiCommand(ScsiCommand {
        immediate: false,
        final_bit: true,
        read: true,
        write: false,
        attr: TaskAttr::Simple,
        lun: Lun::from_index(1),
        itt: 42,
        expected_data_transfer_length: 4096,
        cmd_sn: 1000,
        exp_stat_sn: 999,
        cdb: [0x28, 0, 0, 0, 0x10, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0],
    }));
    let data_in = |len: usize| {
        Pdu::with_data(
            Bhs::DataIn(DataIn {
                final_bit: true,
                acknowledge: false,
                overflow: false,
                underflow: false,
                status: Some(0),
                lun: Lun::default(),
                itt: 42,
                ttt: RESERVED_TAG,
                stat_sn: 7,
                exp_cmd_sn: 8,
                max_cmd_sn: 200,
                data_sn: 0,
                buffer_offset: 0,
                residual_count: 0,
            }),
            vec![0xa5u8; len],
        )
    };
    let nop = Pdu::new(Bhs::NopOut(NopOut {
        immediate: true,
        lun: Lun::default(),
        itt: 1,
        ttt: RESERVED_TAG,
        cmd_sn: 1,
        exp_stat_sn: 1,
    }));
    let cases = [
        ("NOP-Out", nop),
        ("SCSI Command READ(10)", read10),
        ("Data-In 4 KiB", data_in(4096)),
        ("Data-In 256 KiB", data_in(262_144)),
    ];
    println!(
        "{:<24} {:>8} {:>12} {:>12} {:>8}",
        "PDU", "digests", "encode ns", "decode ns", "dec/enc"
    );
    for (name, pdu) in &cases {
        for digests in [Digests::NONE, Digests::BOTH] {
            let iterations = if pdu.data.len() > 65536 {
                2_000
            } else {
                200_000
            };
            let mut buf = Vec::with_capacity(pdu.data.len() + 128);
            let encode = time_per_op(iterations, || {
                buf.clear();
                black_box(pdu).encode_into(&mut buf, digests);
                black_box(&buf);
            });
            let wire = pdu.encode(digests);
            let framer = FrameDecoder::new(1 << 20, digests);
            let decode = time_per_op(iterations, || {
                let Ok(Frame::Pdu { pdu, .. }) = framer.decode(black_box(&wire)) else {
                    panic!("bench PDU must decode");
                };
                black_box(pdu);
            });
            println!(
                "{:<24} {:>8} {:>12.1} {:>12.1} {:>8.2}",
                name,
                if digests.header { "crc32c" } else { "none" },
                encode,
                decode,
                decode / encode
            );
        }
    }
}
