//! What sibling order keeps per root, counted: the index, the last read of
//! each root and the gate's marks, with 101,300 roots across 50 kinds as in
//! the 100,000-object benchmark (`BENCH_ONLY=scale-100k scripts/bench.sh
//! convert`). Counted by an allocator that adds up, per thread, the bytes
//! asked for and the bytes glibc's allocator would take for them.
//!
//! `cargo test -p cascade-guard --lib footprint -- --nocapture` prints the
//! figures.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use super::gate::marks::Marks;
use super::index::{Index, IndexEvent, KindKey, Meta, TreeState};

struct Counting;

thread_local! {
    /// Bytes asked for and not freed on this thread, and glibc's chunks for
    /// them.
    static LIVE: Cell<(isize, isize)> = const { Cell::new((0, 0)) };
}

/// What glibc's malloc takes for `size` bytes on 64-bit: the size and an
/// 8-byte header, in 16-byte steps, 32 at least.
fn chunk(size: usize) -> isize {
    ((size + 8).div_ceil(16) * 16).max(32) as isize
}

fn count(layout: Layout, sign: isize) {
    // Not reachable while the thread is torn down: then nothing is counted.
    let _ = LIVE.try_with(|l| {
        let (asked, taken) = l.get();
        l.set((
            asked + sign * layout.size() as isize,
            taken + sign * chunk(layout.size()),
        ));
    });
}

// SAFETY: every call goes to the system allocator as it came; only counts
// are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout, 1);
        // SAFETY: as the caller promised.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(layout, -1);
        // SAFETY: as the caller promised.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout, 1);
        // SAFETY: as the caller promised.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(layout, -1);
        count(
            Layout::from_size_align(new_size, layout.align()).unwrap_or(layout),
            1,
        );
        // SAFETY: as the caller promised.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Bytes live on this thread now, as glibc would take them.
fn live() -> isize {
    LIVE.with(|l| l.get().1)
}

const KINDS: usize = 50;
const ROOTS: usize = 101_300;

/// A UUID as the API server writes them, different for each `i`.
fn uuid(i: usize) -> String {
    let x = (i as u128 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
    let h = format!("{x:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn kind(k: usize) -> KindKey {
    ("example.org".into(), format!("Scale{k}"))
}

fn mib(bytes: isize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn per_root(bytes: isize) -> isize {
    bytes / ROOTS as isize
}

/// Every root listed, each read alone, each marked ordered: the counts
/// after each step.
#[test]
fn footprint_of_100_000_roots() {
    let start = live();
    let mut index = Index::default();
    let kinds: Vec<_> = (0..KINDS).map(|k| (kind(k), Vec::new())).collect();
    index.set_kinds(&kinds, &[]);
    for (k, (key, _)) in kinds.iter().enumerate() {
        index.apply(key, 1, IndexEvent::Listing);
        for i in (k..ROOTS).step_by(KINDS) {
            let meta = Meta {
                uid: uuid(i),
                rv: format!("{}", 1_000_000 + i),
                namespace: Some("scale".into()),
                name: format!("scale-{i}"),
                ..Meta::default()
            };
            index.apply(key, 1, IndexEvent::Listed(meta));
        }
        index.apply(key, 1, IndexEvent::ListDone);
    }
    let listed = live();
    let now = Instant::now();
    let mut read = 0;
    loop {
        let look = index.look(now, Duration::from_secs(300));
        if look.due.is_empty() {
            break;
        }
        for d in look.due {
            let alone = TreeState {
                alone: true,
                ..TreeState::default()
            };
            index.read(&d.uid, d.rv, now, alone);
            read += 1;
        }
    }
    assert_eq!(read, ROOTS);
    let all_read = live();
    let mut marks = Marks::default();
    for i in 0..ROOTS {
        marks.mark(&uuid(i), "1", true);
    }
    let marked = live();
    // What a record holds at most: the rest are left out.
    marks.fit(super::record::MAX_BYTES);
    let fitted = live();
    println!(
        "footprint of {ROOTS} roots: the index {:.1} MiB ({} B a root), with every root read {:.1} MiB ({} B), the gate's marks {:.1} MiB ({} B), fitted to a record {:.1} MiB ({} B); all {:.1} MiB ({} B)",
        mib(listed - start),
        per_root(listed - start),
        mib(all_read - listed),
        per_root(all_read - listed),
        mib(marked - all_read),
        per_root(marked - all_read),
        mib(fitted - all_read),
        per_root(fitted - all_read),
        mib(fitted - start),
        per_root(fitted - start),
    );
    // 593 bytes a root before uids were kept in 16 bytes, the reads in
    // the index's objects and the marks compact; 130 after.
    assert!(
        per_root(fitted - start) <= 160,
        "{} B",
        per_root(fitted - start)
    );
    drop((index, marks));
}
