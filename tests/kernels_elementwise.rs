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

gpu_test! {
    async fn add_rows_and_softcap_match_their_cpu_twins() {
        let ctx = gpu().await;
        let mut rng = Rng::new(2);
        for (rows, width) in [(1u32, 96u32), (7, 96), (3, 1000)] {
            let n = rows * width;
            let x = rng.vec_uniform(n as usize, -1.0, 1.0);
            let b = rng.vec_uniform(width as usize, -1.0, 1.0);
            let xb = ctx.storage_init("x", bytemuck::cast_slice(&x));
            let bb = ctx.storage_init("b", bytemuck::cast_slice(&b));
            let mut rec = Recorder::new(&ctx, "test");
            rec.dispatch(&ops::elementwise::add_rows(&ctx, &xb, &bb, n, width).unwrap());
            rec.submit();
            let mut want = x.clone();
            pagedlm::cpu::kernels::add_bias(&mut want, &b);
            assert_close("add_rows", &ctx.read_f32(&xb, 0, n as u64).await.unwrap(), &want, 0.0, 0.0);
        }
        // Logits of every size, far past the cap and near 0.
        let x: Vec<f32> = (0..2000).map(|i| (i as f32 - 1000.0) * 0.37).chain([1e-6, -1e-6, 0.0, 1e30, -1e30]).collect();
        for cap in [30.0f32, 3.0] {
            let xb = ctx.storage_init("x", bytemuck::cast_slice(&x));
            let mut rec = Recorder::new(&ctx, "test");
            rec.dispatch(&ops::elementwise::softcap(&ctx, &xb, x.len() as u32, cap).unwrap());
            rec.submit();
            let mut want = x.clone();
            pagedlm::cpu::kernels::softcap(&mut want, cap);
            assert_close(&format!("softcap {cap}"), &ctx.read_f32(&xb, 0, x.len() as u64).await.unwrap(), &want, 1e-5 * cap, 0.0);
        }
        let xb = ctx.storage_zeroed("x", 64);
        assert!(ops::elementwise::add_rows(&ctx, &xb, &xb, 16, 5).is_err(), "16 values are not rows of 5");
        assert!(ops::elementwise::softcap(&ctx, &xb, 16, 0.0).is_err(), "a cap of 0");
    }
}
