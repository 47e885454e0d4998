//! Where the model actors run: each runner of an actor group is a thread of its own
//! (named `mesh-runner`), so the tokio runtime of the servers and the models never
//! share a thread, and a runner blocks on nothing but its group's queue. The
//! system keeps track of the groups it started so that [`ActorSystem::stop`] stops
//! them all.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::batcher::Queue;
use crate::runner::Runner;

/// The model actors of a process. Cheap to clone; every clone is the same system.
#[derive(Clone, Default)]
pub struct ActorSystem {
    groups: Arc<Mutex<Vec<Weak<Queue>>>>,
    stopped: Arc<AtomicBool>,
}

impl ActorSystem {
    /// A system with no actors yet.
    pub fn start() -> std::io::Result<Self> {
        Ok(Self::default())
    }

    /// Starts one thread per runner of the group that `queue` feeds.
    pub(crate) fn spawn_group(&self, queue: &Arc<Queue>, runners: Vec<Runner>) -> std::io::Result<()> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(std::io::Error::other("the actor system has stopped"));
        }
        {
            let mut groups = self.groups.lock();
            groups.retain(|g| g.strong_count() > 0);
            groups.push(Arc::downgrade(queue));
        }
        for r in runners {
            let spawned = std::thread::Builder::new()
                .name("mesh-runner".into())
                .spawn(move || r.run());
            if let Err(e) = spawned {
                queue.close();
                return Err(e);
            }
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
    }
}
