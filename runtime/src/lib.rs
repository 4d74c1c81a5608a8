//! weft: a runtime for programs in which many threads or async tasks communicate at once.
#![deny(unsafe_op_in_unsafe_fn)]

pub(crate) mod loom;
pub mod lock;
