//! libfabric provider, low level. (WIP)
pub(crate) mod sys;
