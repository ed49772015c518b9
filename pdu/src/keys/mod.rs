//! Login/text key=value segments and the RFC 7143 negotiation rules.
