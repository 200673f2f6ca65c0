//! Giving memory back to the operating system after a burst, and keeping
//! glibc's allocator to one arena. glibc's allocator keeps the pages a
//! burst freed (a start's first read of every tree lists every ordered
//! kind's objects whole): at 100,000 objects the controller sat at 200 MiB
//! at rest holding a fraction of it live. musl's (the image's) gives pages
//! back by itself.

/// Returns the free pages glibc holds to the system; elsewhere nothing.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn give_back() {
    // SAFETY: malloc_trim only walks the allocator's own free lists, under
    // its own locks; it takes no pointer and may be called at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn give_back() {}

/// Makes glibc's allocator serve every thread from one arena, before any
/// thread but the main one starts, unless `MALLOC_ARENA_MAX` says
/// otherwise. By default each thread that allocates gets an arena of its
/// own (here the main thread and the runtime's two workers), and each keeps
/// what its own bursts left: at 100,000 objects the controller sat at 61.5
/// MiB at rest with three arenas, 52.8 MiB with one (BENCHMARKS.md); the
/// threads take turns for it only when both allocate at once, and each
/// keeps a small cache of its own. Elsewhere nothing: musl's allocator has
/// no arenas.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn one_arena() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    // SAFETY: mallopt only sets a parameter of the allocator, under its
    // own lock; it takes no pointer.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn one_arena() {}
