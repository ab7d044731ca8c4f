//! Contexts shared between engines: one device per set of [`ContextOptions`], per thread in the
//! browser (a page or a Worker) and per process natively, so that a second engine (a new model,
//! other KV settings, the next test) compiles none of the pipelines its predecessors compiled.
//! On a software GPU a fresh device pays every shader compile again: ~16 s for a tiny model's
//! first prefill and decode in Chromium (SwiftShader), ~3 s on lavapipe with Mesa's shader cache
//! warm, against ~0.1 s on a context that has run them.

use std::sync::Arc;

use super::{Context, ContextOptions, GpuError};

/// The registry's key: the options, spelled out (every field decides what the device is).
fn key(options: &ContextOptions) -> String {
    format!("{options:?}")
}

#[cfg(target_arch = "wasm32")]
mod registry {
    use std::cell::RefCell;
    use std::sync::Arc;

    use super::Context;

    thread_local! {
        static CONTEXTS: RefCell<Vec<(String, Arc<Context>)>> = const { RefCell::new(Vec::new()) };
    }

    pub fn with<R>(f: impl FnOnce(&mut Vec<(String, Arc<Context>)>) -> R) -> R {
        CONTEXTS.with(|c| f(&mut c.borrow_mut()))
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod registry {
    use std::sync::{Arc, Mutex};

    use super::Context;

    static CONTEXTS: Mutex<Vec<(String, Arc<Context>)>> = Mutex::new(Vec::new());

    pub fn with<R>(f: impl FnOnce(&mut Vec<(String, Arc<Context>)>) -> R) -> R {
        f(&mut CONTEXTS.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Context {
    /// The context for `options` that an earlier call created, or a new one that later calls
    /// will share. A lost device leaves the registry: the next call creates a fresh one. Engines
    /// on one context share its pipelines and its [`Context::counters`]; a caller that needs
    /// counters of its own (a profile on a thread next to other engines) creates its own
    /// context with [`Context::new`].
    pub async fn shared(options: ContextOptions) -> Result<Arc<Context>, GpuError> {
        let key = key(&options);
        let found = registry::with(|contexts| {
            contexts.retain(|(_, ctx)| !ctx.is_lost());
            contexts.iter().find(|(k, _)| *k == key).map(|(_, ctx)| ctx.clone())
        });
        if let Some(ctx) = found {
            return Ok(ctx);
        }
        // The registry is not held across the await: natively two callers may race to create
        // one; the first one registered is kept and the other dropped.
        let ctx = Arc::new(Context::new(options).await?);
        Ok(registry::with(|contexts| match contexts.iter().find(|(k, _)| *k == key) {
            Some((_, kept)) => kept.clone(),
            None => {
                contexts.push((key, ctx.clone()));
                ctx
            }
        }))
    }
}
