//! Network namespaces for the partition tests (ADR 0074): each node, and
//! the bucket, in a namespace of its own on a bridge in the test's (root)
//! namespace, so that links can be cut and healed while the processes run.
//!
//! One test's network is `10.77.K.0/24`, where `K` is claimed by creating
//! the bridge `wkpK` (creating a link is atomic: two tests never share a
//! `K`). On the bridge the test has `10.77.K.1` (its clients); the bucket's
//! namespace `wkpKb` has `10.77.K.2`, where the test's proxy to the S3
//! server (which listens on loopback) accepts connections; node `i`'s
//! namespace `wkpKnI` has `10.77.K.(10+i)`. Each namespace reaches the
//! bridge through a veth pair. Traffic between namespaces crosses the
//! bridge and never the test's own routing.
//!
//! A cut drops packets where they arrive: a `blackhole` policy rule
//! `from SENDER` in the receiver's namespace, so the sender's packets leave
//! and are lost, silently, as on a broken link (a rule at the sender would
//! fail its connects at once, which no real partition does). The kernel
//! drops such a packet without a word (no ICMP: forwarding is off). For the
//! rules to see every packet, the namespace's `local` table is moved after
//! them (it answers first by default) and TCP's early demultiplexing is off
//! (it would route packets of established connections past them). Every namespace
//! knows every other's link address (static neighbours): answering an ARP
//! request checks the route back to its sender, which the rule fails, so a
//! cut would otherwise end in "host unreachable" once the neighbour entry
//! expires, where a routed path's packets vanish beyond the first hop.
//! Rules need no kernel module beyond the routing every kernel has; tc
//! filters do.
//!
//! Dropping a [`Net`] deletes the links, the namespaces and the bridge, also
//! when the test panics; the processes inside must be stopped first (the
//! runner kills its nodes before its fields drop). The links go first and
//! at once: a namespace outlives its name while sockets of killed nodes
//! still resend into a cut (for minutes), and its veth pair with it.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, bail};
use parking_lot::Mutex;

/// The first two octets of every test network.
const NET_PREFIX: [u8; 2] = [10, 77];
/// The host part of the test's own address on the bridge.
const CLIENT_HOST: u8 = 1;
/// The host part of the bucket's address.
const BUCKET_HOST: u8 = 2;
/// The host part of node 0's address.
const NODE_HOST_FIRST: u8 = 10;
/// Most nodes on one network.
pub const NODES_MAX: usize = 100;
/// The preference of cut rules: before the `local` table, moved to
/// [`LOCAL_RULE_PREF`].
const CUT_RULE_PREF: &str = "10";
const LOCAL_RULE_PREF: &str = "100";
/// Where `ip netns` keeps a namespace's handle.
const NETNS_DIR: &str = "/run/netns";

/// Why the partition tests cannot run here, if they cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: a plain syscall without arguments.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces need CAP_NET_ADMIN)".to_owned());
    }
    match Command::new("ip").args(["netns", "list"]).output() {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!(
            "`ip netns list` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Some(format!("`ip` (iproute2) cannot run: {e}")),
    }
}

/// Runs `ip ARGS`; an error carries its stderr.
fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .with_context(|| format!("running ip {args:?}"))?;
    if !out.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The alias of a test's bridge, before the test process's id.
const OWNER_ALIAS: &str = "wasmkeep-partition-test pid ";

/// Removes the network of `bridge` if the process that made it is gone
/// (killed before its cleanup ran): the bridge, and the namespaces and
/// links named after it.
fn remove_if_abandoned(bridge: &str) {
    let Ok(alias) = std::fs::read_to_string(format!("/sys/class/net/{bridge}/ifalias")) else {
        return;
    };
    let Some(pid) = alias.trim().strip_prefix(OWNER_ALIAS) else {
        return;
    };
    if pid.parse::<u32>().is_err() || Path::new(&format!("/proc/{pid}")).exists() {
        return;
    }
    let ours = |name: &str| {
        name.strip_prefix(bridge).is_some_and(|rest| {
            rest == "b"
                || rest
                    .strip_prefix('n')
                    .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
        })
    };
    let names: Vec<String> = std::fs::read_dir(NETNS_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| ours(name))
        .collect();
    for name in names {
        let _ = ip(&["link", "del", &name]);
        let _ = ip(&["netns", "del", &name]);
    }
    let _ = ip(&["link", "del", bridge]);
}

/// Runs `f` on a thread of its own inside the namespace `handle` refers
/// to (setns moves the calling thread only); the thread ends with `f`.
/// What `f` opens there stays there: a socket, a file of /proc/sys/net.
fn in_namespace<T: Send>(
    handle: &std::fs::File,
    f: impl FnOnce() -> anyhow::Result<T> + Send,
) -> anyhow::Result<T> {
    let handle = handle.as_raw_fd();
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: a plain syscall on an open namespace handle; it
                // moves this short-lived thread alone.
                if unsafe { libc::setns(handle, libc::CLONE_NEWNET) } != 0 {
                    bail!("entering a namespace: {}", std::io::Error::last_os_error());
                }
                f()
            })
            .join()
            .map_err(|_| anyhow::anyhow!("a thread inside a namespace panicked"))?
    })
}

/// Namespace settings a cut relies on (`/proc/sys/` paths, values):
/// every packet of a connection goes through the routing rules.
const SETTINGS: [(&str, &str); 1] = [("net/ipv4/tcp_early_demux", "0")];

/// Which packets of a node a cut drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// Both directions.
    Both,
    /// What the node sends.
    Out,
    /// What the node receives.
    In,
}

/// Where a namespace's packets come from or go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Node(usize),
    Bucket,
}

/// One namespace of the network.
#[derive(Debug)]
struct Namespace {
    name: String,
    /// Open while the [`Net`] lives: processes and threads enter it.
    handle: std::fs::File,
}

/// The namespaces, links and addresses of one test.
#[derive(Debug)]
pub struct Net {
    /// `K` of `10.77.K.0/24`.
    subnet: u8,
    bridge: String,
    /// The nodes' namespaces, by node.
    nodes: Vec<Namespace>,
    bucket: Option<Namespace>,
    /// Cuts in force: the receiving end and the sender dropped there.
    cuts: Mutex<Vec<(End, End)>>,
}

impl Net {
    /// Claims a free `10.77.K.0/24` and sets up the bucket's namespace and
    /// `nodes` nodes' namespaces on it.
    pub fn create(nodes: usize) -> anyhow::Result<Net> {
        anyhow::ensure!(
            (1..=NODES_MAX).contains(&nodes),
            "{nodes} nodes: 1 to {NODES_MAX}"
        );
        let mut net = Net::claim()?;
        ip(&[
            "addr",
            "add",
            &format!("{}/24", net.addr(CLIENT_HOST)),
            "dev",
            &net.bridge,
        ])?;
        ip(&["link", "set", &net.bridge, "up"])?;
        net.add_namespace(End::Bucket)
            .context("setting up the bucket's namespace")?;
        for i in 0..nodes {
            net.add_namespace(End::Node(i))
                .with_context(|| format!("setting up the namespace of node {i}"))?;
        }
        let ends: Vec<End> = (0..nodes).map(End::Node).chain([End::Bucket]).collect();
        for &here in &ends {
            for &there in ends.iter().filter(|&&e| e != here) {
                let addr = net.end_addr(there).to_string();
                let mac = net.mac(net.end_addr(there));
                ip(&[
                    "-n",
                    &net.namespace(here).name,
                    "neigh",
                    "replace",
                    &addr,
                    "lladdr",
                    &mac,
                    "dev",
                    "eth0",
                    "nud",
                    "permanent",
                ])?;
            }
        }
        Ok(net)
    }

    /// The link address of the interface holding `addr`: locally
    /// administered, unique on the bridge.
    fn mac(&self, addr: Ipv4Addr) -> String {
        format!("02:77:{:02x}:00:00:{:02x}", self.subnet, addr.octets()[3])
    }

    /// Creates the bridge of the first free `K`, starting from one the
    /// process id and a count of this process's networks pick, so that
    /// tests running at once rarely try the same one, and one test does not
    /// take the `K` the one before it just gave back.
    fn claim() -> anyhow::Result<Net> {
        static CLAIMED: AtomicUsize = AtomicUsize::new(0);
        let start = (std::process::id() as usize)
            .wrapping_mul(13)
            .wrapping_add(CLAIMED.fetch_add(1, Ordering::Relaxed) * 29);
        let mut last = None;
        for step in 0..=usize::from(u8::MAX) {
            let subnet = u8::try_from(start.wrapping_add(step) % 256).expect("below 256");
            let bridge = format!("wkp{subnet}");
            remove_if_abandoned(&bridge);
            match ip(&["link", "add", &bridge, "type", "bridge"]) {
                Ok(()) => {
                    // Who owns it, for a later test to find it abandoned.
                    let owner = format!("{OWNER_ALIAS}{}", std::process::id());
                    ip(&["link", "set", &bridge, "alias", &owner])?;
                    let net = Net {
                        subnet,
                        bridge,
                        nodes: Vec::new(),
                        bucket: None,
                        cuts: Mutex::new(Vec::new()),
                    };
                    // Someone else's addresses in the range: leave it to
                    // them (dropping `net` deletes the bridge again).
                    if net.range_is_free()? {
                        return Ok(net);
                    }
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last
            .unwrap_or_else(|| anyhow::anyhow!("no subnet tried"))
            .context("no free 10.77.K.0/24 (every bridge wkpK exists)"))
    }

    fn range_is_free(&self) -> anyhow::Result<bool> {
        let range = format!("{}/24", self.addr(0));
        let out = Command::new("ip")
            .args(["-o", "-4", "addr", "show", "to", &range])
            .output()
            .context("listing addresses")?;
        Ok(out.status.success() && out.stdout.is_empty())
    }

    /// The namespace of `end` (`wkpKnI`, `wkpKb`), with its address on a
    /// veth pair to the bridge.
    fn add_namespace(&mut self, end: End) -> anyhow::Result<()> {
        let name = match end {
            End::Node(i) => format!("{}n{i}", self.bridge),
            End::Bucket => format!("{}b", self.bridge),
        };
        // A namespace or link of this name is left by a test killed before
        // its cleanup: the bridge, claimed just now, says nobody else uses it.
        let _ = ip(&["link", "del", &name]);
        let _ = ip(&["netns", "del", &name]);
        ip(&["netns", "add", &name])?;
        let handle = std::fs::File::open(format!("{NETNS_DIR}/{name}"));
        let handle = match handle {
            Ok(handle) => handle,
            Err(e) => {
                let _ = ip(&["netns", "del", &name]);
                return Err(e).with_context(|| format!("opening {NETNS_DIR}/{name}"));
            }
        };
        // Kept from here on, so that a failure below still removes it.
        let namespace = Namespace { name, handle };
        match end {
            End::Node(_) => self.nodes.push(namespace),
            End::Bucket => self.bucket = Some(namespace),
        }
        let name = self.namespace(end).name.as_str();
        let addr = self.end_addr(end);
        // The veth's outer end is named like the namespace.
        let mac = self.mac(addr);
        ip(&[
            "link", "add", name, "type", "veth", "peer", "name", "eth0", "address", &mac, "netns",
            name,
        ])?;
        ip(&["link", "set", name, "master", &self.bridge, "up"])?;
        let addr = format!("{addr}/24");
        for args in [
            &["link", "set", "lo", "up"][..],
            &["addr", "add", &addr, "dev", "eth0"],
            &["link", "set", "eth0", "up"],
            &["rule", "add", "pref", LOCAL_RULE_PREF, "lookup", "local"],
            &["rule", "del", "pref", "0"],
        ] {
            let mut all = vec!["-n", name];
            all.extend_from_slice(args);
            ip(&all)?;
        }
        in_namespace(&self.namespace(end).handle, || {
            for (setting, value) in SETTINGS {
                let path = format!("/proc/sys/{setting}");
                std::fs::write(&path, value).with_context(|| format!("writing {path}"))?;
            }
            Ok(())
        })
    }

    fn addr(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(NET_PREFIX[0], NET_PREFIX[1], self.subnet, host)
    }

    /// The bucket's address.
    pub fn bucket_addr(&self) -> Ipv4Addr {
        self.addr(BUCKET_HOST)
    }

    /// Node `i`'s address, in its namespace.
    pub fn node_addr(&self, i: usize) -> Ipv4Addr {
        let i = u8::try_from(i).expect("at most NODES_MAX nodes");
        self.addr(NODE_HOST_FIRST + i)
    }

    fn end_addr(&self, end: End) -> Ipv4Addr {
        match end {
            End::Node(i) => self.node_addr(i),
            End::Bucket => self.bucket_addr(),
        }
    }

    fn namespace(&self, end: End) -> &Namespace {
        match end {
            End::Node(i) => &self.nodes[i],
            End::Bucket => self.bucket.as_ref().expect("created with the net"),
        }
    }

    /// The namespace handle a process of node `i` enters (`setns`); open
    /// as long as the [`Net`] lives.
    pub fn handle(&self, i: usize) -> RawFd {
        self.nodes[i].handle.as_raw_fd()
    }

    /// A listener on a free port of the bucket's address, inside its
    /// namespace (a socket stays in the namespace it was made in, whichever
    /// thread then uses it).
    pub fn bucket_listener(&self) -> anyhow::Result<std::net::TcpListener> {
        let addr = SocketAddr::from((self.bucket_addr(), 0));
        in_namespace(&self.namespace(End::Bucket).handle, || {
            let listener = std::net::TcpListener::bind(addr)
                .with_context(|| format!("binding {addr} in the bucket's namespace"))?;
            listener
                .set_nonblocking(true)
                .context("a non-blocking listener")?;
            Ok(listener)
        })
    }

    /// Cuts node `i` off from the bucket.
    pub fn cut_bucket(&self, i: usize, way: Way) -> anyhow::Result<()> {
        self.cut(End::Node(i), End::Bucket, way)
    }

    /// Cuts node `i` off from node `j` (`Way::Out`: what `i` sends to `j`).
    pub fn cut_peer(&self, i: usize, j: usize, way: Way) -> anyhow::Result<()> {
        anyhow::ensure!(i != j, "a node is not cut from itself");
        self.cut(End::Node(i), End::Node(j), way)
    }

    /// Drops what `a` sends `b` (`Way::Out`), what it receives from `b`
    /// (`In`), or both, each where it arrives.
    fn cut(&self, a: End, b: End, way: Way) -> anyhow::Result<()> {
        let drops: &[(End, End)] = match way {
            Way::Both => &[(b, a), (a, b)],
            Way::Out => &[(b, a)],
            Way::In => &[(a, b)],
        };
        let mut cuts = self.cuts.lock();
        for &drop in drops {
            if !cuts.contains(&drop) {
                self.rule("add", drop)?;
                cuts.push(drop);
            }
        }
        Ok(())
    }

    /// Heals every cut.
    pub fn heal(&self) -> anyhow::Result<()> {
        let mut cuts = self.cuts.lock();
        while let Some(drop) = cuts.pop() {
            if let Err(e) = self.rule("del", drop) {
                cuts.push(drop);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Adds or deletes the rule dropping, at `receiver`, what `sender` sends.
    fn rule(&self, verb: &str, (receiver, sender): (End, End)) -> anyhow::Result<()> {
        let from = format!("{}/32", self.end_addr(sender));
        ip(&[
            "-n",
            &self.namespace(receiver).name,
            "rule",
            verb,
            "pref",
            CUT_RULE_PREF,
            "from",
            &from,
            "blackhole",
        ])
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.nodes.iter().chain(&self.bucket) {
            // Deleting the outer end deletes the pair (it may not exist yet).
            let _ = ip(&["link", "del", &ns.name]);
            if let Err(e) = ip(&["netns", "del", &ns.name]) {
                eprintln!("removing the test's namespace: {e:#}");
            }
        }
        if let Err(e) = ip(&["link", "del", &self.bridge]) {
            eprintln!("removing the test's bridge: {e:#}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A network whose maker is gone is removed whole; one whose maker
    /// lives is left alone.
    #[test]
    fn an_abandoned_network_is_removed_and_a_live_one_kept() {
        if let Some(why) = unavailable() {
            assert!(
                std::env::var("WASMKEEP_REQUIRE_NETNS").as_deref() != Ok("1"),
                "WASMKEEP_REQUIRE_NETNS=1 but: {why}"
            );
            eprintln!("!!!!! SKIPPED: {why} !!!!!");
            return;
        }
        let bridge = format!("wkpz{}", std::process::id() % 100_000);
        let exists = |name: &str| Path::new(&format!("/sys/class/net/{name}")).exists();
        let named = |name: &str| Path::new(&format!("{NETNS_DIR}/{name}")).exists();
        let make = |owner: u32| {
            ip(&["link", "add", &bridge, "type", "bridge"]).expect("a bridge");
            let alias = format!("{OWNER_ALIAS}{owner}");
            ip(&["link", "set", &bridge, "alias", &alias]).expect("its alias");
            for suffix in ["b", "n0"] {
                let name = format!("{bridge}{suffix}");
                ip(&["netns", "add", &name]).expect("a namespace");
                ip(&[
                    "link", "add", &name, "type", "veth", "peer", "name", "eth0", "netns", &name,
                ])
                .expect("a veth pair");
            }
        };
        // A process that has exited: its id names nobody (for now).
        let mut gone = Command::new("true").spawn().expect("spawning true");
        gone.wait().expect("reaping true");
        make(gone.id());
        remove_if_abandoned(&bridge);
        for name in [bridge.clone(), format!("{bridge}b"), format!("{bridge}n0")] {
            assert!(!exists(&name) && !named(&name), "{name} is left");
        }
        make(std::process::id());
        remove_if_abandoned(&bridge);
        let kept = exists(&bridge) && named(&format!("{bridge}n0"));
        for suffix in ["b", "n0"] {
            let _ = ip(&["link", "del", &format!("{bridge}{suffix}")]);
            let _ = ip(&["netns", "del", &format!("{bridge}{suffix}")]);
        }
        let _ = ip(&["link", "del", &bridge]);
        assert!(kept, "a live process's network was removed");
    }
}
