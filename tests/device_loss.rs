//! A lost GPU device (driver reset, memory reclaimed, `destroy()`), natively and in the browser:
//! every running and queued request ends with `DeviceLost` carrying exactly the tokens it had
//! streamed, nothing more is accepted, and a new engine on the same model bytes takes over.
//! The engine here has a device of its own, so that destroying it leaves other tests' alone.
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use std::collections::HashMap;
use std::sync::Arc;

use common::tiny_model;
use pagedlm::engine::{Engine, EngineError, EngineOptions, ErrorKind, Event, GenerateRequest, RequestId, SchedConfig};
use pagedlm::gpu::Context;

gpu_test! {
    async fn a_lost_device_ends_every_request_with_what_it_had() {
        let bytes = tiny_model(71);
        let options = EngineOptions { max_context: 128, sched: SchedConfig { max_batch: 2, ..Default::default() }, ..Default::default() };
        let ctx = Arc::new(Context::new(options.context_options()).await.unwrap());
        let mut engine = Engine::load_with_context(ctx.clone(), &bytes, options.clone()).unwrap();
        let request = GenerateRequest { max_tokens: 60, ignore_eos: true, ..Default::default() };
        let prompts: Vec<Vec<u32>> = (0..3u32).map(|k| (0..6 + k).map(|i| 5 + 7 * i + k).collect()).collect();
        // Two run (a batch of 2), the third waits.
        let ids: Vec<RequestId> = prompts.iter().map(|p| engine.submit(p.clone(), request.clone()).unwrap()).collect();
        let mut streamed: HashMap<RequestId, Vec<u32>> = HashMap::new();
        let mut ended: HashMap<RequestId, Result<Vec<u32>, EngineError>> = HashMap::new();
        let mut take = |events: Vec<Event>, streamed: &mut HashMap<RequestId, Vec<u32>>| {
            for e in events {
                match e {
                    Event::Token { id, token, .. } => streamed.entry(id).or_default().push(token),
                    Event::Finished { id, result } => {
                        ended.insert(id, result.map(|g| g.tokens));
                    }
                    _ => {}
                }
            }
        };
        while streamed.get(&ids[1]).map_or(0, Vec::len) < 3 {
            let events = engine.step().await.unwrap();
            take(events, &mut streamed);
        }
        assert!(!engine.is_lost());
        ctx.device.destroy();
        for _ in 0..10 {
            if !engine.has_work() {
                break;
            }
            let events = engine.step().await.expect("a lost device ends the requests, not the step");
            take(events, &mut streamed);
        }
        assert!(!engine.has_work(), "requests still running after the device was lost");
        assert!(engine.is_lost());
        for (k, id) in ids.iter().enumerate() {
            match ended.get(id) {
                Some(Err(EngineError::DeviceLost { tokens, text, .. })) => {
                    let had = streamed.get(id).cloned().unwrap_or_default();
                    assert_eq!(tokens, &had, "request {k}: the tokens it carries are the ones it streamed");
                    assert_eq!(text, &engine.tokenizer().decode(&had).unwrap_or_default(), "request {k}: its text");
                    assert_eq!(had.is_empty(), k == 2, "request {k}: only the queued one had nothing");
                }
                other => panic!("request {k} ended with {other:?}, not DeviceLost"),
            }
        }
        let err = engine.submit(prompts[0].clone(), request.clone()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::DeviceLost, "{err}");
        assert!(err.to_string().contains("recreated"), "{err}");
        // A new engine on the same bytes (and a device of its own) continues where the first
        // request was: the same greedy tokens from the start.
        let ctx = Arc::new(Context::new(options.context_options()).await.unwrap());
        let mut fresh = Engine::load_with_context(ctx, &bytes, options).unwrap();
        let g = fresh.generate(&prompts[0], &request, &mut |_| true).await.unwrap();
        let had = &streamed[&ids[0]];
        assert_eq!(&g.tokens[..had.len()], &had[..], "the new engine's tokens begin with what the lost one streamed");
    }
}
