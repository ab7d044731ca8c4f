//! Wall-clock milliseconds that work natively and in the browser (main thread or Worker).
//!
//! `web_time::Instant` is `std::time::Instant` natively and reads `performance.now()` from the
//! global object in wasm (a `Window` or a `WorkerGlobalScope`), and `gloo-timers` reaches
//! `setTimeout` the same way, so this module needs no JavaScript bindings of its own.

use std::sync::OnceLock;

use web_time::Instant;

/// Milliseconds since an arbitrary origin (the first call), for measuring intervals.
pub fn now_ms() -> f64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_secs_f64() * 1000.0
}

/// Waits `ms` milliseconds on the event loop (`setTimeout` of the global object, a `Window` or a
/// `WorkerGlobalScope`, through `gloo-timers`), letting callbacks queued meanwhile run. Browser
/// only: native code waits on the device instead.
#[cfg(target_arch = "wasm32")]
pub async fn sleep_ms(ms: u32) {
    gloo_timers::future::TimeoutFuture::new(ms).await;
}
