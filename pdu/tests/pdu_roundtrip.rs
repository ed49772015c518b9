//! Property tests: every PDU type survives encode -> decode unchanged, with
//! and without digests, whole and through the stream framer; and no byte
//! string makes the decoder panic.

use blockwire_pdu::pdu::codes::*;
use blockwire_pdu::pdu::*;
use blockwire_pdu::{Digests, Frame, FrameDecoder};
use proptest::prelude::*;

fn lun() -> impl Strategy<Value = Lun> {
    any::<[u8; 8]>().prop_map(Lun)
}
fn stage() -> impl Strategy<Value = Stage> {
    (0u8..4).prop_map(Stage::from_bits)
}
fn digests() -> impl Strategy<Value = Digests> {
    (any::<bool>(), any::<bool>()).prop_map(|(header, data)| Digests { header, data })
}

prop_compose! {
    fn nop_out()(immediate: bool, lun in lun(), itt: u32, ttt: u32, cmd_sn: u32, exp_stat_sn: u32) -> Bhs {
        Bhs::NopOut(NopOut { immediate, lun, itt, ttt, cmd_sn, exp_stat_sn })
    }
}
prop_compose! {
    fn scsi_command()(immediate: bool, final_bit: bool, read: bool, write: bool, attr in 0u8..8,
                      lun in lun(), itt: u32, edtl: u32, cmd_sn: u32, exp_stat_sn: u32, cdb: [u8; 16]) -> Bhs {
        Bhs::ScsiCommand(ScsiCommand { immediate, final_bit, read, write, attr: TaskAttr::from_u8(attr),
            lun, itt, expected_data_transfer_length: edtl, cmd_sn, exp_stat_sn, cdb })
    }
}
prop_compose! {
    fn tmf_request()(immediate: bool, f in 0u8..128, lun in lun(), itt: u32, rtt: u32, cmd_sn: u32,
                     exp_stat_sn: u32, ref_cmd_sn: u32, exp_data_sn: u32) -> Bhs {
        Bhs::TaskMgmtRequest(TaskMgmtRequest { immediate, function: TmfFunction::from_u8(f), lun, itt,
            referenced_task_tag: rtt, cmd_sn, exp_stat_sn, ref_cmd_sn, exp_data_sn })
    }
}
prop_compose! {
    fn login_request()(transit: bool, continue_bit: bool, csg in stage(), nsg in stage(), version_max: u8,
                       version_min: u8, isid: [u8; 6], tsih: u16, itt: u32, cid: u16, cmd_sn: u32,
                       exp_stat_sn: u32) -> Bhs {
        Bhs::LoginRequest(LoginRequest { transit, continue_bit, csg, nsg, version_max, version_min, isid,
            tsih, itt, cid, cmd_sn, exp_stat_sn })
    }
}
prop_compose! {
    fn text_request()(immediate: bool, final_bit: bool, continue_bit: bool, lun in lun(), itt: u32,
                      ttt: u32, cmd_sn: u32, exp_stat_sn: u32) -> Bhs {
        Bhs::TextRequest(TextRequest { immediate, final_bit, continue_bit, lun, itt, ttt, cmd_sn, exp_stat_sn })
    }
}
prop_compose! {
    fn data_out()(final_bit: bool, lun in lun(), itt: u32, ttt: u32, exp_stat_sn: u32, data_sn: u32,
                  buffer_offset: u32) -> Bhs {
        Bhs::DataOut(DataOut { final_bit, lun, itt, ttt, exp_stat_sn, data_sn, buffer_offset })
    }
}
prop_compose! {
    fn logout_request()(immediate: bool, reason in 0u8..128, itt: u32, cid: u16, cmd_sn: u32,
                        exp_stat_sn: u32) -> Bhs {
        Bhs::LogoutRequest(LogoutRequest { immediate, reason: LogoutReason::from_u8(reason), itt, cid,
            cmd_sn, exp_stat_sn })
    }
}
prop_compose! {
    fn snack()(t in 0u8..16, lun in lun(), itt: u32, tag: u32, exp_stat_sn: u32, beg_run: u32,
               run_length: u32) -> Bhs {
        Bhs::SnackRequest(SnackRequest { snack_type: SnackType::from_u8(t), lun, itt, ttt_or_snack_tag: tag,
            exp_stat_sn, beg_run, run_length })
    }
}
prop_compose! {
    fn nop_in()(lun in lun(), itt: u32, ttt: u32, stat_sn: u32, exp_cmd_sn: u32, max_cmd_sn: u32) -> Bhs {
        Bhs::NopIn(NopIn { lun, itt, ttt, stat_sn, exp_cmd_sn, max_cmd_sn })
    }
}
prop_compose! {
    fn scsi_response()(flags: [bool; 4], response: u8, status: u8, itt: u32, snack_tag: u32, sns: [u32; 3],
                       exp_data_sn: u32, bidi: u32, residual: u32) -> Bhs {
        Bhs::ScsiResponse(ScsiResponse { bidi_read_overflow: flags[0], bidi_read_underflow: flags[1],
            overflow: flags[2], underflow: flags[3], response: ServiceResponse::from_u8(response), status,
            itt, snack_tag, stat_sn: sns[0], exp_cmd_sn: sns[1], max_cmd_sn: sns[2], exp_data_sn,
            bidi_read_residual_count: bidi, residual_count: residual })
    }
}
prop_compose! {
    fn tmf_response()(response: u8, itt: u32, sns: [u32; 3]) -> Bhs {
        Bhs::TaskMgmtResponse(TaskMgmtResponse { response: TmfResponse::from_u8(response), itt,
            stat_sn: sns[0], exp_cmd_sn: sns[1], max_cmd_sn: sns[2] })
    }
}
prop_compose! {
    fn login_response()(transit: bool, continue_bit: bool, csg in stage(), nsg in stage(), version_max: u8,
                        version_active: u8, isid: [u8; 6], tsih: u16, itt: u32, sns: [u32; 3],
                        class: u8, detail: u8) -> Bhs {
        Bhs::LoginResponse(LoginResponse { transit, continue_bit, csg, nsg, version_max, version_active,
            isid, tsih, itt, stat_sn: sns[0], exp_cmd_sn: sns[1], max_cmd_sn: sns[2],
            status: LoginStatus::new(class, detail) })
    }
}
prop_compose! {
    fn text_response()(final_bit: bool, continue_bit: bool, lun in lun(), itt: u32, ttt: u32,
                       sns: [u32; 3]) -> Bhs {
        Bhs::TextResponse(TextResponse { final_bit, continue_bit, lun, itt, ttt, stat_sn: sns[0],
            exp_cmd_sn: sns[1], max_cmd_sn: sns[2] })
    }
}
prop_compose! {
    fn data_in()(flags: [bool; 4], status: Option<u8>, lun in lun(), itt: u32, ttt: u32, sns: [u32; 3],
                 data_sn: u32, buffer_offset: u32, residual_count: u32) -> Bhs {
        Bhs::DataIn(DataIn { final_bit: flags[0], acknowledge: flags[1], overflow: flags[2],
            underflow: flags[3], status, lun, itt, ttt, stat_sn: sns[0], exp_cmd_sn: sns[1],
            max_cmd_sn: sns[2], data_sn, buffer_offset, residual_count })
    }
}
prop_compose! {
    fn logout_response()(response: u8, itt: u32, sns: [u32; 3], time2wait: u16, time2retain: u16) -> Bhs {
        Bhs::LogoutResponse(LogoutResponse { response: LogoutResponseCode::from_u8(response), itt,
            stat_sn: sns[0], exp_cmd_sn: sns[1], max_cmd_sn: sns[2], time2wait, time2retain })
    }
}
prop_compose! {
    fn r2t()(lun in lun(), itt: u32, ttt: u32, sns: [u32; 3], r2t_sn: u32, buffer_offset: u32,
             desired: u32) -> Bhs {
        Bhs::R2t(R2t { lun, itt, ttt, stat_sn: sns[0], exp_cmd_sn: sns[1], max_cmd_sn: sns[2], r2t_sn,
            buffer_offset, desired_data_transfer_length: desired })
    }
}
prop_compose! {
    fn async_message()(lun in lun(), sns: [u32; 3], event: u8, vcode: u8, p: [u16; 3]) -> Bhs {
        Bhs::AsyncMessage(AsyncMessage { lun, stat_sn: sns[0], exp_cmd_sn: sns[1], max_cmd_sn: sns[2],
            event: AsyncEvent::from_u8(event), vcode, parameter1: p[0], parameter2: p[1], parameter3: p[2] })
    }
}
prop_compose! {
    fn reject()(reason: u8, sns: [u32; 3], sn: u32) -> Bhs {
        Bhs::Reject(Reject { reason: RejectReason::from_u8(reason), stat_sn: sns[0], exp_cmd_sn: sns[1],
            max_cmd_sn: sns[2], data_sn_or_r2t_sn: sn })
    }
}

fn any_bhs() -> impl Strategy<Value = Bhs> {
    prop_oneof![
        nop_out(),
        scsi_command(),
        tmf_request(),
        login_request(),
        text_request(),
        data_out(),
        logout_request(),
        snack(),
        nop_in(),
        scsi_response(),
        tmf_response(),
        login_response(),
        text_response(),
        data_in(),
        logout_response(),
        r2t(),
        async_message(),
        reject(),
    ]
}

fn any_ahs() -> impl Strategy<Value = Ahs> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 1..240).prop_map(Ahs::ExtendedCdb),
        any::<u32>().prop_map(Ahs::BidiReadDataLength),
        (3u8..=255, proptest::collection::vec(any::<u8>(), 0..40))
            .prop_map(|(ahs_type, specific)| Ahs::Other { ahs_type, specific }),
    ]
}

fn any_pdu() -> impl Strategy<Value = Pdu> {
    (
        any_bhs(),
        proptest::collection::vec(any_ahs(), 0..3),
        proptest::collection::vec(any::<u8>(), 0..600),
    )
        .prop_map(|(bhs, ahs, data)| Pdu {
            bhs,
            ahs,
            data: data.into(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn header_roundtrip(bhs in any_bhs(), ahs_words: u8, dsl in 0u32..0x0100_0000) {
        let bytes = bhs.encode(ahs_words, dsl);
        let (back, lengths) = Bhs::decode(&bytes).unwrap();
        prop_assert_eq!(back, bhs);
        prop_assert_eq!(lengths.ahs_len, usize::from(ahs_words) * 4);
        prop_assert_eq!(lengths.data_segment_length, dsl);
        // Encoding is canonical: decoding then encoding gives the same bytes.
        prop_assert_eq!(back.encode(ahs_words, dsl), bytes);
    }

    #[test]
    fn pdu_roundtrip(pdu in any_pdu(), digests in digests()) {
        let bytes = pdu.encode(digests);
        prop_assert_eq!(bytes.len() % 4, 0);
        let (back, used) = Pdu::decode(&bytes, digests).unwrap();
        prop_assert_eq!(used, bytes.len());
        prop_assert_eq!(back, pdu);
    }

    #[test]
    fn shared_decode_equals_copying_decode(pdu in any_pdu(), digests in digests()) {
        let bytes = bytes::Bytes::from(pdu.encode(digests));
        let (shared, used) = Pdu::decode_shared(&bytes, digests).unwrap();
        prop_assert_eq!(used, bytes.len());
        prop_assert_eq!(shared, pdu);
    }

    #[test]
    fn framer_reassembles_any_split(pdus in proptest::collection::vec(any_pdu(), 1..5),
                                    digests in digests(), cut in 1usize..97) {
        let mut wire = Vec::new();
        for p in &pdus { p.encode_into(&mut wire, digests); }
        let framer = FrameDecoder::new(1 << 16, digests);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        for chunk in wire.chunks(cut) {
            buf.extend_from_slice(chunk);
            loop {
                match framer.decode(&buf).unwrap() {
                    Frame::NeedMore(n) => { prop_assert!(n > 0); break; }
                    Frame::Pdu { pdu, consumed } => { out.push(pdu); buf.drain(..consumed); }
                }
            }
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(out, pdus);
    }

    #[test]
    fn any_corrupted_byte_is_caught_by_digests(pdu in any_pdu(), at: prop::sample::Index, flip in 1u8..=255) {
        let mut bytes = pdu.encode(Digests::BOTH);
        let i = at.index(bytes.len());
        bytes[i] ^= flip;
        // CRC32C catches every single-byte error in what it covers; a flip in
        // a length field moves the digests, which then mismatch (or the PDU
        // looks incomplete). Never a silently changed PDU.
        prop_assert!(Pdu::decode(&bytes, Digests::BOTH).is_err());
    }

    #[test]
    fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400), digests in digests(), max: u32) {
        let framer = FrameDecoder::new(max, digests);
        let _ = framer.decode(&bytes);
        let _ = Pdu::decode(&bytes, digests);
    }
}

#[test]
fn oversized_data_segment_is_refused_from_the_header_alone() {
    let bhs = Bhs::DataOut(DataOut {
        final_bit: true,
        lun: Lun::default(),
        itt: 1,
        ttt: 2,
        exp_stat_sn: 3,
        data_sn: 0,
        buffer_offset: 0,
    });
    // Only the 48 header bytes exist; the PDU claims 16 MiB - 1 of data.
    let header = bhs.encode(0, 0x00ff_ffff);
    let framer = FrameDecoder::new(262_144, Digests::NONE);
    match framer.decode(&header[..8]) {
        Err(blockwire_pdu::DecodeError::DataSegmentTooLong { len, max }) => {
            assert_eq!((len, max), (0x00ff_ffff, 262_144));
        }
        other => panic!("expected DataSegmentTooLong, got {other:?}"),
    }
}

#[test]
fn need_more_counts_exactly() {
    let pdu = Pdu::with_data(
        Bhs::NopOut(NopOut {
            immediate: true,
            lun: Lun::default(),
            itt: 7,
            ttt: RESERVED_TAG,
            cmd_sn: 1,
            exp_stat_sn: 1,
        }),
        vec![1u8, 2, 3, 4, 5],
    );
    let bytes = pdu.encode(Digests::BOTH);
    assert_eq!(bytes.len(), 48 + 4 + 8 + 4);
    let framer = FrameDecoder::new(8192, Digests::BOTH);
    assert_eq!(framer.decode(&bytes[..3]).unwrap(), Frame::NeedMore(45));
    assert_eq!(framer.decode(&bytes[..50]).unwrap(), Frame::NeedMore(14));
    assert!(matches!(
        framer.decode(&bytes).unwrap(),
        Frame::Pdu { consumed: 64, .. }
    ));
}

#[test]
fn lun_addressing() {
    assert_eq!(Lun::from_index(0).0, [0; 8]);
    assert_eq!(Lun::from_index(5).0, [0, 5, 0, 0, 0, 0, 0, 0]);
    assert_eq!(Lun::from_index(300).0, [0x41, 0x2c, 0, 0, 0, 0, 0, 0]);
    for i in [0u16, 1, 255, 256, 16383] {
        assert_eq!(Lun::from_index(i).index(), Some(i));
    }
    assert_eq!(Lun([0x80, 0, 0, 0, 0, 0, 0, 0]).index(), None);
}

mod iser {
    use blockwire_pdu::iser::{IserHeader, RemoteBuffer, ISER_HEADER_LEN};
    use proptest::prelude::*;

    fn remote() -> impl Strategy<Value = Option<RemoteBuffer>> {
        proptest::option::of(
            (any::<u32>(), any::<u64>())
                .prop_map(|(stag, base_offset)| RemoteBuffer { stag, base_offset }),
        )
    }

    fn any_iser() -> impl Strategy<Value = IserHeader> {
        prop_oneof![
            (remote(), remote()).prop_map(|(write, read)| IserHeader::Control { write, read }),
            (0u8..16, 0u8..16, any::<u16>()).prop_map(|(max_version, min_version, ird)| {
                IserHeader::Hello {
                    max_version,
                    min_version,
                    ird,
                }
            }),
            (any::<bool>(), 0u8..16, 0u8..16, any::<u16>()).prop_map(
                |(reject, max_version, current_version, ord)| IserHeader::HelloReply {
                    reject,
                    max_version,
                    current_version,
                    ord,
                }
            ),
        ]
    }

    proptest! {
        #[test]
        fn roundtrip(h in any_iser()) {
            prop_assert_eq!(IserHeader::decode(&h.encode()).unwrap(), h);
        }

        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = IserHeader::decode(&bytes);
        }
    }

    #[test]
    fn control_header_layout() {
        // RFC 7145 §9.2: opcode 0x1 in the high nibble, then WSV and RSV.
        let h = IserHeader::Control {
            write: Some(RemoteBuffer {
                stag: 0x11223344,
                base_offset: 0x1000,
            }),
            read: None,
        };
        let b = h.encode();
        assert_eq!(b.len(), ISER_HEADER_LEN);
        assert_eq!(b[0], 0x18);
        assert_eq!(&b[4..8], &[0x11, 0x22, 0x33, 0x44]);
        assert_eq!(&b[8..16], &[0, 0, 0, 0, 0, 0, 0x10, 0]);
    }
}
