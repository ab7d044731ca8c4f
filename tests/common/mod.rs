//! Shared test helpers: a GPU context that fails loudly without an adapter, a test macro that
//! runs the same async test natively (lavapipe, through pollster) and in headless Chromium
//! (SwiftShader, through wasm-bindgen-test), and tolerance checks.
#![allow(dead_code)]

use pagedlm::gpu::{Context, ContextOptions};

/// The GPU context for a test. A missing adapter is a failure that says why, never a skip.
pub async fn gpu() -> Context {
    match Context::new(ContextOptions::default()).await {
        Ok(ctx) => ctx,
        Err(e) => panic!("this test needs a WebGPU/Vulkan adapter and found none: {e}"),
    }
}

/// Defines an async test that runs in both runtimes.
#[macro_export]
macro_rules! gpu_test {
    (async fn $name:ident() $body:block) => {
        #[cfg(not(target_arch = "wasm32"))]
        #[test]
        fn $name() {
            pollster::block_on(async $body)
        }
        #[cfg(target_arch = "wasm32")]
        #[wasm_bindgen_test::wasm_bindgen_test]
        async fn $name() $body
    };
}

/// Asserts |a - b| <= abs_tol + rel_tol * |b| element-wise, reporting the worst element.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], abs_tol: f32, rel_tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length {} != {}", got.len(), want.len());
    let mut worst = (0usize, 0f32);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        let excess = err - (abs_tol + rel_tol * w.abs());
        if !(g.is_finite()) || excess > worst.1 {
            worst = (i, if g.is_finite() { excess } else { f32::INFINITY });
        }
    }
    if worst.1 > 0.0 {
        let i = worst.0;
        panic!(
            "{what}: element {i} is {} but the reference is {} (tolerance {abs_tol} + {rel_tol}·|ref|)",
            got[i], want[i]
        );
    }
}
