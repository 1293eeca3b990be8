//! The heartbeat: one text object per node, rewritten every heartbeat period.
//! It is the node's lease (ADR 0020) and how peers learn about each other.
//!
//! ```text
//! 1  wasmkeep-heartbeat 1
//! 2  node id
//! 3  advertised URL
//! 4  app
//! 5  incarnation
//! 6  state: starting | serving | stopping
//! 7  classes served: * or a comma list
//! 8  resident actor count
//! 9  drain: none | asked | draining | drained
//! 10 secrets: yes | no
//! 11 capabilities: space-separated words (take)
//! 12 generation: a counter, new for every write
//! 13 hand-over: sockets closing, releases failed (two numbers)
//! ```
//!
//! Readers ignore lines past those they know and read a missing line as the
//! oldest behaviour (no line 11: no capabilities). Line 12 makes every body
//! unique: S3 servers give equal bodies equal etags, and an observer judges a
//! lease by seeing the object change. Line 13 is what `node drain --wait`
//! shows while a node hands its actors over: sockets it closed that have not
//! finished the close handshake, and ownership records whose release failed
//! (the node gives them back at later heartbeats).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::{AppName, ClassName, Error, NodeId};

/// The first line of every heartbeat.
pub const MAGIC: &str = "wasmkeep-heartbeat 1";
/// Longest heartbeat body a reader accepts, in bytes.
pub const HEARTBEAT_BYTES_MAX: usize = 64 * 1024;
/// Longest holder token (line 14), in hex digits.
pub const HOLDER_BYTES_MAX: usize = 64;

/// Whether `text` is a holder token: 1 to [`HOLDER_BYTES_MAX`] lower-case
/// hex digits.
pub fn is_holder_token(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= HOLDER_BYTES_MAX
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}
/// The capability word of ADR 0017: the node runs take calls.
pub const CAPABILITY_TAKE: &str = "take";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    Starting,
    Serving,
    Stopping,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainState {
    None,
    Asked,
    Draining,
    Drained,
}

/// Which classes a node serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClassesServed {
    All,
    Only(BTreeSet<ClassName>),
}

impl ClassesServed {
    pub fn serves(&self, class: &ClassName) -> bool {
        match self {
            ClassesServed::All => true,
            ClassesServed::Only(set) => set.contains(class),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub node: NodeId,
    pub advertise: String,
    pub app: AppName,
    pub incarnation: String,
    pub state: NodeState,
    pub classes: ClassesServed,
    pub resident_actors: u64,
    pub drain: DrainState,
    pub secrets: bool,
    pub capabilities: BTreeSet<String>,
    pub generation: u64,
    /// Line 13: sockets this node closed, still in their close handshake.
    pub sockets_closing: u64,
    /// Line 13: ownership records whose release failed, not yet given back.
    pub releases_failed: u64,
    /// Line 14: the token of the data dir of the process that wrote it
    /// (lower-case hex, empty when the process had none). A process that
    /// holds that data dir's lock knows the writer is dead (ADR 0054).
    pub holder: String,
}

impl Heartbeat {
    pub fn has_capability(&self, word: &str) -> bool {
        self.capabilities.contains(word)
    }

    pub fn to_text(&self) -> String {
        let classes = match &self.classes {
            ClassesServed::All => "*".to_owned(),
            ClassesServed::Only(set) => set
                .iter()
                .map(ClassName::as_str)
                .collect::<Vec<_>>()
                .join(","),
        };
        let mut out = String::new();
        let caps: Vec<&str> = self.capabilities.iter().map(String::as_str).collect();
        // Writing to a String cannot fail.
        let _ = write!(
            out,
            "{MAGIC}\n{}\n{}\n{}\n{}\n{}\n{classes}\n{}\n{}\n{}\n{}\n{}\n{} {}\n{}\n",
            self.node,
            self.advertise,
            self.app,
            self.incarnation,
            match self.state {
                NodeState::Starting => "starting",
                NodeState::Serving => "serving",
                NodeState::Stopping => "stopping",
            },
            self.resident_actors,
            match self.drain {
                DrainState::None => "none",
                DrainState::Asked => "asked",
                DrainState::Draining => "draining",
                DrainState::Drained => "drained",
            },
            if self.secrets { "yes" } else { "no" },
            caps.join(" "),
            self.generation,
            self.sockets_closing,
            self.releases_failed,
            self.holder,
        );
        out
    }

    /// Parses a heartbeat. Lines 1-8 are required; 9-14 default to the
    /// oldest behaviour when missing; lines past 14 are ignored.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let bad = |reason: &'static str| Error::InvalidRecord {
            what: "heartbeat",
            reason,
        };
        if text.len() > HEARTBEAT_BYTES_MAX {
            return Err(bad("longer than 64 KiB"));
        }
        let lines: Vec<&str> = text.lines().collect();
        if lines.first().copied() != Some(MAGIC) {
            return Err(bad("line 1 is not 'wasmkeep-heartbeat 1'"));
        }
        if lines.len() < 8 {
            return Err(bad("fewer than 8 lines"));
        }
        let node = NodeId::new(lines[1]).map_err(|_| bad("line 2: node id does not parse"))?;
        let advertise = lines[2].to_owned();
        if advertise.is_empty() {
            return Err(bad("line 3: empty advertised URL"));
        }
        let app = AppName::new(lines[3]).map_err(|_| bad("line 4: app does not parse"))?;
        let incarnation = lines[4].to_owned();
        if incarnation.is_empty() {
            return Err(bad("line 5: empty incarnation"));
        }
        let state = match lines[5] {
            "starting" => NodeState::Starting,
            "serving" => NodeState::Serving,
            "stopping" => NodeState::Stopping,
            _ => return Err(bad("line 6: unknown state")),
        };
        let classes = match lines[6] {
            "*" => ClassesServed::All,
            list => ClassesServed::Only(
                list.split(',')
                    .filter(|c| !c.is_empty())
                    .map(ClassName::new)
                    .collect::<Result<_, _>>()
                    .map_err(|_| bad("line 7: a class name does not parse"))?,
            ),
        };
        let resident_actors = lines[7]
            .parse()
            .map_err(|_| bad("line 8: resident actor count is not a number"))?;
        let drain = match lines.get(8).copied() {
            None | Some("none") => DrainState::None,
            Some("asked") => DrainState::Asked,
            Some("draining") => DrainState::Draining,
            Some("drained") => DrainState::Drained,
            Some(_) => return Err(bad("line 9: unknown drain state")),
        };
        let secrets = match lines.get(9).copied() {
            None | Some("no") => false,
            Some("yes") => true,
            Some(_) => return Err(bad("line 10: want yes or no")),
        };
        let capabilities = lines
            .get(10)
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default();
        let generation = match lines.get(11) {
            None => 0,
            Some(l) => l
                .parse()
                .map_err(|_| bad("line 12: generation is not a number"))?,
        };
        let (sockets_closing, releases_failed) = match lines.get(12) {
            None => (0, 0),
            Some(l) => l
                .split_once(' ')
                .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                .ok_or_else(|| bad("line 13: want two numbers"))?,
        };
        let holder = lines.get(13).copied().unwrap_or_default();
        if !holder.is_empty() && !is_holder_token(holder) {
            return Err(bad(
                "line 14: holder token is not lower-case hex of at most 64 digits",
            ));
        }
        Ok(Self {
            node,
            advertise,
            app,
            incarnation,
            state,
            classes,
            resident_actors,
            drain,
            secrets,
            capabilities,
            generation,
            sockets_closing,
            releases_failed,
            holder: holder.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Heartbeat {
        Heartbeat {
            node: NodeId::new("n1").unwrap(),
            advertise: "https://127.0.0.1:9001".into(),
            app: AppName::default_app(),
            incarnation: "3f2a".into(),
            state: NodeState::Serving,
            classes: ClassesServed::Only(
                ["chat", "counter"]
                    .into_iter()
                    .map(|c| ClassName::new(c).unwrap())
                    .collect(),
            ),
            resident_actors: 12,
            drain: DrainState::Draining,
            secrets: true,
            capabilities: [CAPABILITY_TAKE.to_owned()].into(),
            generation: 7,
            sockets_closing: 2,
            releases_failed: 1,
            holder: "0123456789abcdef".into(),
        }
    }

    #[test]
    fn heartbeat_round_trips() {
        let hb = sample();
        assert_eq!(Heartbeat::parse(&hb.to_text()).unwrap(), hb);
        assert_eq!(hb.to_text().lines().count(), 14);
    }

    #[test]
    fn heartbeat_without_line_13_reports_no_hand_over_in_progress() {
        let text: String = sample()
            .to_text()
            .lines()
            .take(12)
            .map(|l| format!("{l}\n"))
            .collect();
        let hb = Heartbeat::parse(&text).unwrap();
        assert_eq!((hb.sockets_closing, hb.releases_failed), (0, 0));
        assert_eq!(hb.generation, 7);
    }

    #[test]
    fn heartbeat_without_line_14_has_no_holder() {
        let text: String = sample()
            .to_text()
            .lines()
            .take(13)
            .map(|l| format!("{l}\n"))
            .collect();
        let hb = Heartbeat::parse(&text).unwrap();
        assert_eq!(hb.holder, "");
        assert_eq!(hb.releases_failed, 1);
    }

    #[test]
    fn older_heartbeat_without_line_11_has_no_capabilities() {
        let text: String = sample()
            .to_text()
            .lines()
            .take(10)
            .map(|l| format!("{l}\n"))
            .collect();
        let hb = Heartbeat::parse(&text).unwrap();
        assert!(!hb.has_capability(CAPABILITY_TAKE));
        assert!(hb.secrets);
        let text: String = sample()
            .to_text()
            .lines()
            .take(8)
            .map(|l| format!("{l}\n"))
            .collect();
        let hb = Heartbeat::parse(&text).unwrap();
        assert_eq!(hb.drain, DrainState::None);
        assert!(!hb.secrets);
    }

    #[test]
    fn newer_heartbeat_lines_are_ignored() {
        let text = format!("{}future line\nanother\n", sample().to_text());
        assert_eq!(Heartbeat::parse(&text).unwrap(), sample());
    }

    #[test]
    fn malformed_heartbeats_are_refused() {
        let good = sample().to_text();
        let replace = |n: usize, with: &str| {
            good.lines()
                .enumerate()
                .map(|(i, l)| {
                    if i == n {
                        with.to_owned()
                    } else {
                        l.to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        for bad in [
            String::new(),
            "garbage".into(),
            replace(0, "wasmkeep-heartbeat 2"),
            replace(1, "Bad/Node"),
            replace(5, "sleeping"),
            replace(7, "many"),
            replace(8, "maybe"),
            replace(9, "perhaps"),
            replace(11, "x"),
            replace(12, "1"),
            replace(12, "1 x"),
            replace(12, "-1 0"),
            replace(13, "ABC"),
            replace(13, "token with spaces"),
            replace(13, &"a".repeat(65)),
            good.lines().take(5).collect::<Vec<_>>().join("\n"),
        ] {
            assert!(Heartbeat::parse(&bad).is_err(), "accepted {bad:?}");
        }
    }
}
