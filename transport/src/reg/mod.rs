//! Memory registration layer (placeholder while the RDMA core lands).
