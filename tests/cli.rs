//! The CLI's contract (see README "Command line"): JSON lines in the shapes outside checks rely on,
//! options checked before anything is loaded, errors said once on stderr, nothing else there.
#![cfg(not(target_arch = "wasm32"))]
mod common;

use std::path::PathBuf;
use std::process::Command;

use common::tiny_model;
use pagedlm::gguf::{GgmlType, Gguf};
use pagedlm::synth::{tiny_llama_gguf, GgufWriter, SynthConfig, SynthTypes};
use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pagedlm"))
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pagedlm-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn real_model() -> String {
    let path = std::env::var("PAGEDLM_MODEL").unwrap_or_else(|_| format!("{}/models/SmolLM2-135M-Instruct.Q4_1.gguf", env!("CARGO_MANIFEST_DIR")));
    assert!(std::path::Path::new(&path).exists(), "the real model is needed at {path}: run `npm run fetch-model`");
    path
}

fn lines(out: &std::process::Output) -> Vec<Value> {
    assert!(out.status.success(), "pagedlm failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Asserts that no part of an error message is said twice in a row, as in
/// `outer: inner: inner` (what an error chain prints when a wrapper both shows its inner error
/// and returns it as its `source()`).
fn assert_said_once(message: &str) {
    for line in message.lines() {
        let parts: Vec<&str> = line.split(": ").collect();
        for start in 1..parts.len() {
            let tail = parts[start..].join(": ");
            let head = parts[..start].join(": ");
            assert!(!head.ends_with(&tail), "the message repeats {tail:?}: {line}");
        }
    }
}

/// Runs pagedlm with `args`, which must fail: returns its stderr, which must say why once.
fn fails(args: &[&str]) -> String {
    let out = bin().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "pagedlm {args:?} succeeded; stdout: {}", String::from_utf8_lossy(&out.stdout));
    assert!(out.stdout.is_empty(), "pagedlm {args:?} failed after printing {}", String::from_utf8_lossy(&out.stdout));
    assert!(stderr.starts_with("pagedlm: "), "pagedlm {args:?}: {stderr}");
    assert_said_once(&stderr);
    stderr
}

/// `model` with the tensor `name` stored as another GGML type (its bytes cut or zero-padded to
/// the size that type takes).
fn with_tensor_type(model: &[u8], name: &str, ggml_type: GgmlType) -> Vec<u8> {
    let g = Gguf::parse(model).unwrap();
    let mut w = GgufWriter::new();
    for (key, value) in &g.metadata {
        w.add_meta(key.clone(), value.clone()).unwrap();
    }
    assert!(g.tensor(name).is_some(), "no tensor {name}");
    for t in &g.tensors {
        let ty = if t.name == name { ggml_type } else { t.ggml_type };
        let mut data = g.tensor_data(t).to_vec();
        if let Some((values, bytes)) = ty.block_size() {
            data.resize((t.dims.iter().product::<u64>() / values * bytes) as usize, 0);
        }
        w.add_tensor(t.name.clone(), &t.dims, ty, data).unwrap();
    }
    w.to_bytes()
}

#[test]
fn tokenize_matches_llamacpp_on_the_reference_strings() {
    let reference: Value = serde_json::from_str(include_str!("data/llamacpp_tokens_public.json")).unwrap();
    let items = reference["items"].as_array().unwrap();
    let texts: Vec<&str> = items.iter().map(|i| i["text"].as_str().unwrap()).collect();
    let dir = temp_dir("tokenize");
    let file = dir.join("texts.json");
    std::fs::write(&file, serde_json::to_string(&texts).unwrap()).unwrap();
    let out = bin().args(["tokenize", "--model", &real_model(), "--texts", file.to_str().unwrap()]).output().unwrap();
    let got = lines(&out);
    assert_eq!(got.len(), items.len());
    for (g, want) in got.iter().zip(items) {
        assert_eq!(g["ids"], want["ids"], "text {:?}", want["text"]);
    }
}

#[test]
fn score_and_generate_print_the_contract_shapes() {
    let dir = temp_dir("gen");
    let model = dir.join("tiny.gguf");
    std::fs::write(&model, tiny_model(SynthConfig::tiny().seed)).unwrap();
    let model = model.to_str().unwrap();

    let items = dir.join("score.json");
    std::fs::write(&items, r#"[{"id": "a", "ids": [10, 20, 30, 40, 50], "from": 3}]"#).unwrap();
    for mode in ["decode", "prefill"] {
        let out = bin().args(["score", "--model", model, "--input", items.to_str().unwrap(), "--mode", mode]).output().unwrap();
        let got = lines(&out);
        assert_eq!(got[0]["id"], "a");
        assert_eq!(got[0]["argmax"].as_array().unwrap().len(), 3, "len(ids) - from + 1 positions");
        let top5 = got[0]["top5"].as_array().unwrap();
        assert_eq!(top5.len(), 3);
        assert_eq!(top5[0].as_array().unwrap().len(), 5);
        assert_eq!(top5[0][0][0], got[0]["argmax"][0]);
    }

    let prompts = dir.join("prompts.json");
    std::fs::write(&prompts, r#"[{"id": "raw", "prompt": "hello"}, {"id": "chat", "messages": [{"role": "user", "content": "hi"}]}]"#).unwrap();
    let out = bin().args(["generate", "--model", model, "--input", prompts.to_str().unwrap(), "--max-tokens", "5"]).output().unwrap();
    let got = lines(&out);
    let contiguous =
        bin().args(["generate", "--model", model, "--input", prompts.to_str().unwrap(), "--max-tokens", "5", "--kv-layout", "contiguous"]).output().unwrap();
    let contiguous = lines(&contiguous);
    for (p, c) in got.iter().zip(&contiguous) {
        assert_eq!(p["tokens"], c["tokens"], "paged (default) and contiguous give the same greedy tokens");
    }
    assert_eq!(got.len(), 2);
    for g in &got {
        for key in ["id", "prompt_tokens", "tokens", "text", "finish_reason", "prefill_ms", "decode_ms"] {
            assert!(g.get(key).is_some(), "generate output lacks {key}: {g}");
        }
        assert!(g["tokens"].as_array().unwrap().len() <= 5);
        let reason = g["finish_reason"].as_str().unwrap();
        assert!(reason == "stop" || reason == "length", "{reason}");
    }
    // "hello" is 5 byte tokens in the synthetic vocabulary (3 + byte).
    assert_eq!(got[0]["prompt_tokens"], serde_json::json!([107, 104, 111, 111, 114]));
    // The chat prompt starts with <|im_start|>system (the template's default system prompt).
    assert_eq!(got[1]["prompt_tokens"][0], 1);
}

/// `--backend cpu` runs the same commands on the CPU backend with the WebGPU backend's greedy
/// tokens and scores, and `bench` says which backend ran.
#[test]
fn the_cpu_backend_runs_the_commands_and_says_so() {
    let dir = temp_dir("cpu");
    let model = dir.join("tiny.gguf");
    std::fs::write(&model, tiny_model(SynthConfig::tiny().seed)).unwrap();
    let model = model.to_str().unwrap();
    let prompts = dir.join("prompts.json");
    std::fs::write(&prompts, r#"[{"id": "chat", "messages": [{"role": "user", "content": "hi"}]}]"#).unwrap();
    let items = dir.join("score.json");
    std::fs::write(&items, r#"[{"id": "a", "ids": [10, 20, 30, 40, 50], "from": 2}]"#).unwrap();
    let run = |args: &[&str], backend: &str| lines(&bin().args(args).args(["--model", model, "--backend", backend]).output().unwrap());
    let generate = ["generate", "--input", prompts.to_str().unwrap(), "--max-tokens", "8"];
    assert_eq!(run(&generate, "cpu")[0]["tokens"], run(&generate, "webgpu")[0]["tokens"], "generate: the same greedy tokens on both backends");
    let score = ["score", "--input", items.to_str().unwrap(), "--mode", "prefill"];
    assert_eq!(run(&score, "cpu")[0]["argmax"], run(&score, "webgpu")[0]["argmax"], "score: the same argmax on both backends");
    let bench = run(&["bench", "--prompt-tokens", "8", "--gen-tokens", "16"], "cpu");
    assert_eq!(bench[0]["backend"], "cpu", "{}", bench[0]);
    assert!(bench[0]["adapter"].as_str().unwrap().starts_with("CPU backend"), "{}", bench[0]);
    assert!(bench[0]["decode_tok_s"].as_f64().unwrap() > 0.0);
    assert!(bench[0].get("speculative").is_none(), "bench measures without drafts unless asked: {}", bench[0]);
    // --speculative auto adds the decode with drafts: its speed, ratio and acceptance (this
    // model's greedy reply repeats one token, which prompt lookup drafts).
    let drafted = run(&["bench", "--prompt-tokens", "8", "--gen-tokens", "16", "--speculative", "auto"], "cpu");
    let s = &drafted[0]["speculative"];
    let acceptance = s["acceptance"].as_f64().unwrap();
    assert!(s["decode_tok_s"].as_f64().unwrap() > 0.0 && s["ratio"].as_f64().unwrap() > 0.0, "{s}");
    assert!(acceptance > 0.0 && acceptance <= 1.0 && s["accepted"].as_u64().unwrap() > 0, "{s}");
    let webgpu = run(&["bench", "--prompt-tokens", "8", "--gen-tokens", "16"], "webgpu");
    assert_eq!(webgpu[0]["backend"], "webgpu");
    assert_eq!(webgpu[0]["backend_reason"], "asked for");
    // The default is auto: the CPU backend where the adapter is a CPU emulation (lavapipe; its
    // kernels then run as the "cpu" class), WebGPU on a real GPU; the line says which and why.
    let default = lines(&bin().args(["bench", "--prompt-tokens", "8", "--gen-tokens", "16", "--model", model]).output().unwrap());
    let emulated = webgpu[0]["variant"].as_str().unwrap().starts_with("cpu");
    assert_eq!(default[0]["backend"], if emulated { "cpu" } else { "webgpu" }, "{}", default[0]);
    let reason = default[0]["backend_reason"].as_str().unwrap();
    assert!(reason.starts_with(if emulated { "auto: the WebGPU adapter is a CPU emulation" } else { "auto: a GPU adapter" }), "{reason}");
    let profile = run(&["profile", "--prompt-tokens", "8"], "cpu");
    assert_eq!(profile[0]["backend"], "cpu", "{}", profile[0]);
    assert_eq!(profile[0]["dispatches_per_decode_step"], 0, "a CPU step dispatches nothing: {}", profile[0]);
}

/// `--model` names the first part of a split model (llama.cpp's `name-00001-of-00003.gguf`): the
/// command reads every part and answers as on the whole file; a missing part is named.
#[test]
fn a_split_model_runs_from_its_first_part() {
    let dir = temp_dir("split");
    let bytes = tiny_model(SynthConfig::tiny().seed);
    let whole = dir.join("tiny.gguf");
    std::fs::write(&whole, &bytes).unwrap();
    let prefix = dir.join("tiny-split");
    for (i, part) in pagedlm::synth::split_gguf(&bytes, 3).iter().enumerate() {
        std::fs::write(pagedlm::synth::split_part_name(prefix.to_str().unwrap(), i, 3), part).unwrap();
    }
    let first = pagedlm::synth::split_part_name(prefix.to_str().unwrap(), 0, 3);
    let prompts = dir.join("prompts.json");
    std::fs::write(&prompts, r#"[{"id": "chat", "messages": [{"role": "user", "content": "hi"}]}]"#).unwrap();
    let run = |model: &str| {
        lines(&bin().args(["generate", "--input", prompts.to_str().unwrap(), "--max-tokens", "6", "--backend", "cpu", "--model", model]).output().unwrap())
    };
    assert_eq!(run(&first)[0]["tokens"], run(whole.to_str().unwrap())[0]["tokens"]);
    std::fs::remove_file(pagedlm::synth::split_part_name(prefix.to_str().unwrap(), 2, 3)).unwrap();
    let err = fails(&["generate", "--input", prompts.to_str().unwrap(), "--backend", "cpu", "--model", &first]);
    assert!(err.contains("tiny-split-00003-of-00003.gguf"), "{err}");
}

/// `profile` prints one JSON line (the same with `--json`): the profile of a prefill and a decode
/// step, the summary fields CONTRACTS names, and the per-kernel `prefill_ms`/`decode_ms` pairs
/// it printed before; `--table` prints the same for people.
#[test]
fn profile_prints_one_json_line_with_the_contract_fields() {
    let dir = temp_dir("profile");
    let model = dir.join("tiny.gguf");
    std::fs::write(&model, tiny_model(SynthConfig::tiny().seed)).unwrap();
    let model = model.to_str().unwrap();
    let args = ["profile", "--model", model, "--prompt-tokens", "20", "--prefill-chunk", "8", "--backend", "webgpu"];
    let plain = lines(&bin().args(args).output().unwrap());
    let json = lines(&bin().args(args).arg("--json").output().unwrap());
    assert_eq!((plain.len(), json.len()), (1, 1));
    for p in [&plain[0], &json[0]] {
        for key in ["adapter", "method", "prompt_tokens", "prefill", "decode", "prefill_cold", "prefill_ms", "decode_ms"] {
            assert!(p.get(key).is_some(), "profile output lacks {key}: {p}");
        }
        let decode = &p["decode"];
        assert_eq!(p["dispatches_per_decode_step"], decode["dispatches"]);
        assert_eq!(p["host_ms_per_decode_step"], decode["host_ms"]);
        assert_eq!(p["gpu_ms_per_decode_step"], decode["gpu_ms"]);
        // Steps planned ahead (the default): each token is read while the next step runs.
        assert_eq!(p["blocking_readbacks_per_token"], 0.0);
        assert_eq!(p["lookahead"], true);
        assert_eq!(decode["bytes_read_back_per_token"], 4.0);
        for key in ["variant", "host_share_of_decode_step", "record_share_of_decode_step", "decode_wall_over_gpu"] {
            assert!(p.get(key).is_some(), "profile output lacks {key}: {p}");
        }
        // The old per-kernel pairs: [name, ms] for every kernel of the step.
        let pairs = p["decode_ms"].as_array().unwrap();
        let kernels = decode["kernels"].as_array().unwrap();
        assert_eq!(pairs.len(), kernels.len());
        for (pair, k) in pairs.iter().zip(kernels) {
            assert_eq!((&pair[0], &pair[1]), (&k["name"], &k["ms"]));
        }
        let dispatches: u64 = kernels.iter().map(|k| k["dispatches"].as_u64().unwrap()).sum();
        assert_eq!(Some(dispatches), decode["dispatches"].as_u64());
        assert_eq!(p["prefill"]["readbacks"], 3, "20 prompt tokens in passes of 8");
    }
    let no_timestamps = lines(&bin().args(args).arg("--no-timestamps").output().unwrap());
    assert_eq!(no_timestamps[0]["method"], "wall_clock_per_kernel");
    let no_lookahead = lines(&bin().args(args).arg("--no-lookahead").output().unwrap());
    assert_eq!(no_lookahead[0]["blocking_readbacks_per_token"], 1.0);

    let table = bin().args(args).arg("--table").output().unwrap();
    assert!(table.status.success(), "{}", String::from_utf8_lossy(&table.stderr));
    let text = String::from_utf8(table.stdout).unwrap();
    for want in ["wall ms", "dispatches", "bytes read back / token", "decode kernel", "prefill kernel"] {
        assert!(text.contains(want), "the table lacks {want:?}:\n{text}");
    }
    let first_kernel = plain[0]["decode"]["kernels"][0]["name"].as_str().unwrap();
    assert!(text.contains(first_kernel), "the table lists the kernels:\n{text}");
    assert!(fails(&[&args[..], &["--json", "--table"]].concat()).contains("not both"));
}

#[test]
fn errors_go_to_stderr_with_a_nonzero_exit() {
    assert!(fails(&["generate", "--model", "/nonexistent.gguf", "--prompt", "x"]).contains("fetch-model"));
    let dir = temp_dir("err");
    let model = dir.join("tiny.gguf");
    std::fs::write(&model, tiny_model(SynthConfig::tiny().seed)).unwrap();
    let model = model.to_str().unwrap();
    assert!(fails(&["generate", "--model", model, "--prompt", "x", "--kv-dtype", "int4"]).contains("f32 or int8"));
    // A pool too small for the prompt says so.
    let err = fails(&["generate", "--model", model, "--prompt", "a prompt longer than the pool", "--pool-tokens", "8", "--block-size", "4"]);
    assert!(err.contains("pool"), "{err}");
    assert!(fails(&["generate", "--model", model, "--prompt", "x", "--kv-layout", "ring"]).contains("contiguous or paged"));
    assert!(fails(&["generate", "--model", model, "--prompt", "x", "--temperature", "-2"]).contains("temperature"));
    // The binding limit reaches the device: too small a one is refused naming it, and a small
    // model runs under 1 MiB.
    let err = fails(&["generate", "--model", model, "--prompt", "x", "--max-binding-mib", "0", "--backend", "webgpu"]);
    assert!(err.contains("storage-binding limit of 0 bytes"), "{err}");
    let out =
        bin().args(["generate", "--model", model, "--prompt", "x", "--max-tokens", "2", "--max-binding-mib", "1", "--backend", "webgpu"]).output().unwrap();
    assert!(out.status.success(), "a tiny model under a 1 MiB binding limit: {}", String::from_utf8_lossy(&out.stderr));
    // Input files: missing, not JSON, the wrong shape.
    let err = fails(&["score", "--model", model, "--input", "/nonexistent.json"]);
    assert!(err.contains("/nonexistent.json"), "{err}");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "[{").unwrap();
    assert!(fails(&["tokenize", "--model", model, "--texts", bad.to_str().unwrap()]).contains("not valid JSON"));
    std::fs::write(&bad, r#"[{"id": "a", "ids": "nope", "from": 1}]"#).unwrap();
    assert!(fails(&["score", "--model", model, "--input", bad.to_str().unwrap()]).contains("\"ids\""));
    // Not a model, and a truncated one.
    let junk = dir.join("junk.gguf");
    std::fs::write(&junk, b"definitely not a model").unwrap();
    assert!(fails(&["generate", "--model", junk.to_str().unwrap(), "--prompt", "x"]).contains("GGUF"));
    let bytes = tiny_model(SynthConfig::tiny().seed);
    std::fs::write(&junk, &bytes[..bytes.len() / 2]).unwrap();
    assert!(fails(&["generate", "--model", junk.to_str().unwrap(), "--prompt", "x"]).contains("past the end"));
}

#[test]
fn a_file_of_k_quants_generates_and_scores() {
    let dir = temp_dir("q4k");
    let model = dir.join("q4_k.gguf");
    let types = SynthTypes { embedding: GgmlType::Q5_K, linear: GgmlType::Q4_K };
    std::fs::write(&model, tiny_llama_gguf(&SynthConfig { hidden: 256, ffn: 512, types, ..SynthConfig::tiny() })).unwrap();
    let model = model.to_str().unwrap();
    let out = bin().args(["generate", "--model", model, "--prompt", "hello", "--max-tokens", "4"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let items = dir.join("items.json");
    std::fs::write(&items, r#"[{"id": "a", "ids": [5, 6, 7, 8], "from": 2}]"#).unwrap();
    let got = lines(&bin().args(["score", "--model", model, "--input", items.to_str().unwrap()]).output().unwrap());
    assert_eq!(got[0]["argmax"].as_array().unwrap().len(), 3, "{got:?}");
}

#[test]
fn an_unsupported_tensor_type_is_named_once() {
    let dir = temp_dir("iq4");
    let model = dir.join("iq4_nl.gguf");
    // IQ4_NL (id 20): 32-value blocks ggml can size, a type pagedlm does not compute with.
    std::fs::write(&model, with_tensor_type(&tiny_model(SynthConfig::tiny().seed), "blk.0.attn_q.weight", GgmlType::from_u32(20))).unwrap();
    let err = fails(&["generate", "--model", model.to_str().unwrap(), "--prompt", "x"]);
    assert_eq!(err.matches("IQ4_NL").count(), 1, "{err}");
    assert!(err.contains("blk.0.attn_q.weight"), "{err}");
    assert!(err.contains("Q4_K"), "the message lists the supported types: {err}");
}

/// A misspelt, unknown or repeated option, a missing value, a value of the wrong type or outside
/// its set: each exits non-zero naming the option, before the model is read (the model path
/// given does not exist, and no message mentions it).
#[test]
fn options_are_checked_before_anything_is_loaded() {
    let model = "/nonexistent/model.gguf";
    let check = |args: &[&str], wants: &[&str]| {
        let mut argv = args.to_vec();
        argv.extend(["--model", model]);
        let err = fails(&argv);
        for want in wants {
            assert!(err.contains(want), "pagedlm {args:?}: {err:?} lacks {want:?}");
        }
        assert!(!err.contains(model) && !err.contains("fetch-model"), "pagedlm {args:?} read the model first: {err}");
    };
    check(&["generate", "--prompt", "x", "--kv-dtpye", "int8"], &["--kv-dtpye", "did you mean --kv-dtype?"]);
    check(&["generate", "--prompt", "x", "--max-token", "5"], &["--max-token", "did you mean --max-tokens?"]);
    check(&["generate", "--prompt", "x", "--backend", "gpu"], &["--backend", "gpu"]);
    check(&["generate", "--prompt", "x", "--kv-dtype", "fp16"], &["--kv-dtype", "f32 or int8", "fp16"]);
    check(&["score", "--input", "items.json", "--mode", "greedy"], &["--mode", "decode or prefill", "greedy"]);
    check(&["score", "--input"], &["--input", "needs a value"]);
    check(&["score", "--input", "--mode", "decode"], &["--input", "needs a value"]);
    check(&["generate", "--prompt", "x", "--max-tokens", "ten"], &["--max-tokens", "ten"]);
    check(&["generate", "--prompt", "x", "--max-tokens", "-1"], &["--max-tokens", "-1"]);
    check(&["generate", "--prompt", "x", "--temperature", "warm"], &["--temperature", "warm"]);
    check(&["generate", "--prompt", "x", "--seed", "1.5"], &["--seed", "1.5"]);
    check(&["generate", "--prompt", "x", "--seed", "1", "--seed", "2"], &["--seed", "twice"]);
    check(&["bench", "--transfer", "--lengths", "256,x"], &["--lengths", "x"]);
    check(&["bench", "--transfer=yes"], &["--transfer", "no value"]);
    check(&["tokenize", "--input", "texts.json"], &["--input", "tokenize", "score, generate and trace take it"]);
    check(&["trace", "--input", "t.jsonl", "stray"], &["stray"]);
    check(&["generat", "--prompt", "x"], &["generat", "generate"]);
    for command in ["tokenize", "score", "generate", "bench", "trace", "profile"] {
        check(&[command, "--no-such-option"], &["--no-such-option", command]);
    }
    // `--key=value` is the same as `--key value`.
    check(&["generate", "--prompt=x", "--kv-dtype=fp16"], &["--kv-dtype", "fp16"]);
    let out = bin().args(["help"]).output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("usage: pagedlm"));
    let out = bin().args(["generate", "--help"]).output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("usage: pagedlm"));
}

/// The graphics stack prints a warning on stderr when XDG_RUNTIME_DIR is unset or invalid; the
/// CLI's stderr carries only its own messages.
#[test]
fn nothing_but_the_output_without_xdg_runtime_dir() {
    let dir = temp_dir("xdg");
    let model = dir.join("tiny.gguf");
    std::fs::write(&model, tiny_model(SynthConfig::tiny().seed)).unwrap();
    let items = dir.join("score.json");
    std::fs::write(&items, r#"[{"id": "a", "ids": [10, 20, 30], "from": 2}]"#).unwrap();
    for xdg in [None, Some("relative/dir"), Some("/nonexistent/run")] {
        let mut cmd = bin();
        cmd.args(["score", "--model", model.to_str().unwrap(), "--input", items.to_str().unwrap()]);
        match xdg {
            None => cmd.env_remove("XDG_RUNTIME_DIR"),
            Some(v) => cmd.env("XDG_RUNTIME_DIR", v),
        };
        let out = cmd.output().unwrap();
        assert_eq!(lines(&out).len(), 1);
        assert_eq!(String::from_utf8_lossy(&out.stderr), "", "stderr with XDG_RUNTIME_DIR={xdg:?}");
    }
}

#[test]
fn trace_continues_conversations_and_prints_the_summary() {
    let dir = temp_dir("trace");
    let model = dir.join("tiny.gguf");
    std::fs::write(&model, tiny_model(SynthConfig::tiny().seed)).unwrap();
    let input = dir.join("trace.jsonl");
    std::fs::write(
        &input,
        concat!(
            r#"{"id": "a1", "conversation": "a", "system": "Be brief.", "user": "hi", "max_tokens": 4}"#,
            "\n",
            r#"{"id": "b1", "conversation": "b", "user": "yo", "max_tokens": 3}"#,
            "\n",
            r#"{"id": "a2", "conversation": "a", "user": "and then?", "max_tokens": 4}"#,
            "\n",
        ),
    )
    .unwrap();
    let out = bin().args(["trace", "--model", model.to_str().unwrap(), "--input", input.to_str().unwrap(), "--block-size", "8"]).output().unwrap();
    let mut got = lines(&out);
    assert_eq!(got.len(), 4, "three requests and the summary");
    // Lines come in finishing order; the checks below read them in file order.
    let by_id = |v: &Vec<serde_json::Value>, id: &str| v.iter().position(|g| g["id"] == id).unwrap_or_else(|| panic!("{id} missing"));
    let (a1, b1, a2) = (by_id(&got, "a1"), by_id(&got, "b1"), by_id(&got, "a2"));
    let summary_line = got.pop().unwrap();
    got = vec![got[a1].clone(), got[b1].clone(), got[a2].clone(), summary_line];
    for key in ["id", "conversation", "prompt_tokens", "prefix_hit_tokens", "prefill_tokens", "tokens", "text", "finish_reason", "ttft_ms", "decode_ms"] {
        assert!(got[0].get(key).is_some(), "trace output lacks {key}");
    }
    // The second turn of "a" carries the first turn and its reply: a longer prompt.
    assert!(got[2]["prompt_tokens"].as_u64().unwrap() > got[0]["prompt_tokens"].as_u64().unwrap() + 9);
    let summary = &got[3]["summary"];
    assert_eq!(summary["requests"], 3);
    assert_eq!(summary["integrity_ok"], true);
    assert_eq!(summary["pool"]["block_size"], 8);
    assert_eq!(summary["pool"]["kv_dtype"], "f32");
    assert!(summary["pool"]["blocks_total"].as_u64().unwrap() > 0);
    let sum: u64 = got[..3].iter().map(|g| g["prompt_tokens"].as_u64().unwrap()).sum();
    assert_eq!(summary["prompt_tokens"], sum);
    // The prefix cache: the second turn of "a" starts from its history, and nothing else changes.
    for g in &got[..3] {
        assert_eq!(g["prefix_hit_tokens"].as_u64().unwrap() + g["prefill_tokens"].as_u64().unwrap(), g["prompt_tokens"].as_u64().unwrap());
    }
    let a1_prompt = got[0]["prompt_tokens"].as_u64().unwrap();
    assert!(got[2]["prefix_hit_tokens"].as_u64().unwrap() >= a1_prompt, "turn 2 of a hit {} tokens", got[2]["prefix_hit_tokens"]);
    let hits: u64 = got[..3].iter().map(|g| g["prefix_hit_tokens"].as_u64().unwrap()).sum();
    assert_eq!(summary["prefix_hit_tokens"], hits);
    let out = bin()
        .args(["trace", "--model", model.to_str().unwrap(), "--input", input.to_str().unwrap(), "--block-size", "8", "--no-prefix-cache"])
        .output()
        .unwrap();
    let plain = lines(&out);
    assert_eq!(plain.len(), 4);
    for a in &got[..3] {
        let b = &plain[by_id(&plain, a["id"].as_str().unwrap())];
        assert_eq!(a["tokens"], b["tokens"], "request {}: tokens differ without the prefix cache", a["id"]);
        assert_eq!(b["prefix_hit_tokens"], 0);
        assert_eq!(b["prefill_tokens"], b["prompt_tokens"]);
    }
    assert_eq!(plain[3]["summary"]["prefix_hit_tokens"], 0);
    // Batched: conversations a and b run together; every request gives its sequential tokens.
    let out = bin()
        .args(["trace", "--model", model.to_str().unwrap(), "--input", input.to_str().unwrap(), "--block-size", "8", "--max-batch", "3"])
        .output()
        .unwrap();
    let batched = lines(&out);
    assert_eq!(batched.len(), 4, "{}", String::from_utf8_lossy(&out.stderr));
    for g in &got[..3] {
        let b = batched[..3].iter().find(|b| b["id"] == g["id"]).unwrap_or_else(|| panic!("{} missing from the batched trace", g["id"]));
        assert_eq!(b["tokens"], g["tokens"], "request {}: batched tokens differ", g["id"]);
    }
    assert_eq!(batched[3]["summary"]["integrity_ok"], true);
    assert_eq!(batched[3]["summary"]["max_batch"], 3);
    // Disaggregated: a prefill engine hands each prompt's K/V to the decoding engine.
    let out =
        bin().args(["trace", "--model", model.to_str().unwrap(), "--input", input.to_str().unwrap(), "--block-size", "8", "--disaggregate"]).output().unwrap();
    let split = lines(&out);
    assert_eq!(split.len(), 4, "{}", String::from_utf8_lossy(&out.stderr));
    for g in &got[..3] {
        let d = &split[by_id(&split, g["id"].as_str().unwrap())];
        assert_eq!(d["tokens"], g["tokens"], "request {}: tokens differ when disaggregated", g["id"]);
        assert_eq!(d["prefix_hit_tokens"].as_u64().unwrap() + 1, d["prompt_tokens"].as_u64().unwrap(), "the snapshot covers all but the last prompt token");
        assert!(d["snapshot_bytes"].as_u64().unwrap() > 0 && d["transfer_ms"].as_f64().is_some());
    }
    let out = bin().args(["bench", "--model", model.to_str().unwrap(), "--transfer", "--lengths", "20,50", "--block-size", "8"]).output().unwrap();
    let rows = lines(&out);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1]["tokens"], 50);
    assert!(rows.iter().all(|r| r["architecture"] == "llama"), "the rows name the file's architecture: {rows:?}");
    assert!(rows[1]["snapshot_bytes"].as_u64().unwrap() > rows[0]["snapshot_bytes"].as_u64().unwrap());
    assert_eq!(plain[3]["summary"]["pool"]["blocks_cached"], 0);
}

#[test]
fn generate_follows_json_schemas_grammars_and_response_formats() {
    let dir = temp_dir("constrained");
    let model = dir.join("tiny.gguf");
    std::fs::write(&model, tiny_model(61)).unwrap();
    let model = model.to_str().unwrap();
    let schema = dir.join("schema.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["n"], "additionalProperties": false}"#,
    )
    .unwrap();
    let items = dir.join("items.json");
    std::fs::write(
        &items,
        r#"[{"id": "plain", "prompt": "abc"},
            {"id": "enum", "prompt": "def", "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": {"enum": ["on", "off"]}, "strict": true}}},
            {"id": "text", "prompt": "ghi", "response_format": {"type": "text"}}]"#,
    )
    .unwrap();
    let (items, schema) = (items.to_str().unwrap(), schema.to_str().unwrap());
    let got = lines(&bin().args(["generate", "--model", model, "--input", items, "--json-schema", schema, "--max-tokens", "40"]).output().unwrap());
    assert_eq!(got.len(), 3, "{got:?}");
    let g = &got[0];
    let v: Value = serde_json::from_str(g["text"].as_str().unwrap()).unwrap_or_else(|e| panic!("{g}: {e}"));
    assert!((1..=9).contains(&v["n"].as_i64().unwrap_or(0)) && v.as_object().unwrap().len() == 1, "{g}");
    assert_eq!(g["finish_reason"], "stop", "{g}");
    // An item's own response_format wins over --json-schema: an enum, and plain text.
    assert!(["\"on\"", "\"off\""].contains(&got[1]["text"].as_str().unwrap()), "{}", got[1]);
    let free = lines(&bin().args(["generate", "--model", model, "--input", items, "--max-tokens", "40"]).output().unwrap());
    assert_eq!(got[2]["tokens"], free[2]["tokens"], "response_format text is unconstrained");
    assert_ne!(got[0]["tokens"], free[0]["tokens"], "the schema changed nothing on this model");
    let grammar = dir.join("g.lark");
    std::fs::write(&grammar, "start: \"x=\" /[0-9]{2}/\n").unwrap();
    let out = bin().args(["generate", "--model", model, "--prompt", "abc", "--grammar", grammar.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.trim_end().len() == 4 && text.starts_with("x=") && text[2..4].bytes().all(|b| b.is_ascii_digit()), "{text:?}");
    // The bench's constrained decode on the GPU: its steps go ahead of the token before, like free ones.
    let prose = dir.join("prose.lark");
    std::fs::write(&prose, "start: /[a-z ]{16,64}/\n").unwrap();
    let line = &lines(
        &bin()
            .args(["bench", "--model", model, "--prompt-tokens", "8", "--gen-tokens", "12", "--grammar", prose.to_str().unwrap(), "--backend", "webgpu"])
            .output()
            .unwrap(),
    )[0];
    let c = &line["constrained"];
    assert_eq!(c["tokens"], 12, "{line}");
    assert!(c["steps_ahead_share"].as_f64().unwrap() > 0.5 && c["mask_ms_per_token"].as_f64().unwrap() > 0.0, "{line}");

    // A bad constraint anywhere exits before anything is generated.
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"[{"id": "fine", "prompt": "abc"}, {"id": "broken", "prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "objekt"}}}}]"#).unwrap();
    let err = fails(&["generate", "--model", model, "--input", bad.to_str().unwrap()]);
    assert!(err.contains("broken") && err.contains("objekt"), "{err}");
    let err = fails(&["generate", "--model", model, "--input", items, "--json-schema", schema, "--grammar", grammar.to_str().unwrap()]);
    assert!(err.contains("exclude"), "{err}");
    std::fs::write(&bad, r#"[{"id": "a", "prompt": "x", "response_format": {"type": "yaml"}}]"#).unwrap();
    assert!(fails(&["generate", "--model", model, "--input", bad.to_str().unwrap()]).contains("yaml"));
}

#[test]
fn generate_splits_reasoning_and_takes_chat_template_kwargs() {
    let dir = temp_dir("reasoning");
    let model = dir.join("qwen3-template.gguf");
    let tiny = tiny_llama_gguf(&SynthConfig { seed: 63, context: 1536, ..SynthConfig::tiny() });
    std::fs::write(&model, common::with_chat_template(&tiny, &common::chat_template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"))).unwrap();
    let model = model.to_str().unwrap();
    let items = dir.join("items.json");
    std::fs::write(&items, r#"[{"id": "think", "messages": [{"role": "user", "content": "2 + 2?"}]}]"#).unwrap();
    let got =
        lines(&bin().args(["generate", "--model", model, "--input", items.to_str().unwrap(), "--max-tokens", "12", "--temperature", "1"]).output().unwrap());
    // R1's generation prompt opens the think block and a random model never closes it.
    assert_eq!(got[0]["text"], "", "{}", got[0]);
    assert!(got[0]["reasoning_content"].is_string(), "{}", got[0]);
    // Qwen3 with `enable_thinking: false` from the item or the flag: the prompt closes the block.
    std::fs::write(model, common::with_chat_template(&tiny, &common::chat_template("Qwen-Qwen3-0.6B.jinja"))).unwrap();
    std::fs::write(&items, r#"[{"id": "off", "messages": [{"role": "user", "content": "2 + 2?"}], "chat_template_kwargs": {"enable_thinking": false}}, {"id": "on", "messages": [{"role": "user", "content": "2 + 2?"}]}]"#).unwrap();
    let got = lines(&bin().args(["generate", "--model", model, "--input", items.to_str().unwrap(), "--max-tokens", "2"]).output().unwrap());
    let prompt_len = |g: &Value| g["prompt_tokens"].as_array().unwrap().len();
    assert_eq!(prompt_len(&got[0]), prompt_len(&got[1]) + "<think>\n\n</think>\n\n".len(), "byte tokens: {got:?}");
    let flag = lines(
        &bin()
            .args([
                "generate",
                "--model",
                model,
                "--input",
                items.to_str().unwrap(),
                "--max-tokens",
                "2",
                "--chat-template-kwargs",
                r#"{"enable_thinking": false}"#,
            ])
            .output()
            .unwrap(),
    );
    assert_eq!(prompt_len(&flag[1]), prompt_len(&got[0]), "the flag applies to every item");
    let err = fails(&["generate", "--model", model, "--input", items.to_str().unwrap(), "--chat-template-kwargs", "[1]"]);
    assert!(err.contains("--chat-template-kwargs must be a JSON object"), "{err}");
}

#[test]
fn generate_answers_with_tool_calls_and_refuses_bad_tools() {
    let dir = temp_dir("tools");
    let model = dir.join("tiny.gguf");
    // Room for the tools' system turn in the tiny model's byte-level tokens.
    std::fs::write(&model, tiny_llama_gguf(&SynthConfig { seed: 62, context: 1536, ..SynthConfig::tiny() })).unwrap();
    let model = model.to_str().unwrap();
    let tools = r#"[{"type": "function", "function": {"name": "lamp", "description": "Turns the lamp on or off", "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"], "additionalProperties": false}}}]"#;
    let items = dir.join("items.json");
    let item = |id: &str, extra: &str| format!(r#"{{"id": "{id}", "messages": [{{"role": "user", "content": "Light, please."}}], "tools": {tools}{extra}}}"#);
    std::fs::write(&items, format!("[{}, {}]", item("forced", r#", "tool_choice": "required""#), item("none", r#", "tool_choice": "none""#))).unwrap();
    let got = lines(&bin().args(["generate", "--model", model, "--input", items.to_str().unwrap(), "--max-tokens", "120"]).output().unwrap());
    assert_eq!(got.len(), 2, "{got:?}");
    let g = &got[0];
    assert_eq!(g["finish_reason"], "tool_calls", "{g}");
    let call = &g["tool_calls"][0];
    assert_eq!((call["type"].as_str(), call["function"]["name"].as_str()), (Some("function"), Some("lamp")), "{g}");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["on"].is_boolean() && args.as_object().unwrap().len() == 1, "{args}");
    assert!(got[1].get("tool_calls").is_none() && got[1]["finish_reason"] != "tool_calls", "tool_choice none: {}", got[1]);
    assert!(got[1]["prompt_tokens"].as_array().unwrap().len() < got[0]["prompt_tokens"].as_array().unwrap().len(), "none still offered the tools");

    let bad = dir.join("bad.json");
    for (text, needle) in [
        (format!(r#"[{{"id": "raw", "prompt": "x", "tools": {tools}}}]"#), "messages"),
        (r#"[{"id": "lonely", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}]"#.to_string(), "tool_choice"),
        (format!("[{}]", item("unknown", r#", "tool_choice": {"type": "function", "function": {"name": "fan"}}"#)), "fan"),
    ] {
        std::fs::write(&bad, text).unwrap();
        let err = fails(&["generate", "--model", model, "--input", bad.to_str().unwrap()]);
        assert!(err.contains(needle), "{needle}: {err}");
    }
}

/// `generate --speculative auto|off --max-draft N` and an item's `prediction`: the same tokens
/// either way (SmolLM2, greedy, on the CPU backend), every line counting the draft tokens taken
/// and refused, and a prediction that is the output itself mostly taken.
#[test]
fn speculative_generate_gives_the_same_tokens_and_counts_the_drafts() {
    let model = real_model();
    let dir = temp_dir("speculative");
    let text = "Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing to do.";
    let ask = |prediction: Option<&str>| {
        let mut item = serde_json::json!({"id": "edit", "messages": [{"role": "user", "content": format!("Repeat this sentence exactly: {text}")}]});
        if let Some(p) = prediction {
            item["prediction"] = serde_json::json!({"type": "content", "content": p});
        }
        item
    };
    let run = |items: Value, speculative: &str| {
        let input = dir.join(format!("items-{speculative}.json"));
        std::fs::write(&input, items.to_string()).unwrap();
        let args = [
            "generate",
            "--model",
            &model,
            "--input",
            input.to_str().unwrap(),
            "--max-tokens",
            "40",
            "--backend",
            "cpu",
            "--speculative",
            speculative,
            "--max-draft",
            "7",
        ];
        lines(&bin().args(args).output().unwrap())
    };
    let off = run(Value::Array(vec![ask(None)]), "off");
    assert_eq!((off[0]["accepted_prediction_tokens"].as_u64(), off[0]["rejected_prediction_tokens"].as_u64()), (Some(0), Some(0)), "{}", off[0]);
    let reply = off[0]["text"].as_str().unwrap().to_string();
    let on = run(Value::Array(vec![ask(None), ask(Some(&reply)), ask(Some("Something else entirely, nothing like it."))]), "auto");
    for line in &on {
        assert_eq!(line["tokens"], off[0]["tokens"], "speculation changed the tokens: {line}");
    }
    let accepted = on[1]["accepted_prediction_tokens"].as_u64().unwrap();
    let generated = on[1]["tokens"].as_array().unwrap().len() as u64;
    assert!(accepted * 2 >= generated, "the output as its own prediction: {accepted} of {generated} tokens taken");
    assert!(on[2]["rejected_prediction_tokens"].as_u64().unwrap() > 0, "a wrong prediction is refused: {}", on[2]);
    let err = fails(&["generate", "--model", &model, "--prompt", "x", "--speculative", "maybe"]);
    assert!(err.contains("--speculative") && err.contains("maybe"), "{err}");
}
