//! Small devices, natively and in the browser: a device created with a phone's limits
//! ([`DeviceLimits::Phone`]: WebGPU's defaults, 128 MiB buffers) enforces them and the engine runs
//! there as it runs on the adapter's own limits; a memory cap (`max_memory_bytes`) sizes the KV
//! pool to fit, refuses what cannot fit as `OutOfMemory` naming it, and a step past it fails its
//! requests while the engine keeps serving what fits. The whole suite runs under a phone's
//! limits with `scripts/test-phone-limits.sh`.
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use common::tiny_model;
use pagedlm::engine::{DeviceLimits, Engine, EngineOptions, ErrorKind, GenerateRequest, SchedConfig, ScoreMode};
use pagedlm::gpu::{Context, ContextOptions, PHONE_MAX_BUFFER};
use pagedlm::synth::{tiny_llama_gguf, SynthConfig, SYNTH_BASE_VOCAB, SYNTH_MERGES};

fn greedy(n: u32) -> GenerateRequest {
    GenerateRequest { max_tokens: n, ignore_eos: true, ..Default::default() }
}

gpu_test! {
    async fn a_phone_device_has_webgpus_default_limits_and_enforces_them() {
        let ctx = Context::new(ContextOptions { limits: DeviceLimits::Phone, ..Default::default() }).await.unwrap();
        let device = ctx.device.limits();
        assert_eq!(device.max_storage_buffers_per_shader_stage, 8);
        assert_eq!(device.max_compute_workgroup_storage_size, 16 << 10);
        assert_eq!(device.max_compute_invocations_per_workgroup, 256);
        assert!(ctx.limits.max_storage_buffer_binding_size as u64 <= PHONE_MAX_BUFFER && ctx.limits.max_buffer_size <= PHONE_MAX_BUFFER, "{:?}", ctx.limits);
        // A kernel binding nine storage buffers is refused there, and reported rather than
        // panicking (the engine fails the work it hit).
        let bindings: String = (0..9).map(|i| format!("@group(0) @binding({i}) var<storage, read_write> b{i}: array<u32>;\n")).collect();
        let body: String = (0..9).map(|i| format!("b{i}[0] = 1u; ")).collect();
        let source = format!("{bindings}@compute @workgroup_size(1) fn main() {{ {body} }}");
        let module = ctx.device.create_shader_module(wgpu::ShaderModuleDescriptor { label: None, source: wgpu::ShaderSource::Wgsl(source.into()) });
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let _ = ctx.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: None, layout: None, module: &module, entry_point: Some("main"), compilation_options: Default::default(), cache: None,
        });
        assert!(scope.pop().await.is_some(), "nine storage buffers in one stage must be refused on a phone's limits");
    }
}

gpu_test! {
    async fn the_engine_on_a_phones_limits_generates_what_it_does_on_the_adapters() {
        let bytes = tiny_model(5);
        let prompt: Vec<u32> = (0..40).map(|i| 3 + (i * 7) % 250).collect();
        let mut want = Engine::load(&bytes, EngineOptions { device_limits: DeviceLimits::Adapter, ..Default::default() }).await.unwrap();
        let mut phone = Engine::load(&bytes, EngineOptions { device_limits: DeviceLimits::Phone, ..Default::default() }).await.unwrap();
        assert_eq!(phone.context().expect("a WebGPU engine").device.limits().max_storage_buffers_per_shader_stage, 8, "the phone engine runs on a phone's device");
        let a = want.generate(&prompt, &greedy(12), &mut |_| true).await.unwrap();
        let b = phone.generate(&prompt, &greedy(12), &mut |_| true).await.unwrap();
        assert_eq!(a.tokens, b.tokens, "a phone's limits change no token");
    }
}

gpu_test! {
    async fn a_memory_cap_sizes_the_pool_and_refuses_what_cannot_fit() {
        // A narrow model with the largest synthetic vocabulary (hidden 32, 278 tokens), in steps
        // of 64 rows: a logit row takes more than a row of activations, as in real models
        // (SmolLM2: 49,152 logits for 576 hidden), so a step that reads every row's logits needs
        // more than any step of a generation.
        let bytes = tiny_llama_gguf(&SynthConfig { hidden: 32, ffn: 64, n_heads: 2, n_kv_heads: 1, vocab: SYNTH_BASE_VOCAB + SYNTH_MERGES.len(), seed: 6, ..SynthConfig::tiny() });
        let base = EngineOptions {
            max_context: 512,
            prefill_chunk: 64,
            // One sequence at a time: the steps of a generation are a decode row or a chunk.
            sched: SchedConfig { step_tokens: 64, max_batch: 1, ..Default::default() },
            check_integrity: true,
            ..Default::default()
        };
        // What the weights and the largest steps of a generation hold (no cap to speak of).
        let probe = Engine::load(&bytes, base.clone()).await.unwrap();
        let (weights, activations) = (probe.memory().weights_bytes, probe.largest_steps_bytes().unwrap());
        let per_token = probe.kv_cache().bytes_per_token();
        drop(probe);

        // Below the weights: refused at load, saying what takes the memory.
        let err = Engine::load(&bytes, EngineOptions { max_memory_bytes: Some(weights / 2), ..base.clone() }).await.err().expect("a cap under the weights loads");
        assert_eq!(err.kind(), ErrorKind::OutOfMemory, "{err}");
        assert!(err.to_string().contains("weights"), "{err}");

        // Room for the weights, the activations and 192 tokens of K/V: the default pool (the
        // maximum context, 512 tokens) shrinks to fit, and the engine stays within the cap.
        let cap = weights + activations + 200 * per_token;
        let opts = EngineOptions { max_memory_bytes: Some(cap), ..base.clone() };
        let mut engine = Engine::load(&bytes, opts.clone()).await.unwrap();
        let pool = engine.kv_cache().stats().blocks_total * engine.kv_cache().block_size();
        assert!((128..512).contains(&pool), "the pool shrank to what the cap leaves: {pool} tokens");
        let prompt: Vec<u32> = (0..60).map(|i| 3 + (i * 11) % 250).collect();
        for n in [1u32, 8, 40] {
            let g = engine.generate(&prompt[..20 + n as usize], &greedy(n), &mut |_| true).await.unwrap();
            assert_eq!(g.tokens.len(), n as usize);
            assert!(engine.memory().total() <= cap, "the engine holds {} bytes, over its cap of {cap}", engine.memory().total());
        }

        // A pool asked for that cannot fit: refused at load, naming it.
        let err = Engine::load(&bytes, EngineOptions { pool_tokens: 4096, ..opts.clone() }).await.err().expect("an oversized pool loads");
        assert_eq!(err.kind(), ErrorKind::OutOfMemory, "{err}");
        assert!(err.to_string().contains("4096 tokens"), "{err}");

        // A step past the cap: scoring reads every position's logits, 64 rows of them per step,
        // more than any step of a generation holds; that call fails with OutOfMemory, within the
        // cap, and the engine serves the next request as before.
        let long: Vec<u32> = (0..180).map(|i| 3 + (i * 13) % 250).collect();
        let err = engine.score_logits(&long, 1, ScoreMode::Prefill).await.expect_err("a step past the cap runs");
        assert_eq!(err.kind(), ErrorKind::OutOfMemory, "{err}");
        assert!(engine.memory().total() <= cap);
        let again = engine.generate(&prompt, &greedy(5), &mut |_| true).await.unwrap();
        assert_eq!(again.tokens.len(), 5, "the engine still serves after an allocation it refused");
        engine.kv_cache().check_integrity().unwrap();
        common::report(&format!(
            "memory cap {cap} bytes: weights {weights}, activations {activations}, pool {pool} tokens ({per_token} bytes each); a 64-row scoring step refused: {err}"
        ));
    }
}
