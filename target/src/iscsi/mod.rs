//! The iSCSI fabric: portals, login, authentication, discovery, sessions
//! and the command lifecycle over TCP.

pub mod catalog;
