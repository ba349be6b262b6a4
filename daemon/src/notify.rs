//! systemd's readiness protocol (`sd_notify`, for `Type=notify` units): the daemon says
//! READY=1 once it answers (the proxy bound, the state restored, the admin API up), RELOADING=1
//! and READY=1 around a SIGHUP reload, STOPPING=1 when it stops, and a STATUS= line systemctl
//! shows. Outside systemd (`NOTIFY_SOCKET` unset) every call does nothing.

use sd_notify::NotifyState;

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "telling systemd the daemon's state (NOTIFY_SOCKET) failed");
    }
}

/// The daemon serves: systemd starts the units ordered after it.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A reload starts.
pub fn reloading() {
    send(&[NotifyState::Reloading]);
}

/// A reload ended (applied or refused: the daemon serves either way).
pub fn reloaded(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// The daemon stops.
pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

/// A new status line (e.g. the operator's leader/follower/unreachable).
pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}
