//! The tokenizer against llama.cpp's token ids for the real SmolLM2 GGUF (reference files in
//! tests/data/, copied from the project's llama.cpp runs), plus streaming decoding and ChatML.
#![cfg(not(target_arch = "wasm32"))]

use std::path::PathBuf;
use std::sync::OnceLock;

use pagedlm::tokenizer::{chatml_default_system, ChatMessage, Tokenizer, TokenizerError, TokenizerSpec};
use serde::Deserialize;

const TOKENS_JSON: &str = include_str!("data/llamacpp_tokens_public.json");
const PROMPTS_JSON: &str = include_str!("data/llamacpp_public.json");

#[derive(Deserialize)]
struct TokenFile {
    items: Vec<TokenItem>,
}

#[derive(Deserialize)]
struct TokenItem {
    text: String,
    utf8_hex: String,
    ids: Vec<u32>,
    pieces_hex: Vec<String>,
    roundtrip_exact: bool,
}

#[derive(Deserialize)]
struct PromptFile {
    settings: Settings,
    results: Vec<PromptResult>,
}

#[derive(Deserialize)]
struct Settings {
    llama_cpp_eog_ids: Vec<u32>,
}

#[derive(Deserialize)]
struct PromptResult {
    id: String,
    chatml: bool,
    messages: Option<Vec<ChatMessage>>,
    prompt_text: String,
    prompt_ids: Vec<u32>,
    completion_ids: Vec<u32>,
    completion_text: String,
}

fn token_file() -> TokenFile {
    serde_json::from_str(TOKENS_JSON).expect("tests/data/llamacpp_tokens_public.json parses")
}

fn prompt_file() -> PromptFile {
    serde_json::from_str(PROMPTS_JSON).expect("tests/data/llamacpp_public.json parses")
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex digits")).collect()
}

fn model_path() -> PathBuf {
    match std::env::var_os("PAGEDLM_MODEL") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    }
}

fn spec() -> &'static TokenizerSpec {
    static SPEC: OnceLock<TokenizerSpec> = OnceLock::new();
    SPEC.get_or_init(|| {
        let path = model_path();
        let bytes = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "cannot read the model {}: {e}. Run `npm run fetch-model` to download it, \
                 or point PAGEDLM_MODEL at a copy",
                path.display()
            )
        });
        gguf_meta::tokenizer_spec(&bytes)
    })
}

fn tok() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::from_spec(spec().clone()).expect("tokenizer builds from the model"))
}

fn user(content: &str) -> ChatMessage {
    ChatMessage::new("user", content)
}

#[test]
fn token_ids_match_llama_cpp_on_tricky_strings() {
    let tok = tok();
    for item in token_file().items {
        let ids = tok.encode(&item.text).unwrap();
        assert_eq!(ids, item.ids, "ids of {:?}", item.text);
        let pieces: Vec<Vec<u8>> = ids.iter().map(|&id| tok.token_bytes(id).unwrap().to_vec()).collect();
        let want_pieces: Vec<Vec<u8>> = item.pieces_hex.iter().map(|h| hex_bytes(h)).collect();
        assert_eq!(pieces, want_pieces, "token bytes of {:?}", item.text);
        if item.roundtrip_exact {
            let decoded = tok.decode(&ids).unwrap();
            assert_eq!(decoded.as_bytes(), hex_bytes(&item.utf8_hex), "round trip of {:?}", item.text);
        }
    }
}

#[test]
fn prompts_and_completions_match_llama_cpp() {
    let tok = tok();
    for result in prompt_file().results {
        if result.chatml {
            let messages = result.messages.as_deref().expect("chat prompts list their messages");
            let rendered = tok.apply_chat_template(messages, true).unwrap();
            assert_eq!(rendered, result.prompt_text, "rendered template of {}", result.id);
        }
        let ids = tok.encode(&result.prompt_text).unwrap();
        assert_eq!(ids, result.prompt_ids, "prompt ids of {}", result.id);
        assert_eq!(tok.decode(&ids).unwrap(), result.prompt_text, "prompt round trip of {}", result.id);
        let completion = tok.decode(&result.completion_ids).unwrap();
        assert_eq!(completion, result.completion_text, "completion text of {}", result.id);
    }
}

#[test]
fn end_of_generation_ids_match_llama_cpp() {
    let tok = tok();
    let want = prompt_file().settings.llama_cpp_eog_ids;
    assert_eq!(tok.eos_ids(), want);
    let eos = tok.eos_id().expect("the model names an EOS token");
    assert!(tok.is_eos(eos));
    for &id in &want {
        assert!(tok.is_special(id), "EOG token {id} ({:?}) is a control token", tok.id_to_token(id));
    }
    let im_start = tok.token_to_id("<|im_start|>").unwrap();
    assert!(!tok.is_eos(im_start) && tok.is_special(im_start));
    assert!(!tok.is_special(tok.encode("hello").unwrap()[0]));
}

#[test]
fn vocabulary_lookups_agree() {
    let tok = tok();
    assert_eq!(tok.vocab_size(), spec().tokens.len());
    for id in [0u32, 1, 2, 17, 1000, tok.vocab_size() as u32 - 1] {
        let token = tok.id_to_token(id).unwrap();
        assert_eq!(tok.token_to_id(token), Some(id), "token {token:?}");
    }
    assert_eq!(tok.id_to_token(tok.vocab_size() as u32), None);
    assert_eq!(tok.bos_id(), spec().bos_id);
    assert_eq!(tok.add_bos(), spec().add_bos);
}

fn stream_all(tok: &Tokenizer, ids: &[u32]) -> (Vec<String>, String) {
    let mut decoder = tok.stream_decoder();
    let chunks: Vec<String> = ids.iter().map(|&id| decoder.push(id).unwrap()).collect();
    let rest = decoder.finish();
    (chunks, rest)
}

#[test]
fn stream_decoder_never_emits_half_characters() {
    let tok = tok();
    let mut texts: Vec<String> = token_file().items.into_iter().map(|item| item.text).collect();
    texts.extend(prompt_file().results.into_iter().map(|r| r.prompt_text));
    texts.push("日本語のテキスト🎉🇯🇵 한국어 ไทย 🧑🏿‍🚀".to_string());
    let mut split_chars_seen = 0;
    for text in &texts {
        let ids = tok.encode(text).unwrap();
        split_chars_seen += ids.iter().filter(|&&id| std::str::from_utf8(tok.token_bytes(id).unwrap()).is_err()).count();
        let (chunks, rest) = stream_all(tok, &ids);
        for chunk in &chunks {
            assert!(!chunk.contains('\u{FFFD}'), "chunk {chunk:?} of {text:?}");
        }
        assert_eq!(rest, "", "nothing left over after whole characters in {text:?}");
        assert_eq!(chunks.concat(), tok.decode(&ids).unwrap());
        assert_eq!(&chunks.concat(), text);
    }
    assert!(split_chars_seen > 20, "the texts must exercise characters split across tokens");
}

#[test]
fn stream_decoder_holds_then_flushes_an_unfinished_character() {
    let tok = tok();
    let ids = tok.encode("👋").unwrap();
    assert!(ids.len() >= 2, "the emoji spans several tokens: {ids:?}");
    let mut decoder = tok.stream_decoder();
    assert_eq!(decoder.push(ids[0]).unwrap(), "", "a partial character is held back");
    assert_eq!(decoder.finish(), "\u{FFFD}", "finish flushes it lossily");
    assert_eq!(decoder.finish(), "", "finish empties the decoder");
    // Text after an abandoned prefix: same replacement as decoding everything at once.
    let mut ids_after = vec![ids[0]];
    ids_after.extend(tok.encode("ok").unwrap());
    let (chunks, rest) = stream_all(tok, &ids_after);
    assert_eq!(chunks.concat() + &rest, tok.decode(&ids_after).unwrap());
    assert!(chunks.concat().starts_with('\u{FFFD}'));
}

#[test]
fn out_of_range_ids_are_errors() {
    let tok = tok();
    let bad = tok.vocab_size() as u32;
    assert!(matches!(tok.decode(&[1, bad]), Err(TokenizerError::UnknownId { id, .. }) if id == bad));
    let mut decoder = tok.stream_decoder();
    assert!(matches!(decoder.push(bad), Err(TokenizerError::UnknownId { .. })));
}

#[test]
fn chat_template_inserts_the_default_system_prompt() {
    let tok = tok();
    let default_system = tok.default_system_prompt().expect("SmolLM2's template has a default system prompt");
    assert!(spec().chat_template.as_deref().unwrap().contains(default_system));
    // The reference chats pass that same system prompt explicitly; leaving it out must render
    // the identical prompt.
    let reference = prompt_file().results.into_iter().find(|r| r.chatml).unwrap();
    let messages = reference.messages.unwrap();
    assert_eq!(messages[0].role, "system");
    assert_eq!(messages[0].content, default_system);
    let implicit = tok.apply_chat_template(&messages[1..], true).unwrap();
    assert_eq!(implicit, reference.prompt_text);
    assert_eq!(tok.encode(&implicit).unwrap(), reference.prompt_ids);
}

#[test]
fn chat_template_keeps_an_explicit_system_prompt() {
    let tok = tok();
    let messages = [ChatMessage::new("system", "You are a pirate."), user("Hi")];
    let prompt = tok.apply_chat_template(&messages, false).unwrap();
    assert_eq!(prompt, "<|im_start|>system\nYou are a pirate.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
    assert!(!prompt.contains(tok.default_system_prompt().unwrap()));
}

#[test]
fn generation_prompt_ends_with_assistant_header() {
    let tok = tok();
    let with = tok.encode(&tok.apply_chat_template(&[user("Hello")], true).unwrap()).unwrap();
    let without = tok.encode(&tok.apply_chat_template(&[user("Hello")], false).unwrap()).unwrap();
    assert!(with.ends_with(&[1, 520, 9531, 198]), "{with:?}");
    assert_eq!(&with[..without.len()], &without[..]);
    assert!(without.ends_with(&[tok.token_to_id("<|im_end|>").unwrap(), 198]));
}

#[test]
fn default_system_prompt_extraction() {
    let escaped = "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou\\'re Qwen.\\nBe nice.<|im_end|>\\n' }}{% endif %}";
    assert_eq!(chatml_default_system(escaped).as_deref(), Some("You're Qwen.\nBe nice."));
    let dynamic_only = "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'}}{% endfor %}";
    assert_eq!(chatml_default_system(dynamic_only), None);
    let expression_then_default =
        "{{ '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}{% else %}{{ '<|im_start|>system\nDefault.<|im_end|>\n' }}";
    assert_eq!(chatml_default_system(expression_then_default).as_deref(), Some("Default."));
    let llama3 = "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>{% endfor %}";
    assert_eq!(chatml_default_system(llama3), None);
}

#[test]
fn a_foreign_template_renders_as_written_and_none_is_a_base_model() {
    // Another family's template is executed as it is (SmolLM2's BOS token is <|im_start|>).
    let mut foreign = spec().clone();
    foreign.chat_template = Some("{{ bos_token }}[INST] {{ messages[0]['content'] }} [/INST]".to_string());
    let tok = Tokenizer::from_spec(foreign).unwrap();
    assert_eq!(tok.default_system_prompt(), None);
    assert_eq!(tok.chat_format(), pagedlm::tokenizer::ChatFormatKind::Other);
    let prompt = tok.apply_chat_template(&[user("Hi")], true).unwrap();
    assert_eq!(prompt, "<|im_start|>[INST] Hi [/INST]");
    // No template at all: a base model (even with ChatML's tokens in its vocabulary, as
    // SmolLM2's base models have), which completes text and refuses chat.
    let mut base = spec().clone();
    base.chat_template = None;
    let tok = Tokenizer::from_spec(base).unwrap();
    assert_eq!(tok.chat_format(), pagedlm::tokenizer::ChatFormatKind::None);
    let err = tok.apply_chat_template(&[user("Hi")], true).unwrap_err();
    assert!(err.to_string().contains("completion mode"), "{err}");
}

#[test]
fn user_defined_tokens_are_matched_whole_but_not_special() {
    let mut spec = spec().clone();
    spec.tokens.push("<tool_call>".to_string());
    spec.token_types.push(pagedlm::tokenizer::token_type::USER_DEFINED);
    let tok = Tokenizer::from_spec(spec).unwrap();
    let new_id = tok.vocab_size() as u32 - 1;
    let ids = tok.encode("a<tool_call>b").unwrap();
    assert!(ids.contains(&new_id), "{ids:?}");
    assert_eq!(tok.decode(&ids).unwrap(), "a<tool_call>b");
    assert!(!tok.is_special(new_id));
}

#[test]
fn bad_specs_give_typed_errors() {
    let with = |edit: &dyn Fn(&mut TokenizerSpec)| {
        let mut spec = spec().clone();
        edit(&mut spec);
        Tokenizer::from_spec(spec).err().expect("the spec must be rejected")
    };
    let err = with(&|s| s.model = "rwkv".into());
    assert!(matches!(&err, TokenizerError::UnsupportedModel(m) if m == "rwkv"));
    assert!(err.to_string().contains("'rwkv'"));
    let err = with(&|s| s.pre = "bloom".into());
    assert!(matches!(&err, TokenizerError::UnsupportedPreTokenizer(p) if p == "bloom"));
    assert!(err.to_string().contains("'bloom'"));
    let err = with(&|s| s.merges[5] = "nospace".into());
    assert!(matches!(err, TokenizerError::MalformedMerge { index: 5, .. }));
    let err = with(&|s| {
        s.token_types.pop();
    });
    assert!(matches!(err, TokenizerError::TokenTypeCount { .. }));
    let err = with(&|s| s.eos_id = Some(s.tokens.len() as u32));
    assert!(matches!(err, TokenizerError::SpecialIdOutOfRange { what: "EOS", .. }));
    let err = with(&|s| s.merges.push("Ġzzqx Ġzzqy".into()));
    assert!(matches!(err, TokenizerError::Build(_)), "{err}");
    let err = with(&|s| s.tokens.clear());
    assert!(matches!(err, TokenizerError::EmptyVocab));
}

#[test]
fn chat_without_chatml_tokens_is_an_error() {
    let mut spec = spec().clone();
    let im_start = spec.tokens.iter().position(|t| t == "<|im_start|>").unwrap();
    spec.tokens[im_start] = "<|unused_marker|>".to_string();
    let tok = Tokenizer::from_spec(spec).unwrap();
    let err = tok.apply_chat_template(&[user("Hi")], true).unwrap_err();
    assert!(matches!(err, TokenizerError::NoChatTokens("<|im_start|>")), "{err}");
}

/// Just enough of GGUF v3 to read the `tokenizer.*` keys of the real model. The crate's own
/// GGUF reader lives in src/gguf.rs; this stays independent so the tokenizer is tested alone.
mod gguf_meta {
    use pagedlm::tokenizer::TokenizerSpec;
    use std::collections::HashMap;

    #[derive(Debug)]
    pub enum Value {
        Int(i64),
        Float,
        Bool(bool),
        Str(String),
        Array(Vec<Value>),
    }

    struct Reader<'a> {
        bytes: &'a [u8],
        at: usize,
    }

    impl Reader<'_> {
        fn take(&mut self, n: usize) -> &[u8] {
            let end = self.at.checked_add(n).filter(|&end| end <= self.bytes.len());
            let end = end.unwrap_or_else(|| panic!("GGUF truncated at byte {}", self.at));
            let out = &self.bytes[self.at..end];
            self.at = end;
            out
        }
        fn u32(&mut self) -> u32 {
            u32::from_le_bytes(self.take(4).try_into().unwrap())
        }
        fn u64(&mut self) -> u64 {
            u64::from_le_bytes(self.take(8).try_into().unwrap())
        }
        fn string(&mut self) -> String {
            let len = self.u64() as usize;
            String::from_utf8(self.take(len).to_vec()).expect("GGUF strings are UTF-8")
        }
        fn value(&mut self, kind: u32) -> Value {
            match kind {
                0 => Value::Int(self.take(1)[0] as i64),
                1 => Value::Int(self.take(1)[0] as i8 as i64),
                2 => Value::Int(u16::from_le_bytes(self.take(2).try_into().unwrap()) as i64),
                3 => Value::Int(i16::from_le_bytes(self.take(2).try_into().unwrap()) as i64),
                4 => Value::Int(self.u32() as i64),
                5 => Value::Int(self.u32() as i32 as i64),
                6 => {
                    self.take(4);
                    Value::Float
                }
                7 => Value::Bool(self.take(1)[0] != 0),
                8 => Value::Str(self.string()),
                9 => {
                    let item_kind = self.u32();
                    let len = self.u64() as usize;
                    Value::Array((0..len).map(|_| self.value(item_kind)).collect())
                }
                10 | 11 => Value::Int(self.u64() as i64),
                12 => {
                    self.take(8);
                    Value::Float
                }
                other => panic!("unknown GGUF value type {other}"),
            }
        }
    }

    fn metadata(bytes: &[u8]) -> HashMap<String, Value> {
        let mut reader = Reader { bytes, at: 0 };
        assert_eq!(reader.take(4), b"GGUF", "not a GGUF file");
        assert_eq!(reader.u32(), 3, "GGUF version");
        let _n_tensors = reader.u64();
        let n_kv = reader.u64();
        (0..n_kv)
            .map(|_| {
                let key = reader.string();
                let kind = reader.u32();
                (key, reader.value(kind))
            })
            .collect()
    }

    pub fn tokenizer_spec(bytes: &[u8]) -> TokenizerSpec {
        let meta = metadata(bytes);
        let string = |key: &str| match meta.get(key) {
            Some(Value::Str(s)) => Some(s.clone()),
            None => None,
            other => panic!("{key}: expected a string, got {other:?}"),
        };
        let int = |key: &str| match meta.get(key) {
            Some(Value::Int(i)) => Some(*i),
            None => None,
            other => panic!("{key}: expected an integer, got {other:?}"),
        };
        let array = |key: &str| match meta.get(key) {
            Some(Value::Array(items)) => items,
            other => panic!("{key}: expected an array, got {other:?}"),
        };
        let strings = |key: &str| {
            array(key)
                .iter()
                .map(|v| match v {
                    Value::Str(s) => s.clone(),
                    other => panic!("{key}: expected strings, got {other:?}"),
                })
                .collect()
        };
        TokenizerSpec {
            model: string("tokenizer.ggml.model").expect("tokenizer.ggml.model"),
            pre: string("tokenizer.ggml.pre").expect("tokenizer.ggml.pre"),
            tokens: strings("tokenizer.ggml.tokens"),
            token_types: array("tokenizer.ggml.token_type")
                .iter()
                .map(|v| match v {
                    Value::Int(i) => *i as i32,
                    other => panic!("token_type: expected integers, got {other:?}"),
                })
                .collect(),
            merges: strings("tokenizer.ggml.merges"),
            bos_id: int("tokenizer.ggml.bos_token_id").map(|i| i as u32),
            eos_id: int("tokenizer.ggml.eos_token_id").map(|i| i as u32),
            chat_template: string("tokenizer.chat_template"),
            add_bos: matches!(meta.get("tokenizer.ggml.add_bos_token"), Some(Value::Bool(true))),
            ..TokenizerSpec::default()
        }
    }
}
