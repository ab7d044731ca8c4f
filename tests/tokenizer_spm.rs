//! The SentencePiece tokenizer: Gemma 3's real vocabulary against llama.cpp's ids (reference in
//! tests/data/gemma3/, copied from ../shared/reference by scripts/gemma3-tokens.py), synthetic
//! vocabularies for each rule of llama.cpp's SPM tokenizer, and the Gemma chat format.
#![cfg(not(target_arch = "wasm32"))]
mod common;

use std::sync::OnceLock;
use std::time::Instant;

use pagedlm::gguf::Gguf;
use pagedlm::tokenizer::token_type::{BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED};
use pagedlm::tokenizer::{ChatFormatKind, ChatMessage, Tokenizer, TokenizerError, TokenizerSpec};
use serde::Deserialize;

const TOKENS_JSON: &str = include_str!("data/gemma3/tokens.json");
const GEMMA_TEMPLATE: &str = include_str!("data/gemma3/chat_template.jinja");

#[derive(Deserialize)]
struct Reference {
    add_bos: bool,
    eog_ids: Vec<u32>,
    strings: Vec<Item>,
    prompts: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    text: String,
    ids: Vec<u32>,
}

fn reference() -> Reference {
    serde_json::from_str(TOKENS_JSON).expect("tests/data/gemma3/tokens.json parses")
}

fn gemma_spec() -> &'static TokenizerSpec {
    static SPEC: OnceLock<TokenizerSpec> = OnceLock::new();
    SPEC.get_or_init(|| {
        let bytes = common::gemma_model_bytes();
        let gguf = Gguf::parse(&bytes).expect("the Gemma file parses");
        TokenizerSpec::from_gguf(&gguf).expect("the Gemma file has tokenizer metadata")
    })
}

fn gemma() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::from_spec(gemma_spec().clone()).expect("Gemma's tokenizer builds"))
}

fn stream(tok: &Tokenizer, ids: &[u32]) -> (Vec<String>, String) {
    let mut decoder = tok.stream_decoder();
    let chunks = ids.iter().map(|&id| decoder.push(id).unwrap()).collect();
    (chunks, decoder.finish())
}

#[test]
fn gemma_strings_match_llama_cpp_and_decode_back() {
    let tok = gemma();
    for item in reference().strings {
        let ids = tok.encode(&item.text).unwrap();
        assert_eq!(ids, item.ids, "ids of {:?}", item.text);
        assert_eq!(tok.decode(&ids).unwrap().as_bytes(), item.text.as_bytes(), "round trip of {:?}", item.text);
        let (chunks, rest) = stream(tok, &ids);
        assert_eq!(chunks.concat() + &rest, item.text, "streamed {:?}", item.text);
    }
}

#[test]
fn gemma_prompts_match_llama_cpp_with_one_bos() {
    let tok = gemma();
    let reference = reference();
    assert_eq!(tok.add_bos(), reference.add_bos);
    let bos = tok.bos_id().expect("Gemma names a BOS token");
    for prompt in reference.prompts {
        let ids = tok.encode_prompt(&prompt.text).unwrap();
        assert_eq!(ids, prompt.ids, "prompt ids of {:?}", &prompt.text[..prompt.text.len().min(40)]);
        assert_eq!(ids.iter().filter(|&&id| id == bos).count(), 1, "exactly one BOS");
        let plain = tok.encode(&prompt.text).unwrap();
        assert_eq!(plain[..], ids[1..], "encode adds no BOS");
        assert_eq!(tok.decode(&plain).unwrap(), prompt.text);
    }
    // Text that already starts with BOS keeps just that one.
    assert_eq!(tok.encode_prompt("<bos>Hi").unwrap(), tok.encode_prompt("Hi").unwrap());
}

#[test]
fn gemma_end_of_generation_matches_llama_cpp() {
    let tok = gemma();
    let want = reference().eog_ids;
    assert_eq!(tok.eos_ids(), want);
    for id in want {
        assert!(tok.is_eos(id) && tok.is_special(id), "{id} ({:?})", tok.id_to_token(id));
    }
    assert!(!tok.is_eos(tok.bos_id().unwrap()));
}

#[test]
fn gemma_base_model_has_no_chat_format() {
    let tok = gemma();
    assert_eq!(tok.chat_format(), ChatFormatKind::None);
    let err = tok.apply_chat_template(&[ChatMessage::new("user", "Hi")], true).unwrap_err();
    assert!(matches!(err, TokenizerError::NoChatTemplate), "{err}");
    let message = err.to_string();
    assert!(message.contains("base model") && message.contains("completion"), "{message}");
}

#[test]
fn gemma_chat_template_renders_like_jinja() {
    let mut spec = gemma_spec().clone();
    spec.chat_template = Some(GEMMA_TEMPLATE.to_string());
    let tok = Tokenizer::from_spec(spec).unwrap();
    assert_eq!(tok.chat_format(), ChatFormatKind::Gemma);
    assert_eq!(tok.default_system_prompt(), None);
    let messages = [
        ChatMessage::new("system", "You are terse."),
        ChatMessage::new("user", "  Hi there! "),
        ChatMessage::new("assistant", "Hello.\n"),
        ChatMessage::new("user", "Name a colour."),
    ];
    // jinja2 on tests/data/gemma3/chat_template.jinja (bos_token "<bos>"): the template writes
    // BOS as text, which encode_prompt turns into the one BOS id (never doubled).
    let want = "<bos><start_of_turn>user\nYou are terse.\n\nHi there!<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n\
                <start_of_turn>user\nName a colour.<end_of_turn>\n<start_of_turn>model\n";
    let prompt = tok.apply_chat_template(&messages, true).unwrap();
    assert_eq!(prompt, want);
    let ids = tok.encode_prompt(&prompt).unwrap();
    let start_of_turn = tok.token_to_id("<start_of_turn>").unwrap();
    assert_eq!(&ids[..2], &[tok.bos_id().unwrap(), start_of_turn]);
    let end_of_turn = tok.token_to_id("<end_of_turn>").unwrap();
    assert_eq!(end_of_turn, 106);
    assert!(tok.is_eos(end_of_turn));
    // History without the generation prompt is a prefix of the next prompt.
    let history = tok.encode_prompt(&tok.apply_chat_template(&messages, false).unwrap()).unwrap();
    assert_eq!(ids[..history.len()], history[..]);
    // Roles must alternate, as Gemma's template raises otherwise.
    let bad = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
    let err = tok.apply_chat_template(&bad, true).unwrap_err();
    assert!(matches!(&err, TokenizerError::Template(m) if m.ends_with("Conversation roles must alternate user/assistant/user/assistant/...")), "{err}");
}

#[test]
fn gemma_builds_and_encodes_fast_enough() {
    let spec = gemma_spec().clone();
    let started = Instant::now();
    let tok = Tokenizer::from_spec(spec).unwrap();
    let build = started.elapsed();
    let text: String = reference().prompts.iter().map(|p| p.text.as_str()).collect::<Vec<_>>().join("\n");
    let text = text.repeat(5000 / text.len() + 1);
    let started = Instant::now();
    let ids = tok.encode(&text).unwrap();
    let encode = started.elapsed();
    eprintln!("Gemma tokenizer: built in {build:?}; {} bytes -> {} ids in {encode:?}", text.len(), ids.len());
    assert_eq!(tok.decode(&ids).unwrap(), text);
    // Generous bounds for a loaded machine and a debug build; typical figures are printed above.
    assert!(build.as_secs_f64() < 5.0, "building took {build:?}");
    assert!(encode.as_secs_f64() < 0.5, "encoding {} bytes took {encode:?}", text.len());
}

/// A SentencePiece vocabulary written by the test: `(text, type, score)` per token, id = index.
fn synthetic(tokens: &[(&str, i32, f32)], add_space_prefix: bool) -> Tokenizer {
    Tokenizer::from_spec(TokenizerSpec {
        model: "llama".into(),
        pre: "default".into(),
        tokens: tokens.iter().map(|t| t.0.to_string()).collect(),
        token_types: tokens.iter().map(|t| t.1).collect(),
        scores: tokens.iter().map(|t| t.2).collect(),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        add_bos: true,
        add_space_prefix,
        ..TokenizerSpec::default()
    })
    .expect("the synthetic vocabulary builds")
}

/// `<unk>`, `<s>`, `</s>`, then the given normal tokens with their scores.
fn base_vocab<'a>(normal: &[(&'a str, f32)]) -> Vec<(&'a str, i32, f32)> {
    let mut tokens = vec![("<unk>", UNKNOWN, 0.0), ("<s>", CONTROL, 0.0), ("</s>", CONTROL, 0.0)];
    tokens.extend(normal.iter().map(|&(t, s)| (t, NORMAL, s)));
    tokens
}

fn ids_of(tok: &Tokenizer, pieces: &[&str]) -> Vec<u32> {
    pieces.iter().map(|p| tok.token_to_id(p).unwrap_or_else(|| panic!("no token {p:?}"))).collect()
}

#[test]
fn merges_follow_scores_and_ties_go_left() {
    let letters = [("a", -10.0), ("b", -10.0), ("c", -10.0)];
    let with = |ab: f32, bc: f32| {
        let mut normal = letters.to_vec();
        normal.extend([("ab", ab), ("bc", bc)]);
        synthetic(&base_vocab(&normal), false)
    };
    let tok = with(-1.0, -2.0);
    assert_eq!(tok.encode("abc").unwrap(), ids_of(&tok, &["ab", "c"]));
    let tok = with(-2.0, -1.0);
    assert_eq!(tok.encode("abc").unwrap(), ids_of(&tok, &["a", "bc"]));
    let tok = with(-1.0, -1.0);
    assert_eq!(tok.encode("abc").unwrap(), ids_of(&tok, &["ab", "c"]), "a tie merges the leftmost pair");
    // A merge makes new pairs: "ab" + "c" -> "abc" even though "bc" scores higher than "ab"
    // would need... "bc" never forms once "ab" took the "b".
    let mut normal = letters.to_vec();
    normal.extend([("ab", -1.0), ("bc", -3.0), ("abc", -5.0)]);
    let tok = synthetic(&base_vocab(&normal), false);
    assert_eq!(tok.encode("abcab").unwrap(), ids_of(&tok, &["abc", "ab"]));
}

#[test]
fn unknown_characters_fall_back_to_bytes_and_stream_whole() {
    let mut tokens = base_vocab(&[("a", -1.0), ("\u{2581}", -2.0)]);
    let hex: Vec<String> = (0..=255u32).map(|b| format!("<0x{b:02X}>")).collect();
    tokens.extend(hex.iter().map(|h| (h.as_str(), BYTE, 0.0)));
    let tok = synthetic(&tokens, false);
    let ids = tok.encode("a é").unwrap();
    assert_eq!(ids, ids_of(&tok, &["a", "\u{2581}", "<0xC3>", "<0xA9>"]));
    assert_eq!(tok.token_bytes(ids[2]).unwrap(), &[0xC3]);
    assert_eq!(tok.decode(&ids).unwrap(), "a é");
    // The character split over two byte tokens streams as one piece, after its second byte.
    let (chunks, rest) = stream(&tok, &ids);
    assert_eq!(chunks, ["a", " ", "", "é"]);
    assert_eq!(rest, "");
    // Without byte tokens each byte becomes the unknown token.
    let tok = synthetic(&base_vocab(&[("a", -1.0)]), false);
    assert_eq!(tok.encode("aé").unwrap(), vec![tok.token_to_id("a").unwrap(), 0, 0]);
}

#[test]
fn special_tokens_are_cut_out_longest_first() {
    let mut tokens = base_vocab(&[("a", -1.0), ("b", -1.0), ("\u{2581}", -1.0), ("<", -1.0), (">", -1.0), ("x", -1.0)]);
    tokens.extend([("<x>", USER_DEFINED, 0.0), ("<x>b", CONTROL, 0.0), ("<ctl>", CONTROL, 0.0), ("<nothing>", UNUSED, 0.0)]);
    let tok = synthetic(&tokens, false);
    let user = tok.token_to_id("<x>").unwrap();
    let longer = tok.token_to_id("<x>b").unwrap();
    let ctl = tok.token_to_id("<ctl>").unwrap();
    let a = tok.token_to_id("a").unwrap();
    assert_eq!(tok.encode("a<x>a").unwrap(), vec![a, user, a], "a user-defined token inside text");
    assert_eq!(tok.encode("a<x>b<x>").unwrap(), vec![a, longer, user], "the longer token wins");
    assert_eq!(tok.encode("<ctl><ctl>a").unwrap(), vec![ctl, ctl, a], "control tokens are parsed");
    assert!(tok.is_special(ctl) && !tok.is_special(user));
    assert_eq!(tok.decode(&[a, user, ctl]).unwrap(), "a<x><ctl>");
    assert_eq!(tok.decode(&[tok.token_to_id("<nothing>").unwrap()]).unwrap(), "", "unused tokens are nothing");
}

#[test]
fn space_prefix_on_and_off() {
    let normal = [("a", -5.0), ("b", -5.0), ("\u{2581}", -5.0), ("\u{2581}a", -1.0), ("\u{2581}b", -1.0)];
    let mut tokens = base_vocab(&normal);
    tokens.push(("<sep>", CONTROL, 0.0));
    let on = synthetic(&tokens, true);
    let sep = on.token_to_id("<sep>").unwrap();
    assert_eq!(on.encode("a b").unwrap(), ids_of(&on, &["\u{2581}a", "\u{2581}b"]));
    let mut want = ids_of(&on, &["\u{2581}a"]);
    want.push(sep);
    want.extend(ids_of(&on, &["\u{2581}b"]));
    assert_eq!(on.encode("a<sep>b").unwrap(), want, "raw text after a special token gets the prefix too");
    assert_eq!(on.decode(&on.encode("a b").unwrap()).unwrap(), " a b", "decoding keeps the prefix space");
    let off = synthetic(&tokens, false);
    assert_eq!(off.encode("a b").unwrap(), ids_of(&off, &["a", "\u{2581}b"]));
    assert_eq!(off.decode(&off.encode("a b").unwrap()).unwrap(), "a b");
}

#[test]
fn a_sentencepiece_file_without_scores_is_refused() {
    let spec = TokenizerSpec { model: "llama".into(), tokens: vec!["<unk>".into(), "a".into()], scores: vec![0.0], ..TokenizerSpec::default() };
    let err = Tokenizer::from_spec(spec).err().expect("scores must match tokens");
    assert!(matches!(err, TokenizerError::ScoreCount { tokens: 2, scores: 1 }), "{err}");
}
