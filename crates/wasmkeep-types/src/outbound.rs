//! A class's outbound allow-list (ADR 0066): which hosts its actors may
//! reach over HTTP. Nothing is allowed by default. An entry is
//! `HOST[:PORT]`:
//!
//! - HOST is a DNS name (`api.example.com`), a name with a `*.` prefix
//!   (`*.example.com`: every name under it, not the name itself), `*` (every
//!   name), an IP address (`127.0.0.1`, `[::1]`) or an IP network
//!   (`10.0.0.0/8`, `[fd00::/8]`);
//! - PORT is a number, or `*` for every port; without it, only the scheme's
//!   own port (80 for http, 443 for https).
//!
//! Two checks, both needed: the URL's host must match an entry, and every
//! address the host resolves to and that the node connects to must be public
//! or lie in an entry's address or network. So a name on the list cannot
//! lead to a loopback, private or link-local address through DNS unless the
//! operator listed that address too.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

use crate::Error;

/// Most entries one class may list.
pub const ENTRIES_MAX: usize = 64;

/// Longest entry (a DNS name is at most 253 bytes, plus a port).
const ENTRY_BYTES_MAX: usize = 300;

/// A class's allow-list; empty allows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<Entry>,
}

/// One `HOST[:PORT]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    host: HostPattern,
    port: PortRule,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// `*`: every name and every address.
    Any,
    /// A name, lower case.
    Name(String),
    /// `*.suffix`: names ending in `.suffix` (kept without the `*.`).
    Under(String),
    /// An address (a network of one) or a network.
    Net(IpNet),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortRule {
    /// The scheme's own port: 80 for http, 443 for https.
    SchemeDefault,
    Port(u16),
    Any,
}

fn invalid(value: &str, reason: &'static str) -> Error {
    Error::InvalidName {
        what: "outbound allow-list entry",
        value: value.to_owned(),
        reason,
    }
}

impl FromStr for Entry {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        if text.is_empty() || text.len() > ENTRY_BYTES_MAX {
            return Err(invalid(text, "write HOST[:PORT], at most 300 bytes"));
        }
        if text.contains("://") {
            return Err(invalid(
                text,
                "write HOST[:PORT], without a scheme or a path",
            ));
        }
        let (host, port) = split_host_port(text)?;
        let port = match port {
            None => PortRule::SchemeDefault,
            Some("*") => PortRule::Any,
            Some(port) => match port.parse::<u16>() {
                Ok(0) | Err(_) => return Err(invalid(text, "the port must be 1 to 65535 or *")),
                Ok(port) => PortRule::Port(port),
            },
        };
        let host = parse_host(text, host)?;
        Ok(Self { host, port })
    }
}

/// Splits `host`, `host:port`, `[v6]`, `[v6]:port`, `[v6/len]:port`.
fn split_host_port(text: &str) -> Result<(&str, Option<&str>), Error> {
    if let Some(rest) = text.strip_prefix('[') {
        let (inner, after) = rest
            .split_once(']')
            .ok_or_else(|| invalid(text, "an IPv6 address in [ ] lacks its ]"))?;
        return match after {
            "" => Ok((inner, None)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((inner, Some(port))),
                None => Err(invalid(text, "only :PORT may follow an IPv6 address")),
            },
        };
    }
    match text.split_once(':') {
        Some((_, port)) if port.contains(':') => Err(invalid(
            text,
            "write an IPv6 address in brackets: [::1]:8080",
        )),
        Some((host, port)) => Ok((host, Some(port))),
        None => Ok((text, None)),
    }
}

fn parse_host(text: &str, host: &str) -> Result<HostPattern, Error> {
    if host == "*" {
        return Ok(HostPattern::Any);
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(HostPattern::Net(IpNet::from(ip)));
    }
    if let Some((addr, _)) = host.split_once('/') {
        if addr.parse::<IpAddr>().is_err() {
            return Err(invalid(
                text,
                "write HOST[:PORT], without a scheme or a path",
            ));
        }
        let net = host
            .parse::<IpNet>()
            .map_err(|_| invalid(text, "not an IP network such as 10.0.0.0/8"))?;
        if net.trunc() != net {
            return Err(invalid(
                text,
                "the network has bits set past its prefix length (write 10.0.0.0/8, not 10.1.2.3/8)",
            ));
        }
        return Ok(HostPattern::Net(net));
    }
    let (under, name) = match host.strip_prefix("*.") {
        Some(name) => (true, name),
        None => (false, host),
    };
    check_dns_name(text, name)?;
    let name = name.to_ascii_lowercase();
    Ok(if under {
        HostPattern::Under(name)
    } else {
        HostPattern::Name(name)
    })
}

/// A DNS name: dot-separated labels of letters, digits and `-` (not at a
/// label's ends), 1 to 63 bytes each, at most 253 in all.
fn check_dns_name(text: &str, name: &str) -> Result<(), Error> {
    if name.is_empty() || name.len() > 253 {
        return Err(invalid(text, "a host name has 1 to 253 bytes"));
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(invalid(
                text,
                "a host name is dot-separated labels of letters, digits and - (a * only as a leading *.)",
            ));
        }
    }
    Ok(())
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bracket = matches!(&self.host, HostPattern::Net(net) if net.addr().is_ipv6());
        match &self.host {
            HostPattern::Any => f.write_str("*")?,
            HostPattern::Name(name) => f.write_str(name)?,
            HostPattern::Under(name) => write!(f, "*.{name}")?,
            HostPattern::Net(net) if bracket => {
                if net.prefix_len() == net.max_prefix_len() {
                    write!(f, "[{}]", net.addr())?
                } else {
                    write!(f, "[{net}]")?
                }
            }
            HostPattern::Net(net) => {
                if net.prefix_len() == net.max_prefix_len() {
                    write!(f, "{}", net.addr())?
                } else {
                    write!(f, "{net}")?
                }
            }
        }
        match self.port {
            PortRule::SchemeDefault => Ok(()),
            PortRule::Port(port) => write!(f, ":{port}"),
            PortRule::Any => f.write_str(":*"),
        }
    }
}

impl Entry {
    fn allows_port(&self, port: u16, scheme_port: u16) -> bool {
        match self.port {
            PortRule::SchemeDefault => port == scheme_port,
            PortRule::Port(allowed) => port == allowed,
            PortRule::Any => true,
        }
    }

    fn allows_host(&self, host: &Host<'_>) -> bool {
        match (&self.host, host) {
            (HostPattern::Any, _) => true,
            (HostPattern::Name(name), Host::Name(host)) => name == host,
            (HostPattern::Under(suffix), Host::Name(host)) => host
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            (HostPattern::Net(net), Host::Ip(ip)) => net.contains(&canonical(*ip)),
            _ => false,
        }
    }
}

/// The host of a URL: a name (lower case) or an address.
enum Host<'a> {
    Name(&'a str),
    Ip(IpAddr),
}

impl AllowList {
    /// Entries as `deploy --allow-outbound` takes them; a repeated entry is
    /// kept once.
    pub fn parse<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<Self, Error> {
        let mut list = Vec::new();
        for text in entries {
            let entry = text.trim().parse::<Entry>()?;
            if !list.contains(&entry) {
                list.push(entry);
            }
            if list.len() > ENTRIES_MAX {
                return Err(invalid(text, "a class lists at most 64 entries"));
            }
        }
        Ok(Self { entries: list })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Whether a URL's host and port are listed. `host` is the URL's host
    /// (an IPv6 address with or without its brackets); `scheme_port` is 80
    /// for http and 443 for https.
    pub fn allows_url_host(&self, host: &str, port: u16, scheme_port: u16) -> bool {
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let lower;
        let host = match bare.parse::<IpAddr>() {
            Ok(ip) => Host::Ip(ip),
            Err(_) => {
                lower = bare.trim_end_matches('.').to_ascii_lowercase();
                Host::Name(&lower)
            }
        };
        self.entries
            .iter()
            .any(|e| e.allows_host(&host) && e.allows_port(port, scheme_port))
    }

    /// Whether the node may connect to `ip`: a public address always; any
    /// other (loopback, private, link-local, ...) only when an entry lists
    /// it or its network (`*` does not).
    pub fn allows_address(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        is_public(ip)
            || self
                .entries
                .iter()
                .any(|e| matches!(&e.host, HostPattern::Net(net) if net.contains(&ip)))
    }
}

impl fmt::Display for AllowList {
    /// The entries separated by spaces; `(nothing)` for an empty list.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.entries.is_empty() {
            return f.write_str("(nothing)");
        }
        for (i, entry) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{entry}")?;
        }
        Ok(())
    }
}

/// An IPv4 address written as IPv6 (`::ffff:10.0.0.1`) is that IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether `ip` is an address of the public internet: not loopback,
/// private, shared (carrier-grade NAT), link-local, unspecified, broadcast,
/// multicast, documentation or otherwise reserved.
pub fn is_public(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 198 && (b == 18 || b == 19))
                || a >= 240)
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || v6.is_unique_local()
                || v6.is_unicast_link_local()
                || first == 0x2001 && v6.segments()[1] == 0x0db8
                || first == 0x0064 && v6.segments()[1] == 0xff9b
                || first == 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::parse(entries.iter().copied()).expect("valid entries")
    }

    #[test]
    fn entries_parse_and_print_back() {
        for text in [
            "api.example.com",
            "api.example.com:8443",
            "*.example.com",
            "*.example.com:*",
            "*",
            "127.0.0.1:8080",
            "10.0.0.0/8",
            "[::1]:9000",
            "[fd00::/8]",
        ] {
            let entry: Entry = text.parse().expect(text);
            assert_eq!(entry.to_string(), text);
        }
        assert_eq!(
            "API.Example.COM"
                .parse::<Entry>()
                .expect("valid")
                .to_string(),
            "api.example.com"
        );
    }

    #[test]
    fn malformed_entries_are_refused_with_the_rule() {
        for (text, rule) in [
            ("", "HOST[:PORT]"),
            ("https://api.example.com", "without a scheme"),
            ("api.example.com/path", "without a scheme or a path"),
            ("api.example.com:0", "1 to 65535"),
            ("api.example.com:http", "1 to 65535"),
            ("::1", "brackets"),
            ("[::1", "lacks its ]"),
            ("10.1.2.3/8", "past its prefix length"),
            ("10.0.0.0/33", "IP network"),
            ("a..b", "labels"),
            ("-a.b", "labels"),
            ("api.*.com", "labels"),
            ("ex ample.com", "labels"),
        ] {
            let error = text.parse::<Entry>().expect_err(text).to_string();
            assert!(error.contains(rule), "{text:?}: {error}");
        }
        let many: Vec<String> = (0..65).map(|i| format!("h{i}.example.com")).collect();
        assert!(AllowList::parse(many.iter().map(String::as_str)).is_err());
    }

    #[test]
    fn an_empty_list_allows_nothing() {
        let empty = AllowList::default();
        assert!(!empty.allows_url_host("example.com", 443, 443));
        assert!(!empty.allows_url_host("1.1.1.1", 443, 443));
        assert_eq!(empty.to_string(), "(nothing)");
    }

    #[test]
    fn names_ports_and_wildcards_match_as_written() {
        let allow = list(&["api.example.com", "*.hooks.example.org:*", "127.0.0.1:8080"]);
        assert!(allow.allows_url_host("api.example.com", 443, 443));
        assert!(allow.allows_url_host("API.example.com.", 80, 80));
        assert!(!allow.allows_url_host("api.example.com", 8443, 443));
        assert!(!allow.allows_url_host("evil-api.example.com", 443, 443));
        assert!(!allow.allows_url_host("api.example.com.evil.net", 443, 443));
        assert!(allow.allows_url_host("a.hooks.example.org", 9999, 443));
        assert!(allow.allows_url_host("a.b.hooks.example.org", 1, 80));
        assert!(!allow.allows_url_host("hooks.example.org", 443, 443));
        assert!(!allow.allows_url_host("xhooks.example.org", 443, 443));
        assert!(allow.allows_url_host("127.0.0.1", 8080, 80));
        assert!(!allow.allows_url_host("127.0.0.1", 8081, 80));
        assert!(!allow.allows_url_host("localhost", 8080, 80));
        assert!(list(&["[::1]:9"]).allows_url_host("[::1]", 9, 80));
        assert!(list(&["*"]).allows_url_host("anything.example", 443, 443));
        assert!(!list(&["*"]).allows_url_host("anything.example", 8443, 443));
    }

    #[test]
    fn only_public_addresses_pass_unless_listed() {
        let names_only = list(&["*", "api.example.com"]);
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd12::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            let ip: IpAddr = private.parse().expect(private);
            assert!(!is_public(ip), "{private}");
            assert!(!names_only.allows_address(ip), "{private}");
        }
        for public in [
            "1.1.1.1",
            "93.184.216.34",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            let ip: IpAddr = public.parse().expect(public);
            assert!(names_only.allows_address(ip), "{public}");
        }
        let listed = list(&["127.0.0.1:8080", "10.0.0.0/8", "[fd00::/8]"]);
        assert!(listed.allows_address("127.0.0.1".parse().expect("ip")));
        assert!(listed.allows_address("::ffff:127.0.0.1".parse().expect("ip")));
        assert!(listed.allows_address("10.200.0.9".parse().expect("ip")));
        assert!(listed.allows_address("fd12::1".parse().expect("ip")));
        assert!(!listed.allows_address("127.0.0.2".parse().expect("ip")));
        assert!(!listed.allows_address("192.168.0.1".parse().expect("ip")));
    }
}
