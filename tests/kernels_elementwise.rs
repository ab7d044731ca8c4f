//! Element-wise kernels against their CPU references, natively and in the browser.
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use common::{assert_close, gpu};
use pagedlm::gpu::{ops, Recorder};
use pagedlm::rng::Rng;

gpu_test! {
    async fn add_matches_cpu() {
        let ctx = gpu().await;
        let mut rng = Rng::new(1);
        for n in [1u32, 63, 64, 65, 10_000] {
            let x = rng.vec_uniform(n as usize, -1.0, 1.0);
            let y = rng.vec_uniform(n as usize, -1.0, 1.0);
            let xb = ctx.storage_init("x", bytemuck::cast_slice(&x));
            let yb = ctx.storage_init("y", bytemuck::cast_slice(&y));
            let k = ops::elementwise::add(&ctx, &xb, &yb, n).unwrap();
            let mut rec = Recorder::new(&ctx, "test");
            rec.dispatch(&k);
            rec.submit();
            let got = ctx.read_f32(&xb, 0, n as u64).await.unwrap();
            let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
            assert_close("add", &got, &want, 0.0, 0.0);
        }
    }
}

gpu_test! {
    async fn add_rejects_short_buffers() {
        let ctx = gpu().await;
        let xb = ctx.storage_zeroed("x", 16);
        let yb = ctx.storage_zeroed("y", 8);
        let err = ops::elementwise::add(&ctx, &xb, &yb, 4).err().expect("a short y must be refused");
        assert!(err.to_string().contains("y needs 16 bytes"), "{err}");
    }
}
