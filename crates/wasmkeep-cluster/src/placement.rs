//! Where an actor's next event goes when the actor is not resident on this
//! node: one pure function of what the node knows ([`Facts`]), so that the
//! rule is read in one place and tested without a node. The node gathers
//! the facts (its class registry, moves, hints, drain and lease), asks
//! [`place`], and carries the answer out. Never does I/O.
//!
//! The order of the questions is the rule (ADR 0014, 0017, 0020):
//! a node that shuts down takes nothing (but a draining one still looks
//! for the holder); an unknown class is refused; a move under way sends the
//! actor to its target, never back here; a fresh owner hint sends it to
//! the hinted peer; a draining node looks elsewhere once before it takes
//! the actor itself; a node without a valid lease takes nothing; otherwise
//! the actor is activated here.

use wasmkeep_types::NodeId;

/// What the node knows when an event arrives for an actor not resident here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts<'a> {
    /// This node.
    pub node: &'a NodeId,
    /// The node is shutting down.
    pub shutting_down: bool,
    /// The node drains and has not looked for the holder elsewhere yet for
    /// this event.
    pub drain_look: bool,
    /// The node serves the actor's class, and a version of it is loaded.
    pub class_ready: bool,
    /// The target of a move of the actor under way, if any.
    pub move_target: Option<&'a NodeId>,
    /// A fresh owner hint, if any.
    pub hint: Option<&'a NodeId>,
}

/// Where the event goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Refused for now: the node is shutting down.
    ShuttingDown,
    /// Refused: the class is unknown here or not loaded yet (the node
    /// tells which).
    ClassNotReady,
    /// To this peer (a move's target or the hinted holder).
    Elsewhere(NodeId),
    /// The node drains: find the holder, or the peer that takes the
    /// actor, before taking it here.
    LookElsewhere,
    /// Refused for now: this node's lease is not valid.
    LeaseNotValid,
    /// Activate the actor here.
    Here,
}

/// Where the next event of an actor not resident on `facts.node` goes.
/// `lease_valid` is asked last, and only when the answer depends on it:
/// asking a lease past its end marks it lapsed, which the heartbeat acts on.
pub fn place(facts: &Facts<'_>, lease_valid: impl FnOnce() -> bool) -> Placement {
    if facts.shutting_down && !facts.drain_look {
        return Placement::ShuttingDown;
    }
    if !facts.class_ready {
        return Placement::ClassNotReady;
    }
    if let Some(target) = facts.move_target
        && target != facts.node
    {
        return Placement::Elsewhere(target.clone());
    }
    if let Some(peer) = facts.hint
        && peer != facts.node
    {
        return Placement::Elsewhere(peer.clone());
    }
    if facts.drain_look {
        return Placement::LookElsewhere;
    }
    if facts.shutting_down {
        return Placement::ShuttingDown;
    }
    if !lease_valid() {
        return Placement::LeaseNotValid;
    }
    Placement::Here
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> NodeId {
        NodeId::new(name).expect("valid")
    }

    fn valid() -> bool {
        true
    }

    fn never_asked() -> bool {
        panic!("the lease was asked, though the answer does not depend on it")
    }

    fn facts<'a>(me: &'a NodeId) -> Facts<'a> {
        Facts {
            node: me,
            shutting_down: false,
            drain_look: false,
            class_ready: true,
            move_target: None,
            hint: None,
        }
    }

    #[test]
    fn a_serving_node_with_nothing_known_activates_the_actor_here() {
        let me = id("n1");
        assert_eq!(place(&facts(&me), valid), Placement::Here);
    }

    #[test]
    fn a_move_under_way_sends_the_actor_to_its_target_before_any_hint() {
        let (me, target, hinted) = (id("n1"), id("n2"), id("n3"));
        let f = Facts {
            move_target: Some(&target),
            hint: Some(&hinted),
            ..facts(&me)
        };
        assert_eq!(place(&f, valid), Placement::Elsewhere(target.clone()));
        // Even from a draining node, and without asking the lease.
        let f = Facts {
            drain_look: true,
            ..f
        };
        assert_eq!(place(&f, never_asked), Placement::Elsewhere(target));
    }

    #[test]
    fn a_move_or_hint_naming_this_node_is_no_reason_to_look_elsewhere() {
        let me = id("n1");
        let f = Facts {
            move_target: Some(&me),
            hint: Some(&me),
            ..facts(&me)
        };
        assert_eq!(place(&f, valid), Placement::Here);
    }

    #[test]
    fn a_fresh_hint_sends_the_actor_to_the_hinted_peer() {
        let (me, peer) = (id("n1"), id("n2"));
        let f = Facts {
            hint: Some(&peer),
            ..facts(&me)
        };
        assert_eq!(place(&f, valid), Placement::Elsewhere(peer));
    }

    #[test]
    fn a_shutting_down_node_takes_nothing_but_a_draining_one_still_looks_elsewhere() {
        let me = id("n1");
        let f = Facts {
            shutting_down: true,
            ..facts(&me)
        };
        assert_eq!(place(&f, valid), Placement::ShuttingDown);
        let f = Facts {
            drain_look: true,
            ..f
        };
        assert_eq!(place(&f, valid), Placement::LookElsewhere);
    }

    #[test]
    fn shutting_down_is_answered_before_an_unknown_class() {
        let me = id("n1");
        let f = Facts {
            shutting_down: true,
            class_ready: false,
            ..facts(&me)
        };
        assert_eq!(place(&f, valid), Placement::ShuttingDown);
        let f = Facts {
            shutting_down: false,
            ..f
        };
        assert_eq!(place(&f, valid), Placement::ClassNotReady);
    }

    #[test]
    fn a_draining_node_looks_elsewhere_once_then_takes_the_actor() {
        let me = id("n1");
        let first = Facts {
            drain_look: true,
            ..facts(&me)
        };
        assert_eq!(place(&first, valid), Placement::LookElsewhere);
        let after_looking = Facts {
            drain_look: false,
            ..first
        };
        assert_eq!(place(&after_looking, valid), Placement::Here);
    }

    #[test]
    fn a_node_without_a_valid_lease_takes_nothing() {
        let me = id("n1");
        assert_eq!(place(&facts(&me), || false), Placement::LeaseNotValid);
    }

    #[test]
    fn the_lease_is_asked_only_when_the_actor_would_be_activated_here() {
        let (me, peer) = (id("n1"), id("n2"));
        let hinted = Facts {
            hint: Some(&peer),
            ..facts(&me)
        };
        assert_eq!(place(&hinted, never_asked), Placement::Elsewhere(peer));
        let draining = Facts {
            drain_look: true,
            ..facts(&me)
        };
        assert_eq!(place(&draining, never_asked), Placement::LookElsewhere);
    }
}
