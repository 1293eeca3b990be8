//! Tests of the journal as a process uses it: entries read back, recovery
//! of gone processes' journals, lagging checkpoints, and the pads. The
//! byte format's own tests are in `format.rs`.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::files::{JOURNAL_PREFIX, PAD_GROUP, PAD_PREFIX, inode_number, young_marker};
use super::format::{Decoded, REGION_BYTES, Region, decode_all, read_durable, region_index};
use super::recovery::decoded_regions;
use super::*;
use crate::folder::layout::{JOURNAL_DIR, TEMP_DIR};
use crate::folder::sys::{names_in, read_u64};

fn test_options() -> JournalOptions {
    JournalOptions {
        boot_id: Some("test-boot".to_owned()),
        checkpoint_interval: Duration::from_secs(3600),
        adopt: false,
    }
}

/// Journals one put of `a/b` as a batch of its own; returns its generation.
fn journal_put(journal: &mut Journal, body: &[u8]) -> io::Result<u64> {
    let generation = journal.begin_batch()?;
    let entry = Entry {
        index: 0,
        kind: EntryKind::Put,
        key: "a/b",
        body,
        young: false,
    };
    journal.append(generation, 1, &[entry], || {})?;
    journal.end_batch()?;
    Ok(generation)
}

/// Recovery reads a region a megabyte at a time and stops at a stretch
/// of zeros: entries over several reads, bodies with long zero runs of
/// their own included, all come back, as a whole read would give them.
#[test]
fn recovery_reads_every_entry_of_a_region_however_many_reads_it_takes() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut journal = Journal::open(dir.path(), &test_options())?;
    let mut body = vec![7u8; 200 << 10];
    body[1000..(150 << 10)].fill(0);
    for _ in 0..12 {
        journal_put(&mut journal, &body)?;
    }
    let decoded = decoded_regions(&journal.file)?;
    assert_eq!(decoded.len(), 12);
    assert!(decoded.iter().all(|entry| entry.body == body));
    let mut whole = Vec::new();
    std::io::Read::read_to_end(&mut &journal.file, &mut whole)?;
    let half = whole.len().min(REGION_BYTES as usize);
    let expected: Vec<Decoded> = decode_all(&whole[..half])
        .into_iter()
        .chain(decode_all(&whole[half..]))
        .collect();
    assert_eq!(decoded, expected);
    Ok(())
}

#[test]
fn appended_entries_read_back_and_a_changed_one_is_refused() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut journal = Journal::open(dir.path(), &test_options())?;
    let generation = journal.begin_batch()?;
    let entries = [
        Entry {
            index: 0,
            kind: EntryKind::Put,
            key: "a/log/1",
            body: b"first body",
            young: true,
        },
        Entry {
            index: 1,
            kind: EntryKind::Put,
            key: "b/log/1",
            body: b"second, longer body",
            young: true,
        },
    ];
    journal.append(generation, 1, &entries, || {})?;
    journal.end_batch()?;
    let at = journal.appended().to_vec();
    assert_eq!(at.len(), 2);
    assert_eq!(at[0].offset + u64::from(at[0].len), at[1].offset);
    let reader = journal.reader()?;
    assert_eq!(reader.body(at[0])?, b"first body");
    assert_eq!(reader.body(at[1])?, b"second, longer body");
    // Bytes that are not that entry any more (here: zeroed, as a region
    // that started over may leave them) are an error, not a body.
    journal.file.write_all_at(&[0u8; 8], at[1].offset)?;
    let err = reader.body(at[1]).expect_err("a changed entry");
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    assert_eq!(reader.body(at[0])?, b"first body");
    journal.close();
    Ok(())
}

#[test]
fn a_gone_solo_journal_has_its_young_objects_put_in_place_on_the_same_boot() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    // The folder bucket makes it before it opens the journal; a replay
    // writes through it.
    fs::create_dir_all(dir.path().join(TEMP_DIR))?;
    let mut first = Journal::open(dir.path(), &test_options())?;
    first.mark_young()?;
    let generation = first.begin_batch()?;
    let put = |key: &'static str, body: &'static [u8], index| Entry {
        index,
        kind: EntryKind::Put,
        key,
        body,
        young: true,
    };
    first.append(
        generation,
        1,
        &[
            put("a/log/1", b"replaced later", 0),
            put("a/log/2", b"deleted later", 1),
            // Not young: already a file when it was journaled.
            Entry {
                young: false,
                ..put("a/placed", b"made at commit", 2)
            },
        ],
        || {},
    )?;
    first.append(
        generation,
        2,
        &[
            put("a/log/1", b"the last body", 0),
            Entry {
                index: 1,
                kind: EntryKind::Delete,
                key: "a/log/2",
                body: b"",
                young: true,
            },
        ],
        || {},
    )?;
    first.end_batch()?;
    let first_path = first.path.clone();
    drop(first); // gone without a clean close

    let second = Journal::open(dir.path(), &test_options())?;
    assert_eq!(fs::read(dir.path().join("a/log/1"))?, b"the last body");
    assert!(!dir.path().join("a/log/2").exists(), "deleted last");
    assert!(
        !dir.path().join("a/placed").exists(),
        "an entry that was not young is not applied on the same boot"
    );
    // The journal and its marker go at the first checkpoint.
    second.shared.checkpoint(true)?;
    assert!(!first_path.exists());
    assert!(young_marker(&first_path).is_some_and(|m| !m.exists()));
    second.close();
    Ok(())
}

/// While the journal holds young objects, a periodic checkpoint puts in
/// place and makes durable only the generation before the current one, then
/// bumps: an object of the current generation waits for the next checkpoint.
/// The region of the new generation starts over all the same, and a full
/// checkpoint (a clean close, another process's knock) leaves nothing
/// behind. Without young objects, every checkpoint is full.
#[test]
fn checkpoints_lag_one_generation_while_the_journal_holds_young_objects() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut journal = Journal::open(dir.path(), &test_options())?;
    let placed = Arc::new(Mutex::new(Vec::new()));
    {
        let placed = Arc::clone(&placed);
        journal.set_placer(Arc::new(move |generation| {
            placed.lock().push(generation);
            Ok(())
        }));
    }
    let durable = |journal: &Journal| read_durable(&journal.shared.durable);
    let current = |journal: &Journal| -> io::Result<u64> {
        Ok(read_u64(&journal.generation_shared, 0)?.unwrap_or(1))
    };

    // Not marked young: full.
    let e1 = journal_put(&mut journal, b"1")?;
    journal.shared.checkpoint(false)?;
    assert_eq!((durable(&journal)?, current(&journal)?), (e1, e1 + 1));
    assert_eq!(placed.lock().as_slice(), [e1]);

    journal.mark_young()?;
    let e2 = journal_put(&mut journal, b"2")?;
    assert_eq!(e2, e1 + 1);
    journal.shared.checkpoint(false)?;
    assert_eq!(
        (durable(&journal)?, current(&journal)?),
        (e2 - 1, e2 + 1),
        "lagging: the generation before is made durable, then the generation moves on"
    );
    assert_eq!(placed.lock().last(), Some(&(e2 - 1)));
    assert!(journal.shared.dirty(), "generation {e2} is not durable yet");

    // The next generation writes to the region of `e2 - 1`, all durable: it
    // starts over.
    let e3 = journal_put(&mut journal, b"3")?;
    assert_eq!(journal.appended()[0].offset, Region::base(region_index(e3)));
    journal.shared.checkpoint(false)?;
    assert_eq!((durable(&journal)?, current(&journal)?), (e2, e3 + 1));
    assert_eq!(placed.lock().last(), Some(&e2));

    // A full checkpoint puts everything in place.
    journal.shared.checkpoint(true)?;
    assert_eq!(durable(&journal)?, e3 + 1);
    assert_eq!(placed.lock().last(), Some(&(e3 + 1)));
    assert!(!journal.shared.dirty());
    journal.close();
    Ok(())
}

#[test]
fn a_gone_journal_without_the_marker_is_not_read_on_the_same_boot() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut first = Journal::open(dir.path(), &test_options())?;
    let generation = first.begin_batch()?;
    first.append(
        generation,
        1,
        &[Entry {
            index: 0,
            kind: EntryKind::Put,
            key: "b/log/1",
            body: b"young, but the journal was never marked",
            young: true,
        }],
        || {},
    )?;
    first.end_batch()?;
    drop(first);
    let second = Journal::open(dir.path(), &test_options())?;
    assert!(!dir.path().join("b/log/1").exists());
    second.close();
    Ok(())
}

/// The pad folders in `.wal`, by name.
fn pad_folders(wal: &Path) -> io::Result<Vec<String>> {
    let mut names: Vec<String> = names_in(wal)?
        .into_iter()
        .filter(|name| name.starts_with(PAD_PREFIX))
        .collect();
    names.sort();
    Ok(names)
}

fn name_of(pads: &Option<PathBuf>) -> Vec<String> {
    pads.iter()
        .filter_map(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn the_journal_shares_its_inode_table_block_with_its_pads_only() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let wal = dir.path().join(JOURNAL_DIR);
    let journal = Journal::open(dir.path(), &test_options())?;
    match &journal.pads {
        // A file system that did not hand out a whole run: nothing is
        // left of the attempt.
        None => assert!(pad_folders(&wal)?.is_empty()),
        Some(pads) => {
            let ino = inode_number(&journal.file)?;
            let start = (ino - 1) / PAD_GROUP * PAD_GROUP + 1;
            let mut run = vec![ino];
            for entry in fs::read_dir(pads)? {
                run.push(inode_number(&File::open(entry?.path())?)?);
            }
            run.sort_unstable();
            run.retain(|i| (start..start + PAD_GROUP).contains(i));
            assert_eq!(run, (start..start + PAD_GROUP).collect::<Vec<_>>());
            assert_eq!(pad_folders(&wal)?, name_of(&journal.pads));
        }
    }
    let path = journal.path.clone();
    journal.close();
    assert!(!path.exists());
    assert!(pad_folders(&wal)?.is_empty());
    Ok(())
}

#[test]
fn pads_stay_while_their_journal_does_and_go_with_it() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let wal = dir.path().join(JOURNAL_DIR);
    let first = Journal::open(dir.path(), &test_options())?;
    // A gone process's pads, its journal already removed.
    let orphan = wal.join(format!("{PAD_PREFIX}j.1.00000000000000ab"));
    fs::create_dir(&orphan)?;
    for n in 0..3 {
        File::create(orphan.join(n.to_string()))?;
    }
    // And a pad file of an earlier build, which kept pads beside the
    // journal rather than in a folder.
    let loose = wal.join(format!("{PAD_PREFIX}j.2.00000000000000ef.0"));
    File::create(&loose)?;
    let second = Journal::open(dir.path(), &test_options())?;
    assert!(!orphan.exists());
    assert!(!loose.exists());
    let mut live = name_of(&first.pads);
    live.extend(name_of(&second.pads));
    live.sort();
    assert_eq!(pad_folders(&wal)?, live);
    let (first_path, second_path) = (first.path.clone(), second.path.clone());
    first.close();
    assert!(!first_path.exists());
    assert_eq!(pad_folders(&wal)?, name_of(&second.pads));
    second.close();
    assert!(!second_path.exists());
    assert!(pad_folders(&wal)?.is_empty());
    Ok(())
}

#[test]
fn a_gone_padded_journal_is_taken_over_and_one_without_pads_removed() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let wal = dir.path().join(JOURNAL_DIR);
    let first = Journal::open(dir.path(), &test_options())?;
    let (first_path, first_pads) = (first.path.clone(), first.pads.clone());
    // Gone without a clean close (a crash, or a stop that left it).
    drop(first);
    // And a gone journal of a build without pads.
    let unpadded = wal.join(format!("{JOURNAL_PREFIX}1.00000000000000cd"));
    File::create(&unpadded)?;
    let mut second = Journal::open(dir.path(), &test_options())?;
    assert!(!unpadded.exists());
    if first_pads.is_none() {
        // Unpadded (a file system without a whole run): a new journal.
        assert_ne!(second.path, first_path);
        assert!(!first_path.exists());
    } else {
        assert_eq!(second.path, first_path);
        assert_eq!(second.pads, first_pads);
        assert_eq!(pad_folders(&wal)?, name_of(&first_pads));
    }
    // The journal taken over writes and reads back as its own.
    let generation = journal_put(&mut second, b"after the takeover")?;
    let bytes = fs::read(&second.path)?;
    let index = usize::try_from(generation % 2).expect("0 or 1");
    let region = &bytes[usize::try_from(Region::base(index)).expect("small")..];
    let decoded = decode_all(region);
    assert_eq!(decoded[0].body, b"after the takeover");
    assert_eq!(decoded[0].generation, generation);
    // A journal in use is never taken.
    let third = Journal::open(dir.path(), &test_options())?;
    assert_ne!(third.path, second.path);
    third.close();
    second.close();
    assert!(pad_folders(&wal)?.is_empty());
    Ok(())
}

#[test]
fn a_gone_journal_with_entries_not_yet_durable_stays_until_the_first_checkpoint() -> io::Result<()>
{
    let dir = tempfile::tempdir()?;
    let wal = dir.path().join(JOURNAL_DIR);
    let mut first = Journal::open(dir.path(), &test_options())?;
    let generation = journal_put(&mut first, b"journaled, not yet durable in place")?;
    let (first_path, first_pads) = (first.path.clone(), first.pads.clone());
    // Gone before any checkpoint (a crash).
    drop(first);

    let second = Journal::open(dir.path(), &test_options())?;
    assert_ne!(second.path, first_path, "not taken over");
    assert!(first_path.exists(), "kept until a checkpoint");
    let mut both = name_of(&first_pads);
    both.extend(name_of(&second.pads));
    both.sort();
    assert_eq!(pad_folders(&wal)?, both, "its pads stay with it");
    assert!(second.shared.dirty(), "a checkpoint is owed");
    assert!(
        read_u64(&second.generation_shared, 0)?.unwrap_or(1) > generation,
        "this process's entries come after the gone one's"
    );
    // A third process sees it held (by the second): it leaves it alone.
    let third = Journal::open(dir.path(), &test_options())?;
    assert!(first_path.exists());
    third.close();

    second.shared.checkpoint(true)?;
    assert!(
        read_durable(&second.shared.durable)? >= generation,
        "its entries are durable"
    );
    assert!(!first_path.exists(), "removed after the checkpoint");
    assert_eq!(pad_folders(&wal)?, name_of(&second.pads));
    assert!(!second.shared.dirty());
    second.close();
    Ok(())
}
