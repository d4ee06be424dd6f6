//! The memory of the coordination table (`share`): a region of 32-bit words and
//! owner bytes that several processes map. Fenced unsafe module.
//!
//! Invariants:
//! - A [`Region`] implementation promises that `words()` and `owners()` return the
//!   same memory for the region's whole life (that is why the trait is `unsafe`).
//! - [`Mem`] owns its region and keeps the slices' raw parts beside it, so a table
//!   reaches its words without a virtual call; the slices it hands out borrow the
//!   `Mem`, so none outlives the region.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU32, AtomicU8};

/// Memory shared by the parties: 32-bit words and one owner byte per block.
///
/// # Safety
/// `words()` and `owners()` must return the same slices (address and length) every
/// time, for as long as the region lives.
pub unsafe trait Region: Send + Sync + 'static {
    /// The coordination words.
    fn words(&self) -> &[AtomicU32];
    /// Owner bytes, one per pool block.
    fn owners(&self) -> &[AtomicU8];
}

/// `n` zeroed atomic words from a zeroed allocation (calloc: for a large `n` the
/// kernel backs each page when it is first touched), so a sparse table costs only
/// the pages it uses.
pub(crate) fn zeroed_words(n: usize) -> Box<[AtomicU32]> {
    let v: Box<[u32]> = vec![0u32; n].into_boxed_slice();
    let len = v.len();
    let p = Box::into_raw(v) as *mut AtomicU32;
    // SAFETY: `AtomicU32` has the same size, alignment and bit validity as `u32`
    // (its documented layout), so the allocation of `len` zeroed `u32`s is one of
    // `len` zeroed `AtomicU32`s; `Box::from_raw` takes back exactly the allocation
    // `Box::into_raw` gave up, with the same layout.
    unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, len)) }
}

/// A table in this process's heap (parties are threads: tests, the simulator).
pub struct HeapRegion {
    words: Box<[AtomicU32]>,
    owners: Box<[AtomicU8]>,
}

impl HeapRegion {
    /// A zeroed region of `words` words and `owners` owner bytes.
    pub fn zeroed(words: usize, owners: usize) -> HeapRegion {
        HeapRegion {
            words: zeroed_words(words),
            owners: (0..owners).map(|_| AtomicU8::new(0)).collect(),
        }
    }
}

// SAFETY: boxed slices never move or change length while the box lives.
unsafe impl Region for HeapRegion {
    fn words(&self) -> &[AtomicU32] {
        &self.words
    }
    fn owners(&self) -> &[AtomicU8] {
        &self.owners
    }
}

/// A region with its slices at hand.
pub(crate) struct Mem {
    words: *const AtomicU32,
    nwords: usize,
    owners: *const AtomicU8,
    nowners: usize,
    _r: Box<dyn Region>,
}

// SAFETY: the pointers refer to memory of `_r`, which is Send + Sync and accessed
// only through atomics.
unsafe impl Send for Mem {}
// SAFETY: as above.
unsafe impl Sync for Mem {}

impl Mem {
    pub(crate) fn new(r: Box<dyn Region>) -> Mem {
        let (w, o) = (r.words(), r.owners());
        Mem { words: w.as_ptr(), nwords: w.len(), owners: o.as_ptr(), nowners: o.len(), _r: r }
    }

    /// The words.
    #[inline]
    pub(crate) fn words(&self) -> &[AtomicU32] {
        // SAFETY: the raw parts of `_r.words()`, which the `Region` contract keeps
        // valid and unchanged while `_r` lives; the slice borrows `self`.
        unsafe { std::slice::from_raw_parts(self.words, self.nwords) }
    }

    /// The owner bytes.
    #[inline]
    pub(crate) fn owners(&self) -> &[AtomicU8] {
        // SAFETY: as in `words`.
        unsafe { std::slice::from_raw_parts(self.owners, self.nowners) }
    }
}
