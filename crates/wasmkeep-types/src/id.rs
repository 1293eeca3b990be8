//! Names and ids: apps, tenants, classes, nodes and actors.
//!
//! Apps, tenants, classes and nodes are short lower-case words because they
//! appear verbatim in bucket keys and URLs. An actor's name is any UTF-8
//! string up to [`ACTOR_NAME_BYTES_MAX`] bytes: it is hex-encoded in keys,
//! as one key segment, which a folder bucket makes a file name (at most 255
//! bytes on common file systems): ADR 0052.

use std::fmt;

use crate::Error;

/// Longest app, tenant, class or node name, in bytes.
pub const WORD_BYTES_MAX: usize = 63;
/// Longest actor name, in bytes of UTF-8: its hex (two characters a byte)
/// fits one 255-byte key segment (ADR 0052).
pub const ACTOR_NAME_BYTES_MAX: usize = 127;

/// Checks a short word: `[a-z0-9][a-z0-9_-]*`, at most 63 bytes. `extra`
/// admits more characters (node ids may contain `.`).
fn check_word(what: &'static str, value: &str, extra: &[u8]) -> Result<(), Error> {
    let invalid = |reason| Error::InvalidName {
        what,
        value: value.to_owned(),
        reason,
    };
    if value.is_empty() {
        return Err(invalid("must not be empty"));
    }
    if value.len() > WORD_BYTES_MAX {
        return Err(invalid("longer than 63 bytes"));
    }
    let bytes = value.as_bytes();
    if !(bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit()) {
        return Err(invalid("must start with a lower-case letter or a digit"));
    }
    let allowed = |b: &u8| {
        b.is_ascii_lowercase()
            || b.is_ascii_digit()
            || *b == b'-'
            || *b == b'_'
            || extra.contains(b)
    };
    if !bytes.iter().all(allowed) {
        return Err(invalid(
            "may contain only lower-case letters, digits, '-' and '_'",
        ));
    }
    Ok(())
}

macro_rules! word_type {
    ($(#[$doc:meta])* $name:ident, $what:literal, $extra:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            pub fn new(value: impl Into<String>) -> Result<Self, Error> {
                let value = value.into();
                check_word($what, &value, $extra)?;
                Ok(Self(value))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self, Error> {
                Self::new(s)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

word_type!(
    /// A deployment unit: classes, secrets and tenants live under `apps/<app>/`.
    AppName, "app name", b""
);
word_type!(
    /// An isolated customer namespace inside an app.
    TenantName, "tenant name", b""
);
word_type!(
    /// One deployed component, e.g. `counter`.
    ClassName, "class name", b""
);
word_type!(
    /// A node's stable id (its incarnation changes at every start).
    NodeId, "node id", b"."
);

impl AppName {
    /// The app every command uses unless `--app` says otherwise.
    pub fn default_app() -> Self {
        Self("default".to_owned())
    }
}

/// `TENANT/CLASS/NAME`: one actor.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActorId {
    pub tenant: TenantName,
    pub class: ClassName,
    name: String,
}

impl ActorId {
    pub fn new(
        tenant: TenantName,
        class: ClassName,
        name: impl Into<String>,
    ) -> Result<Self, Error> {
        let name = name.into();
        check_actor_name(&name)?;
        Ok(Self {
            tenant,
            class,
            name,
        })
    }

    /// Parses `TENANT/CLASS/NAME`; the name is everything after the second `/`.
    pub fn parse(value: &str) -> Result<Self, Error> {
        let mut parts = value.splitn(3, '/');
        let (Some(tenant), Some(class), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(Error::InvalidName {
                what: "actor id",
                value: value.to_owned(),
                reason: "must be TENANT/CLASS/NAME",
            });
        };
        Self::new(TenantName::new(tenant)?, ClassName::new(class)?, name)
    }

    /// Builds an id from the three parts of a bucket key, the name hex-encoded.
    pub fn from_key_parts(tenant: &str, class: &str, name_hex: &str) -> Result<Self, Error> {
        let bytes = hex::decode(name_hex).map_err(|_| Error::InvalidName {
            what: "actor name hex",
            value: name_hex.to_owned(),
            reason: "is not hexadecimal",
        })?;
        let name = String::from_utf8(bytes).map_err(|_| Error::InvalidName {
            what: "actor name hex",
            value: name_hex.to_owned(),
            reason: "does not decode to UTF-8",
        })?;
        Self::new(TenantName::new(tenant)?, ClassName::new(class)?, name)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name as it appears in bucket keys.
    pub fn name_hex(&self) -> String {
        hex::encode(self.name.as_bytes())
    }
}

impl fmt::Display for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.tenant, self.class, self.name)
    }
}

fn check_actor_name(name: &str) -> Result<(), Error> {
    let invalid = |reason| Error::InvalidName {
        what: "actor name",
        value: name.chars().take(80).collect(),
        reason,
    };
    if name.is_empty() {
        return Err(invalid("must not be empty"));
    }
    if name.len() > ACTOR_NAME_BYTES_MAX {
        return Err(invalid("longer than 127 bytes"));
    }
    if name.chars().any(char::is_control) {
        return Err(invalid("must not contain control characters"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_accept_lower_case_digits_dash_underscore() {
        assert!(TenantName::new("acme-1_x").is_ok());
        assert!(NodeId::new("node-1.eu").is_ok());
        assert!(AppName::new("default").is_ok());
    }

    #[test]
    fn words_refuse_what_would_break_keys() {
        for bad in ["", "A", "a/b", "..", "-a", "a b", "a\0", &"x".repeat(64)] {
            assert!(TenantName::new(bad).is_err(), "{bad:?} accepted");
        }
        assert!(TenantName::new("a.b").is_err());
        assert!(NodeId::new("a/b").is_err());
    }

    #[test]
    fn actor_id_parses_and_round_trips_through_hex() {
        let id = ActorId::parse("acme/counter/a/b c").unwrap();
        assert_eq!(id.name(), "a/b c");
        assert_eq!(id.to_string(), "acme/counter/a/b c");
        let back = ActorId::from_key_parts("acme", "counter", &id.name_hex()).unwrap();
        assert_eq!(back, id);
    }

    #[test]
    fn actor_names_have_limits() {
        assert!(ActorId::parse("t/c/").is_err());
        assert!(ActorId::parse("t/c").is_err());
        // "é" is two bytes: 127 bytes pass, 128 do not.
        assert!(ActorId::parse(&format!("t/c/{}", "é".repeat(64))).is_err());
        assert!(ActorId::parse(&format!("t/c/x{}", "é".repeat(63))).is_ok());
        let too_long = ActorId::parse(&format!("t/c/{}", "x".repeat(128)))
            .expect_err("128 bytes")
            .to_string();
        assert!(too_long.contains("longer than 127 bytes"), "{too_long}");
        assert!(ActorId::parse("t/c/a\nb").is_err());
        assert!(ActorId::from_key_parts("t", "c", "zz").is_err());
        assert!(ActorId::from_key_parts("t", "c", "ff").is_err());
    }
}
