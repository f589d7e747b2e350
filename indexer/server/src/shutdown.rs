//! The one way a task of the service learns that it must stop (mini-redis's `shutdown.rs`):
//! every long-lived task (the sources, the pods file watcher, discovery, snapshots, the
//! servers) holds a [`Shutdown`] and selects on [`Shutdown::recv`] beside its work, so the
//! server stops them all with one [`ShutdownSignal::trigger`]. Built on a `watch` channel, so a
//! handle made or cloned after the signal sees it at once, and a dropped signal counts as one
//! (a task never outlives whoever could stop it).

use tokio::sync::watch;

/// The sending side: whoever owns the tasks triggers it once.
#[derive(Debug)]
pub struct ShutdownSignal {
    notify: watch::Sender<bool>,
}

/// A task's handle on the signal.
#[derive(Debug, Clone)]
pub struct Shutdown {
    /// Whether the signal was seen already (then [`recv`](Shutdown::recv) returns at once).
    is_shutdown: bool,
    notify: watch::Receiver<bool>,
}

impl ShutdownSignal {
    /// A new signal and the first handle on it.
    pub fn new() -> (ShutdownSignal, Shutdown) {
        let (notify, rx) = watch::channel(false);
        (ShutdownSignal { notify }, Shutdown { is_shutdown: false, notify: rx })
    }

    /// Another handle on this signal (triggered already if the signal was).
    pub fn subscribe(&self) -> Shutdown {
        let notify = self.notify.subscribe();
        let is_shutdown = *notify.borrow();
        Shutdown { is_shutdown, notify }
    }

    /// Tells every handle to stop.
    pub fn trigger(&self) {
        let _ = self.notify.send(true);
    }
}

impl Shutdown {
    /// Whether the signal was seen by this handle.
    pub fn is_shutdown(&self) -> bool {
        self.is_shutdown || *self.notify.borrow()
    }

    /// Waits for the signal (returns at once once seen, or when the signal is dropped).
    pub async fn recv(&mut self) {
        if self.is_shutdown {
            return;
        }
        let _ = self.notify.wait_for(|stop| *stop).await;
        self.is_shutdown = true;
    }

    /// Resolves once the signal is seen: for servers that take a shutdown future.
    pub async fn stopped(mut self) {
        self.recv().await
    }

    /// The channel underneath, for a crate that takes a `watch::Receiver<bool>` stop flag
    /// (`kvindex_discovery::watcher::run`).
    pub fn into_watch(self) -> watch::Receiver<bool> {
        self.notify
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_handle_sees_one_trigger_even_those_made_after_it() {
        let (signal, mut first) = ShutdownSignal::new();
        let mut cloned = first.clone();
        assert!(!first.is_shutdown());
        let waiter = tokio::spawn(async move { cloned.recv().await });
        signal.trigger();
        first.recv().await;
        assert!(first.is_shutdown());
        waiter.await.unwrap();
        let mut late = signal.subscribe();
        assert!(late.is_shutdown());
        late.recv().await;
    }

    #[tokio::test]
    async fn a_dropped_signal_stops_its_handles() {
        let (signal, mut handle) = ShutdownSignal::new();
        drop(signal);
        handle.recv().await;
        assert!(handle.is_shutdown());
    }
}
