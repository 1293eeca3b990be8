//! [`WaitCell`]: a value that tasks wait on until it meets a condition. Its
//! waiters are woken in the order they began waiting: tokio's `watch` wakes
//! several waiters in an order drawn from tokio's own random generator,
//! which makes two runs of one simulated seed differ (ADR 0006). Used where
//! several tasks wait at once: an actor's activation and its release.

use parking_lot::Mutex;
use tokio::sync::Notify;

#[derive(Debug)]
pub struct WaitCell<T> {
    value: Mutex<T>,
    changed: Notify,
}

impl<T: Clone> WaitCell<T> {
    pub fn new(value: T) -> Self {
        Self {
            value: Mutex::new(value),
            changed: Notify::new(),
        }
    }

    pub fn get(&self) -> T {
        self.value.lock().clone()
    }

    /// Sets the value and wakes every waiter (in the order they waited).
    pub fn set(&self, value: T) {
        *self.value.lock() = value;
        self.changed.notify_waiters();
    }

    /// Waits until the value meets `done`, and returns it.
    pub async fn wait_for(&self, done: impl Fn(&T) -> bool) -> T {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Registered before the value is read: a set in between wakes it.
            notified.as_mut().enable();
            {
                let value = self.value.lock();
                if done(&value) {
                    return value.clone();
                }
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn waiters_see_the_value_that_meets_their_condition() {
        let signal = Arc::new(WaitCell::new(0));
        let waiter = {
            let signal = Arc::clone(&signal);
            tokio::spawn(async move { signal.wait_for(|v| *v >= 2).await })
        };
        tokio::task::yield_now().await;
        signal.set(1);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        signal.set(2);
        assert_eq!(waiter.await.expect("the waiter ends"), 2);
        assert_eq!(signal.wait_for(|v| *v == 2).await, 2);
    }
}
