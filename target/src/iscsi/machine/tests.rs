//! In-memory tests of the connection state machine.
