//! The actix system that hosts the batcher actors, on a thread of its own so the
//! tokio runtime of the servers and the actors' event loop never share a thread.
use std::sync::mpsc;

use actix::{Arbiter, ArbiterHandle, System};

/// A running actix system. Actor addresses taken from it can be used from any
/// thread or runtime (`Addr::do_send` and `Addr::send` are channel operations).
#[derive(Clone)]
pub struct ActorSystem {
    system: System,
    arbiter: ArbiterHandle,
}

impl ActorSystem {
    /// Starts the system thread.
    pub fn start() -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("mesh-actors".into())
            .spawn(move || {
                let sys = System::new();
                sys.block_on(async {
                    let _ = tx.send((System::current(), Arbiter::current()));
                });
                if let Err(e) = sys.run() {
                    tracing::error!(error = %e, "actor system stopped with an error");
                }
            })?;
        let (system, arbiter) = rx
            .recv()
            .map_err(|_| std::io::Error::other("the actor system thread exited before starting"))?;
        Ok(Self { system, arbiter })
    }

    /// Runs `f` on the actor system's arbiter (where actors may be started) and
    /// returns its result.
    pub fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> std::io::Result<R> {
        let (tx, rx) = mpsc::sync_channel(1);
        if !self.arbiter.spawn_fn(move || {
            let _ = tx.send(f());
        }) {
            return Err(std::io::Error::other("the actor system has stopped"));
        }
        rx.recv()
            .map_err(|_| std::io::Error::other("the actor system dropped a task"))
    }

    /// Stops the system; actors finish the message in hand and stop.
    pub fn stop(&self) {
        self.system.stop();
    }
}
