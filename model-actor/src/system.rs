//! Where the model actors run. Each runner of an actor group is an actix sync actor
//! (`ModelActor`, started by a [`SyncArbiter`] on a thread of its own named
//! `mesh-runner`): it owns one instance of the model and its device, takes the next
//! batch from its group's queue itself and answers each caller directly, so a
//! request crosses one thread boundary on the way in and one on the way out (the
//! batcher actor between the async side and the runners is gone: it bought
//! nothing but a hand-off). The actix system lives on a thread of its own
//! (`mesh-actors`), so the tokio runtime of the servers and the actors never share a
//! thread. The system keeps track of the groups it started so that
//! [`ActorSystem::stop`] stops them all.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Weak};

use actix::{Actor, Arbiter, ArbiterHandle, SyncArbiter, SyncContext, System};
use parking_lot::Mutex;

use crate::batcher::Queue;
use crate::runner::Runner;

/// The model actors of a process. Cheap to clone; every clone is the same system.
#[derive(Clone)]
pub struct ActorSystem {
    system: System,
    arbiter: ArbiterHandle,
    groups: Arc<Mutex<Vec<Weak<Queue>>>>,
    stopped: Arc<AtomicBool>,
}

/// One runner of a group as an actix actor on its own thread: started, it runs
/// batches from its group's queue until the queue closes, then its thread ends.
struct ModelActor {
    runner: Option<Runner>,
}

impl Actor for ModelActor {
    type Context = SyncContext<Self>;

    fn started(&mut self, _: &mut SyncContext<Self>) {
        if let Some(r) = self.runner.take() {
            r.run();
        }
    }
}

impl ActorSystem {
    /// Starts the actix system thread (no actors yet).
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
        Ok(Self {
            system,
            arbiter,
            groups: Default::default(),
            stopped: Default::default(),
        })
    }

    /// Starts one actor (and thread) per runner of the group that `queue` feeds.
    pub(crate) fn spawn_group(
        &self,
        queue: &Arc<Queue>,
        runners: Vec<Runner>,
    ) -> std::io::Result<()> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(std::io::Error::other("the actor system has stopped"));
        }
        {
            let mut groups = self.groups.lock();
            groups.retain(|g| g.strong_count() > 0);
            groups.push(Arc::downgrade(queue));
        }
        let n = runners.len();
        let runners = Arc::new(Mutex::new(runners));
        let (tx, rx) = mpsc::sync_channel(1);
        // SyncArbiter needs the actix system's thread; each actor takes one runner.
        let started = self.arbiter.spawn_fn(move || {
            let addr = SyncArbiter::start_with_thread_builder(
                n,
                || std::thread::Builder::new().name("mesh-runner".into()),
                move || ModelActor {
                    runner: runners.lock().pop(),
                },
            );
            // No messages are sent: the actors take work from the queue. Dropping
            // the address lets each thread end once its runner's queue closes.
            drop(addr);
            let _ = tx.send(());
        });
        if !started || rx.recv().is_err() {
            queue.close();
            return Err(std::io::Error::other("the actor system has stopped"));
        }
        Ok(())
    }

    /// Stops every group: runners finish the batch in hand and exit; requests still
    /// queued are answered `Unavailable`. Nothing starts on this system afterwards.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        for g in self.groups.lock().drain(..) {
            if let Some(q) = g.upgrade() {
                q.close();
            }
        }
        self.system.stop();
    }
}
