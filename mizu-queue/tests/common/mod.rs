//! Fixtures shared by the integration tests and the peer binary.

pub mod steal_fixture;
