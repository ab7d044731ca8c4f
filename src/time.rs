//! Wall-clock milliseconds that work natively and in the browser (main thread or Worker).

/// Milliseconds since an arbitrary origin, for measuring intervals.
#[cfg(not(target_arch = "wasm32"))]
pub fn now_ms() -> f64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_secs_f64() * 1000.0
}

/// Milliseconds since an arbitrary origin, for measuring intervals.
#[cfg(target_arch = "wasm32")]
pub fn now_ms() -> f64 {
    let global = js_sys::global();
    js_sys::Reflect::get(&global, &"performance".into())
        .ok()
        .and_then(|p| {
            let now = js_sys::Reflect::get(&p, &"now".into()).ok()?;
            let f: js_sys::Function = now.dyn_into().ok()?;
            f.call0(&p).ok()?.as_f64()
        })
        .unwrap_or_else(js_sys::Date::now)
}

#[cfg(target_arch = "wasm32")]
use wasm_bindgen::JsCast;
