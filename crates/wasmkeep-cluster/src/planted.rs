//! Deliberate mistakes, switched on only by the simulation's tests to show
//! that its checkers catch them. Without the `planted-bugs` feature every
//! switch is a constant `false` and the compiler removes the mistake.

#[cfg(feature = "planted-bugs")]
mod switches {
    use std::sync::atomic::{AtomicBool, Ordering};

    pub static LEASE_FROM_REPLY: AtomicBool = AtomicBool::new(false);
    pub static HIBERNATE_AFTER_RELEASE: AtomicBool = AtomicBool::new(false);
    pub static FORGET_ALARM_BEFORE_TAKE: AtomicBool = AtomicBool::new(false);
    pub static ERASE_FREES_NUMBERS: AtomicBool = AtomicBool::new(false);
    pub static LATE_RECORD_ANSWERED_FAILED: AtomicBool = AtomicBool::new(false);
    pub static ACK_BEFORE_DURABLE: AtomicBool = AtomicBool::new(false);
    pub static ALARM_EARLY: AtomicBool = AtomicBool::new(false);

    pub fn get(flag: &AtomicBool) -> bool {
        flag.load(Ordering::Relaxed)
    }

    pub fn set(flag: &AtomicBool, on: bool) {
        flag.store(on, Ordering::Relaxed);
    }
}

#[cfg(feature = "planted-bugs")]
pub use switches::{
    ACK_BEFORE_DURABLE, ALARM_EARLY, ERASE_FREES_NUMBERS, FORGET_ALARM_BEFORE_TAKE,
    HIBERNATE_AFTER_RELEASE, LATE_RECORD_ANSWERED_FAILED, LEASE_FROM_REPLY, set,
};

/// Bug: the owner counts its lease from the renewal's reply, not its request.
pub fn lease_from_reply() -> bool {
    #[cfg(feature = "planted-bugs")]
    {
        switches::get(&switches::LEASE_FROM_REPLY)
    }
    #[cfg(not(feature = "planted-bugs"))]
    {
        false
    }
}

/// Bug (ADR 0017's first draft): hibernate the stub right after the release,
/// so the owner's next event claims the actor back.
pub fn hibernate_after_release() -> bool {
    #[cfg(feature = "planted-bugs")]
    {
        switches::get(&switches::HIBERNATE_AFTER_RELEASE)
    }
    #[cfg(not(feature = "planted-bugs"))]
    {
        false
    }
}

/// Bug: forget the alarm registration before the take succeeded.
pub fn forget_alarm_before_take() -> bool {
    #[cfg(feature = "planted-bugs")]
    {
        switches::get(&switches::FORGET_ALARM_BEFORE_TAKE)
    }
    #[cfg(not(feature = "planted-bugs"))]
    {
        false
    }
}

/// Bug (ADR 0055's first version): `actor delete` deletes the whole log,
/// freeing its sequence numbers for a former holder's in-flight record.
pub fn erase_frees_numbers() -> bool {
    #[cfg(feature = "planted-bugs")]
    {
        switches::get(&switches::ERASE_FREES_NUMBERS)
    }
    #[cfg(not(feature = "planted-bugs"))]
    {
        false
    }
}

/// Bug (the server before ADR 0062): a new holder serves without fencing
/// the log, and a record that became durable after its writer's lease ran
/// out is answered 503 (it stays in the log all the same).
pub fn late_record_answered_failed() -> bool {
    #[cfg(feature = "planted-bugs")]
    {
        switches::get(&switches::LATE_RECORD_ANSWERED_FAILED)
    }
    #[cfg(not(feature = "planted-bugs"))]
    {
        false
    }
}

/// Bug: an event's answer leaves before its log record is durable (the
/// output gate is not waited for), so a crash can lose a write its client
/// saw acknowledged.
pub fn ack_before_durable() -> bool {
    #[cfg(feature = "planted-bugs")]
    {
        switches::get(&switches::ACK_BEFORE_DURABLE)
    }
    #[cfg(not(feature = "planted-bugs"))]
    {
        false
    }
}

/// Bug: the alarm timer runs alarms a minute before they are due.
pub fn alarm_early() -> bool {
    #[cfg(feature = "planted-bugs")]
    {
        switches::get(&switches::ALARM_EARLY)
    }
    #[cfg(not(feature = "planted-bugs"))]
    {
        false
    }
}
