//! Run to completion per core: the UDP path's sockets and tasks split over threads that each
//! run their own current-thread runtime ([`Config::udp_threads`](crate::Config)).
//!
//! UDP listener socket `i` and upstream socket slot `i` belong to shard `i % threads`: the
//! socket is registered with that shard's reactor, and the task that reads it runs there. A
//! listener's task forwards through its own shard's upstream sockets first, so a query and its
//! answer are handled on one thread: no wake of another thread (`futex`) and no work stolen
//! between threads on the common path. A shard thread sleeps in `epoll_wait` when it has
//! nothing to do, as a thread blocked in `recvmmsg` would.
//!
//! With no shard (`udp_threads = 0`) everything runs on the caller's runtime, as tests with a
//! paused clock need.

use std::cell::Cell;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Where the UDP path's sockets live: a handle per shard thread (none: the caller's runtime).
#[derive(Clone, Default)]
pub(crate) struct Shards {
    handles: Arc<[Handle]>,
}

impl std::fmt::Debug for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("threads", &self.handles.len())
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
    /// The runtime of shard `i % len`; `None` without shards (the caller's runtime).
    pub(crate) fn handle(&self, i: usize) -> Option<&Handle> {
        let n = self.handles.len();
        (n > 0).then(|| &self.handles[i % n])
    }

    /// Runs `f` inside the runtime of socket `i`'s shard, so a socket made there is registered
    /// with that shard's reactor (with no shard: in the caller's runtime).
    pub(crate) fn enter<T>(&self, i: usize, f: impl FnOnce() -> T) -> T {
        match self.handle(i) {
            Some(handle) => {
                let _entered = handle.enter();
                f()
            }
            None => f(),
        }
    }
}

/// The shard threads: dropping this stops them (their tasks are dropped with their runtime).
#[derive(Default)]
pub(crate) struct ShardThreads {
    stop: Vec<oneshot::Sender<()>>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for ShardThreads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardThreads")
            .field("threads", &self.threads.len())
            .finish()
    }
}

impl ShardThreads {
    /// Stops the threads and waits until each has dropped its runtime (and so closed the
    /// sockets only it still held). Blocks: call it off the async threads.
    pub(crate) fn stop_and_join(mut self) {
        self.stop.clear();
        for thread in self.threads.drain(..) {
            // A shard thread that panicked has nothing left to stop.
            let _ = thread.join();
        }
    }
}

/// Starts `threads` shard threads (`fqdnd-dns-N`), each running a current-thread runtime with
/// I/O and timers until the returned [`ShardThreads`] is dropped.
pub(crate) fn start(threads: usize) -> io::Result<(Shards, ShardThreads)> {
    let mut handles = Vec::with_capacity(threads);
    let mut owned = ShardThreads::default();
    for n in 0..threads {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        handles.push(runtime.handle().clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("fqdnd-dns-{n}"))
            .spawn(move || {
                CURRENT.with(|c| c.set(Some((n, threads))));
                // Returns when the sender is dropped; the runtime, its tasks and the sockets
                // registered with it go with it.
                let _ = runtime.block_on(stopped);
            })?;
        owned.stop.push(stop);
        owned.threads.push(thread);
    }
    Ok((
        Shards {
            handles: handles.into(),
        },
        owned,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_spread_over_the_shards_and_run_on_their_threads() {
        let (shards, threads) = start(2).unwrap();
        let on = |i: usize| {
            let (tx, rx) = std::sync::mpsc::channel();
            shards.handle(i).unwrap().spawn(async move {
                let name = std::thread::current().name().map(str::to_owned);
                tx.send((name, current())).unwrap();
            });
            rx.recv().unwrap()
        };
        assert_eq!(on(0), (Some("fqdnd-dns-0".to_owned()), Some((0, 2))));
        assert_eq!(on(5), (Some("fqdnd-dns-1".to_owned()), Some((1, 2))));
        assert_eq!(current(), None, "not a shard thread");
        // A socket made inside a shard is registered with its reactor.
        let socket = shards.enter(1, || {
            let std = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            std.set_nonblocking(true).unwrap();
            tokio::net::UdpSocket::from_std(std).unwrap()
        });
        drop(socket);
        threads.stop_and_join();
    }

    #[test]
    fn without_shards_everything_stays_on_the_caller() {
        let shards = Shards::default();
        assert!(shards.handle(0).is_none());
        assert_eq!(shards.enter(3, || 5), 5);
    }
}
