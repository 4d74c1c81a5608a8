//! `membarrier(2)`: asymmetric fences between threads.
//!
//! A store-buffering handshake (a waker stores its news, then loads the sleeper's flag; a
//! sleeper stores its flag, then loads the news) needs a full fence on each side. Where one
//! side runs often (every frame sent) and the other rarely (a thread about to sleep), the
//! kernel can take the frequent side's fence over: the rare side, after its store, asks
//! `membarrier` for a full barrier on every CPU that runs a thread of the processes
//! concerned, and the frequent side needs only a compiler fence between its store and its
//! load (its CPU's barrier, if it is running, comes from the call; if it is not, its stores
//! have drained). Both commands are registered once per process; where the kernel lacks
//! them (or a seccomp filter refuses them), callers keep the full fence on both sides.
//!
//! * [`private_registered`] / [`private_barrier`]: `MEMBARRIER_CMD_PRIVATE_EXPEDITED`, the
//!   CPUs running threads of this process: for a handshake within one process (the
//!   doorbell of an in-process rank).
//! * [`global_registered`] / [`global_barrier`]: `MEMBARRIER_CMD_GLOBAL_EXPEDITED`, the CPUs
//!   running threads of any registered process: for a handshake across processes (the
//!   same-host lane of the libfabric provider).
//!
//! Under `cfg(loom)` neither is registered: loom cannot model a barrier another thread
//! runs, so its models check the symmetric handshake (a `SeqCst` fence on each side).

use std::sync::OnceLock;

/// `membarrier(2)` commands (the kernel's ABI, `linux/membarrier.h`).
const QUERY: libc::c_long = 0;
const GLOBAL_EXPEDITED: libc::c_long = 1 << 1;
const REGISTER_GLOBAL_EXPEDITED: libc::c_long = 1 << 2;
const PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

/// `membarrier(cmd, 0, 0)`: its result (negative where it failed).
#[cfg(all(target_os = "linux", not(loom), not(miri)))]
fn membarrier(cmd: libc::c_long) -> libc::c_long {
    // SAFETY: a system call with integer arguments and no memory of ours.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_long, 0 as libc::c_long) }
}

/// Elsewhere, under loom (module docs) and under Miri (which has no such system call): no
/// command.
#[cfg(not(all(target_os = "linux", not(loom), not(miri))))]
fn membarrier(_: libc::c_long) -> libc::c_long {
    -1
}

/// Registers this process for `barrier` with `register` (once per `cell`): whether the
/// kernel has both commands (a seccomp filter may refuse them), the registration took and a
/// first barrier ran.
fn registered(cell: &OnceLock<bool>, barrier: libc::c_long, register: libc::c_long) -> bool {
    *cell.get_or_init(|| {
        let cmds = membarrier(QUERY);
        let wanted = barrier | register;
        cmds >= 0 && cmds & wanted == wanted && membarrier(register) >= 0 && membarrier(barrier) >= 0
    })
}

/// Registers this process for `MEMBARRIER_CMD_GLOBAL_EXPEDITED` (once): whether it took, so
/// that [`global_barrier`] orders the stores of every registered process's threads.
#[cfg_attr(not(feature = "ofi"), allow(dead_code))]
pub(crate) fn global_registered() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    registered(&REGISTERED, GLOBAL_EXPEDITED, REGISTER_GLOBAL_EXPEDITED)
}

/// Registers this process for `MEMBARRIER_CMD_PRIVATE_EXPEDITED` (once): whether it took, so
/// that [`private_barrier`] orders the stores of every thread of this process.
pub fn private_registered() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    registered(&REGISTERED, PRIVATE_EXPEDITED, REGISTER_PRIVATE_EXPEDITED)
}

/// A full barrier on every CPU running a thread of a registered process; for a process that
/// [`global_registered`].
#[cfg_attr(not(feature = "ofi"), allow(dead_code))]
pub(crate) fn global_barrier() {
    membarrier(GLOBAL_EXPEDITED);
}

/// A full barrier on every CPU running a thread of this process; for a process that
/// [`private_registered`].
pub fn private_barrier() {
    membarrier(PRIVATE_EXPEDITED);
}
