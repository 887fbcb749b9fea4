//! The one Tokio runtime every network backend runs on. Two worker threads
//! carry the sockets; engine threads block on their own requests with
//! `block_on`, so the number of requests in flight is set by the engine,
//! not by the runtime's size.

use std::future::Future;
use std::sync::OnceLock;

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("capsule-net")
            .enable_all()
            .build()
            // Without a runtime no network backend can work; this fails only
            // when the process cannot create threads at all.
            .unwrap_or_else(|e| panic!("cannot start the network runtime: {e}"))
    })
}

/// Runs `f` to completion from a synchronous caller.
pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
    runtime().block_on(f)
}
