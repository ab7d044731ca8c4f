//! Wall-clock milliseconds that work natively and in the browser (main thread or Worker).
//!
//! `web_time::Instant` is `std::time::Instant` natively and reads `performance.now()` from the
//! global object in wasm (a `Window` or a `WorkerGlobalScope`), so this module needs no
//! JavaScript bindings of its own ([`sleep_ms`] reaches `setTimeout` through `js_sys`).

use std::sync::OnceLock;

use web_time::Instant;

/// Milliseconds since an arbitrary origin (the first call), for measuring intervals.
pub fn now_ms() -> f64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_secs_f64() * 1000.0
}

/// Waits `ms` milliseconds on the event loop (`setTimeout` of the global object, a `Window` or a
/// `WorkerGlobalScope`), letting callbacks queued meanwhile run. Browser only: native code waits
/// on the device instead.
#[cfg(target_arch = "wasm32")]
pub async fn sleep_ms(ms: u32) {
    use wasm_bindgen::JsCast;
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        let global = js_sys::global();
        let set_timeout = js_sys::Reflect::get(&global, &"setTimeout".into()).ok().and_then(|f| f.dyn_into::<js_sys::Function>().ok());
        match set_timeout {
            Some(f) => {
                let _ = f.call2(&global, &resolve, &ms.into());
            }
            None => {
                let _ = resolve.call0(&wasm_bindgen::JsValue::UNDEFINED);
            }
        }
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}
