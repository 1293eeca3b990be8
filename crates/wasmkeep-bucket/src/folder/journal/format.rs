//! The journal's bytes, which never change (a folder left by an earlier
//! build is recovered with them): the file's two regions, an entry's
//! encoding and its decoding up to the first entry that is not whole, a
//! reader of entries' bodies, and the two checked slots of `.wal/durable`.
//!
//! Byte layouts only: it never creates, finds or removes a journal file,
//! and never takes the generation lock.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use crate::folder::locks::flock;
use crate::folder::sys::read_u64;

/// Largest journal file: two regions of half this size (see [`Journal`]); a
/// full region waits for a checkpoint.
///
/// [`Journal`]: super::Journal
pub const JOURNAL_BYTES_MAX: u64 = 64 << 20;
pub(super) const REGION_BYTES: u64 = JOURNAL_BYTES_MAX / 2;

/// Bytes of each region zero-filled when a journal is created; a region
/// grows by doubling, so overwriting is metadata-free after the first pass.
pub(super) const JOURNAL_ZEROED_START: u64 = 128 << 10;

pub(super) const ENTRY_MAGIC: u32 = 0x314A_4B57; // "WKJ1"
const ENTRY_HEADER_BYTES: usize = 32;
const ENTRY_CRC_BYTES: usize = 4;
const DURABLE_CHECK: u64 = 0x5741_534D_4B45_4550; // "WASMKEEP"

/// What a journal entry does to its key when replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryKind {
    /// The key holds the body.
    Put = 1,
    /// The key is absent.
    Delete = 2,
    /// The key was made durable in place: keep what the disk holds.
    Durable = 3,
}

impl EntryKind {
    fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(Self::Put),
            2 => Some(Self::Delete),
            3 => Some(Self::Durable),
            _ => None,
        }
    }
}

/// One entry to append.
pub(crate) struct Entry<'a> {
    pub index: u32,
    pub kind: EntryKind,
    pub key: &'a str,
    pub body: &'a [u8],
    /// Written in solo mode and not yet in place as a file (ADR 0034): a
    /// recovery after this process died applies it even on the same boot.
    pub young: bool,
}

/// The flags byte of an entry's header (byte 29; zero before ADR 0034).
const FLAG_YOUNG: u8 = 1;

/// Where an appended entry sits in its journal file, for reading its body
/// back ([`JournalReader::body`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EntryAt {
    /// Byte offset of the entry in the journal file.
    pub offset: u64,
    /// The entry's encoded length.
    pub len: u32,
}

/// The encoded size of an entry.
pub(crate) fn entry_bytes(key: &str, body_len: usize) -> usize {
    ENTRY_HEADER_BYTES + key.len() + body_len + ENTRY_CRC_BYTES
}

pub(super) fn encode(out: &mut Vec<u8>, generation: u64, order: u64, entry: &Entry<'_>) {
    let start = out.len();
    let len = entry_bytes(entry.key, entry.body.len());
    out.extend_from_slice(&ENTRY_MAGIC.to_le_bytes());
    out.extend_from_slice(
        &u32::try_from(len)
            .expect("entries are bounded")
            .to_le_bytes(),
    );
    out.extend_from_slice(&generation.to_le_bytes());
    out.extend_from_slice(&order.to_le_bytes());
    out.extend_from_slice(&entry.index.to_le_bytes());
    out.push(entry.kind as u8);
    out.push(if entry.young { FLAG_YOUNG } else { 0 });
    out.extend_from_slice(
        &u16::try_from(entry.key.len())
            .expect("keys are at most 1024 bytes")
            .to_le_bytes(),
    );
    out.extend_from_slice(entry.key.as_bytes());
    out.extend_from_slice(entry.body);
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// A decoded entry, as recovery reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decoded {
    pub generation: u64,
    pub order: u64,
    pub index: u32,
    pub kind: EntryKind,
    pub key: String,
    pub body: Vec<u8>,
    pub young: bool,
}

/// Decodes entries from the start of a journal until the first one that is
/// not whole (zeros, a torn write, or an older entry cut by a newer one).
pub(crate) fn decode_all(bytes: &[u8]) -> Vec<Decoded> {
    decode_prefix(bytes).0
}

/// Why [`decode_prefix`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// The bytes end before the next entry does (or exactly where it
    /// starts): more bytes may make it whole.
    Short,
    /// The next bytes are not an entry, whatever follows them.
    NotAnEntry,
}

/// [`decode_all`], also returning where the decoded entries end and why
/// decoding stopped there.
pub(super) fn decode_prefix(bytes: &[u8]) -> (Vec<Decoded>, usize, Stop) {
    let mut out = Vec::new();
    let mut at = 0usize;
    let stop = loop {
        let Some(header) = bytes.get(at..at + ENTRY_HEADER_BYTES) else {
            break Stop::Short;
        };
        let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("4 bytes"));
        let long = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().expect("8 bytes"));
        if word(0) != ENTRY_MAGIC {
            break Stop::NotAnEntry;
        }
        let len = word(4) as usize;
        let key_len = usize::from(u16::from_le_bytes([header[30], header[31]]));
        if len < ENTRY_HEADER_BYTES + key_len + ENTRY_CRC_BYTES {
            break Stop::NotAnEntry;
        }
        let Some(whole) = bytes.get(at..at + len) else {
            break Stop::Short;
        };
        let (content, crc) = whole.split_at(len - ENTRY_CRC_BYTES);
        if crc32fast::hash(content) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            break Stop::NotAnEntry;
        }
        let Some(kind) = EntryKind::from_byte(header[28]) else {
            break Stop::NotAnEntry;
        };
        let key_end = ENTRY_HEADER_BYTES + key_len;
        let Ok(key) = std::str::from_utf8(&content[ENTRY_HEADER_BYTES..key_end]) else {
            break Stop::NotAnEntry;
        };
        out.push(Decoded {
            generation: long(8),
            order: long(16),
            index: word(24),
            kind,
            key: key.to_owned(),
            body: content[key_end..].to_vec(),
            young: header[29] & FLAG_YOUNG != 0,
        });
        at += len;
    };
    (out, at, stop)
}

/// Reads appended entries back from a journal file, from any thread.
#[derive(Debug, Clone)]
pub(crate) struct JournalReader {
    pub(super) file: Arc<File>,
}

impl JournalReader {
    /// The body of the entry at `at`, checked whole: an entry that is not
    /// there any more (its region started over) is an error, never another
    /// entry's bytes.
    pub(crate) fn body(&self, at: EntryAt) -> io::Result<Vec<u8>> {
        let mut bytes = vec![0u8; at.len as usize];
        self.file.read_exact_at(&mut bytes, at.offset)?;
        let changed = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "journal entry at {} ({} bytes) is not there any more",
                    at.offset, at.len
                ),
            )
        };
        match decode_all(&bytes).pop() {
            Some(entry) if entry_bytes(&entry.key, entry.body.len()) == bytes.len() => {
                Ok(entry.body)
            }
            _ => Err(changed()),
        }
    }
}

/// The durable generation: two slots of (value, value ^ check), the newer valid
/// one wins, so a torn write of one slot leaves the other.
pub(super) fn read_durable(file: &File) -> io::Result<u64> {
    let mut best = 0;
    for slot in 0..2u64 {
        if let (Some(value), Some(check)) =
            (read_u64(file, slot * 16)?, read_u64(file, slot * 16 + 8)?)
            && value ^ DURABLE_CHECK == check
        {
            best = best.max(value);
        }
    }
    Ok(best)
}

/// Raises the durable generation to `generation` (never lowers it), synced.
pub(super) fn raise_durable(file: &File, generation: u64) -> io::Result<()> {
    flock(file, libc::LOCK_EX)?;
    let result = (|| {
        if read_durable(file)? >= generation {
            return Ok(());
        }
        let mut slot = [0u8; 16];
        slot[..8].copy_from_slice(&generation.to_le_bytes());
        slot[8..].copy_from_slice(&(generation ^ DURABLE_CHECK).to_le_bytes());
        file.write_all_at(&slot, (generation % 2) * 16)?;
        file.sync_data()
    })();
    let unlocked = flock(file, libc::LOCK_UN);
    result.and(unlocked)
}

/// Where one region of the journal stands.
#[derive(Debug, Clone, Copy)]
pub(super) struct Region {
    /// Bytes of entries from the region's start.
    pub(super) offset: u64,
    /// Bytes from the region's start known to be written (allocated).
    pub(super) zeroed: u64,
    /// The highest generation among its entries (0: none).
    pub(super) generation: u64,
}

/// The region a batch of `generation` writes to.
pub(super) fn region_index(generation: u64) -> usize {
    usize::try_from(generation % 2).expect("0 or 1")
}

impl Region {
    pub(super) fn base(index: usize) -> u64 {
        index as u64 * REGION_BYTES
    }

    /// Whether a batch of `generation` may start the region over.
    pub(super) fn reusable(&self, generation: u64, durable: u64) -> bool {
        self.generation < generation && self.generation <= durable
    }
}

#[cfg(test)]
mod tests {
    use crate::folder::sys::open_counter_file;

    use super::*;

    #[test]
    fn entries_round_trip_and_stop_at_the_first_damaged_one() {
        let mut bytes = Vec::new();
        let entries = [
            Entry {
                index: 0,
                kind: EntryKind::Put,
                key: "a/b",
                body: b"hello",
                young: false,
            },
            Entry {
                index: 1,
                kind: EntryKind::Delete,
                key: "c",
                body: b"",
                young: true,
            },
            Entry {
                index: 2,
                kind: EntryKind::Durable,
                key: "d/e/f",
                body: b"",
                young: false,
            },
        ];
        for entry in &entries {
            encode(&mut bytes, 7, 42, entry);
        }
        let decoded = decode_all(&bytes);
        assert_eq!(decoded.len(), 3);
        assert_eq!(decoded[0].key, "a/b");
        assert_eq!(decoded[0].body, b"hello");
        assert_eq!(
            (decoded[1].generation, decoded[1].order, decoded[1].index),
            (7, 42, 1)
        );
        assert_eq!(decoded[2].kind, EntryKind::Durable);
        let young: Vec<bool> = decoded.iter().map(|d| d.young).collect();
        assert_eq!(young, [false, true, false]);
        assert_eq!(
            bytes.len(),
            entries
                .iter()
                .map(|e| entry_bytes(e.key, e.body.len()))
                .sum::<usize>()
        );
        // A flipped byte in the second entry ends the journal there.
        let second = entry_bytes("a/b", 5);
        let mut damaged = bytes.clone();
        damaged[second + ENTRY_HEADER_BYTES] ^= 1;
        assert_eq!(decode_all(&damaged).len(), 1);
        // Zeros and a cut entry end it too.
        assert!(decode_all(&[0u8; 64]).is_empty());
        assert_eq!(decode_all(&bytes[..bytes.len() - 1]).len(), 2);
    }

    #[test]
    fn the_durable_generation_only_rises_and_survives_a_torn_slot() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let file = open_counter_file(&dir.path().join("durable"))?;
        assert_eq!(read_durable(&file)?, 0);
        raise_durable(&file, 5)?;
        raise_durable(&file, 3)?;
        assert_eq!(read_durable(&file)?, 5);
        raise_durable(&file, 6)?;
        assert_eq!(read_durable(&file)?, 6);
        // Tear the slot of 6: the other slot (5) still answers.
        file.write_all_at(&[0xff; 4], 0)?;
        assert_eq!(read_durable(&file)?, 5);
        Ok(())
    }
}
