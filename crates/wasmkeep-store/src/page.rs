//! A database page in memory as records store it: the page's bytes without
//! their longest run of zeros (ADR 0030 for records, ADR 0038 in memory).
//!
//! In a SQLite b-tree page that run is the free space between the cell
//! pointers and the cells, so an actor with a few rows keeps ~100 bytes per
//! page instead of 4096: a counter's two pages took 8 KiB of every resident
//! actor's memory, and every log record and snapshot held a 4 KiB copy of
//! each page it carried.
//!
//! The form is canonical (the gap is always the first longest run, found by
//! [`longest_zero_run`]), so two pages are equal exactly when their forms
//! are.

use std::fmt;

use crate::vfs::{PAGE_BYTES, Page};

/// One page's bytes, without its longest run of zeros.
#[derive(Clone, PartialEq, Eq)]
pub struct PageData {
    /// Where the left-out run of zeros starts, and its length.
    gap_start: u16,
    gap_len: u16,
    /// The bytes before the gap, then those after it.
    bytes: Box<[u8]>,
}

impl fmt::Debug for PageData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PageData")
            .field("gap_start", &self.gap_start)
            .field("gap_len", &self.gap_len)
            .field("stored_bytes", &self.bytes.len())
            .finish()
    }
}

fn to_u16(n: usize) -> u16 {
    u16::try_from(n).expect("within a page")
}

impl PageData {
    /// A page of zeros (stores nothing).
    pub fn zeroed() -> Self {
        Self {
            gap_start: 0,
            gap_len: to_u16(PAGE_BYTES),
            bytes: Box::default(),
        }
    }

    pub fn new(page: &Page) -> Self {
        let (start, len) = longest_zero_run(page);
        let mut bytes = Vec::with_capacity(PAGE_BYTES - len);
        bytes.extend_from_slice(&page[..start]);
        bytes.extend_from_slice(&page[start + len..]);
        Self {
            gap_start: to_u16(start),
            gap_len: to_u16(len),
            bytes: bytes.into_boxed_slice(),
        }
    }

    /// Where the left-out run of zeros starts, and its length.
    pub fn gap(&self) -> (usize, usize) {
        (usize::from(self.gap_start), usize::from(self.gap_len))
    }

    /// The bytes before the gap, then those after it.
    pub fn stored(&self) -> &[u8] {
        &self.bytes
    }

    /// Copies the page's bytes from `offset` on into `out`.
    ///
    /// # Panics
    /// When `offset + out.len()` passes the page's end.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        let end = offset + out.len();
        assert!(end <= PAGE_BYTES, "a read past the page's end");
        let (gap_start, gap_len) = self.gap();
        let gap_end = gap_start + gap_len;
        let (mut pos, mut done) = (offset, 0);
        if pos < gap_start.min(end) {
            let n = gap_start.min(end) - pos;
            out[..n].copy_from_slice(&self.bytes[pos..pos + n]);
            (pos, done) = (pos + n, n);
        }
        if pos < gap_end.min(end) {
            let n = gap_end.min(end) - pos;
            out[done..done + n].fill(0);
            (pos, done) = (pos + n, done + n);
        }
        if pos < end {
            let from = pos - gap_len;
            out[done..].copy_from_slice(&self.bytes[from..from + (end - pos)]);
        }
    }

    /// The whole page.
    pub fn to_page(&self) -> Page {
        let mut page = [0; PAGE_BYTES];
        self.read(0, &mut page);
        page
    }
}

/// Where the page's longest run of zero bytes starts, and its length,
/// eight bytes at a time. Zero bytes at a word's start continue the run,
/// those at its end start the next one; a run inside one word (at most six
/// bytes) is not looked for, so a page with only such runs keeps them.
///
/// Runs on every page an event writes, on the mailbox's path: a block of
/// four zero words (most of a typical page's free space) is passed over
/// with one test, which the compiler makes a vector compare.
pub fn longest_zero_run(page: &Page) -> (usize, usize) {
    const WORDS: usize = 4;
    let mut run = ZeroRun::default();
    for (b, block) in page.chunks_exact(8 * WORDS).enumerate() {
        let words: [u64; WORDS] = std::array::from_fn(|i| {
            u64::from_le_bytes(block[8 * i..8 * i + 8].try_into().expect("8 bytes"))
        });
        if words.iter().fold(0, |acc, w| acc | w) == 0 {
            run.len += 8 * WORDS;
            continue;
        }
        for (i, word) in words.into_iter().enumerate() {
            run.word(b * WORDS + i, word);
        }
    }
    run.finish()
}

/// The longest run so far and the one under way, word by word.
#[derive(Default)]
struct ZeroRun {
    best_start: usize,
    best_len: usize,
    start: usize,
    len: usize,
}

impl ZeroRun {
    /// Word `w` of the page (its bytes in little-endian order).
    fn word(&mut self, w: usize, word: u64) {
        if word == 0 {
            self.len += 8;
            return;
        }
        self.len += (word.trailing_zeros() / 8) as usize;
        if self.len > self.best_len {
            (self.best_start, self.best_len) = (self.start, self.len);
        }
        let tail = (word.leading_zeros() / 8) as usize;
        (self.start, self.len) = (w * 8 + 8 - tail, tail);
    }

    fn finish(self) -> (usize, usize) {
        if self.len > self.best_len {
            (self.start, self.len)
        } else {
            (self.best_start, self.best_len)
        }
    }
}

/// Pages with a few non-zero bytes at pseudo-random places, 0 to 39 of
/// them (a fixed LCG: the same pages every run).
#[cfg(test)]
pub(crate) fn sample_pages() -> Vec<Page> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = || {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (x >> 33) as usize
    };
    (0..200)
        .map(|round| {
            let mut page: Page = [0; PAGE_BYTES];
            for _ in 0..round % 40 {
                page[next() % PAGE_BYTES] = (next() % 255 + 1) as u8;
            }
            page
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_reads_back_whole_and_in_every_slice() {
        let mut page: Page = [0; PAGE_BYTES];
        page[..12].fill(7);
        page[PAGE_BYTES - 40..].fill(9);
        page[2000] = 1;
        let data = PageData::new(&page);
        assert_eq!(data.gap(), (2001, 2055));
        assert_eq!(data.stored().len(), PAGE_BYTES - 2055);
        assert_eq!(data.to_page(), page);
        // Slices that start and end before, inside and after the gap.
        for (offset, len) in [
            (0, 100),
            (0, 12),
            (5, 3000),
            (1990, 20),
            (2001, 2055),
            (2500, 100),
            (3000, PAGE_BYTES - 3000),
            (4056, 40),
            (PAGE_BYTES, 0),
        ] {
            let mut out = vec![0xEE; len];
            data.read(offset, &mut out);
            assert_eq!(out, page[offset..offset + len], "{offset}+{len}");
        }
    }

    #[test]
    fn equal_pages_have_equal_forms_and_zeros_store_nothing() {
        let zeros = PageData::zeroed();
        assert_eq!(zeros, PageData::new(&[0; PAGE_BYTES]));
        assert!(zeros.stored().is_empty());
        assert_eq!(zeros.to_page(), [0; PAGE_BYTES]);
        let full = PageData::new(&[0xAB; PAGE_BYTES]);
        assert_eq!((full.gap().1, full.stored().len()), (0, PAGE_BYTES));
        let mut a: Page = [0; PAGE_BYTES];
        a[10] = 1;
        let mut b = a;
        assert_eq!(PageData::new(&a), PageData::new(&b));
        b[11] = 1;
        assert_ne!(PageData::new(&a), PageData::new(&b));
    }

    /// The block-skipping scan finds what a plain word-by-word scan does,
    /// including runs that start or end at a block's edge or inside it.
    #[test]
    fn the_block_scan_finds_the_word_scan_s_run() {
        let word_scan = |page: &Page| {
            let mut run = ZeroRun::default();
            for (w, chunk) in page.chunks_exact(8).enumerate() {
                run.word(w, u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
            }
            run.finish()
        };
        let mut pages = sample_pages();
        for edge in [
            0,
            1,
            7,
            8,
            31,
            32,
            33,
            63,
            64,
            2047,
            2048,
            PAGE_BYTES - 33,
            PAGE_BYTES - 1,
        ] {
            let mut page: Page = [0; PAGE_BYTES];
            page[edge] = 1;
            pages.push(page);
            let mut page: Page = [5; PAGE_BYTES];
            page[edge..(edge + 100).min(PAGE_BYTES)].fill(0);
            pages.push(page);
        }
        for (i, page) in pages.iter().enumerate() {
            assert_eq!(longest_zero_run(page), word_scan(page), "page {i}");
        }
        assert_eq!(longest_zero_run(&[0; PAGE_BYTES]), (0, PAGE_BYTES));
    }

    #[test]
    fn the_gap_is_always_zeros_and_pages_read_back_whole() {
        for (round, page) in sample_pages().iter().enumerate() {
            let page = *page;
            let (start, len) = longest_zero_run(&page);
            assert!(start + len <= PAGE_BYTES);
            assert!(
                page[start..start + len].iter().all(|b| *b == 0),
                "round {round}"
            );
            assert_eq!(PageData::new(&page).to_page(), page, "round {round}");
        }
    }
}
