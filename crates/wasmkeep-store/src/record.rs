//! The bytes of a log record and of a snapshot: one format, checked whole.
//!
//! ```text
//! magic        8   "wkstore\0"
//! version      2   FORMAT_VERSION (u16 LE)
//! kind         1   1 = log record, 2 = snapshot
//! flags        1   bit 0: an alarm is set (alarm_ms valid)
//! seq          8   u64 LE: the record's sequence number (a snapshot: the last record it holds)
//! page_bytes   4   u32 LE: 4096
//! db_pages     4   u32 LE: the database's size in pages after this record
//! alarm_ms     8   i64 LE: the committed alarm after this record (0 when none)
//! time_ms      8   i64 LE: when the record was sealed, wall-clock ms (version 3)
//! actor        2+n u16 LE length + UTF-8 "tenant/class/name"
//! node         2+n writer node id
//! incarnation  2+n writer incarnation
//! n_pages      4   u32 LE: pages that follow
//! pages        n_pages x page, ascending index (below)
//! crc32        4   u32 LE over every byte above
//! ```
//!
//! A page (versions 2 and 3): `u32 LE` index, `u16 LE` gap start, `u16 LE` gap
//! length, then the page's bytes without the gap, a run of zero bytes
//! (ADR 0030). The gap is the page's longest run of zeros: in a SQLite
//! b-tree page, the free space between the cell pointers and the cells.
//! A counter's page is ~100 bytes instead of 4096, so records stop
//! spanning two file-system blocks, and the disk's bandwidth goes ~2.5x
//! further. Version 1 (still read) stored every page whole: `u32 LE` index
//! and `page_bytes` bytes.
//!
//! The time (version 3, ADR 0076) is the writer's wall clock when it sealed
//! the record, after every event in it committed and before any was
//! acknowledged; a snapshot carries the time of the record it holds up to.
//! A point-in-time restore to T replays the log while records are at or
//! before T. Versions 1 and 2 (still read) have no time: they read as 0,
//! older than any instant asked for.
//!
//! The writer id, the sequence number and the checksum make every record's
//! body unique, so a writer that lost a reply can tell its own record from
//! another writer's by comparing bytes. The alarm is carried in every record
//! (not only when it changed) so the alarm is read from the newest header.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use crate::page::PageData;
use crate::vfs::{PAGE_BYTES, Page, SharedPage};

const MAGIC: &[u8; 8] = b"wkstore\0";
/// Format of records and snapshots written by this version.
pub const FORMAT_VERSION: u16 = 3;
/// The format before records carried their time: still read.
const FORMAT_VERSION_UNTIMED: u16 = 2;
/// The format before pages left out their zero gap: still read.
const FORMAT_VERSION_WHOLE_PAGES: u16 = 1;
/// Longest text field (actor id, node, incarnation) in a header.
const TEXT_BYTES_MAX: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Log = 1,
    Snapshot = 2,
}

/// A decoded record or snapshot.
#[derive(Debug, Clone)]
pub struct Decoded {
    pub kind: Kind,
    pub seq: u64,
    pub db_pages: u32,
    pub alarm_ms: Option<i64>,
    /// When the record was sealed (0: written before records had times).
    pub time_ms: i64,
    pub actor: String,
    pub node: String,
    pub incarnation: String,
    pub pages: Vec<(u32, SharedPage)>,
}

/// The header fields of a record to encode.
pub struct Header<'a> {
    pub kind: Kind,
    pub seq: u64,
    pub db_pages: u32,
    pub alarm_ms: Option<i64>,
    /// The writer's wall-clock milliseconds when the record was sealed.
    pub time_ms: i64,
    pub actor: &'a str,
    pub node: &'a str,
    pub incarnation: &'a str,
}

/// Most bytes a record holding `n_pages` pages with these text fields takes
/// (for limits: a page without zeros to leave out).
pub fn encoded_len(n_pages: usize, header_text_bytes: usize) -> usize {
    8 + 2 + 1 + 1 + 8 + 4 + 4 + 8 + 8 + 6 + header_text_bytes + 4 + n_pages * (8 + PAGE_BYTES) + 4
}

/// Bytes of a record without pages (the shortest record this version
/// writes).
fn header_len() -> usize {
    encoded_len(0, 0)
}

/// Bytes of the shortest record of any version read (those before version
/// 3 have no time).
fn shortest_len() -> usize {
    header_len() - 8
}

pub fn encode<'p>(
    header: &Header<'_>,
    pages: impl ExactSizeIterator<Item = (u32, &'p PageData)>,
) -> Bytes {
    let text = header.actor.len() + header.node.len() + header.incarnation.len();
    let mut out = BytesMut::with_capacity(encoded_len(pages.len(), text));
    out.put_slice(MAGIC);
    out.put_u16_le(FORMAT_VERSION);
    out.put_u8(header.kind as u8);
    out.put_u8(u8::from(header.alarm_ms.is_some()));
    out.put_u64_le(header.seq);
    out.put_u32_le(PAGE_BYTES as u32);
    out.put_u32_le(header.db_pages);
    out.put_i64_le(header.alarm_ms.unwrap_or(0));
    out.put_i64_le(header.time_ms);
    for field in [header.actor, header.node, header.incarnation] {
        let len = u16::try_from(field.len().min(TEXT_BYTES_MAX)).expect("bounded above");
        out.put_u16_le(len);
        out.put_slice(&field.as_bytes()[..len as usize]);
    }
    out.put_u32_le(
        u32::try_from(pages.len()).expect("pages per record bounded by record_bytes_max"),
    );
    for (idx, page) in pages {
        // Pages are kept in memory in the form records store.
        let (gap_start, gap_len) = page.gap();
        out.put_u32_le(idx);
        out.put_u16_le(u16::try_from(gap_start).expect("within a page"));
        out.put_u16_le(u16::try_from(gap_len).expect("within a page"));
        out.put_slice(page.stored());
    }
    let crc = crc32fast::hash(&out);
    out.put_u32_le(crc);
    out.freeze()
}

/// Decodes and checks a record; the error says what is wrong (for `Corrupt`).
pub fn decode(bytes: &[u8]) -> Result<Decoded, String> {
    if bytes.len() < shortest_len() {
        return Err(format!(
            "{} bytes is shorter than any record (truncated?)",
            bytes.len()
        ));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let want = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
    let got = crc32fast::hash(body);
    if want != got {
        return Err(format!(
            "checksum mismatch (stored {want:08x}, computed {got:08x}): truncated or altered"
        ));
    }
    let mut r = Reader {
        bytes: body,
        pos: 0,
    };
    if r.take(8)? != MAGIC {
        return Err("bad magic: not a wasmkeep store record".into());
    }
    let version = r.u16()?;
    if !(FORMAT_VERSION_WHOLE_PAGES..=FORMAT_VERSION).contains(&version) {
        return Err(format!(
            "format version {version} is not one this wasmkeep reads (1 to {FORMAT_VERSION}): written by a newer wasmkeep"
        ));
    }
    let kind = match r.u8()? {
        1 => Kind::Log,
        2 => Kind::Snapshot,
        other => return Err(format!("unknown record kind {other}")),
    };
    let flags = r.u8()?;
    let seq = r.u64()?;
    let page_bytes = r.u32()?;
    if page_bytes as usize != PAGE_BYTES {
        return Err(format!("page size {page_bytes} is not {PAGE_BYTES}"));
    }
    let db_pages = r.u32()?;
    let alarm = r.i64()?;
    let time_ms = if version > FORMAT_VERSION_UNTIMED {
        r.i64()?
    } else {
        0
    };
    let actor = r.text()?;
    let node = r.text()?;
    let incarnation = r.text()?;
    let n_pages = r.u32()? as usize;
    let whole = version == FORMAT_VERSION_WHOLE_PAGES;
    // Every page takes at least its index (and gap) fields.
    let least = n_pages.saturating_mul(if whole { 4 + PAGE_BYTES } else { 8 });
    if body.len() - r.pos < least || (whole && body.len() - r.pos != least) {
        return Err(format!(
            "{n_pages} pages announced, {} bytes follow",
            body.len() - r.pos
        ));
    }
    let mut pages = Vec::with_capacity(n_pages);
    let mut last: Option<u32> = None;
    for _ in 0..n_pages {
        let idx = r.u32()?;
        if idx >= db_pages || last.is_some_and(|l| l >= idx) {
            return Err(format!(
                "page index {idx} out of order or past the database's {db_pages} pages"
            ));
        }
        last = Some(idx);
        let page: Page = if whole {
            r.take(PAGE_BYTES)?.try_into().expect("PAGE_BYTES bytes")
        } else {
            let gap_start = usize::from(r.u16()?);
            let gap_len = usize::from(r.u16()?);
            if gap_start + gap_len > PAGE_BYTES {
                return Err(format!(
                    "page {idx}: a gap of {gap_len} bytes at {gap_start} passes the page's end"
                ));
            }
            let mut page = [0u8; PAGE_BYTES];
            page[..gap_start].copy_from_slice(r.take(gap_start)?);
            page[gap_start + gap_len..].copy_from_slice(r.take(PAGE_BYTES - gap_start - gap_len)?);
            page
        };
        // Made again from the whole page: canonical whatever gap the writer chose.
        pages.push((idx, Arc::new(PageData::new(&page))));
    }
    if r.pos != body.len() {
        return Err(format!(
            "{} bytes follow the last of {n_pages} pages",
            body.len() - r.pos
        ));
    }
    if kind == Kind::Snapshot && pages.len() != db_pages as usize {
        return Err(format!(
            "snapshot holds {} of {db_pages} pages",
            pages.len()
        ));
    }
    Ok(Decoded {
        kind,
        seq,
        db_pages,
        alarm_ms: (flags & 1 != 0).then_some(alarm),
        time_ms,
        actor,
        node,
        incarnation,
        pages,
    })
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.bytes.len());
        let Some(end) = end else {
            return Err("record ends early".into());
        };
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn text(&mut self) -> Result<String, String> {
        let len = self.u16()? as usize;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| "header text is not UTF-8".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Bytes {
        let p1 = PageData::new(&[1; PAGE_BYTES]);
        let p3 = PageData::new(&[3; PAGE_BYTES]);
        encode(
            &Header {
                kind: Kind::Log,
                seq: 7,
                db_pages: 4,
                alarm_ms: Some(-5),
                time_ms: 1_700_000_000_123,
                actor: "t/c/n",
                node: "n1",
                incarnation: "abc",
            },
            [(1u32, &p1), (3u32, &p3)].into_iter(),
        )
    }

    #[test]
    fn record_round_trips() {
        let d = decode(&sample()).unwrap();
        assert_eq!(
            (d.kind, d.seq, d.db_pages, d.alarm_ms),
            (Kind::Log, 7, 4, Some(-5))
        );
        assert_eq!(
            (d.actor.as_str(), d.node.as_str(), d.incarnation.as_str()),
            ("t/c/n", "n1", "abc")
        );
        assert_eq!(d.pages.len(), 2);
        assert_eq!(d.pages[1].0, 3);
        assert_eq!(d.pages[1].1.to_page(), [3; PAGE_BYTES]);
    }

    fn header(seq: u64, db_pages: u32) -> Header<'static> {
        Header {
            kind: Kind::Log,
            seq,
            db_pages,
            alarm_ms: None,
            time_ms: 42,
            actor: "t/c/n",
            node: "n1",
            incarnation: "abc",
        }
    }

    /// Seals `body` with its checksum, as `encode` does.
    fn sealed(mut body: Vec<u8>) -> Vec<u8> {
        let crc = crc32fast::hash(&body);
        body.extend_from_slice(&crc.to_le_bytes());
        body
    }

    #[test]
    fn pages_leave_out_their_longest_zero_run_and_read_back_whole() {
        let mut middle: Page = [0; PAGE_BYTES];
        middle[..12].fill(7);
        middle[PAGE_BYTES - 40..].fill(9);
        middle[2000] = 1; // two zero runs: the longer one goes
        let mut at_start: Page = [0; PAGE_BYTES];
        at_start[PAGE_BYTES - 1] = 5;
        let mut at_end: Page = [0; PAGE_BYTES];
        at_end[0] = 6;
        let zeros: Page = [0; PAGE_BYTES];
        let full: Page = [0xAB; PAGE_BYTES];
        let pages = [middle, at_start, at_end, zeros, full];
        let data: Vec<PageData> = pages.iter().map(PageData::new).collect();
        let bytes = encode(
            &header(1, 5),
            data.iter().enumerate().map(|(i, p)| (i as u32, p)),
        );
        // A full page plus the few non-zero bytes of the others.
        let least = header_len() + 15 + 5 * 8 + PAGE_BYTES;
        assert!(
            bytes.len() < least + 2200,
            "{} bytes for 5 pages",
            bytes.len()
        );
        let d = decode(&bytes).unwrap();
        let back: Vec<Page> = d.pages.iter().map(|(_, p)| p.to_page()).collect();
        assert_eq!(back, pages);
        let gaps: Vec<_> = d.pages.iter().map(|(_, p)| p.gap()).collect();
        assert_eq!(
            gaps,
            [
                (2001, 2055),
                (0, PAGE_BYTES - 1),
                (1, PAGE_BYTES - 1),
                (0, PAGE_BYTES),
                (0, 0)
            ]
        );
        assert_eq!(
            encoded_len(1, 0),
            header_len() + 8 + PAGE_BYTES,
            "the limit is a page without zeros"
        );
    }

    #[test]
    fn pages_of_every_shape_read_back_whole_in_their_canonical_form() {
        for (round, page) in crate::page::sample_pages().iter().enumerate() {
            let page = *page;
            let data = PageData::new(&page);
            let bytes = encode(&header(1, 1), [(0u32, &data)].into_iter());
            let back = &decode(&bytes).unwrap().pages[0].1;
            assert_eq!(back.to_page(), page, "round {round}");
            assert_eq!(**back, data, "round {round}");
        }
    }

    #[test]
    fn records_of_the_whole_page_format_still_read() {
        let mut page: Page = [0; PAGE_BYTES];
        page[100] = 42;
        let mut body = Vec::new();
        body.extend_from_slice(MAGIC);
        body.extend_from_slice(&FORMAT_VERSION_WHOLE_PAGES.to_le_bytes());
        body.extend_from_slice(&[Kind::Log as u8, 0]);
        body.extend_from_slice(&3u64.to_le_bytes());
        body.extend_from_slice(&(PAGE_BYTES as u32).to_le_bytes());
        body.extend_from_slice(&2u32.to_le_bytes());
        body.extend_from_slice(&0i64.to_le_bytes());
        for text in ["t/c/n", "n1", "abc"] {
            body.extend_from_slice(&(text.len() as u16).to_le_bytes());
            body.extend_from_slice(text.as_bytes());
        }
        body.extend_from_slice(&1u32.to_le_bytes());
        body.extend_from_slice(&1u32.to_le_bytes());
        body.extend_from_slice(&page);
        let d = decode(&sealed(body)).unwrap();
        assert_eq!((d.seq, d.db_pages, d.pages.len()), (3, 2, 1));
        assert_eq!((d.pages[0].0, d.pages[0].1.to_page()), (1, page));
        assert_eq!(d.time_ms, 0, "no time before version 3");
    }

    #[test]
    fn records_written_before_they_had_a_time_still_read_as_time_zero() {
        // A version 3 record with its time cut out and its version set to
        // 2 is a version 2 record: the same fields, no time.
        let v3 = sample().to_vec();
        let time_at = 8 + 2 + 1 + 1 + 8 + 4 + 4 + 8;
        let mut body = v3[..time_at].to_vec();
        body.extend_from_slice(&v3[time_at + 8..v3.len() - 4]);
        body[8..10].copy_from_slice(&FORMAT_VERSION_UNTIMED.to_le_bytes());
        let d = decode(&sealed(body)).unwrap();
        assert_eq!((d.seq, d.alarm_ms, d.time_ms), (7, Some(-5), 0));
        assert_eq!(d.actor, "t/c/n");
        assert_eq!(d.pages[1].1.to_page(), [3; PAGE_BYTES]);
        // And the version 3 record carries its time.
        assert_eq!(decode(&sample()).unwrap().time_ms, 1_700_000_000_123);
    }

    #[test]
    fn a_version_from_a_newer_wasmkeep_is_refused_by_name() {
        let mut body = sample().to_vec();
        body.truncate(body.len() - 4);
        body[8..10].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        let e = decode(&sealed(body)).unwrap_err();
        assert!(e.contains("newer wasmkeep"), "{e}");
    }

    #[test]
    fn a_gap_past_the_page_or_bytes_after_the_pages_are_refused() {
        let mut page: Page = [0; PAGE_BYTES];
        page[0] = 1;
        let good = encode(&header(1, 1), [(0u32, &PageData::new(&page))].into_iter()).to_vec();
        let body = &good[..good.len() - 4];
        // The page's gap fields follow its index, 8 bytes before the page's
        // single stored byte.
        let gap_at = body.len() - 1 - 4;
        let mut bad = body.to_vec();
        bad[gap_at..gap_at + 2].copy_from_slice(&4000u16.to_le_bytes());
        let err = decode(&sealed(bad)).unwrap_err();
        assert!(err.contains("passes the page's end"), "{err}");
        let mut longer = body.to_vec();
        longer.push(0);
        let err = decode(&sealed(longer)).unwrap_err();
        assert!(err.contains("follow the last"), "{err}");
    }

    #[test]
    fn any_flipped_byte_or_truncation_is_detected() {
        let good = sample();
        for pos in [0, 9, 20, 60, good.len() / 2, good.len() - 1] {
            let mut bad = good.to_vec();
            bad[pos] ^= 0x40;
            assert!(decode(&bad).is_err(), "flip at {pos} not detected");
        }
        assert!(decode(&good[..good.len() - 100]).is_err());
        assert!(decode(&[]).is_err());
    }
}
