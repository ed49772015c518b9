//! SCSI wire types shared by target and initiator: CDBs, sense data, status, VPD pages.
