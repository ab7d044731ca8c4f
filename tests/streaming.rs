//! Loading by ranges (`Engine::load_from`): a model read from a source that never lends its
//! bytes, on both backends, gives what the whole-file load gives (same fingerprint, same
//! tokens); the GPU backend never asks for more than a bounded window at once; split models load
//! as one; a source that fails or shrinks is `MODEL_READ`, a short file `MODEL_FORMAT`; the
//! memory estimate from the header alone matches what the engine then holds.
mod common;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

use std::cell::{Cell, RefCell};

use common::{real_model_bytes, tiny_model};
use pagedlm::engine::{BackendChoice, Engine, EngineOptions, ErrorKind, GenerateRequest, LoadEvent, SamplingParams};
use pagedlm::gguf::{Gguf, ReadAhead, ReadAt};
use pagedlm::gpu::ops::matmul::FILL_CHUNK_BYTES;
use pagedlm::synth::split_gguf;

/// A file in memory that only reads (never lends its bytes, as a browser `Blob` or a disk file),
/// counting what it is asked for; it can fail after `fail_after` bytes, or claim to be longer
/// than it is (a file that shrank after its header was read).
struct Reader<'a> {
    bytes: &'a [u8],
    claimed: u64,
    fail_after: Option<u64>,
    read: Cell<u64>,
    largest: Cell<u64>,
    calls: Cell<u32>,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, claimed: bytes.len() as u64, fail_after: None, read: Cell::new(0), largest: Cell::new(0), calls: Cell::new(0) }
    }
}

impl ReadAt for Reader<'_> {
    fn size(&self) -> u64 {
        self.claimed
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        if self.fail_after.is_some_and(|n| self.read.get() + buf.len() as u64 > n) {
            return Err("the disk went away".into());
        }
        self.read.set(self.read.get() + buf.len() as u64);
        self.calls.set(self.calls.get() + 1);
        self.largest.set(self.largest.get().max(buf.len() as u64));
        self.bytes.read_at(offset, buf)
    }
}

fn options(backend: BackendChoice) -> EngineOptions {
    EngineOptions { backend, max_context: 256, ..EngineOptions::default() }
}

async fn greedy(engine: &mut Engine) -> Vec<u32> {
    let request = GenerateRequest { max_tokens: 8, sampling: SamplingParams::greedy(), ignore_eos: true, ..Default::default() };
    engine.generate(&[1, 20, 30, 40, 50], &request, &mut |_| true).await.unwrap().tokens
}

async fn streamed_matches_whole(bytes: &[u8], backend: BackendChoice) -> Reader<'_> {
    let mut whole = Engine::load(bytes, options(backend)).await.unwrap();
    let reader = Reader::new(bytes);
    let events = RefCell::new(Vec::new());
    let mut streamed = Engine::load_from(&[&reader], options(backend), &mut |e| events.borrow_mut().push(e)).await.unwrap();
    assert_eq!(streamed.config().fingerprint, whole.config().fingerprint, "{backend:?}: the fingerprint does not depend on how the file is read");
    assert_eq!(greedy(&mut streamed).await, greedy(&mut whole).await, "{backend:?}: the same tokens");
    assert_eq!(streamed.memory().weights_bytes, whole.memory().weights_bytes);
    let events = events.into_inner();
    let total: u64 = Gguf::parse(bytes).unwrap().tensors.iter().map(|t| t.size_bytes).sum();
    assert_eq!(events.first(), Some(&LoadEvent::Tokenizer), "{events:?}");
    assert!(events.contains(&LoadEvent::Upload { loaded: total, total }), "{backend:?}: the upload reaches its total: {events:?}");
    assert_eq!(events.last(), Some(&LoadEvent::Pipelines), "{events:?}");
    assert!(reader.read.get() >= total, "every tensor was read");
    reader
}

gpu_test! {
    async fn streamed_loads_match_whole_loads_on_both_backends() {
        let bytes = tiny_model(7);
        streamed_matches_whole(&bytes, BackendChoice::Cpu).await;
        streamed_matches_whole(&bytes, BackendChoice::Webgpu).await;
    }
}

gpu_test! {
    async fn reading_ahead_serves_small_reads_from_one_window() {
        // A source that costs a call per read (the browser's) behind `ReadAhead`: the same model,
        // far fewer calls (a tensor's fingerprint samples and norms come from one window).
        let bytes = tiny_model(17);
        let direct = Reader::new(&bytes);
        let mut a = Engine::load_from(&[&direct], options(BackendChoice::Cpu), &mut |_| {}).await.unwrap();
        let ahead = ReadAhead::new(Reader::new(&bytes));
        let mut b = Engine::load_from(&[&ahead], options(BackendChoice::Cpu), &mut |_| {}).await.unwrap();
        assert_eq!(a.config().fingerprint, b.config().fingerprint);
        assert_eq!(greedy(&mut a).await, greedy(&mut b).await);
        let (direct, ahead) = (direct.calls.get(), ahead.inner().calls.get());
        assert!(ahead * 4 < direct, "{ahead} calls read ahead, {direct} without");
    }
}

gpu_test! {
    async fn the_gpu_backend_reads_bounded_windows() {
        // SmolLM2's embedding (49,152 × 576 Q8_0, 30 MB) is read in windows of at most
        // `FILL_CHUNK_BYTES` on the GPU backend (the header's first read is 1 MiB).
        let bytes = real_model_bytes().await;
        let reader = streamed_matches_whole(&bytes, BackendChoice::Webgpu).await;
        let largest_tensor = Gguf::parse(&bytes).unwrap().tensors.iter().map(|t| t.size_bytes).max().unwrap();
        assert!(largest_tensor > 2 * FILL_CHUNK_BYTES, "the model has a tensor worth splitting ({largest_tensor} bytes)");
        assert!(reader.largest.get() <= FILL_CHUNK_BYTES, "largest read {} bytes, over the {FILL_CHUNK_BYTES}-byte window", reader.largest.get());
    }
}

gpu_test! {
    async fn split_models_load_as_one() {
        let bytes = tiny_model(11);
        let parts = split_gguf(&bytes, 3);
        assert_eq!(parts.len(), 3);
        let readers: Vec<Reader<'_>> = parts.iter().map(|p| Reader::new(p)).collect();
        let sources: Vec<&dyn ReadAt> = readers.iter().map(|r| r as &dyn ReadAt).collect();
        for backend in [BackendChoice::Cpu, BackendChoice::Webgpu] {
            let mut split = Engine::load_from(&sources, options(backend), &mut |_| {}).await.unwrap();
            let mut whole = Engine::load(&bytes, options(backend)).await.unwrap();
            assert_eq!(greedy(&mut split).await, greedy(&mut whole).await, "{backend:?}");
        }
        // One part alone, or the parts out of order, are refused by name.
        let alone = Engine::load_from(&sources[..1], options(BackendChoice::Cpu), &mut |_| {}).await.err().unwrap();
        assert_eq!(alone.kind(), ErrorKind::ModelFormat);
        assert!(alone.to_string().contains("give every part"), "{alone}");
        let swapped = [sources[1], sources[0], sources[2]];
        let err = Engine::load_from(&swapped, options(BackendChoice::Cpu), &mut |_| {}).await.err().unwrap();
        assert_eq!(err.kind(), ErrorKind::ModelFormat, "{err}");
    }
}

gpu_test! {
    async fn a_failing_or_shrunk_source_is_model_read() {
        let bytes = tiny_model(13);
        let header = Gguf::parse(&bytes).unwrap().data_offset;
        for backend in [BackendChoice::Cpu, BackendChoice::Webgpu] {
            let failing = Reader { fail_after: Some(header + 2000), ..Reader::new(&bytes) };
            let err = Engine::load_from(&[&failing], options(backend), &mut |_| {}).await.err().unwrap();
            assert_eq!(err.kind(), ErrorKind::ModelRead, "{backend:?}: {err}");
            assert!(err.to_string().contains("the disk went away"), "{err}");
            // The file is shorter than the size it was opened with: its end cannot be read.
            let cut = &bytes[..bytes.len() - 100];
            let shrunk = Reader { claimed: bytes.len() as u64, ..Reader::new(cut) };
            let err = Engine::load_from(&[&shrunk], options(backend), &mut |_| {}).await.err().unwrap();
            assert_eq!(err.kind(), ErrorKind::ModelRead, "{backend:?}: {err}");
        }
        // A file cut short is refused from its header: its last tensors lie past its end.
        let cut = Reader::new(&bytes[..bytes.len() - 100]);
        let err = Engine::load_from(&[&cut], options(BackendChoice::Cpu), &mut |_| {}).await.err().unwrap();
        assert_eq!(err.kind(), ErrorKind::ModelFormat, "{err}");
    }
}

// Natively only: a 600-token prefill on SwiftShader would add a minute to the browser run for
// arithmetic that is the same in both runtimes.
#[cfg(not(target_arch = "wasm32"))]
gpu_test! {
    async fn the_estimate_matches_what_the_engine_holds() {
        use pagedlm::engine::{estimate, DeviceBudget, MemoryEstimate, SchedConfig, Speculative};
        use pagedlm::gguf::Prefix;
        // The estimate from the header alone: the weights exactly what each backend then holds, the
        // KV cache what the pool takes, the total within 5% of what the engine holds after a
        // generation; a budget under it says it does not fit, and why.
        let bytes = real_model_bytes().await;
        let data_offset = Gguf::parse(&bytes).unwrap().data_offset as usize;
        let prefix = Prefix { bytes: &bytes[..data_offset], size: bytes.len() as u64 };
        let short = Prefix { bytes: &bytes[..4096], size: bytes.len() as u64 };
        assert!(Gguf::header_need(&short).unwrap().is_some_and(|n| n > 4096), "a 4 KiB prefix does not hold SmolLM2's header");
        assert_eq!(Gguf::header_need(&prefix).unwrap(), None);
        let gguf = Gguf::open(&[&prefix]).unwrap();
        for backend in [BackendChoice::Webgpu, BackendChoice::Cpu] {
            let users = EngineOptions { backend, max_context: 1024, ..EngineOptions::for_users() };
            // Speculation (the users' default) may build a step of a token and a draft per
            // sequence, whose logit rows the estimate counts: more than the plain steps here hold.
            let opts = EngineOptions { sched: SchedConfig { speculative: Speculative::Off, ..users.sched.clone() }, ..users.clone() };
            let e = estimate(&gguf, &opts, DeviceBudget::default()).unwrap();
            assert!(e.fits && e.reasons.is_empty(), "{e:?}");
            let drafting = estimate(&gguf, &users, DeviceBudget::default()).unwrap();
            let more = |per: fn(&MemoryEstimate) -> u64| per(&drafting) as i64 - per(&e) as i64;
            assert!(more(|x| x.activations_bytes.webgpu) > 0, "the estimate counts verification steps' logit rows: {drafting:?}");
            assert_eq!(more(|x| x.total_bytes.webgpu), more(|x| x.activations_bytes.webgpu), "and only those");
            let mut engine = Engine::load(&bytes, opts.clone()).await.unwrap();
            // A prompt past one prefill chunk: the engine then holds its largest step's graph.
            let prompt: Vec<u32> = (0..600).map(|i| 100 + i).collect();
            let request = GenerateRequest { max_tokens: 2, ignore_eos: true, ..Default::default() };
            if backend == BackendChoice::Webgpu {
                engine.generate(&prompt, &request, &mut |_| true).await.unwrap();
            }
            let held = engine.memory();
            let (weights, total) = match backend {
                BackendChoice::Cpu => (e.weights_bytes.cpu, e.total_bytes.cpu),
                _ => (e.weights_bytes.webgpu, e.total_bytes.webgpu),
            };
            assert_eq!(weights, held.weights_bytes, "{backend:?}: weights");
            assert_eq!(e.kv_bytes.f32, held.kv_bytes, "{backend:?}: the KV pool");
            // The CPU backend's scratch is wasm memory, not counted in `memory()`: its total
            // is the WebGPU one's check only.
            let off = (total as f64 - held.total() as f64).abs() / held.total() as f64;
            assert!(backend == BackendChoice::Cpu || off <= 0.05, "{backend:?}: estimated {total}, the engine holds {} ({held:?}): {:.1}% off", held.total(), off * 100.0);
            let tight = DeviceBudget { memory_bytes: Some(total - 1), ..DeviceBudget::default() };
            let e = estimate(&gguf, &opts, tight).unwrap();
            assert!(!e.fits && !e.reasons.is_empty(), "{e:?}");
        }
        // A KV layer over a lowered buffer limit does not fit WebGPU.
        let opts = EngineOptions { backend: BackendChoice::Webgpu, max_context: 8192, ..EngineOptions::for_users() };
        let low = DeviceBudget { max_buffer_size: Some(1 << 20), ..DeviceBudget::default() };
        let e = estimate(&gguf, &opts, low).unwrap();
        assert!(!e.fits && e.reasons.iter().any(|r| r.contains("buffer limit")), "{e:?}");
    }
}
