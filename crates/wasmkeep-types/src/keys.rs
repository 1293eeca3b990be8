//! Every bucket key wasmkeep reads or writes is built here, and nowhere else.
//!
//! ```text
//! apps/<app>/control/move/<tenant>/<class>/<name hex>/<target node>   move key (ADR 0017)
//! apps/<app>/control/drain/<node>                                     drain request (ADR 0014)
//! apps/<app>/control/delete/<tenant>/<class>/<name hex>/<request>     delete request (ADR 0055)
//! apps/<app>/control/sql/<tenant>/<class>/<name hex>/<request>        an operator's write (ADR 0065)
//! apps/<app>/control/import/<tenant>/<class>/<name hex>/<request>     an import (ADR 0069)
//! apps/<app>/control/tenant-tokens                                    every tenant needs a token (ADR 0059)
//! apps/<app>/results/sql/<tenant>/<class>/<name hex>/<request>        that write's result
//! apps/<app>/results/import/<tenant>/<class>/<name hex>/<request>     that import's result
//! apps/<app>/nodes/<node>                                             heartbeat = node lease
//! apps/<app>/owners/<tenant>/<class>/<name hex>                       ownership record
//! apps/<app>/actors/<tenant>/<class>/<name hex>/log/<seq>             actor log record
//! apps/<app>/actors/<tenant>/<class>/<name hex>/snap/<seq>            actor snapshot
//! apps/<app>/alarms/<tenant>/<class>/<name hex>                       alarm index for the sweep
//! apps/<app>/classes/<class>/current                                  deployed version (a digest)
//! apps/<app>/classes/<class>/components/<digest>                      component bytes
//! apps/<app>/secrets/<name>                                           encrypted secret (ADR 0016)
//! apps/<app>/recipient                                                the app's age recipient
//! apps/<app>/tenants/<tenant>/tokens/<digest>                         tenant token hash
//! ```
//!
//! Sequence numbers are written as 20 decimal digits so that the bucket's
//! lexicographic listing order is numeric order.

use crate::{ActorId, AppName, ClassName, Error, NodeId, TenantName};

/// Key builder for one app.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    root: String,
}

/// Width of a sequence number in a key.
const SEQ_DIGITS: usize = 20;

/// Appends `seq` in [`SEQ_DIGITS`] decimal digits, zero-padded: what
/// `format!("{seq:020}")` writes, without the formatter's padding loop (one
/// log key per record; ADR 0046).
fn push_seq(key: &mut String, mut seq: u64) {
    let mut digits = [b'0'; SEQ_DIGITS];
    for digit in digits.iter_mut().rev() {
        *digit = b'0' + (seq % 10) as u8;
        seq /= 10;
    }
    key.push_str(std::str::from_utf8(&digits).expect("ASCII digits are UTF-8"));
}

impl Keys {
    pub fn new(app: &AppName) -> Self {
        Self {
            root: format!("apps/{app}/"),
        }
    }

    /// `apps/<app>/`: everything of the app.
    pub fn app_prefix(&self) -> &str {
        &self.root
    }

    fn actor_path(actor: &ActorId) -> String {
        format!("{}/{}/{}", actor.tenant, actor.class, actor.name_hex())
    }

    // ---- control keys ----------------------------------------------------

    pub fn move_key(&self, actor: &ActorId, target: &NodeId) -> String {
        format!(
            "{}control/move/{}/{target}",
            self.root,
            Self::actor_path(actor)
        )
    }

    /// Every operator command's key: the move, delete and drain keys and
    /// the tenant-token policy. A node lists it once per heartbeat.
    pub fn control_prefix(&self) -> String {
        format!("{}control/", self.root)
    }

    pub fn moves_prefix(&self) -> String {
        format!("{}control/move/", self.root)
    }

    /// Parses a key listed under [`Keys::moves_prefix`].
    pub fn parse_move_key(&self, key: &str) -> Result<(ActorId, NodeId), Error> {
        let rest = self.strip(key, &self.moves_prefix())?;
        let parts: Vec<&str> = rest.split('/').collect();
        let [tenant, class, name_hex, target] = parts[..] else {
            return Err(invalid(
                key,
                "want <tenant>/<class>/<name hex>/<target node>",
            ));
        };
        let actor = ActorId::from_key_parts(tenant, class, name_hex)
            .map_err(|_| invalid(key, "actor id does not parse"))?;
        let target =
            NodeId::new(target).map_err(|_| invalid(key, "target node id does not parse"))?;
        Ok((actor, target))
    }

    /// `control/delete/<tenant>/<class>/<name hex>/<request>`: `wasmkeep
    /// actor delete` asks for the actor's data to be deleted (ADR 0055).
    /// Every request has a key of its own (`request`: [`DELETE_REQUEST_MAX`]
    /// lower-case hex digits at most), so that a node that removes the
    /// request it carried out can never remove a later one for the same
    /// actor, however late its removal lands; S3 has no conditional delete
    /// that could tell them apart under one key.
    pub fn delete_key(&self, actor: &ActorId, request: &str) -> Result<String, Error> {
        request_key(
            format!("{}{request}", self.delete_requests_prefix(actor)),
            request,
        )
    }

    /// Every delete request of one actor.
    pub fn delete_requests_prefix(&self, actor: &ActorId) -> String {
        format!("{}{}/", self.deletes_prefix(), Self::actor_path(actor))
    }

    pub fn deletes_prefix(&self) -> String {
        format!("{}control/delete/", self.root)
    }

    /// Parses a key listed under [`Keys::deletes_prefix`] into the actor it
    /// deletes. A key of a version before per-request keys (no `<request>`
    /// segment) still names its actor: a delete asked before an upgrade is
    /// carried out after it.
    pub fn parse_delete_key(&self, key: &str) -> Result<ActorId, Error> {
        let rest = self.strip(key, &self.deletes_prefix())?;
        let parts: Vec<&str> = rest.split('/').collect();
        let (tenant, class, name_hex) = match parts[..] {
            [tenant, class, name_hex] => (tenant, class, name_hex),
            [tenant, class, name_hex, request] if is_delete_request(request) => {
                (tenant, class, name_hex)
            }
            [_, _, _, _] => {
                return Err(invalid(key, "the request is 1 to 32 lower-case hex digits"));
            }
            _ => return Err(invalid(key, "want <tenant>/<class>/<name hex>/<request>")),
        };
        ActorId::from_key_parts(tenant, class, name_hex)
            .map_err(|_| invalid(key, "actor id does not parse"))
    }

    /// `control/sql/<tenant>/<class>/<name hex>/<request>`: `wasmkeep actor
    /// sql --write` asks the actor's holder to run the statement in the
    /// key's body as one event (ADR 0065, amended). `request` as for
    /// [`Keys::delete_key`].
    pub fn sql_key(&self, actor: &ActorId, request: &str) -> Result<String, Error> {
        request_key(
            format!(
                "{}{}/{request}",
                self.sqls_prefix(),
                Self::actor_path(actor)
            ),
            request,
        )
    }

    pub fn sqls_prefix(&self) -> String {
        format!("{}control/sql/", self.root)
    }

    /// Parses a key listed under [`Keys::sqls_prefix`] into the actor and
    /// the request.
    pub fn parse_sql_key(&self, key: &str) -> Result<(ActorId, String), Error> {
        parse_request_key(key, self.strip(key, &self.sqls_prefix())?)
    }

    /// `results/sql/<tenant>/<class>/<name hex>/<request>`: what the
    /// statement of [`Keys::sql_key`] returned, written by the node that
    /// ran it, read and removed by the command. Outside `control/`: the
    /// heartbeat's listing does not carry it.
    pub fn sql_result_key(&self, actor: &ActorId, request: &str) -> Result<String, Error> {
        request_key(
            format!(
                "{}results/sql/{}/{request}",
                self.root,
                Self::actor_path(actor)
            ),
            request,
        )
    }

    /// `control/import/<tenant>/<class>/<name hex>/<request>`: `wasmkeep
    /// actor import` asks for a database to take the actor's data's place
    /// (ADR 0069); the body says how, then holds the file. `request` as for
    /// [`Keys::delete_key`].
    pub fn import_key(&self, actor: &ActorId, request: &str) -> Result<String, Error> {
        request_key(
            format!(
                "{}{}/{request}",
                self.imports_prefix(),
                Self::actor_path(actor)
            ),
            request,
        )
    }

    pub fn imports_prefix(&self) -> String {
        format!("{}control/import/", self.root)
    }

    /// Parses a key listed under [`Keys::imports_prefix`] into the actor
    /// and the request.
    pub fn parse_import_key(&self, key: &str) -> Result<(ActorId, String), Error> {
        parse_request_key(key, self.strip(key, &self.imports_prefix())?)
    }

    /// `results/import/<tenant>/<class>/<name hex>/<request>`: how the
    /// import of [`Keys::import_key`] ended, written by the node that
    /// carried it out, read and removed by the command.
    pub fn import_result_key(&self, actor: &ActorId, request: &str) -> Result<String, Error> {
        request_key(
            format!(
                "{}results/import/{}/{request}",
                self.root,
                Self::actor_path(actor)
            ),
            request,
        )
    }

    /// Every result of an operator's request (`results/sql/...`,
    /// `results/import/...`).
    pub fn results_prefix(&self) -> String {
        format!("{}results/", self.root)
    }

    /// `control/tenant-tokens`: while it exists, every node of the app
    /// requires a tenant token on every client request (ADR 0059). Under
    /// `control/`, so the heartbeat's one listing sees it.
    pub fn tenant_tokens_policy(&self) -> String {
        format!("{}control/tenant-tokens", self.root)
    }

    pub fn drain(&self, node: &NodeId) -> String {
        format!("{}control/drain/{node}", self.root)
    }

    pub fn drains_prefix(&self) -> String {
        format!("{}control/drain/", self.root)
    }

    // ---- nodes and owners ------------------------------------------------

    pub fn node(&self, node: &NodeId) -> String {
        format!("{}nodes/{node}", self.root)
    }

    pub fn nodes_prefix(&self) -> String {
        format!("{}nodes/", self.root)
    }

    pub fn parse_node_key(&self, key: &str) -> Result<NodeId, Error> {
        let rest = self.strip(key, &self.nodes_prefix())?;
        NodeId::new(rest).map_err(|_| invalid(key, "node id does not parse"))
    }

    pub fn owner(&self, actor: &ActorId) -> String {
        format!("{}owners/{}", self.root, Self::actor_path(actor))
    }

    pub fn owners_prefix(&self) -> String {
        format!("{}owners/", self.root)
    }

    pub fn parse_owner_key(&self, key: &str) -> Result<ActorId, Error> {
        let rest = self.strip(key, &self.owners_prefix())?;
        parse_actor_path(key, rest)
    }

    // ---- actor data --------------------------------------------------------

    pub fn actors_prefix(&self) -> String {
        format!("{}actors/", self.root)
    }

    /// `.../actors/<tenant>/<class>/<name hex>/`: the actor's whole database.
    pub fn actor_prefix(&self, actor: &ActorId) -> String {
        format!("{}actors/{}/", self.root, Self::actor_path(actor))
    }

    pub fn actor_log_prefix(&self, actor: &ActorId) -> String {
        format!("{}log/", self.actor_prefix(actor))
    }

    pub fn actor_log(&self, actor: &ActorId, seq: u64) -> String {
        Self::log_under(&self.actor_log_prefix(actor), seq)
    }

    /// The log key of `seq` under `prefix`, an [`Keys::actor_log_prefix`]
    /// (for writers that make the prefix once).
    pub fn log_under(prefix: &str, seq: u64) -> String {
        let mut key = String::with_capacity(prefix.len() + SEQ_DIGITS);
        key.push_str(prefix);
        push_seq(&mut key, seq);
        key
    }

    pub fn actor_snapshot_prefix(&self, actor: &ActorId) -> String {
        format!("{}snap/", self.actor_prefix(actor))
    }

    pub fn actor_snapshot(&self, actor: &ActorId, seq: u64) -> String {
        let mut key = self.actor_snapshot_prefix(actor);
        push_seq(&mut key, seq);
        key
    }

    /// The sequence number at the end of a log or snapshot key.
    pub fn parse_seq(key: &str) -> Result<u64, Error> {
        let last = key.rsplit('/').next().unwrap_or_default();
        if last.len() != SEQ_DIGITS || !last.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid(key, "does not end in a 20-digit sequence number"));
        }
        last.parse()
            .map_err(|_| invalid(key, "sequence number out of range"))
    }

    /// Parses `.../actors/<tenant>/<class>/<name hex>/...` into the actor id.
    pub fn parse_actor_data_key(&self, key: &str) -> Result<ActorId, Error> {
        let rest = self.strip(key, &self.actors_prefix())?;
        let mut parts = rest.splitn(4, '/');
        let (Some(t), Some(c), Some(n)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(invalid(key, "want <tenant>/<class>/<name hex>/..."));
        };
        ActorId::from_key_parts(t, c, n).map_err(|_| invalid(key, "actor id does not parse"))
    }

    // ---- alarms ------------------------------------------------------------

    pub fn alarm(&self, actor: &ActorId) -> String {
        format!("{}alarms/{}", self.root, Self::actor_path(actor))
    }

    pub fn alarms_prefix(&self) -> String {
        format!("{}alarms/", self.root)
    }

    pub fn parse_alarm_key(&self, key: &str) -> Result<ActorId, Error> {
        let rest = self.strip(key, &self.alarms_prefix())?;
        parse_actor_path(key, rest)
    }

    // ---- classes -------------------------------------------------------------

    pub fn classes_prefix(&self) -> String {
        format!("{}classes/", self.root)
    }

    /// Names the digest of the class's deployed component.
    pub fn class_current(&self, class: &ClassName) -> String {
        format!("{}classes/{class}/current", self.root)
    }

    pub fn class_component(&self, class: &ClassName, digest: &str) -> String {
        format!("{}classes/{class}/components/{digest}", self.root)
    }

    /// The class of a key listed under [`Keys::classes_prefix`] that ends in `/current`.
    pub fn parse_class_current_key(&self, key: &str) -> Option<ClassName> {
        let rest = key.strip_prefix(&self.classes_prefix())?;
        let class = rest.strip_suffix("/current")?;
        ClassName::new(class).ok()
    }

    // ---- secrets and tenants -------------------------------------------------

    pub fn secret(&self, name: &str) -> String {
        format!("{}secrets/{name}", self.root)
    }

    pub fn secrets_prefix(&self) -> String {
        format!("{}secrets/", self.root)
    }

    pub fn recipient(&self) -> String {
        format!("{}recipient", self.root)
    }

    /// `tenants/`: every tenant's tokens (a backup copies them).
    pub fn tenants_prefix(&self) -> String {
        format!("{}tenants/", self.root)
    }

    pub fn tenant_token(&self, tenant: &TenantName, digest: &str) -> String {
        format!("{}tenants/{tenant}/tokens/{digest}", self.root)
    }

    pub fn tenant_tokens_prefix(&self, tenant: &TenantName) -> String {
        format!("{}tenants/{tenant}/tokens/", self.root)
    }

    fn strip<'k>(&self, key: &'k str, prefix: &str) -> Result<&'k str, Error> {
        key.strip_prefix(prefix)
            .ok_or_else(|| invalid(key, "not under the expected prefix"))
    }
}

fn parse_actor_path(key: &str, rest: &str) -> Result<ActorId, Error> {
    let parts: Vec<&str> = rest.split('/').collect();
    let [tenant, class, name_hex] = parts[..] else {
        return Err(invalid(key, "want <tenant>/<class>/<name hex>"));
    };
    ActorId::from_key_parts(tenant, class, name_hex)
        .map_err(|_| invalid(key, "actor id does not parse"))
}

/// Longest request segment of a delete key.
pub const DELETE_REQUEST_MAX: usize = 32;

fn is_delete_request(request: &str) -> bool {
    (1..=DELETE_REQUEST_MAX).contains(&request.len())
        && request
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The actor and request of an operator's request `key`, whose part after
/// its kind's prefix is `rest`: `<tenant>/<class>/<name hex>/<request>`.
fn parse_request_key(key: &str, rest: &str) -> Result<(ActorId, String), Error> {
    let parts: Vec<&str> = rest.split('/').collect();
    let [tenant, class, name_hex, request] = parts[..] else {
        return Err(invalid(key, "want <tenant>/<class>/<name hex>/<request>"));
    };
    if !is_delete_request(request) {
        return Err(invalid(key, "the request is 1 to 32 lower-case hex digits"));
    }
    let actor = ActorId::from_key_parts(tenant, class, name_hex)
        .map_err(|_| invalid(key, "actor id does not parse"))?;
    Ok((actor, request.to_owned()))
}

/// `key`, which ends in `request`, if the request is a request id (1 to
/// [`DELETE_REQUEST_MAX`] lower-case hex digits).
fn request_key(key: String, request: &str) -> Result<String, Error> {
    if is_delete_request(request) {
        Ok(key)
    } else {
        Err(invalid(
            &key,
            "the request is 1 to 32 lower-case hex digits",
        ))
    }
}

fn invalid(key: &str, reason: &'static str) -> Error {
    Error::InvalidKey {
        key: key.to_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys::new(&AppName::new("shop").unwrap())
    }

    #[test]
    fn sequence_numbers_are_twenty_digits_zero_padded() {
        for seq in [
            0,
            1,
            9,
            10,
            12_345,
            10_u64.pow(19) - 1,
            10_u64.pow(19),
            u64::MAX,
        ] {
            let log = Keys::log_under("p/log/", seq);
            assert_eq!(log, format!("p/log/{seq:020}"));
            assert_eq!(Keys::parse_seq(&log).unwrap(), seq);
            let snapshot = keys().actor_snapshot(&actor(), seq);
            assert_eq!(
                snapshot,
                format!("{}{seq:020}", keys().actor_snapshot_prefix(&actor()))
            );
        }
    }

    fn actor() -> ActorId {
        ActorId::parse("acme/counter/a/b").unwrap()
    }

    #[test]
    fn layout_matches_design() {
        let k = keys();
        let a = actor();
        let node = NodeId::new("n1").unwrap();
        assert_eq!(
            k.move_key(&a, &node),
            "apps/shop/control/move/acme/counter/612f62/n1"
        );
        assert_eq!(k.drain(&node), "apps/shop/control/drain/n1");
        assert_eq!(
            k.delete_key(&a, "0a1b").unwrap(),
            "apps/shop/control/delete/acme/counter/612f62/0a1b"
        );
        assert_eq!(
            k.delete_requests_prefix(&a),
            "apps/shop/control/delete/acme/counter/612f62/"
        );
        assert_eq!(k.node(&node), "apps/shop/nodes/n1");
        assert_eq!(k.owner(&a), "apps/shop/owners/acme/counter/612f62");
        assert_eq!(k.alarm(&a), "apps/shop/alarms/acme/counter/612f62");
        assert_eq!(
            k.actor_log(&a, 7),
            "apps/shop/actors/acme/counter/612f62/log/00000000000000000007"
        );
    }

    #[test]
    fn operator_sql_keys_name_their_actor_and_request() {
        let k = keys();
        let a = actor();
        let key = k.sql_key(&a, "00ff").unwrap();
        assert_eq!(key, "apps/shop/control/sql/acme/counter/612f62/00ff");
        assert_eq!(
            k.parse_sql_key(&key).unwrap(),
            (a.clone(), "00ff".to_owned())
        );
        assert_eq!(
            k.sql_result_key(&a, "00ff").unwrap(),
            "apps/shop/results/sql/acme/counter/612f62/00ff"
        );
        for bad in ["", "0A", "xyz", &"0".repeat(DELETE_REQUEST_MAX + 1)] {
            assert!(k.sql_key(&a, bad).is_err(), "{bad:?}");
            assert!(k.sql_result_key(&a, bad).is_err(), "{bad:?}");
            let key = format!("apps/shop/control/sql/acme/counter/612f62/{bad}");
            assert!(k.parse_sql_key(&key).is_err(), "{key}");
        }
        assert!(
            k.parse_sql_key("apps/shop/control/sql/acme/counter/612f62")
                .is_err()
        );
        assert!(k.parse_sql_key(&k.delete_key(&a, "00").unwrap()).is_err());
    }

    #[test]
    fn import_keys_name_their_actor_and_request() {
        let k = Keys::new(&AppName::new("shop").unwrap());
        let a = ActorId::parse("acme/counter/a/b").unwrap();
        let key = k.import_key(&a, "00ff").unwrap();
        assert_eq!(key, "apps/shop/control/import/acme/counter/612f62/00ff");
        assert_eq!(
            k.parse_import_key(&key).unwrap(),
            (a.clone(), "00ff".into())
        );
        assert_eq!(
            k.import_result_key(&a, "00ff").unwrap(),
            "apps/shop/results/import/acme/counter/612f62/00ff"
        );
        assert!(
            k.import_result_key(&a, "00ff")
                .unwrap()
                .starts_with(&k.results_prefix())
                && k.sql_result_key(&a, "00ff")
                    .unwrap()
                    .starts_with(&k.results_prefix())
        );
        for bad in ["", "00FF", "x", &"0".repeat(33)] {
            assert!(k.import_key(&a, bad).is_err(), "{bad:?}");
            assert!(k.import_result_key(&a, bad).is_err(), "{bad:?}");
        }
        assert!(k.parse_import_key(&k.sql_key(&a, "00").unwrap()).is_err());
        assert!(
            k.parse_import_key("apps/shop/control/import/acme/counter/612f62")
                .is_err()
        );
    }

    #[test]
    fn delete_requests_of_one_actor_have_keys_of_their_own() {
        let k = keys();
        let a = actor();
        let first = k.delete_key(&a, "00ff").unwrap();
        let second = k.delete_key(&a, "00fe").unwrap();
        assert_ne!(first, second);
        assert_eq!(k.parse_delete_key(&first).unwrap(), a);
        assert_eq!(k.parse_delete_key(&second).unwrap(), a);
        // A key written before per-request keys still names its actor.
        assert_eq!(
            k.parse_delete_key("apps/shop/control/delete/acme/counter/612f62")
                .unwrap(),
            a
        );
        for bad in ["", "0A", "xyz", "0-1", &"0".repeat(DELETE_REQUEST_MAX + 1)] {
            assert!(k.delete_key(&a, bad).is_err(), "request {bad:?} accepted");
            let key = format!("{}{bad}", k.delete_requests_prefix(&a));
            assert!(k.parse_delete_key(&key).is_err(), "{key} parsed");
        }
        assert!(
            k.parse_delete_key("apps/shop/control/delete/acme/counter")
                .is_err()
        );
        assert!(
            k.parse_delete_key("apps/shop/control/delete/acme/counter/612f62/00/extra")
                .is_err()
        );
        let node = NodeId::new("n1").unwrap();
        assert!(k.parse_delete_key(&k.move_key(&a, &node)).is_err());
    }

    #[test]
    fn keys_parse_back() {
        let k = keys();
        let a = actor();
        let node = NodeId::new("n1").unwrap();
        assert_eq!(
            k.parse_move_key(&k.move_key(&a, &node)).unwrap(),
            (a.clone(), node.clone())
        );
        assert_eq!(k.parse_owner_key(&k.owner(&a)).unwrap(), a);
        assert_eq!(k.parse_alarm_key(&k.alarm(&a)).unwrap(), a);
        assert_eq!(k.parse_node_key(&k.node(&node)).unwrap(), node);
        assert_eq!(k.parse_actor_data_key(&k.actor_log(&a, 3)).unwrap(), a);
        assert_eq!(
            Keys::parse_seq(&k.actor_snapshot(&a, u64::MAX)).unwrap(),
            u64::MAX
        );
        let class = ClassName::new("counter").unwrap();
        assert_eq!(
            k.parse_class_current_key(&k.class_current(&class)),
            Some(class)
        );
    }

    #[test]
    fn malformed_keys_are_refused() {
        let k = keys();
        for bad in [
            "apps/shop/control/move/acme/counter/612f62",
            "apps/shop/control/move/acme/counter/zz/n1",
            "apps/shop/control/move/ACME/counter/61/n1",
            "apps/other/control/move/acme/counter/61/n1",
            "apps/shop/control/move/acme/counter/61/n1/extra",
        ] {
            assert!(k.parse_move_key(bad).is_err(), "{bad} parsed");
        }
        assert!(Keys::parse_seq("x/log/12").is_err());
        assert!(Keys::parse_seq("x/log/0000000000000000001a").is_err());
    }

    #[test]
    fn sequence_keys_sort_numerically() {
        let k = keys();
        let a = actor();
        assert!(k.actor_log(&a, 9) < k.actor_log(&a, 10));
    }
}
