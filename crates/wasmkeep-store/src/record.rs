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
//! actor        2+n u16 LE length + UTF-8 "tenant/class/name"
//! node         2+n writer node id
//! incarnation  2+n writer incarnation
//! n_pages      4   u32 LE: pages that follow
//! pages        n_pages x (u32 LE page index, page_bytes bytes), ascending index
//! crc32        4   u32 LE over every byte above
//! ```
//!
//! The writer id, the sequence number and the checksum make every record's
//! body unique, so a writer that lost a reply can tell its own record from
//! another writer's by comparing bytes. The alarm is carried in every record
//! (not only when it changed) so the alarm is read from the newest header.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use crate::vfs::{PAGE_BYTES, Page};

const MAGIC: &[u8; 8] = b"wkstore\0";
/// Format of records and snapshots written by this version.
pub const FORMAT_VERSION: u16 = 1;
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
    pub actor: String,
    pub node: String,
    pub incarnation: String,
    pub pages: Vec<(u32, Arc<Page>)>,
}

/// The header fields of a record to encode.
pub struct Header<'a> {
    pub kind: Kind,
    pub seq: u64,
    pub db_pages: u32,
    pub alarm_ms: Option<i64>,
    pub actor: &'a str,
    pub node: &'a str,
    pub incarnation: &'a str,
}

/// Bytes of a record holding `n_pages` pages with these text fields (for limits).
pub fn encoded_len(n_pages: usize, header_text_bytes: usize) -> usize {
    8 + 2 + 1 + 1 + 8 + 4 + 4 + 8 + 6 + header_text_bytes + 4 + n_pages * (4 + PAGE_BYTES) + 4
}

pub fn encode<'p>(
    header: &Header<'_>,
    pages: impl ExactSizeIterator<Item = (u32, &'p Page)>,
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
    for field in [header.actor, header.node, header.incarnation] {
        let len = u16::try_from(field.len().min(TEXT_BYTES_MAX)).expect("bounded above");
        out.put_u16_le(len);
        out.put_slice(&field.as_bytes()[..len as usize]);
    }
    out.put_u32_le(
        u32::try_from(pages.len()).expect("pages per record bounded by record_bytes_max"),
    );
    for (idx, page) in pages {
        out.put_u32_le(idx);
        out.put_slice(page);
    }
    let crc = crc32fast::hash(&out);
    out.put_u32_le(crc);
    out.freeze()
}

/// Decodes and checks a record; the error says what is wrong (for `Corrupt`).
pub fn decode(bytes: &[u8]) -> Result<Decoded, String> {
    if bytes.len() < encoded_len(0, 0) {
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
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version} is not {FORMAT_VERSION} (written by another wasmkeep version)"
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
    let actor = r.text()?;
    let node = r.text()?;
    let incarnation = r.text()?;
    let n_pages = r.u32()? as usize;
    if body.len() - r.pos != n_pages * (4 + PAGE_BYTES) {
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
        let page: Page = r.take(PAGE_BYTES)?.try_into().expect("PAGE_BYTES bytes");
        pages.push((idx, Arc::new(page)));
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
        let p1: Page = [1; PAGE_BYTES];
        let p3: Page = [3; PAGE_BYTES];
        encode(
            &Header {
                kind: Kind::Log,
                seq: 7,
                db_pages: 4,
                alarm_ms: Some(-5),
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
        assert_eq!(d.pages[1].1[0], 3);
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
