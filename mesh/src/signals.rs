//! The signals that stop a long-running command (`mesh serve`, `mesh logs convert
//! --watch`): Ctrl-C and SIGTERM. SIGHUP, whose default action would end the
//! process too, is listened for and stops nothing (a server with TLS reloads its
//! certificates on it, `mesh_router::tls`).
//!
//! Listen before announcing anything. tokio installs its handler when the first
//! listener of a signal is made, and hands a signal only to the listeners that exist
//! when its driver gets to it. A listener made after a "serving" line races whoever
//! signals on reading that line: the signal either comes before the handler (the
//! process dies by the default action, without draining) or between the handler and
//! the listener (it is dropped, and the server never stops).

/// Listeners for Ctrl-C, SIGTERM and SIGHUP, made by [`StopSignals::listen`]; a
/// signal that arrives after that and before [`StopSignals::recv`] is kept for it.
pub struct StopSignals {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    hangup: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Installs the handlers and listens. Call inside a tokio runtime with IO enabled.
    pub fn listen() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Self {
                terminate: signal(SignalKind::terminate())?,
                interrupt: signal(SignalKind::interrupt())?,
                hangup: signal(SignalKind::hangup())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// Waits for the next stop signal; returns its name. A SIGHUP meanwhile is logged.
    pub async fn recv(&mut self) -> &'static str {
        #[cfg(unix)]
        loop {
            tokio::select! {
                _ = self.terminate.recv() => return "SIGTERM",
                _ = self.interrupt.recv() => return "SIGINT",
                _ = self.hangup.recv() => tracing::info!(
                    "SIGHUP received: it stops nothing (a server with [server.tls] reloads its certificates on it)"
                ),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }
}
