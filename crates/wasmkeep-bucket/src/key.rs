//! Key and prefix rules shared by every backend, so code that works against
//! `memory://` also works against a folder or S3.
//!
//! A key is 1..=[`KEY_BYTES_MAX`] bytes of UTF-8, `/`-separated segments, each
//! segment 1..=[`KEY_SEGMENT_BYTES_MAX`] bytes, not `.` or `..`, with no NUL
//! and no backslash, and no leading `/`. These are the keys a folder can hold
//! without escaping its root, and every S3 server accepts them.

use crate::{Error, Result};

/// Longest key in bytes (S3's limit).
pub const KEY_BYTES_MAX: usize = 1024;
/// Longest key segment in bytes (a file name on common file systems).
pub const KEY_SEGMENT_BYTES_MAX: usize = 255;

fn invalid(key: &str, reason: &'static str) -> Error {
    Error::InvalidKey {
        key: key.to_owned(),
        reason,
    }
}

/// Checks `key` against the rules above.
pub fn validate_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(invalid(key, "empty key"));
    }
    if key.ends_with('/') {
        return Err(invalid(key, "a key must not end with '/'"));
    }
    validate_path_like(key, key)
}

/// Checks a listing prefix: like a key, but it may be empty and may end with
/// `/` (its last segment may also be a partial name).
pub fn validate_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() {
        return Ok(());
    }
    let body = prefix.strip_suffix('/').unwrap_or(prefix);
    if body.is_empty() {
        return Err(invalid(prefix, "a prefix must not start with '/'"));
    }
    validate_path_like(prefix, body)
}

fn validate_path_like(original: &str, body: &str) -> Result<()> {
    if original.len() > KEY_BYTES_MAX {
        return Err(invalid(original, "longer than 1024 bytes"));
    }
    if body.contains('\0') {
        return Err(invalid(original, "contains NUL"));
    }
    if body.contains('\\') {
        return Err(invalid(original, "contains a backslash"));
    }
    if body.starts_with('/') {
        return Err(invalid(original, "absolute (starts with '/')"));
    }
    for segment in body.split('/') {
        match segment {
            "" => return Err(invalid(original, "empty segment ('//')")),
            "." | ".." => return Err(invalid(original, "'.' or '..' segment")),
            s if s.len() > KEY_SEGMENT_BYTES_MAX => {
                return Err(invalid(original, "a segment is longer than 255 bytes"));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_keys_are_accepted() {
        for key in [
            "a",
            "apps/default/nodes/n1",
            "a/b.c/d-e_f",
            "ünï/cödé",
            "a/.hidden",
        ] {
            assert!(validate_key(key).is_ok(), "{key}");
        }
    }

    #[test]
    fn escaping_or_malformed_keys_are_refused() {
        let long_segment = "x".repeat(256);
        let long_key = "y/".repeat(600);
        for key in [
            "",
            "/abs",
            "a//b",
            "a/../b",
            "..",
            ".",
            "a/./b",
            "a\\b",
            "a\0b",
            "a/",
            &long_segment,
            &long_key,
        ] {
            assert!(
                matches!(validate_key(key), Err(Error::InvalidKey { .. })),
                "{key:?}"
            );
        }
    }

    #[test]
    fn each_fault_is_named_and_the_first_in_order_wins() {
        let reason = |key: &str| match validate_key(key) {
            Err(Error::InvalidKey { reason, .. }) => reason,
            other => panic!("{key:?}: {other:?}"),
        };
        let long_segment = format!("a/{}/b", "x".repeat(256));
        for (key, want) in [
            ("a\0b", "contains NUL"),
            ("a\\b", "contains a backslash"),
            ("/a", "absolute (starts with '/')"),
            ("a//b", "empty segment ('//')"),
            ("a/../b", "'.' or '..' segment"),
            ("a/.", "'.' or '..' segment"),
            (long_segment.as_str(), "a segment is longer than 255 bytes"),
            // Several faults: NUL, then backslash, then absolute, then the
            // first bad segment.
            ("/a\\b/..\0", "contains NUL"),
            ("/a\\b/..", "contains a backslash"),
            ("/a/../b", "absolute (starts with '/')"),
            ("a/../b//c", "'.' or '..' segment"),
        ] {
            assert_eq!(reason(key), want, "{key:?}");
        }
        let longest_segment = format!("a/{}/b", "x".repeat(KEY_SEGMENT_BYTES_MAX));
        assert!(validate_key(&longest_segment).is_ok());
        assert!(validate_key("\u{00e9}/\u{1f600}/..x").is_ok());
    }

    #[test]
    fn prefixes_may_be_empty_or_end_with_slash() {
        for prefix in ["", "a/", "a/b", "apps/x/own"] {
            assert!(validate_prefix(prefix).is_ok(), "{prefix}");
        }
        for prefix in ["/", "/a", "a//", "../", "a/../"] {
            assert!(validate_prefix(prefix).is_err(), "{prefix:?}");
        }
    }
}
