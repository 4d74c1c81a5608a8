//! The spin lock of a libfabric 1.17 `shm` region, seen from outside libfabric: to release
//! it when a process died holding it.
//!
//! Each `shm` endpoint lives in a shared-memory region (`/dev/shm/<pid>:<uid>:<index>`)
//! whose header holds a process-shared `pthread_spinlock_t`. A peer takes it to queue a
//! command for the endpoint, and the endpoint's own progress (every `fi_cq_read`) takes it
//! too. A process killed inside that critical section leaves the lock held, and every
//! thread that then progresses the endpoint spins in `pthread_spin_lock` for ever. The lock
//! records no owner and has no robust mode; libfabric cannot recover it.
//!
//! [`ShmRegionLock`] maps the first page of such a region a second time (the same memory)
//! and reaches the lock through the C library: [`is_free`](ShmRegionLock::is_free) tries
//! it, [`release`](ShmRegionLock::release) unlocks it whoever holds it. Only the caller
//! can know that the holder is dead (the provider releases a lock only when a peer is lost
//! and the lock stayed held at every sample over a long interval, while a live holder keeps
//! it for microseconds; see `ofi_provider`, *A CRI stuck in libfabric*). What the dead
//! process was doing under the lock stays half done: a command slot it had not committed
//! is never seen, a buffer it had taken from a pool is not returned — harmless to a job
//! that is failing its requests on that peer.
//!
//! # Layout
//!
//! The header is libfabric's private `struct smr_region` (`include/ofi_shm.h`), stable
//! within a release series only. Fields used, for 1.17:
//!
//! | bytes | field | |
//! |---|---|---|
//! | 0 | `version` | 4 ([`REGION_VERSION`]) |
//! | 4..8 | `pid` | the creator; 0 until the region is initialized |
//! | 24..28 | `lock` | `pthread_spinlock_t`, process-shared |
//!
//! [`ShmRegionLock::open`] refuses (returns `None`) unless the library that runs is 1.17
//! (`fi_version()`) and the region's version byte says 4: with another libfabric nothing is
//! touched, and a stuck CRI stays stuck (libfabric 1.18 queues commands lock-free, which
//! removes the common case).

use std::ptr::NonNull;

/// libfabric `smr_region.version` of the 1.17 series.
pub const REGION_VERSION: u8 = 4;

/// Offset of `smr_region.pid` (an `int`).
const PID_AT: usize = 4;

/// Offset of `smr_region.lock` (a `pthread_spinlock_t`).
const LOCK_AT: usize = 24;

/// Bytes mapped: the header's page.
const MAPPED: usize = 4096;

extern "C" {
    /// libfabric's runtime version, `FI_VERSION(major, minor)`.
    fn fi_version() -> u32;
}

/// Whether the libfabric that runs is of the 1.17 series (the layout above).
fn layout_known() -> bool {
    // SAFETY: `fi_version` takes nothing and returns a number.
    let v = unsafe { fi_version() };
    (v >> 16, v & 0xffff) == (1, 17)
}

/// The spin lock of one `shm` region, through a mapping of the region's first page.
#[derive(Debug)]
pub struct ShmRegionLock {
    /// Start of the mapping (`MAPPED` bytes, shared with the region).
    base: NonNull<u8>,
}

// SAFETY: the mapping is shared memory touched only through the C library's spin lock
// calls and volatile reads, which any thread may make.
unsafe impl Send for ShmRegionLock {}
// SAFETY: as above; no method needs exclusive access.
unsafe impl Sync for ShmRegionLock {}

impl ShmRegionLock {
    /// Maps the header of the `shm` region named `name` (a file of `/dev/shm`, no `/`) if
    /// it is an initialized libfabric 1.17 region; `None` otherwise (no such file, another
    /// version, another libfabric).
    pub fn open(name: &str) -> Option<Self> {
        if name.is_empty() || name.contains('/') || !layout_known() {
            return None;
        }
        let path = std::ffi::CString::new(format!("/dev/shm/{name}")).ok()?;
        // SAFETY: `path` is a NUL-terminated string; the flags ask for nothing unusual.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: a plain stat of an open descriptor into a zeroed out-structure.
        let size = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) == 0 {
                st.st_size
            } else {
                0
            }
        };
        let p = if size >= MAPPED as libc::off_t {
            // SAFETY: a new shared mapping of the file's first page; the kernel picks the
            // address.
            unsafe { libc::mmap(std::ptr::null_mut(), MAPPED, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) }
        } else {
            libc::MAP_FAILED
        };
        // SAFETY: `fd` is ours and open; the mapping (if any) does not need it.
        unsafe { libc::close(fd) };
        if p == libc::MAP_FAILED {
            return None;
        }
        let lock = ShmRegionLock { base: NonNull::new(p.cast::<u8>())? };
        // SAFETY: both reads are inside the mapped page; volatile, as other processes write
        // the region.
        let (version, pid) =
            unsafe { (std::ptr::read_volatile(lock.base.as_ptr()), std::ptr::read_volatile(lock.base.as_ptr().add(PID_AT).cast::<i32>())) };
        (version == REGION_VERSION && pid != 0).then_some(lock)
    }

    /// The lock, inside the mapped page.
    fn lock(&self) -> *mut libc::pthread_spinlock_t {
        // SAFETY: `LOCK_AT + 4 <= MAPPED`, inside the mapping; 4-aligned as the page is.
        unsafe { self.base.as_ptr().add(LOCK_AT).cast() }
    }

    /// Whether the lock could be taken now (it is then released at once).
    pub fn is_free(&self) -> bool {
        // SAFETY: the lock is a process-shared spin lock libfabric initialized
        // (`open` checked the region is initialized); trying it is what its users do.
        if unsafe { libc::pthread_spin_trylock(self.lock()) } == 0 {
            // SAFETY: taken just above by this thread.
            unsafe { libc::pthread_spin_unlock(self.lock()) };
            true
        } else {
            false
        }
    }

    /// Unlocks the lock, whoever holds it. Only for a lock whose holder is known to be dead
    /// (module docs): a live holder would find its critical section shared.
    pub fn release(&self) {
        // SAFETY: the lock is initialized (see `is_free`); unlocking it is a store that
        // makes it free, which a dead holder cannot object to.
        unsafe { libc::pthread_spin_unlock(self.lock()) };
    }

    /// Tests: takes the lock and keeps it (as a process killed inside its critical section
    /// would), and raises the region's signal word so that the next `fi_cq_read` of its
    /// endpoint progresses it — and spins.
    #[doc(hidden)]
    pub fn hold_as_a_dead_peer(&self) {
        /// Offset of `smr_region.signal` (an `ofi_atomic32_t`, right after the lock).
        const SIGNAL_AT: usize = LOCK_AT + 4;
        // SAFETY: as in `is_free`; the lock is taken and deliberately never released here.
        unsafe { libc::pthread_spin_lock(self.lock()) };
        // SAFETY: inside the mapped page, 4-aligned; an atomic store, as libfabric's own
        // `smr_signal` makes.
        let signal = unsafe { &*self.base.as_ptr().add(SIGNAL_AT).cast::<std::sync::atomic::AtomicI32>() };
        // Release: the lock taken above is visible before the signal that leads to it.
        signal.store(1, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for ShmRegionLock {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), MAPPED) };
    }
}
