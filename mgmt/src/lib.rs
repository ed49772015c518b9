//! Placeholder: see README status.
