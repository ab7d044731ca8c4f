//! The `pagedlm` command line: tokenize, score, generate, bench, trace and profile (see README
//! and CONTRACTS). Options are typed and checked before anything is loaded ([`args`]).

// Under src/bin/pagedlm/, where cargo does not take them for binaries of their own.
#[cfg(not(target_arch = "wasm32"))]
#[path = "pagedlm/args.rs"]
mod args;
#[cfg(not(target_arch = "wasm32"))]
#[path = "pagedlm/bench.rs"]
mod bench;
#[cfg(not(target_arch = "wasm32"))]
#[path = "pagedlm/commands.rs"]
mod commands;
#[cfg(not(target_arch = "wasm32"))]
#[path = "pagedlm/setup.rs"]
mod setup;
#[cfg(not(target_arch = "wasm32"))]
#[path = "pagedlm/trace.rs"]
mod trace;
#[cfg(not(target_arch = "wasm32"))]
#[path = "pagedlm/xdg.rs"]
mod xdg;

#[cfg(target_arch = "wasm32")]
fn main() {}

#[cfg(not(target_arch = "wasm32"))]
fn main() {
    // Before any GPU instance exists, and while this is the only thread.
    let runtime_dir = xdg::RuntimeDir::ensure();
    let code = match cli::run(std::env::args().skip(1).collect()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("pagedlm: {e:#}");
            1
        }
    };
    drop(runtime_dir);
    std::process::exit(code);
}

/// Every option here is declared in [`args::COMMANDS`]; a test checks the two agree.
#[cfg(not(target_arch = "wasm32"))]
const USAGE: &str = "usage: pagedlm <tokenize|score|generate|bench|trace|profile> [options]
  common:   --model PATH  --kv-layout contiguous|paged  --kv-dtype f32|int8  --block-size N  --pool-tokens N
            --max-context N  --prefill-chunk N  --max-batch N  --step-tokens N  --no-prefix-cache  --no-cache-aware  --no-lookahead
            --max-binding-mib N   (run as on a device whose largest buffer binding is N MiB)
            --device-limits adapter|phone  (phone: WebGPU's default limits, 128 MiB buffers)
            --max-memory-mib N   (cap the GPU memory the engine holds; the KV pool shrinks to fit)
            --adapter-class cpu|integrated|discrete   (tune the kernels as for that kind of adapter)
            --no-optional-features   (the variants for adapters without subgroups and shader-f16)
            --activations auto|f32|int8   (the matmuls' activations; auto: f32)
            --backend auto|webgpu|cpu   (default auto: WebGPU on a real GPU, else cpu; cpu: CPU kernels, no device)
            --speculative auto|off  --max-draft N   (draft tokens by prompt lookup and from an item's
             `prediction`, verified in one step; default auto, 15; bench measures without unless given)
            (every command takes them; tokenize reads only --model)
  tokenize  --texts FILE.json
  score     --input FILE.json [--mode decode|prefill]
  generate  --input FILE.json | --prompt TEXT  [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]
            [--repetition-penalty R] [--json-schema FILE.json | --grammar FILE.lark]
            [--chat-template-kwargs JSON]
            (the output matches the schema or Lark grammar; an --input item's OpenAI-style
             `response_format` does the same for that item; the kwargs go to the chat template,
             e.g. '{\"enable_thinking\": false}', an item's own `chat_template_kwargs` winning)
  bench     [--prompt-tokens 512] [--gen-tokens 128] [--context N] [--batch N]
            [--json-schema FILE.json | --grammar FILE.lark]   (decode under it too: `constrained`)
  bench     --transfer [--lengths 256,512,1024,2048,4096]   (KV snapshot export/import vs recomputing the prefill)
  bench     --interference [--prompt-tokens 2048] [--step-tokens N]   (4 decoding sequences while a long prompt arrives)
  trace     --input FILE.jsonl [--max-batch N] [--no-prefix-cache] [--disaggregate] [--step-tokens N]
  profile   [--prompt-tokens 512] [--json | --table] [--no-timestamps]
            (one JSON line by default or with --json; --table prints it for people;
             --no-timestamps times each kernel alone on the host clock even where GPU timestamps exist)
  Values follow their option (`--max-tokens 5`) or an equals sign (`--max-tokens=5`).";

#[cfg(not(target_arch = "wasm32"))]
mod cli {
    use anyhow::{bail, Result};

    use crate::args::{self, Cmd, Parsed};
    use crate::bench::{bench, profile};
    use crate::commands::{generate, score, tokenize};
    use crate::trace::trace;
    use crate::USAGE;

    /// Parses the whole command line first, so a mistake in it stops the run before any file is read.
    pub fn run(argv: Vec<String>) -> Result<()> {
        let args = match args::parse(&argv) {
            Ok(Parsed::Run(args)) => args,
            Ok(Parsed::Help) => {
                println!("{USAGE}");
                return Ok(());
            }
            Err(e @ args::ArgError::UnknownCommand { .. }) => bail!("{e}\n{USAGE}"),
            Err(e) => return Err(e.into()),
        };
        match args.command.what {
            Cmd::Tokenize => tokenize(&args),
            Cmd::Score => pollster::block_on(score(&args)),
            Cmd::Generate => pollster::block_on(generate(&args)),
            Cmd::Bench => pollster::block_on(bench(&args)),
            Cmd::Profile => pollster::block_on(profile(&args)),
            Cmd::Trace => pollster::block_on(trace(&args)),
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use crate::bench::{BENCH_GEN_TOKENS, BENCH_PROMPT_TOKENS, INTERFERENCE_PROMPT_TOKENS, PROFILE_PROMPT_TOKENS, TRANSFER_LENGTHS};
    use crate::USAGE;
    use pagedlm::engine::EngineOptions;

    /// The usage text shows the defaults the commands take: their own constants, and the
    /// library's backend for users.
    #[test]
    fn usage_shows_the_defaults() {
        let lengths: Vec<String> = TRANSFER_LENGTHS.iter().map(u32::to_string).collect();
        let backend = serde_json::to_value(EngineOptions::for_users().backend).unwrap();
        let backend = backend.as_str().unwrap();
        for shown in [
            format!("bench     [--prompt-tokens {BENCH_PROMPT_TOKENS}] [--gen-tokens {BENCH_GEN_TOKENS}]"),
            format!("--transfer [--lengths {}]", lengths.join(",")),
            format!("--interference [--prompt-tokens {INTERFERENCE_PROMPT_TOKENS}]"),
            format!("profile   [--prompt-tokens {PROFILE_PROMPT_TOKENS}]"),
            format!("--backend auto|webgpu|cpu   (default {backend}:"),
        ] {
            assert!(USAGE.contains(&shown), "the usage text does not say {shown:?}");
        }
    }
}
