//! `tokenize`, `score` and `generate`.

use std::io::Write;

use anyhow::{anyhow, bail, Context as _, Result};
use pagedlm::engine::{Constraint, GenerateRequest, Message, Prediction, ScoreMode, Tools};
use pagedlm::gguf::{Gguf, ReadAt};
use pagedlm::tokenizer::{Tokenizer, TokenizerSpec};
use serde_json::{json, Value};

use crate::args::Args;
use crate::setup::{chat_template_kwargs_option, constraint_option, load, model_files, print_line, read_json, request_options};

pub(crate) fn tokenize(args: &Args) -> Result<()> {
    let texts = read_json(args.text("texts"), "--texts")?;
    let texts = texts.as_array().ok_or_else(|| anyhow!("--texts must hold a JSON array of strings"))?;
    let files = model_files(args)?;
    let gguf = Gguf::open(&files.iter().map(|f| f as &dyn ReadAt).collect::<Vec<_>>())?;
    let tokenizer = Tokenizer::from_spec(TokenizerSpec::from_gguf(&gguf)?)?;
    for (i, t) in texts.iter().enumerate() {
        let s = t.as_str().ok_or_else(|| anyhow!("--texts item {i} is not a string"))?;
        print_line(&json!({ "ids": tokenizer.encode(s)? }))?;
    }
    Ok(())
}

pub(crate) async fn score(args: &Args) -> Result<()> {
    let items = read_json(args.text("input"), "--input")?;
    let items = items.as_array().ok_or_else(|| anyhow!("--input must hold a JSON array"))?;
    // The parser admits only the values in args::SCORE_MODES.
    let mode = match args.text("mode") {
        Some("prefill") => ScoreMode::Prefill,
        _ => ScoreMode::Decode,
    };
    let mut engine = load(args).await?;
    for (i, item) in items.iter().enumerate() {
        let id = item.get("id").and_then(Value::as_str).unwrap_or("").to_string();
        let ids: Vec<u32> = serde_json::from_value(item.get("ids").cloned().unwrap_or(Value::Null))
            .with_context(|| format!("item {i}: \"ids\" must be an array of token ids"))?;
        let from = item.get("from").and_then(Value::as_u64).ok_or_else(|| anyhow!("item {i}: \"from\" is required"))?;
        let top5 = engine.score(&ids, from as usize, mode).await?;
        let argmax: Vec<u32> = top5.iter().map(|t| t.first().map_or(0, |p| p.0)).collect();
        let top5: Vec<Vec<(u32, f32)>> = top5;
        print_line(&json!({ "id": id, "argmax": argmax, "top5": top5 }))?;
    }
    Ok(())
}

// Long: the two inputs (one --prompt, or --input's items with their per-item options) and one line per result, in order.
pub(crate) async fn generate(args: &Args) -> Result<()> {
    let request = GenerateRequest { constraint: constraint_option(args)?, chat_template_kwargs: chat_template_kwargs_option(args)?, ..request_options(args) };
    request.sampling.validate()?;
    if let Some(prompt) = args.text("prompt") {
        let mut engine = load(args).await?;
        let ids = engine.text_prompt(prompt)?;
        let mut out = std::io::stdout();
        let g = engine
            .generate(&ids, &request, &mut |ev| {
                let _ = out.write_all(ev.text.as_bytes());
                let _ = out.flush();
                true
            })
            .await?;
        println!();
        eprintln!(
            "[{} prompt tokens in {:.0} ms, {} tokens in {:.0} ms: {:.1} tok/s, finish: {:?}]",
            g.prompt_tokens.len(),
            g.prefill_ms,
            g.tokens.len(),
            g.decode_ms,
            g.tokens.len() as f64 / (g.decode_ms / 1000.0).max(1e-9),
            g.finish_reason
        );
        if let Some(w) = &g.warning {
            eprintln!("[{w}]");
        }
        return Ok(());
    }
    let items = read_json(args.text("input"), "--input (or --prompt)")?;
    let items = items.as_array().ok_or_else(|| anyhow!("--input must hold a JSON array"))?;
    let mut engine = load(args).await?;
    // Every item's prompt and constraint are checked before anything is generated.
    let mut work = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let id = item.get("id").and_then(Value::as_str).unwrap_or("").to_string();
        let mut request = request.clone();
        if let Some(format) = item.get("response_format") {
            request.constraint = Constraint::from_response_format(format).with_context(|| format!("item {i} ({id})"))?;
        }
        let parallel = item.get("parallel_tool_calls").and_then(Value::as_bool);
        request.tools = Tools::from_options(item.get("tools"), item.get("tool_choice"), parallel).with_context(|| format!("item {i} ({id})"))?;
        if let Some(p) = item.get("prediction") {
            request.prediction = Prediction::from_openai(p).map_err(|e| anyhow!("item {i} ({id}): {e}"))?;
        }
        match item.get("chat_template_kwargs") {
            None | Some(Value::Null) => {}
            Some(Value::Object(kwargs)) => request.chat_template_kwargs = kwargs.clone(),
            Some(_) => bail!("item {i} ({id}): \"chat_template_kwargs\" must be an object"),
        }
        let prompt_ids = if let Some(p) = item.get("prompt").and_then(Value::as_str) {
            if request.tools.is_some() {
                bail!("item {i} ({id}): tools need \"messages\" (a chat), not a raw \"prompt\"");
            }
            engine.text_prompt(p)?
        } else if let Some(m) = item.get("messages") {
            let messages: Vec<Message> = serde_json::from_value(m.clone()).with_context(|| format!("item {i}: \"messages\" must be [{{role, content}}]"))?;
            engine.prepare_chat(&messages, &mut request).with_context(|| format!("item {i} ({id})"))?
        } else {
            bail!("item {i} needs \"prompt\" or \"messages\"");
        };
        if let Some(c) = request.output_constraint().with_context(|| format!("item {i} ({id})"))? {
            engine.grammars()?.start(&c).with_context(|| format!("item {i} ({id})"))?;
        }
        work.push((id, prompt_ids, request));
    }
    for (id, prompt_ids, request) in work {
        let g = engine.generate(&prompt_ids, &request, &mut |_| true).await?;
        let mut line = json!({
            "id": id, "prompt_tokens": g.prompt_tokens, "tokens": g.tokens, "text": g.text,
            "finish_reason": g.finish_reason, "prefill_ms": g.prefill_ms, "decode_ms": g.decode_ms,
            "accepted_prediction_tokens": g.accepted_prediction_tokens, "rejected_prediction_tokens": g.rejected_prediction_tokens,
        });
        if let Some(w) = g.warning {
            line["warning"] = json!(w);
        }
        if let Some(reasoning) = g.reasoning_content {
            line["reasoning_content"] = json!(reasoning);
        }
        if let Some(calls) = g.tool_calls {
            line["tool_calls"] = json!(calls);
        }
        print_line(&line)?;
    }
    Ok(())
}
