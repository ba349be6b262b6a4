//! Run to completion per core: the UDP path's sockets split over threads
//! ([`Config::udp_threads`](crate::Config)) that each wait on their own sockets and handle what
//! arrives without a task wake.
//!
//! UDP listener socket `i` and upstream socket slot `i` belong to shard `i % threads`. A shard
//! thread sleeps in `epoll_wait` on its sockets (level-triggered), and when one is readable
//! runs a round of it to completion on the thread: `recvmmsg`, each query or answer handled,
//! `sendmmsg` (a wake's answers before its queries). A listener's queries go out through its
//! own shard's upstream sockets first, so a query and its answer are handled on one thread, as
//! the bare forwarder of `benchmarks/` handles them: no reactor turn, no task scheduled, no
//! other thread woken.
//!
//! A round is the same `async` code the reactor-driven loops run (tests with a paused clock,
//! `udp_threads = 0`); on the common path it never waits, and it is polled to completion here
//! by a minimal executor that parks the thread when it does wait (a send that finds the
//! socket's buffer full, as a blocking `sendmmsg` would). Everything that waits longer (an
//! observation still pending, a TCP retry, the fallback after `proxyResponseMaxDelay`) is
//! spawned on the proxy's runtime, which each shard thread enters; so are the timers, TCP and
//! the encrypted transports.
//!
//! With no shard (`udp_threads = 0`) everything runs on the caller's runtime.

use std::cell::Cell;
use std::io;
use std::os::fd::AsFd;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::runtime::Handle;

use crate::error::Error;
use crate::listen::UdpServer;
use crate::proxy::{ERROR_PAUSE, Round, Shared, UpstreamReceiver};
use crate::udp::Watcher;
use crate::upstream::Upstream;
use crate::upstream_socket::UpstreamSocket;

/// What a shard thread is given to serve.
pub(crate) enum Job {
    /// UDP listener socket `index`.
    Listener(Arc<Shared>, usize),
    /// An upstream socket (at start, or opened by a rotation).
    Upstream(Arc<Shared>, Arc<Upstream>, Arc<UpstreamSocket>),
}

/// How a job reaches its shard thread: a queue, and an `eventfd` in the thread's `epoll` set.
struct Inbox {
    jobs: mpsc::Sender<Job>,
    wake: Arc<EventFd>,
}

/// The UDP path's threads, as the proxy addresses them (none: the caller's runtime).
#[derive(Clone, Default)]
pub(crate) struct Shards {
    inboxes: Arc<[Inbox]>,
}

impl std::fmt::Debug for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("threads", &self.inboxes.len())
            .finish()
    }
}

thread_local! {
    /// On a shard thread: `(shard, shards)`.
    static CURRENT: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
}

/// The shard this thread runs, as `(shard, shards)`; `None` off the shard threads.
pub(crate) fn current() -> Option<(usize, usize)> {
    CURRENT.with(Cell::get)
}

impl Shards {
    /// No shard threads: the UDP path runs on the caller's runtime.
    pub(crate) fn is_empty(&self) -> bool {
        self.inboxes.is_empty()
    }

    /// Who watches the UDP path's sockets: the shard threads, or the caller's reactor.
    pub(crate) fn watcher(&self) -> Watcher {
        if self.is_empty() {
            Watcher::Reactor
        } else {
            Watcher::Shard
        }
    }

    /// Hands `job` to shard `i % threads`; gives it back if there is no shard, or if that
    /// shard's thread has stopped.
    pub(crate) fn submit(&self, i: usize, job: Job) -> Result<(), Job> {
        let n = self.inboxes.len();
        if n == 0 {
            return Err(job);
        }
        let inbox = &self.inboxes[i % n];
        inbox.jobs.send(job).map_err(|e| e.0)?;
        wake(&inbox.wake);
        Ok(())
    }
}

/// Wakes a shard thread (an `eventfd` counter cannot overflow from these few writes).
fn wake(fd: &EventFd) {
    let _ = fd.write(1);
}

/// The shard threads: stopping them (or dropping this) ends their loops and drops what they
/// served, with the observations those still had pending.
#[derive(Default)]
pub(crate) struct ShardThreads {
    stop: Arc<AtomicBool>,
    wakes: Vec<Arc<EventFd>>,
    threads: Vec<JoinHandle<()>>,
    failures: Option<tokio::sync::mpsc::UnboundedReceiver<Error>>,
}

impl std::fmt::Debug for ShardThreads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardThreads")
            .field("threads", &self.threads.len())
            .finish()
    }
}

impl ShardThreads {
    /// Why a shard thread stopped on its own (it does only when it fails or panics).
    pub(crate) fn failures(&mut self) -> Option<tokio::sync::mpsc::UnboundedReceiver<Error>> {
        self.failures.take()
    }

    fn signal_stop(&self) {
        self.stop.store(true, Ordering::Release);
        for fd in &self.wakes {
            wake(fd);
        }
    }

    /// Stops the threads and waits until each has dropped what it served (and so closed the
    /// sockets only it still held). Blocks: call it off the async threads.
    pub(crate) fn stop_and_join(mut self) {
        self.signal_stop();
        for thread in self.threads.drain(..) {
            // A shard thread that panicked has nothing left to stop.
            let _ = thread.join();
        }
    }
}

impl Drop for ShardThreads {
    fn drop(&mut self) {
        self.signal_stop();
    }
}

/// Starts `threads` shard threads (`fqdnd-dns-N`); each enters `runtime` (where what waits is
/// spawned) and serves the jobs it is given until the returned [`ShardThreads`] stops them.
pub(crate) fn start(threads: usize, runtime: &Handle) -> io::Result<(Shards, ShardThreads)> {
    let mut inboxes = Vec::with_capacity(threads);
    let mut owned = ShardThreads::default();
    let (failed, failures) = tokio::sync::mpsc::unbounded_channel();
    owned.failures = Some(failures);
    for n in 0..threads {
        let wake = Arc::new(EventFd::from_flags(
            EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK,
        )?);
        let (jobs, inbox) = mpsc::channel();
        let mut shard = Shard::new(inbox, wake.clone(), owned.stop.clone())?;
        let runtime = runtime.clone();
        let failed = failed.clone();
        let thread = std::thread::Builder::new()
            .name(format!("fqdnd-dns-{n}"))
            .spawn(move || {
                CURRENT.with(|c| c.set(Some((n, threads))));
                let _entered = runtime.enter();
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| shard.run()));
                let error = match run {
                    Ok(Ok(())) => return,
                    Ok(Err(error)) => Error::Thread { thread: n, error },
                    Err(panic) => Error::TaskPanicked {
                        task: "udp thread",
                        reason: panic
                            .downcast_ref::<&str>()
                            .map(|s| (*s).to_owned())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_default(),
                    },
                };
                let _ = failed.send(error);
            })?;
        inboxes.push(Inbox {
            jobs,
            wake: wake.clone(),
        });
        owned.wakes.push(wake);
        owned.threads.push(thread);
    }
    Ok((
        Shards {
            inboxes: inboxes.into(),
        },
        owned,
    ))
}

/// The `epoll` token of the inbox's `eventfd`.
const WAKE: u64 = u64::MAX;
/// Tokens from here on are upstream receivers (below: listeners).
const RECEIVERS: u64 = 1 << 32;
/// The upstream receiver an `epoll` token stands for, if it stands for one.
fn receiver(token: u64) -> Option<usize> {
    (token != WAKE && token >= RECEIVERS).then(|| (token - RECEIVERS) as usize)
}

/// How often a shard looks at its retired upstream sockets (whose last queries the sweep
/// expires) while it has any.
const RETIRED_CHECK: Duration = Duration::from_millis(100);

/// One shard thread's state: its `epoll` set and what it serves.
struct Shard {
    epoll: Epoll,
    wake: Arc<EventFd>,
    jobs: mpsc::Receiver<Job>,
    stop: Arc<AtomicBool>,
    listeners: Vec<UdpServer>,
    /// By token (minus [`RECEIVERS`]); a closed receiver's place is reused.
    receivers: Vec<Option<UpstreamReceiver>>,
    /// Receivers of closed sockets whose observations still wait (dropping would abort them).
    closing: Vec<UpstreamReceiver>,
}

impl Shard {
    fn new(
        jobs: mpsc::Receiver<Job>,
        wake: Arc<EventFd>,
        stop: Arc<AtomicBool>,
    ) -> io::Result<Self> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(wake.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, WAKE))?;
        Ok(Self {
            epoll,
            wake,
            jobs,
            stop,
            listeners: Vec::new(),
            receivers: Vec::new(),
            closing: Vec::new(),
        })
    }

    fn run(&mut self) -> io::Result<()> {
        let mut events = [EpollEvent::empty(); 64];
        loop {
            if self.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            let waiting = !self.closing.is_empty()
                || self
                    .receivers
                    .iter()
                    .flatten()
                    .any(|r| r.upstream_socket().is_retired());
            let timeout = if waiting {
                EpollTimeout::try_from(RETIRED_CHECK).unwrap_or(EpollTimeout::ZERO)
            } else {
                EpollTimeout::NONE
            };
            let n = match self.epoll.wait(&mut events, timeout) {
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            };
            // Answers first: a reply leaves before the next queries are forwarded, so an
            // answer that came in with new queries does not wait for their round (and for
            // their `sendmmsg`, whose loopback delivery runs on this thread).
            for event in &events[..n] {
                if let Some(at) = receiver(event.data()) {
                    self.read_receiver(at)?;
                }
            }
            for event in &events[..n] {
                match event.data() {
                    WAKE => self.take_jobs()?,
                    token if receiver(token).is_none() => self.read_listener(token as usize),
                    _ => {}
                }
            }
            if waiting {
                self.close_drained()?;
            }
        }
    }

    /// Takes the jobs queued for this thread and adds their sockets to the `epoll` set.
    fn take_jobs(&mut self) -> io::Result<()> {
        let _ = self.wake.read();
        while let Ok(job) = self.jobs.try_recv() {
            match job {
                Job::Listener(shared, index) => {
                    let server = UdpServer::new(shared, index);
                    let token = self.listeners.len() as u64;
                    self.epoll.add(
                        server.socket().as_fd(),
                        EpollEvent::new(EpollFlags::EPOLLIN, token),
                    )?;
                    self.listeners.push(server);
                }
                Job::Upstream(shared, upstream, socket) => {
                    let receiver = UpstreamReceiver::new(shared, upstream, socket);
                    // An encrypted upstream's answers do not come through a UDP socket.
                    let Some(udp) = receiver.udp() else {
                        continue;
                    };
                    let at = match self.receivers.iter().position(Option::is_none) {
                        Some(at) => at,
                        None => {
                            self.receivers.push(None);
                            self.receivers.len() - 1
                        }
                    };
                    self.epoll.add(
                        udp.as_fd(),
                        EpollEvent::new(EpollFlags::EPOLLIN, RECEIVERS + at as u64),
                    )?;
                    self.receivers[at] = Some(receiver);
                }
            }
        }
        Ok(())
    }

    fn read_listener(&mut self, at: usize) {
        let Some(server) = self.listeners.get_mut(at) else {
            return;
        };
        // Level-triggered: a socket left with datagrams (`Round::More`) is reported again.
        complete(pin!(server.round()));
    }

    fn read_receiver(&mut self, at: usize) -> io::Result<()> {
        let Some(Some(receiver)) = self.receivers.get_mut(at) else {
            return Ok(());
        };
        complete(pin!(receiver.round()));
        if receiver.close_if_drained() {
            self.close(at)?;
        }
        Ok(())
    }

    /// Closes the retired sockets whose last query was answered or expired, and drops the
    /// receivers of closed sockets once their observations are done.
    fn close_drained(&mut self) -> io::Result<()> {
        for at in 0..self.receivers.len() {
            let drained = match &mut self.receivers[at] {
                Some(r) if r.upstream_socket().is_retired() => r.close_if_drained(),
                _ => false,
            };
            if drained {
                self.close(at)?;
            }
        }
        self.closing.retain_mut(|r| !r.is_idle());
        Ok(())
    }

    /// Takes receiver `at` out of the `epoll` set; it is dropped (closing its socket) once its
    /// observations are done.
    fn close(&mut self, at: usize) -> io::Result<()> {
        let Some(mut receiver) = self.receivers[at].take() else {
            return Ok(());
        };
        if let Some(udp) = receiver.udp() {
            self.epoll.delete(udp.as_fd())?;
        }
        if !receiver.is_idle() {
            self.closing.push(receiver);
        }
        Ok(())
    }
}

/// Runs a round to completion on this thread (parked if it waits for room in a send buffer);
/// after a failed read the socket rests for [`ERROR_PAUSE`], and the thread with it, as a
/// blocking reader would.
///
/// The round stays pinned where the caller made it. A round's future holds every step of an
/// answer's way inline (a few KiB); moved into the executor, it was copied at each wake, the
/// largest user-space item at 20k qps (`memcpy`, 3 % of the CPU).
fn complete<F: Future<Output = Round>>(round: Pin<&mut F>) {
    if futures_executor::block_on(round) == Round::Failed {
        futures_executor::block_on(tokio::time::sleep(ERROR_PAUSE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_tell_receivers_from_listeners_and_the_inbox() {
        assert_eq!(receiver(RECEIVERS + 3), Some(3));
        assert_eq!(receiver(RECEIVERS), Some(0));
        assert_eq!(receiver(0), None, "listener 0");
        assert_eq!(receiver(RECEIVERS - 1), None, "the last listener token");
        assert_eq!(receiver(WAKE), None, "the inbox");
    }

    #[test]
    fn without_shards_everything_stays_on_the_caller() {
        let shards = Shards::default();
        assert!(shards.is_empty());
        assert_eq!(shards.watcher(), Watcher::Reactor);
    }

    #[tokio::test]
    async fn threads_are_named_and_stop_when_asked() {
        let (shards, mut threads) = start(2, &Handle::current()).unwrap();
        assert_eq!(shards.watcher(), Watcher::Shard);
        let names: Vec<_> = threads
            .threads
            .iter()
            .map(|t| t.thread().name().map(str::to_owned))
            .collect();
        assert_eq!(
            names,
            [
                Some("fqdnd-dns-0".to_owned()),
                Some("fqdnd-dns-1".to_owned())
            ]
        );
        let mut failures = threads.failures().unwrap();
        tokio::task::spawn_blocking(move || threads.stop_and_join())
            .await
            .unwrap();
        assert!(failures.try_recv().is_err(), "a stop is not a failure");
    }
}
