//! Property tests for the SCSI codecs: encode -> decode is the identity on
//! well-formed values, and no decoder panics on arbitrary bytes.

// Inside `mod scsi` so `cargo test -p blockwire-pdu scsi` selects these.
mod scsi {
    use blockwire_pdu::scsi::cdb::PR_SCOPE_LU;
    use blockwire_pdu::scsi::*;
    use proptest::collection::vec;
    use proptest::option;
    use proptest::prelude::*;

    fn size_10_12_16() -> impl Strategy<Value = CdbSize> {
        prop_oneof![
            Just(CdbSize::Ten),
            Just(CdbSize::Twelve),
            Just(CdbSize::Sixteen)
        ]
    }

    fn size_10_16() -> impl Strategy<Value = CdbSize> {
        prop_oneof![Just(CdbSize::Ten), Just(CdbSize::Sixteen)]
    }

    /// Common READ/WRITE fields within the widths of `size`.
    fn rw(size: CdbSize, fua_allowed: bool) -> impl Strategy<Value = Rw> {
        let (lba_max, len_max): (u64, u32) = match size {
            CdbSize::Six => ((1 << 21) - 1, 256),
            CdbSize::Ten => (u64::from(u32::MAX), u32::from(u16::MAX)),
            CdbSize::Twelve => (u64::from(u32::MAX), u32::MAX),
            CdbSize::Sixteen => (u64::MAX, u32::MAX),
        };
        let six = size == CdbSize::Six;
        (
            0..=lba_max,
            if six { 1..=len_max } else { 0..=len_max },
            0u8..8,
            any::<bool>(),
            any::<bool>(),
            0u8..32,
        )
            .prop_map(move |(lba, length, protect, dpo, fua, group)| Rw {
                size,
                lba,
                length,
                protect: if six { 0 } else { protect },
                dpo: !six && dpo,
                fua: !six && fua && fua_allowed,
                group: if six { 0 } else { group },
            })
    }

    fn any_size() -> impl Strategy<Value = CdbSize> {
        prop_oneof![
            Just(CdbSize::Six),
            Just(CdbSize::Ten),
            Just(CdbSize::Twelve),
            Just(CdbSize::Sixteen)
        ]
    }

    fn page_control() -> impl Strategy<Value = PageControl> {
        prop_oneof![
            Just(PageControl::Current),
            Just(PageControl::Changeable),
            Just(PageControl::Default),
            Just(PageControl::Saved)
        ]
    }

    fn cdb_a() -> impl Strategy<Value = Cdb> {
        prop_oneof![
            Just(Cdb::TestUnitReady),
            (any::<bool>(), any::<u8>()).prop_map(|(desc, allocation_length)| Cdb::RequestSense {
                desc,
                allocation_length
            }),
            (any::<bool>(), any::<u8>(), any::<u16>()).prop_map(|(evpd, p, allocation_length)| {
                Cdb::Inquiry {
                    evpd,
                    page_code: if evpd { p } else { 0 },
                    allocation_length,
                }
            }),
            (
                any::<bool>(),
                page_control(),
                0u8..64,
                any::<u8>(),
                any::<u8>()
            )
                .prop_map(
                    |(dbd, page_control, page_code, subpage_code, allocation_length)| {
                        Cdb::ModeSense6 {
                            dbd,
                            page_control,
                            page_code,
                            subpage_code,
                            allocation_length,
                        }
                    }
                ),
            (
                any::<bool>(),
                any::<bool>(),
                page_control(),
                0u8..64,
                any::<u8>(),
                any::<u16>()
            )
                .prop_map(
                    |(llbaa, dbd, page_control, page_code, subpage_code, allocation_length)| {
                        Cdb::ModeSense10 {
                            llbaa,
                            dbd,
                            page_control,
                            page_code,
                            subpage_code,
                            allocation_length,
                        }
                    }
                ),
            (any::<bool>(), any::<bool>(), any::<u8>()).prop_map(
                |(pf, sp, parameter_list_length)| {
                    Cdb::ModeSelect6 {
                        pf,
                        sp,
                        parameter_list_length,
                    }
                }
            ),
            (
                any::<[bool; 2]>(),
                0u8..4,
                0u8..0x40,
                any::<u8>(),
                any::<[u16; 2]>()
            )
                .prop_map(
                    |([sp, ppc], page_control, page_code, subpage_code, [pointer, alloc])| {
                        Cdb::LogSense {
                            sp,
                            ppc,
                            page_control,
                            page_code,
                            subpage_code,
                            parameter_pointer: pointer,
                            allocation_length: alloc,
                        }
                    }
                ),
            (any::<bool>(), any::<bool>(), any::<u16>()).prop_map(
                |(pf, sp, parameter_list_length)| {
                    Cdb::ModeSelect10 {
                        pf,
                        sp,
                        parameter_list_length,
                    }
                }
            ),
            (any_size().prop_flat_map(|s| rw(s, true)), any::<bool>()).prop_map(|(rw, rarc)| {
                Cdb::Read {
                    rarc: rarc && rw.size != CdbSize::Six,
                    rw,
                }
            }),
            any_size()
                .prop_flat_map(|s| rw(s, true))
                .prop_map(Cdb::Write),
            (size_10_12_16().prop_flat_map(|s| rw(s, false)), 0u8..2)
                .prop_map(|(rw, bytchk)| Cdb::WriteAndVerify { rw, bytchk }),
            (
                size_10_12_16().prop_flat_map(|s| rw(s, false)),
                prop_oneof![Just(0u8), Just(1), Just(3)]
            )
                .prop_map(|(rw, bytchk)| Cdb::Verify { rw, bytchk }),
            rw(CdbSize::Sixteen, true).prop_map(Cdb::OrWrite16),
        ]
    }

    fn cdb_b() -> impl Strategy<Value = Cdb> {
        prop_oneof![
            (
                size_10_16(),
                any::<u64>(),
                any::<u32>(),
                0u8..8,
                any::<bool>(),
                any::<bool>(),
                any::<bool>(),
                0u8..32
            )
                .prop_map(
                    |(size, lba, blocks, wrprotect, anchor, unmap, ndob, group)| {
                        let ten = size == CdbSize::Ten;
                        Cdb::WriteSame {
                            size,
                            lba: if ten { lba & 0xffff_ffff } else { lba },
                            blocks: if ten { blocks & 0xffff } else { blocks },
                            wrprotect,
                            anchor,
                            unmap,
                            ndob: ndob && !ten,
                            group,
                        }
                    }
                ),
            (any::<bool>(), 0u8..32, any::<u16>()).prop_map(
                |(anchor, group, parameter_list_length)| {
                    Cdb::Unmap {
                        anchor,
                        group,
                        parameter_list_length,
                    }
                }
            ),
            (
                any::<u64>(),
                any::<u8>(),
                0u8..8,
                any::<bool>(),
                any::<bool>(),
                0u8..32
            )
                .prop_map(|(lba, blocks, wrprotect, dpo, fua, group)| {
                    Cdb::CompareAndWrite {
                        lba,
                        blocks,
                        wrprotect,
                        dpo,
                        fua,
                        group,
                    }
                }),
            (
                any::<u64>(),
                any::<u16>(),
                any::<u16>(),
                0u8..8,
                any::<bool>(),
                any::<bool>(),
                0u8..64
            )
                .prop_map(|(lba, boundary, blocks, wrprotect, dpo, fua, group)| {
                    Cdb::WriteAtomic16 {
                        lba,
                        boundary,
                        blocks,
                        wrprotect,
                        dpo,
                        fua,
                        group,
                    }
                }),
            (
                size_10_16(),
                any::<bool>(),
                any::<u64>(),
                any::<u32>(),
                0u8..32,
                any::<bool>()
            )
                .prop_map(|(size, immed, lba, blocks, group, sync)| {
                    let ten = size == CdbSize::Ten;
                    let lba = if ten { lba & 0xffff_ffff } else { lba };
                    let blocks = if ten { blocks & 0xffff } else { blocks };
                    if sync {
                        Cdb::SynchronizeCache {
                            size,
                            immed,
                            lba,
                            blocks,
                            group,
                        }
                    } else {
                        Cdb::PreFetch {
                            size,
                            immed,
                            lba,
                            blocks,
                            group,
                        }
                    }
                }),
            (any::<u32>(), any::<bool>()).prop_map(|(lba, pmi)| Cdb::ReadCapacity10 { lba, pmi }),
            (any::<u64>(), any::<u32>(), any::<bool>()).prop_map(
                |(lba, allocation_length, pmi)| {
                    Cdb::ReadCapacity16 {
                        lba,
                        allocation_length,
                        pmi,
                    }
                }
            ),
            (any::<u64>(), any::<u32>()).prop_map(|(lba, allocation_length)| Cdb::GetLbaStatus {
                lba,
                allocation_length
            }),
            (any::<u8>(), any::<u32>()).prop_map(|(select_report, allocation_length)| {
                Cdb::ReportLuns {
                    select_report,
                    allocation_length,
                }
            }),
            (0u8..8, any::<u32>()).prop_map(|(parameter_data_format, allocation_length)| {
                Cdb::ReportTargetPortGroups {
                    parameter_data_format,
                    allocation_length,
                }
            }),
            (
                any::<bool>(),
                0u8..8,
                any::<u8>(),
                any::<u16>(),
                any::<u32>()
            )
                .prop_map(|(rctd, ro, op, sa, al)| {
                    Cdb::ReportSupportedOperationCodes {
                        rctd,
                        reporting_options: ro,
                        requested_opcode: op,
                        requested_service_action: sa,
                        allocation_length: al,
                    }
                }),
            (any::<bool>(), any::<u32>()).prop_map(|(repd, allocation_length)| {
                Cdb::ReportSupportedTmfs {
                    repd,
                    allocation_length,
                }
            }),
            any::<u32>().prop_map(|parameter_list_length| Cdb::SetTargetPortGroups {
                parameter_list_length
            }),
        ]
    }

    fn cdb_c() -> impl Strategy<Value = Cdb> {
        let pr_in = prop_oneof![
            Just(PrInAction::ReadKeys),
            Just(PrInAction::ReadReservation),
            Just(PrInAction::ReportCapabilities),
            Just(PrInAction::ReadFullStatus)
        ];
        let pr_out = (0u8..9).prop_filter_map("defined", PrOutAction::from_code);
        prop_oneof![
            (
                any::<bool>(),
                0u8..16,
                0u8..16,
                any::<bool>(),
                any::<bool>(),
                any::<bool>()
            )
                .prop_map(|(immed, pcm, pc, no_flush, loej, start)| {
                    Cdb::StartStopUnit {
                        immed,
                        power_condition_modifier: pcm,
                        power_condition: pc,
                        no_flush,
                        loej,
                        start,
                    }
                }),
            (0u8..4).prop_map(|prevent| Cdb::PreventAllowMediumRemoval { prevent }),
            Just(Cdb::Reserve6),
            Just(Cdb::Release6),
            (
                any::<bool>(),
                any::<bool>(),
                any::<u8>(),
                any::<u16>(),
                any::<bool>()
            )
                .prop_map(|(third_party, long_id, id, len, reserve)| if reserve {
                    Cdb::Reserve10 {
                        third_party,
                        long_id,
                        third_party_device_id: id,
                        parameter_list_length: len,
                    }
                } else {
                    Cdb::Release10 {
                        third_party,
                        long_id,
                        third_party_device_id: id,
                        parameter_list_length: len,
                    }
                }),
            (0u8..2, any::<u32>()).prop_map(|(service_action, parameter_list_length)| {
                Cdb::ExtendedCopy {
                    service_action,
                    parameter_list_length,
                }
            }),
            (0x10u8..0x12, any::<u32>(), any::<u32>(), 0u8..32).prop_map(
                |(service_action, list_identifier, parameter_list_length, group)| {
                    Cdb::TokenCopy {
                        service_action,
                        list_identifier,
                        parameter_list_length,
                        group,
                    }
                }
            ),
            (
                prop_oneof![
                    Just(0u8),
                    Just(1),
                    Just(3),
                    Just(4),
                    Just(5),
                    Just(6),
                    Just(7),
                    Just(8)
                ],
                any::<u32>(),
                any::<u32>()
            )
                .prop_map(|(sa, id, allocation_length)| Cdb::ReceiveCopyResults {
                    service_action: sa,
                    list_identifier: match sa {
                        0 | 1 | 4 => id & 0xff,
                        5..=7 => id,
                        _ => 0,
                    },
                    allocation_length,
                }),
            (pr_in, any::<u16>()).prop_map(|(service_action, allocation_length)| {
                Cdb::PersistentReserveIn {
                    service_action,
                    allocation_length,
                }
            }),
            (pr_out, 0u8..16, 0u8..16, any::<u32>()).prop_map(|(sa, scope, t, len)| {
                Cdb::PersistentReserveOut {
                    service_action: sa,
                    scope,
                    pr_type: t,
                    parameter_list_length: len,
                }
            }),
            // Unknown opcodes: LOG SELECT (10 bytes) and a vendor-specific one.
            vec(any::<u8>(), 9).prop_map(|mut rest| {
                rest.insert(0, opcode::LOG_SELECT);
                Cdb::Unknown {
                    opcode: opcode::LOG_SELECT,
                    bytes: rest,
                }
            }),
            vec(any::<u8>(), 0..20).prop_map(|mut rest| {
                rest.insert(0, 0xc1);
                Cdb::Unknown {
                    opcode: 0xc1,
                    bytes: rest,
                }
            }),
        ]
    }

    fn any_cdb() -> impl Strategy<Value = Cdb> {
        prop_oneof![cdb_a(), cdb_b(), cdb_c()]
    }

    fn sense_key() -> impl Strategy<Value = SenseKey> {
        (0u8..16).prop_map(SenseKey::from_nibble)
    }

    fn bit_ptr() -> impl Strategy<Value = Option<u8>> {
        option::of(0u8..8)
    }

    /// A sense-key-specific value consistent with `key`.
    fn sks_for(key: SenseKey) -> BoxedStrategy<SenseKeySpecific> {
        match key {
            SenseKey::IllegalRequest => (any::<bool>(), bit_ptr(), any::<u16>())
                .prop_map(|(in_cdb, bit, byte)| {
                    SenseKeySpecific::FieldPointer(FieldPointer { in_cdb, bit, byte })
                })
                .boxed(),
            SenseKey::RecoveredError | SenseKey::MediumError | SenseKey::HardwareError => {
                any::<u16>()
                    .prop_map(SenseKeySpecific::ActualRetryCount)
                    .boxed()
            }
            SenseKey::NoSense | SenseKey::NotReady => {
                any::<u16>().prop_map(SenseKeySpecific::Progress).boxed()
            }
            SenseKey::CopyAborted => (any::<bool>(), bit_ptr(), any::<u16>())
                .prop_map(
                    |(segment_descriptor, bit, byte)| SenseKeySpecific::SegmentPointer {
                        segment_descriptor,
                        bit,
                        byte,
                    },
                )
                .boxed(),
            SenseKey::UnitAttention => any::<bool>()
                .prop_map(SenseKeySpecific::UnitAttentionQueueOverflow)
                .boxed(),
            _ => (0u8..0x80, any::<u8>(), any::<u8>())
                .prop_map(|(a, b, c)| SenseKeySpecific::Other([a, b, c]))
                .boxed(),
        }
    }

    fn sense(fixed: bool) -> impl Strategy<Value = Sense> {
        sense_key().prop_flat_map(move |key| {
            let info: BoxedStrategy<Option<u64>> = if fixed {
                option::of(any::<u32>().prop_map(u64::from)).boxed()
            } else {
                option::of(any::<u64>()).boxed()
            };
            let csi: BoxedStrategy<Option<u64>> = if fixed {
                option::of((1..=u32::MAX).prop_map(u64::from)).boxed()
            } else {
                option::of(any::<u64>()).boxed()
            };
            (
                any::<bool>(),
                any::<(u8, u8)>(),
                info,
                csi,
                option::of(sks_for(key)),
                any::<u8>(),
                any::<(bool, bool, bool, bool)>(),
            )
                .prop_map(
                    move |(
                        deferred,
                        (asc, ascq),
                        information,
                        command_specific,
                        sks,
                        fru,
                        flags,
                    )| {
                        Sense {
                            deferred,
                            key,
                            asc,
                            ascq,
                            information,
                            command_specific,
                            sks,
                            fru,
                            filemark: flags.0,
                            eom: flags.1,
                            ili: flags.2,
                            sdat_ovfl: flags.3,
                        }
                    },
                )
        })
    }

    fn ascii<const N: usize>() -> impl Strategy<Value = [u8; N]> {
        proptest::array::uniform(0x20u8..0x7f)
    }

    fn inquiry() -> impl Strategy<Value = StandardInquiry> {
        (
            (0u8..8, 0u8..32, any::<bool>(), any::<u8>(), 0u8..16, 0u8..4),
            any::<[bool; 12]>(),
            (ascii::<8>(), ascii::<16>(), ascii::<4>()),
            vec(1u16..=u16::MAX, 0..=8),
        )
            .prop_map(|((q, t, rmb, version, rdf, tpgs), f, (v, p, r), vd)| {
                StandardInquiry {
                    peripheral: Peripheral {
                        qualifier: q,
                        device_type: t,
                    },
                    rmb,
                    version,
                    normaca: f[0],
                    hisup: f[1],
                    response_data_format: rdf,
                    sccs: f[2],
                    acc: f[3],
                    tpgs,
                    three_pc: f[4],
                    protect: f[5],
                    encserv: f[6],
                    multip: f[7],
                    cmdque: f[8],
                    vendor: v,
                    product: p,
                    revision: r,
                    version_descriptors: vd,
                }
            })
    }

    fn designator() -> impl Strategy<Value = Designator> {
        let m36 = (1u64 << 36) - 1;
        let id = prop_oneof![
            vec(any::<u8>(), 0..40).prop_map(DesignatorId::VendorSpecific),
            (ascii::<8>(), vec(any::<u8>(), 0..40))
                .prop_map(|(vendor, specific)| DesignatorId::T10VendorId { vendor, specific }),
            vec(any::<u8>(), 8).prop_map(DesignatorId::Eui64),
            (0u32..1 << 24, 0..=m36).prop_map(|(company_id, vendor_specific)| {
                DesignatorId::Naa(Naa::IeeeRegistered {
                    company_id,
                    vendor_specific,
                })
            }),
            (0u32..1 << 24, 0..=m36, any::<u64>()).prop_map(|(c, v, e)| DesignatorId::Naa(
                Naa::IeeeRegisteredExtended {
                    company_id: c,
                    vendor_specific: v,
                    extension: e
                }
            )),
            vec(any::<u8>(), 7).prop_map(|mut v| {
                v.insert(0, 0x20); // NAA 2, IEEE Extended: kept raw
                DesignatorId::Naa(Naa::Other(v))
            }),
            any::<u16>().prop_map(DesignatorId::RelativeTargetPort),
            any::<u16>().prop_map(DesignatorId::TargetPortGroup),
            any::<u16>().prop_map(DesignatorId::LogicalUnitGroup),
            "[a-z0-9.:,-]{1,200}".prop_map(DesignatorId::ScsiName),
            (prop_oneof![Just(7u8), 9u8..16], vec(any::<u8>(), 0..40)).prop_map(|(t, value)| {
                DesignatorId::Other {
                    designator_type: t,
                    value,
                }
            }),
        ];
        let code_set = prop_oneof![
            Just(CodeSet::Binary),
            Just(CodeSet::Ascii),
            Just(CodeSet::Utf8),
            (4u8..16).prop_map(CodeSet::Reserved),
            Just(CodeSet::Reserved(0)),
        ];
        let association = prop_oneof![
            Just(Association::LogicalUnit),
            Just(Association::TargetPort),
            Just(Association::TargetDevice),
            Just(Association::Reserved),
        ];
        (0u8..16, code_set, any::<bool>(), association, id).prop_map(
            |(protocol_identifier, code_set, piv, association, id)| Designator {
                protocol_identifier,
                code_set,
                piv,
                association,
                id,
            },
        )
    }

    fn vpd_page() -> impl Strategy<Value = VpdPage> {
        prop_oneof![
            vec(any::<u8>(), 0..20).prop_map(VpdPage::SupportedPages),
            "[ -~]{0,40}".prop_map(VpdPage::UnitSerialNumber),
            vec(designator(), 0..6).prop_map(VpdPage::DeviceIdentification),
            (
                (0u8..4, 0u8..8, 0u8..16, any::<u16>(), any::<u8>()),
                any::<[bool; 20]>()
            )
                .prop_map(|((am, spt, mit, minutes, msl), f)| {
                    VpdPage::ExtendedInquiry(ExtendedInquiry {
                        activate_microcode: am,
                        spt,
                        grd_chk: f[0],
                        app_chk: f[1],
                        ref_chk: f[2],
                        uask_sup: f[3],
                        group_sup: f[4],
                        prior_sup: f[5],
                        headsup: f[6],
                        ordsup: f[7],
                        simpsup: f[8],
                        wu_sup: f[9],
                        crd_sup: f[10],
                        nv_sup: f[11],
                        v_sup: f[12],
                        p_i_i_sup: f[13],
                        luiclr: f[14],
                        r_sup: f[15],
                        cbcs: f[16],
                        multi_it_nexus_microcode_download: mit,
                        extended_self_test_minutes: minutes,
                        poa_sup: f[17],
                        hra_sup: f[18],
                        vsa_sup: f[19],
                        max_sense_length: msl,
                    })
                }),
            (
                (any::<bool>(), any::<u8>(), any::<u16>()),
                any::<[u32; 7]>(),
                option::of(0u32..0x8000_0000),
                any::<u64>(),
                any::<[u32; 5]>()
            )
                .prop_map(|((wsnz, caw, gran), l, uga, ws, at)| {
                    VpdPage::BlockLimits(BlockLimits {
                        wsnz,
                        max_compare_and_write_length: caw,
                        optimal_transfer_length_granularity: gran,
                        max_transfer_length: l[0],
                        optimal_transfer_length: l[1],
                        max_prefetch_length: l[2],
                        max_unmap_lba_count: l[3],
                        max_unmap_block_descriptor_count: l[4],
                        optimal_unmap_granularity: l[5],
                        unmap_granularity_alignment: uga,
                        max_write_same_length: ws,
                        max_atomic_transfer_length: at[0],
                        atomic_alignment: at[1],
                        atomic_transfer_length_granularity: at[2],
                        max_atomic_transfer_length_with_boundary: at[3],
                        max_atomic_boundary_size: at[4],
                    })
                }),
            (
                any::<u16>(),
                any::<u8>(),
                0u8..4,
                0u8..4,
                0u8..16,
                0u8..4,
                any::<bool>(),
                any::<bool>()
            )
                .prop_map(|(rate, pt, wab, wac, ff, zoned, fuab, vbuls)| {
                    VpdPage::BlockDeviceCharacteristics(BlockDeviceCharacteristics {
                        medium_rotation_rate: rate,
                        product_type: pt,
                        wabereq: wab,
                        wacereq: wac,
                        nominal_form_factor: ff,
                        zoned,
                        fuab,
                        vbuls,
                    })
                }),
            (
                (any::<u8>(), any::<[bool; 4]>(), 0u8..8),
                (0u8..32, 0u8..8, any::<u8>()),
                option::of(designator())
            )
                .prop_map(|((te, f, lbprz), (minp, pt, thp), pg)| {
                    VpdPage::LogicalBlockProvisioning(LogicalBlockProvisioning {
                        threshold_exponent: te,
                        lbpu: f[0],
                        lbpws: f[1],
                        lbpws10: f[2],
                        lbprz,
                        anc_sup: f[3],
                        minimum_percentage: minp,
                        provisioning_type: pt,
                        threshold_percentage: thp,
                        provisioning_group: pg,
                    })
                }),
            (
                prop_oneof![0x01u8..0x80, 0x84u8..0x86, 0x87u8..0xb0, 0xb3u8..=0xff],
                vec(any::<u8>(), 0..64)
            )
                .prop_map(|(page_code, data)| VpdPage::Other { page_code, data }),
        ]
    }

    fn mode_page() -> impl Strategy<Value = ModePage> {
        prop_oneof![
            (
                any::<[bool; 14]>(),
                (0u8..16, 0u8..16),
                any::<[u16; 5]>(),
                any::<u8>()
            )
                .prop_map(|(f, (d, w), n, segs)| {
                    ModePage::Caching(CachingPage {
                        ps: f[0],
                        ic: f[1],
                        abpf: f[2],
                        cap: f[3],
                        disc: f[4],
                        size: f[5],
                        wce: f[6],
                        mf: f[7],
                        rcd: f[8],
                        demand_read_retention_priority: d,
                        write_retention_priority: w,
                        disable_prefetch_transfer_length: n[0],
                        minimum_prefetch: n[1],
                        maximum_prefetch: n[2],
                        maximum_prefetch_ceiling: n[3],
                        fsw: f[9],
                        lbcss: f[10],
                        dra: f[11],
                        nv_dis: f[12],
                        number_of_cache_segments: segs,
                        cache_segment_size: n[4],
                    })
                }),
            (
                any::<[bool; 14]>(),
                (0u8..8, 0u8..16, 0u8..4, 0u8..4, 0u8..8),
                any::<(u16, u16)>()
            )
                .prop_map(|(f, (tst, qam, qerr, ua, al), (bt, st))| {
                    ModePage::Control(ControlPage {
                        ps: f[0],
                        tst,
                        tmf_only: f[1],
                        dpicz: f[2],
                        d_sense: f[3],
                        gltsd: f[4],
                        rlec: f[5],
                        queue_algorithm_modifier: qam,
                        nuar: f[6],
                        qerr,
                        rac: f[7],
                        ua_intlck_ctrl: ua,
                        swp: f[8],
                        ato: f[9],
                        tas: f[10],
                        atmpe: f[11],
                        rwwp: f[12],
                        autoload_mode: al,
                        busy_timeout_period: bt,
                        extended_self_test_completion_time: st,
                    })
                }),
            (
                any::<[bool; 10]>(),
                any::<[u8; 2]>(),
                0u8..0x80,
                any::<u16>()
            )
                .prop_map(|(f, [rr, wr], mwr, limit)| {
                    ModePage::ReadWriteErrorRecovery(ReadWriteErrorRecoveryPage {
                        ps: f[0],
                        awre: f[1],
                        arre: f[2],
                        tb: f[3],
                        rc: f[4],
                        eer: f[5],
                        per: f[6],
                        dte: f[7],
                        dcr: f[8],
                        read_retry_count: rr,
                        lbpere: f[9],
                        mwr,
                        write_retry_count: wr,
                        recovery_time_limit: limit,
                    })
                }),
            (
                any::<[bool; 2]>(),
                vec(
                    (any::<bool>(), 0u8..8, 0u8..8, any::<u8>(), any::<u32>()),
                    0..6
                )
            )
                .prop_map(|([ps, situa], ts)| {
                    ModePage::LogicalBlockProvisioning(LogicalBlockProvisioningPage {
                        ps,
                        situa,
                        thresholds: ts
                            .into_iter()
                            .map(|(enabled, threshold_type, arming, resource, count)| {
                                ThresholdDescriptor {
                                    enabled,
                                    threshold_type,
                                    arming,
                                    resource,
                                    count,
                                }
                            })
                            .collect(),
                    })
                }),
            (any::<[bool; 8]>(), 0u8..16, any::<(u32, u32)>()).prop_map(|(f, mrie, (it, rc))| {
                ModePage::InformationalExceptions(InformationalExceptionsPage {
                    ps: f[0],
                    perf: f[1],
                    ebf: f[2],
                    ewasc: f[3],
                    dexcpt: f[4],
                    test: f[5],
                    ebackerr: f[6],
                    logerr: f[7],
                    mrie,
                    interval_timer: it,
                    report_count: rc,
                })
            }),
            (
                any::<bool>(),
                prop_oneof![2u8..8, 0x09u8..0x0a, 0x0bu8..0x1c, 0x1du8..0x3f],
                option::of(any::<u8>()),
                vec(any::<u8>(), 0..30)
            )
                .prop_map(|(ps, page_code, subpage_code, data)| ModePage::Other {
                    ps,
                    page_code,
                    subpage_code,
                    data
                }),
        ]
    }

    fn transport_id() -> impl Strategy<Value = TransportId> {
        prop_oneof![
            ("iqn\\.[a-z0-9.:-]{1,60}", option::of("[0-9a-f]{12}"))
                .prop_map(|(name, isid)| TransportId::Iscsi { name, isid }),
            vec(any::<u8>(), 23).prop_map(|mut b| {
                b.insert(0, 0x06);
                TransportId::Other {
                    protocol_identifier: 6,
                    bytes: b,
                }
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn cdb_round_trip(c in any_cdb()) {
            let bytes = c.encode();
            prop_assert_eq!(Cdb::decode(&bytes), Ok(c.clone()));
            // iSCSI's zero-padded 16-byte CDB field decodes the same.
            if bytes.len() < 16 && !matches!(c, Cdb::Unknown { .. }) {
                let mut padded = bytes.clone();
                padded.resize(16, 0);
                prop_assert_eq!(Cdb::decode(&padded), Ok(c));
            }
        }

        #[test]
        fn cdb_decode_never_panics(b in vec(any::<u8>(), 0..40)) {
            if let Ok(c) = Cdb::decode(&b) {
                let _ = (c.data_direction(), c.transfer_length(), c.lba_range());
                // What decodes re-encodes to something that decodes the same.
                prop_assert_eq!(Cdb::decode(&c.encode()), Ok(c));
            } else if let Err(e) = Cdb::decode(&b) {
                let _ = e.to_sense().encode(SenseFormat::Fixed);
            }
        }

        #[test]
        fn sense_fixed_round_trip(s in sense(true)) {
            prop_assert_eq!(Sense::decode(&s.encode(SenseFormat::Fixed)), Ok(s.clone()));
            let seg = sense_segment(&s, SenseFormat::Fixed);
            prop_assert_eq!(parse_sense_segment(&seg), Ok(Some(s)));
        }

        #[test]
        fn sense_descriptor_round_trip(s in sense(false)) {
            prop_assert_eq!(Sense::decode(&s.encode(SenseFormat::Descriptor)), Ok(s.clone()));
            let seg = sense_segment(&s, SenseFormat::Descriptor);
            prop_assert_eq!(parse_sense_segment(&seg), Ok(Some(s)));
        }

        #[test]
        fn sense_decode_never_panics(b in vec(any::<u8>(), 0..300), first in 0x70u8..0x74) {
            let _ = Sense::decode(&b);
            let mut b2 = b.clone();
            if let Some(x) = b2.first_mut() { *x = first; }
            let _ = Sense::decode(&b2);
            let _ = parse_sense_segment(&b);
        }

        #[test]
        fn inquiry_round_trip(i in inquiry()) {
            prop_assert_eq!(StandardInquiry::decode(&i.encode()), Ok(i));
        }

        #[test]
        fn vpd_round_trip(page in vpd_page(), q in 0u8..8, t in 0u8..32) {
            let v = Vpd { peripheral: Peripheral { qualifier: q, device_type: t }, page };
            prop_assert_eq!(Vpd::decode(&v.encode()), Ok(v));
        }

        #[test]
        fn capacity_round_trip(
            lba in any::<u64>(), bl in any::<u32>(), rc in 0u8..4, pt in 0u8..8,
            pe in any::<bool>(), pie in 0u8..16, lbppbe in 0u8..16, lbpme in any::<bool>(),
            lbprz in any::<bool>(), la in 0u16..0x4000,
        ) {
            let d10 = ReadCapacity10 { returned_lba: lba as u32, block_length: bl };
            prop_assert_eq!(ReadCapacity10::decode(&d10.encode()), Ok(d10));
            let d16 = ReadCapacity16 {
                returned_lba: lba, block_length: bl, rc_basis: rc, p_type: pt, prot_en: pe,
                p_i_exponent: pie, lbppbe, lbpme, lbprz, lowest_aligned_lba: la,
            };
            prop_assert_eq!(ReadCapacity16::decode(&d16.encode()), Ok(d16));
        }

        #[test]
        fn lun_round_trip(v in 0u16..=Lun::MAX) {
            let lun = Lun::new(v).unwrap();
            prop_assert_eq!(Lun::decode(&lun.encode()), Ok(lun));
        }

        #[test]
        fn report_luns_round_trip(vs in vec(0u16..=Lun::MAX, 0..50)) {
            let r = ReportLuns::from_luns(vs.iter().filter_map(|&v| Lun::new(v)));
            prop_assert_eq!(ReportLuns::decode(&r.encode()), Ok(r.clone()));
            let back: Vec<u16> = r.single_level().map(|l| l.map(Lun::value)).collect::<Result<_, _>>().unwrap();
            prop_assert_eq!(back, vs);
        }

        #[test]
        fn mode_round_trip(
            mt in any::<u8>(), wp in any::<bool>(), dpofua in any::<bool>(),
            bds in vec((any::<u32>(), 0u32..0x100_0000), 0..3),
            long in any::<bool>(), pages in vec(mode_page(), 0..5),
        ) {
            let mk = |long_lba: bool| ModeParameters {
                header: ModeHeader { medium_type: mt, wp, dpofua },
                block_descriptors: bds.iter().map(|&(n, l)| BlockDescriptor {
                    number_of_blocks: u64::from(n), block_length: l,
                }).collect(),
                long_lba,
                pages: pages.clone(),
            };
            let m10 = mk(long);
            prop_assert_eq!(ModeParameters::decode10(&m10.encode10()), Ok(m10));
            let m6 = mk(false);
            let b6 = m6.encode6();
            if b6.len() <= 256 {
                prop_assert_eq!(ModeParameters::decode6(&b6), Ok(m6));
            }
        }

        #[test]
        fn log_page_round_trip(
            ds in any::<bool>(), spf in any::<bool>(), code in 0u8..0x40, sub in any::<u8>(),
            params in vec((any::<u16>(), any::<u8>(), vec(any::<u8>(), 0..40)), 0..8),
            codes in vec(any::<u8>(), 0..40),
        ) {
            let body = if code == 0 && sub == 0 {
                LogBody::SupportedPages(codes)
            } else {
                LogBody::Parameters(params.into_iter().map(|(code, control, value)| {
                    LogParameter { code, control, value }
                }).collect())
            };
            let page = LogPage { ds, spf, page_code: code, subpage_code: sub, body };
            prop_assert_eq!(LogPage::decode(&page.encode()), Ok(page));
        }

        #[test]
        fn resource_count_round_trip(count in any::<u32>(), scope in 0usize..4, code in any::<u16>()) {
            let scope = [ResourceScope::NotReported, ResourceScope::Dedicated, ResourceScope::Shared, ResourceScope::Reserved][scope];
            let r = ResourceCount { count, scope };
            prop_assert_eq!(ResourceCount::from_parameter(&r.to_parameter(code)), Ok(r));
        }

        #[test]
        fn unmap_round_trip(ds in vec((any::<u64>(), any::<u32>()), 0..20)) {
            let l = UnmapList {
                descriptors: ds.into_iter().map(|(lba, blocks)| UnmapDescriptor { lba, blocks }).collect(),
            };
            prop_assert_eq!(UnmapList::decode(&l.encode()), Ok(l));
        }

        #[test]
        fn pr_out_round_trip(
            rk in any::<u64>(), sak in any::<u64>(), f in any::<[bool; 4]>(),
            tids in vec(transport_id(), 0..4), port in any::<u16>(), tid in transport_id(),
        ) {
            let basic = PrOutData::Basic(PrOutParameters {
                reservation_key: rk, service_action_key: sak, spec_i_pt: f[0], all_tg_pt: f[1],
                aptpl: f[2], transport_ids: if f[0] { tids } else { Vec::new() },
            });
            prop_assert_eq!(PrOutData::decode(PrOutAction::Register, &basic.encode()), Ok(basic));
            let mv = PrOutData::RegisterAndMove(RegisterAndMoveParameters {
                reservation_key: rk, service_action_key: sak, unreg: f[3], aptpl: f[2],
                relative_target_port: port, transport_id: tid,
            });
            prop_assert_eq!(PrOutData::decode(PrOutAction::RegisterAndMove, &mv.encode()), Ok(mv));
        }

        /// Each TransportID of a SPEC_I_PT list is found where it was put.
        #[test]
        fn transport_id_offsets_follow_the_list(tids in vec(transport_id(), 0..6)) {
            let list = PrOutData::Basic(PrOutParameters {
                spec_i_pt: true, transport_ids: tids.clone(), ..Default::default()
            }).encode();
            let mut at = 28;
            let mut expected = Vec::new();
            for t in &tids {
                expected.push(at);
                let mut b = Vec::new();
                t.encode_into(&mut b);
                prop_assert_eq!(TransportId::decode(&list[at..]), Ok((t.clone(), b.len())));
                at += b.len();
            }
            prop_assert_eq!(PrOutParameters::transport_id_offsets(&list), expected);
        }

        #[test]
        fn data_decoders_never_panic(b in vec(any::<u8>(), 0..300), sa in 0u8..9) {
            let _ = StandardInquiry::decode(&b);
            let _ = Vpd::decode(&b);
            let _ = ReadCapacity10::decode(&b);
            let _ = ReadCapacity16::decode(&b);
            let _ = Lun::decode(&b);
            let _ = ReportLuns::decode(&b);
            let _ = ModeParameters::decode6(&b);
            let _ = ModeParameters::decode10(&b);
            let _ = UnmapList::decode(&b);
            let _ = PrOutParameters::transport_id_offsets(&b);
            if let Some(a) = PrOutAction::from_code(sa) {
                if let Err(e) = PrOutData::decode(a, &b) {
                    let _ = e.to_sense();
                }
            }
        }

        #[test]
        fn vpd_structured_fuzz(code in prop_oneof![Just(0x83u8), Just(0xb2u8)], body in vec(any::<u8>(), 0..80)) {
            // Valid header with a random body exercises the designator walker.
            let mut b = vec![0, code];
            b.extend_from_slice(&(body.len() as u16).to_be_bytes());
            b.extend_from_slice(&body);
            let _ = Vpd::decode(&b);
        }
    }

    #[test]
    fn pr_scope_constant() {
        assert_eq!(PR_SCOPE_LU, 0);
    }
}
