//! Giving memory back to the operating system after a burst. glibc's
//! allocator keeps the pages a burst freed (a start's first read of every
//! tree lists every ordered kind's objects whole): at 100,000 objects the
//! controller sat at 200 MiB at rest holding a fraction of it live. musl's
//! (the image's) gives pages back by itself.

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
