//! Wall-clock milliseconds that work natively and in the browser (main thread or Worker).
//!
//! `web_time::Instant` is `std::time::Instant` natively and reads `performance.now()` from the
//! global object in wasm (a `Window` or a `WorkerGlobalScope`), so this module needs no
//! JavaScript bindings of its own.

use std::sync::OnceLock;

use web_time::Instant;

/// Milliseconds since an arbitrary origin (the first call), for measuring intervals.
pub fn now_ms() -> f64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_secs_f64() * 1000.0
}
