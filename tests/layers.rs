//! The house rules, checked on the source itself (no GPU needed):
//! - no import circle among the top-level modules of `src/` (a module is a file under `src/` or a
//!   folder with its files; an import is a `crate::x` or `super::x` path in code, comments
//!   excluded);
//! - no import circle among the files of one folder either (`cpu/kernels.rs` <-> `cpu/qdot.rs`):
//!   inside a folder, each file `x.rs` and each subfolder `x/` is one node, and `super::x`,
//!   `self::x` and `crate::folder::x` paths (use groups expanded, inline `mod tests { .. }`
//!   followed) that land in a sibling are its edges; `mod x;` declarations are no imports;
//! - `kv/` never imports `model/`; `gguf.rs` never imports `gpu/`; `quant/` imports neither
//!   `kv/`, `model/` nor `gpu/`;
//! - `model/` is the backend-neutral description below the backends: it imports none of `gpu/`,
//!   `webgpu/`, `cpu/`, `kv/`, `engine/` or `backend.rs`;
//! - the backends stand side by side: `cpu/` imports neither `gpu/` nor `webgpu/`, and neither
//!   `webgpu/` nor `gpu/` imports `cpu/`;
//! - only `web.rs` touches wasm-bindgen (`wasm_bindgen`, `js_sys`, `web_sys`,
//!   `wasm_bindgen_futures`, `serde_wasm_bindgen`);
//! - only `engine/` sees the scheduler, the KV cache and the model together;
//! - only the architecture description `model/arch.rs` spells GGUF tensor names: no other string
//!   literal in code holds `blk.`, `output.weight`, or a GGUF tensor name or per-layer stem
//!   ([`GGUF_NAMES`]: `token_embd`, `attn_q`, `ffn_down`, ...) as a whole word, unless the word
//!   ends a dotted label of our own (`"graph.attn_q"`, an activation buffer) and is not followed
//!   by `.weight` or `.bias`;
//! - no function in `src/` runs over 80 lines unless a comment just above it says why
//!   (`// Long: ...`);
//! - no file in `src/` runs over 800 lines, nor `engine/mod.rs` (the wiring) over 500, unless a
//!   `// Long: ...` comment in its header (the comments and inner attributes before its first
//!   item) says why;
//! - only `gpu/context.rs` creates buffers and bind groups or submits on the device and queue
//!   (everything else goes through its methods, so its counters see every one).
//!
//! Each checker is also run on a small made-up source that breaks its rule, so a checker that
//! stopped seeing anything would fail here too. A rule the tree does not meet yet (the tensor
//! names wait for `model/arch.rs`) has its real-tree check in a test of its own, beside its
//! checker's test (`..._checker`), which stays green meanwhile; the lexing the newer rules share
//! ([`lex`]: comments, strings, raw strings, char literals) is exercised by their made-up sources.

#![cfg(not(target_arch = "wasm32"))]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest function body allowed without a written reason.
const MAX_FN_LINES: usize = 80;
/// Longest file allowed without a written reason, and the engine's wiring (`engine/mod.rs`).
const MAX_FILE_LINES: usize = 800;
const MAX_ENGINE_LINES: usize = 500;
/// The one file that spells GGUF tensor names: the architecture description.
const ARCH: &str = "model/arch.rs";
/// GGUF tensor names and per-layer name stems (llama.cpp's, for the architectures pagedlm reads,
/// with the fused `attn_qkv` and `ffn_gate_up`); with `blk.` and `output.weight`, what only
/// [`ARCH`] may spell.
const GGUF_NAMES: [&str; 21] = [
    "token_embd",
    "output_norm",
    "rope_freqs",
    "rope_factors_long",
    "rope_factors_short",
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_qkv",
    "attn_output",
    "attn_q_norm",
    "attn_k_norm",
    "attn_post_norm",
    "post_attention_norm",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
    "ffn_gate_up",
    "post_ffw_norm",
];
const WASM_CRATES: [&str; 5] = ["wasm_bindgen", "js_sys", "web_sys", "wasm_bindgen_futures", "serde_wasm_bindgen"];

/// A source file: its path under `src/`, its text without comments (`code`), its text as written
/// (`raw`) and its text with comments and the insides of string and char literals blanked
/// (`bare`: only code left, at the same byte offsets).
struct Source {
    path: String,
    code: String,
    raw: String,
    bare: String,
    /// The string literals in code, each with the line it starts on.
    literals: Vec<(usize, String)>,
}

fn sources() -> Vec<Source> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&root, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let raw = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("reading {}: {e}", f.display()));
            let path = f.strip_prefix(&root).expect("under src").to_string_lossy().replace('\\', "/");
            let (bare, literals) = lex(&raw);
            Source { path, code: strip_comments(&raw), raw, bare, literals }
        })
        .collect()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text with `//` comments (doc comments included) blanked, strings kept.
fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|line| {
            let mut in_str = false;
            let bytes = line.as_bytes();
            for i in 0..bytes.len() {
                match bytes[i] {
                    b'"' if i == 0 || bytes[i - 1] != b'\\' => in_str = !in_str,
                    b'/' if !in_str && bytes.get(i + 1) == Some(&b'/') => return &line[..i],
                    _ => {}
                }
            }
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level module a file belongs to: `kv/cache.rs` → `kv`, `engine.rs` → `engine`;
/// `lib.rs` and the binaries are the crate root.
fn module_of(path: &str) -> Option<String> {
    if path == "lib.rs" || path.starts_with("bin/") {
        return None;
    }
    Some(path.split('/').next().expect("a path").trim_end_matches(".rs").to_string())
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The top-level modules `code` names through `crate::x` (or `super::x` from a file directly
/// under `src/`, or from `mod.rs` of a folder), including `use crate::{a::.., b}` groups.
fn imports(path: &str, code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let super_is_root = !path.contains('/') || path.ends_with("/mod.rs");
    let prefixes: &[&str] = if super_is_root { &["crate::", "super::"] } else { &["crate::"] };
    for prefix in prefixes {
        for (at, _) in code.match_indices(prefix) {
            if at > 0 && code[..at].chars().next_back().is_some_and(is_ident) {
                continue;
            }
            let rest = &code[at + prefix.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                found.extend(group_heads(group));
            } else {
                let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
                if !name.is_empty() {
                    found.insert(name);
                }
            }
        }
    }
    found
}

/// The first names of each path in a `{a::b, c, d::{e}}` group (text after the `{`).
fn group_heads(group: &str) -> Vec<String> {
    let (mut depth, mut heads, mut at_start, mut name) = (1, Vec::new(), true, String::new());
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => {
                if !name.is_empty() {
                    heads.push(std::mem::take(&mut name));
                }
                at_start = true;
            }
            c if depth == 1 && at_start && is_ident(c) => name.push(c),
            _ if depth == 1 && at_start && !name.is_empty() => {
                heads.push(std::mem::take(&mut name));
                at_start = false;
            }
            _ => {}
        }
    }
    if !name.is_empty() {
        heads.push(name);
    }
    heads
}

/// Module → the modules it imports (only modules that exist, never itself).
fn module_graph(files: &[Source]) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(&f.path)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let Some(m) = module_of(&f.path) else { continue };
        let deps: Vec<String> = imports(&f.path, &f.code).into_iter().filter(|d| modules.contains(d) && *d != m).collect();
        graph.entry(m).or_default().extend(deps);
    }
    graph
}

/// Every import circle of the graph, each as the modules along it from its smallest name (the
/// graph is a dozen modules: a plain search from every module is enough).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    fn visit(n: &str, graph: &BTreeMap<String, BTreeSet<String>>, stack: &mut Vec<String>, found: &mut BTreeSet<Vec<String>>) {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut circle = stack[i..].to_vec();
            let start = circle.iter().enumerate().min_by_key(|(_, m)| m.as_str()).map(|(k, _)| k).unwrap_or(0);
            circle.rotate_left(start);
            found.insert(circle);
            return;
        }
        stack.push(n.to_string());
        for d in graph.get(n).into_iter().flatten() {
            visit(d, graph, stack, found);
        }
        stack.pop();
    }
    let mut found = BTreeSet::new();
    for n in graph.keys() {
        visit(n, graph, &mut Vec::new(), &mut found);
    }
    found.into_iter().collect()
}

/// Files that break the layering rules, with the rule each breaks.
fn layer_violations(files: &[Source]) -> Vec<String> {
    let mut out = Vec::new();
    for f in files {
        let deps = imports(&f.path, &f.code);
        let module = module_of(&f.path).unwrap_or_default();
        let has = |m: &str| deps.contains(m);
        if module == "kv" && has("model") {
            out.push(format!("{}: kv/ imports model/", f.path));
        }
        if f.path == "gguf.rs" && has("gpu") {
            out.push(format!("{}: gguf.rs imports gpu/", f.path));
        }
        if module == "quant" && (has("kv") || has("model") || has("gpu")) {
            out.push(format!("{}: quant/ imports a layer above it", f.path));
        }
        if f.path != "web.rs" {
            for krate in WASM_CRATES {
                if f.code.contains(&format!("{krate}::")) || f.code.contains(&format!("use {krate}")) {
                    out.push(format!("{}: touches {krate} (only web.rs may)", f.path));
                }
            }
        }
        let sees = |m: &str| has(m) || module == m;
        if module != "engine" && sees("sched") && sees("kv") && sees("model") {
            out.push(format!("{}: sees the scheduler, the KV cache and the model together (only engine/ may)", f.path));
        }
    }
    out
}

/// Calls that create or submit behind the context's counters: `path: call` for each use of the
/// device's or queue's own methods outside `gpu/context.rs`.
fn uncounted_gpu_calls(files: &[Source]) -> Vec<String> {
    const CALLS: [&str; 3] = ["device.create_buffer", "device.create_bind_group", "queue.submit("];
    let mut out = Vec::new();
    for f in files.iter().filter(|f| f.path != "gpu/context.rs") {
        for call in CALLS.iter().filter(|c| f.code.contains(*c)) {
            out.push(format!("{}: {call} (use the Context's method, which counts it)", f.path));
        }
    }
    out
}

/// Functions longer than [`MAX_FN_LINES`] without a `// Long:` comment just above them, as
/// `path:line name (lines)`.
fn long_functions(files: &[Source]) -> Vec<String> {
    let mut out = Vec::new();
    for f in files {
        let code: Vec<&str> = f.code.lines().collect();
        let raw: Vec<&str> = f.raw.lines().collect();
        for (i, line) in code.iter().enumerate() {
            let Some(name) = fn_name(line) else { continue };
            let Some(len) = body_lines(&code[i..]) else { continue };
            let reason = raw[..i].iter().rev().map(|l| l.trim()).take_while(|l| l.starts_with("//") || l.starts_with("#[")).any(|l| l.starts_with("// Long:"));
            if len > MAX_FN_LINES && !reason {
                out.push(format!("{}:{} {name} ({len} lines)", f.path, i + 1));
            }
        }
    }
    out
}

/// The name of the function a line declares, if it does.
fn fn_name(line: &str) -> Option<String> {
    let at = line.match_indices("fn ").find(|(i, _)| *i == 0 || !line[..*i].chars().next_back().is_some_and(is_ident))?.0;
    let name: String = line[at + 3..].chars().take_while(|&c| is_ident(c)).collect();
    (!name.is_empty()).then_some(name)
}

/// Lines from a function's declaration to its closing brace (None for a declaration without a
/// body, such as a trait method).
fn body_lines(lines: &[&str]) -> Option<usize> {
    let mut depth = 0i32;
    let mut opened = false;
    for (n, line) in lines.iter().enumerate() {
        let mut in_str = false;
        let mut prev = ' ';
        for c in line.chars() {
            match c {
                '"' if prev != '\\' => in_str = !in_str,
                '{' if !in_str => {
                    depth += 1;
                    opened = true;
                }
                '}' if !in_str => depth -= 1,
                ';' if !in_str && !opened && depth == 0 => return None,
                _ => {}
            }
            prev = c;
        }
        if opened && depth <= 0 {
            return Some(n + 1);
        }
    }
    None
}

/// What [`lex`] makes of the text at one place.
enum Token {
    /// One character of code, kept.
    Code,
    /// A comment or a char literal, blanked.
    Blank,
    /// A string literal whose contents run over this range, blanked (its quotes kept).
    Str(usize, usize),
}

/// A source text lexed just enough for the checks: the text with comments (`//`, nested `/* */`)
/// and the insides of string and char literals blanked (newlines kept), and its string literals
/// (plain, byte and raw, escapes as written) each with the line it starts on. A `"` inside a
/// comment or a char literal opens no string, and a `//` inside a string is no comment.
fn lex(text: &str) -> (String, Vec<(usize, String)>) {
    let c: Vec<char> = text.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let (mut bare, mut literals, mut line, mut i) = (String::with_capacity(text.len()), Vec::new(), 1, 0);
    while i < c.len() {
        let starts_word = i == 0 || !is_ident(c[i - 1]);
        // A raw string's `r` (after an optional `b`), its hashes and its opening quote.
        let r = if at(i) == 'b' { i + 1 } else { i };
        let hashes = c[(r + 1).min(c.len())..].iter().take_while(|&&ch| ch == '#').count();
        let (end, token) = if at(i) == '/' && at(i + 1) == '/' {
            (c[i..].iter().position(|&ch| ch == '\n').map_or(c.len(), |n| i + n), Token::Blank)
        } else if at(i) == '/' && at(i + 1) == '*' {
            let (mut j, mut depth) = (i + 2, 1);
            while j < c.len() && depth > 0 {
                match (at(j), at(j + 1)) {
                    ('/', '*') => (j, depth) = (j + 2, depth + 1),
                    ('*', '/') => (j, depth) = (j + 2, depth - 1),
                    _ => j += 1,
                }
            }
            (j.min(c.len()), Token::Blank)
        } else if starts_word && at(r) == 'r' && at(r + 1 + hashes) == '"' {
            let open = r + 2 + hashes;
            let close = (open..c.len()).find(|&j| at(j) == '"' && (1..=hashes).all(|h| at(j + h) == '#')).unwrap_or(c.len());
            ((close + 1 + hashes).min(c.len()), Token::Str(open, close))
        } else if at(i) == '"' {
            let mut j = i + 1;
            while j < c.len() && at(j) != '"' {
                j += if at(j) == '\\' { 2 } else { 1 };
            }
            let close = j.min(c.len());
            ((close + 1).min(c.len()), Token::Str(i + 1, close))
        } else if at(i) == '\'' && at(i + 1) == '\\' {
            ((i + 3..c.len()).find(|&j| at(j) == '\'').map_or(c.len(), |j| j + 1), Token::Blank)
        } else if at(i) == '\'' && at(i + 2) == '\'' {
            (i + 3, Token::Blank)
        } else {
            // Code, a lifetime's quote included.
            (i + 1, Token::Code)
        };
        let blank = |from: usize, to: usize| c[from..to].iter().map(|&ch| if ch == '\n' { '\n' } else { ' ' }).collect::<String>();
        match token {
            Token::Code => bare.push(c[i]),
            Token::Blank => bare.push_str(&blank(i, end)),
            Token::Str(open, close) => {
                literals.push((line, c[open..close].iter().collect()));
                bare.extend(&c[i..open]);
                bare.push_str(&blank(open, close));
                bare.extend(&c[close..end]);
            }
        }
        line += c[i..end].iter().filter(|&&ch| ch == '\n').count();
        i = end;
    }
    (bare, literals)
}

/// Whether a string literal spells a GGUF tensor name: `blk.`, `output.weight`, or a name of
/// [`GGUF_NAMES`] as a whole word, except a word that ends a dotted label of our own (the
/// activation buffer `"graph.attn_q"`) with no `.weight` or `.bias` after it.
fn spells_tensor_name(literal: &str) -> bool {
    let mut at = 0;
    while let Some(c) = literal[at..].chars().next() {
        let word: String = literal[at..].chars().take_while(|&c| is_ident(c)).collect();
        if word.is_empty() {
            // An escape (`\n`) is no part of the next word.
            at += c.len_utf8() + if c == '\\' { literal[at + 1..].chars().next().map_or(0, char::len_utf8) } else { 0 };
            continue;
        }
        let (before, after) = (&literal[..at], &literal[at + word.len()..]);
        let weight = [".weight", ".bias"].iter().any(|s| after.strip_prefix(s).is_some_and(|rest| !rest.starts_with(is_ident)));
        let found = match word.as_str() {
            "blk" => after.starts_with('.'),
            "output" => weight,
            w => GGUF_NAMES.contains(&w) && (weight || !before.ends_with('.')),
        };
        if found {
            return true;
        }
        at += word.len();
    }
    false
}

/// String literals in code that spell a GGUF tensor name outside [`ARCH`], as
/// `path:line "literal"`.
fn tensor_names_outside_arch(files: &[Source]) -> Vec<String> {
    let mut out = Vec::new();
    for f in files.iter().filter(|f| f.path != ARCH) {
        for (line, literal) in f.literals.iter().filter(|(_, l)| spells_tensor_name(l)) {
            out.push(format!("{}:{line} \"{literal}\"", f.path));
        }
    }
    out
}

/// `model/` files that import a layer above the description (a backend, the cache, the engine),
/// as `path: model/ imports x/`.
fn model_imports_above(files: &[Source]) -> Vec<String> {
    const ABOVE: [&str; 6] = ["gpu", "webgpu", "cpu", "kv", "engine", "backend"];
    let mut out = Vec::new();
    for f in files.iter().filter(|f| module_of(&f.path).as_deref() == Some("model")) {
        for m in imports(&f.path, &f.code).into_iter().filter(|m| ABOVE.contains(&m.as_str())) {
            out.push(format!("{}: model/ imports {m}/", f.path));
        }
    }
    out
}

/// Files of one backend (or of the GPU device layer under the WebGPU one) that import the other,
/// as `path: cpu/ imports gpu/`.
fn backend_crossings(files: &[Source]) -> Vec<String> {
    let mut out = Vec::new();
    for f in files {
        let module = module_of(&f.path).unwrap_or_default();
        let other: &[&str] = match module.as_str() {
            "cpu" => &["gpu", "webgpu"],
            "gpu" | "webgpu" => &["cpu"],
            _ => &[],
        };
        for m in imports(&f.path, &f.code).into_iter().filter(|m| other.contains(&m.as_str())) {
            out.push(format!("{}: {module}/ imports {m}/", f.path));
        }
    }
    out
}

/// Files over their limit ([`MAX_FILE_LINES`], [`MAX_ENGINE_LINES`] for `engine/mod.rs`) without a
/// `// Long:` comment in their header (the blank, comment and inner-attribute lines before the
/// first item), as `path (lines, over limit)`.
fn long_files(files: &[Source]) -> Vec<String> {
    let mut out = Vec::new();
    for f in files {
        let limit = if f.path == "engine/mod.rs" { MAX_ENGINE_LINES } else { MAX_FILE_LINES };
        let lines = f.raw.lines().count();
        let mut header = f.raw.lines().map(str::trim).take_while(|l| l.is_empty() || l.starts_with("//") || l.starts_with("#!["));
        if lines > limit && !header.any(|l| l.starts_with("// Long:")) {
            out.push(format!("{} ({lines} lines, over {limit})", f.path));
        }
    }
    out
}

/// The module a file of the library defines, as its names from the crate root: `kv/cache.rs` →
/// `[kv, cache]`, `kv/mod.rs` → `[kv]`, `lib.rs` → `[]`.
fn module_path(path: &str) -> Vec<String> {
    let mut names: Vec<String> = path.trim_end_matches(".rs").split('/').map(String::from).collect();
    if names.last().is_some_and(|n| n == "mod" || (n == "lib" && names.len() == 1)) {
        names.pop();
    }
    names
}

/// The inline modules of a bare text (`mod tests { .. }`), each with the byte range of its braces.
fn inline_mods(bare: &str) -> Vec<(String, std::ops::Range<usize>)> {
    let mut out = Vec::new();
    for (at, _) in bare.match_indices("mod ") {
        if bare[..at].ends_with(is_ident) {
            continue;
        }
        let rest = bare[at + 4..].trim_start();
        let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
        let after = rest[name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = bare.len() - after.len();
        let mut depth = 0;
        for (i, c) in bare[open..].char_indices() {
            depth += match c {
                '{' => 1,
                '}' => -1,
                _ => 0,
            };
            if depth == 0 {
                out.push((name, open..open + i));
                break;
            }
        }
    }
    out
}

/// Every path a bare text writes from `crate::`, `super::` or `self::`, as names from the crate
/// root, use groups expanded and `super`/`self` taken from where the path sits (`module`, the
/// file's, or an inline module inside it): in `kv/cache.rs`, `super::{pool::KvPool, radix}` gives
/// `[kv, pool, KvPool]` and `[kv, radix]`.
fn crate_paths(module: &[String], bare: &str) -> Vec<Vec<String>> {
    let inline = inline_mods(bare);
    let mut out = Vec::new();
    for anchor in ["crate::", "super::", "self::"] {
        for (at, _) in bare.match_indices(anchor) {
            if bare[..at].ends_with(is_ident) || bare[..at].ends_with("::") {
                continue;
            }
            let mut base: Vec<String> = module.to_vec();
            base.extend(inline.iter().filter(|(_, braces)| braces.contains(&at)).map(|(name, _)| name.clone()));
            let mut rest = &bare[at..];
            if anchor != "super::" {
                rest = &rest[anchor.len()..];
                if anchor == "crate::" {
                    base.clear();
                }
            }
            while let Some(tail) = rest.strip_prefix("super::") {
                base.pop();
                rest = tail;
            }
            out.extend(use_paths(rest).into_iter().map(|path| base.iter().cloned().chain(path).collect()));
        }
    }
    out
}

/// The paths a use tree (or a plain path) at the start of `text` spells, each as its names:
/// `a::{b::c, d}` → `[a, b, c]`, `[a, d]`; `a::*` and `a::f()` → `[a]`, `[a, f]`.
fn use_paths(text: &str) -> Vec<Vec<String>> {
    let text = text.trim_start();
    if let Some(group) = text.strip_prefix('{') {
        return group_items(group).into_iter().flat_map(use_paths).collect();
    }
    let name: String = text.chars().take_while(|&c| is_ident(c)).collect();
    if name.is_empty() {
        return Vec::new();
    }
    let tails = text[name.len()..].strip_prefix("::").map(use_paths).unwrap_or_default();
    if tails.is_empty() {
        return vec![vec![name]];
    }
    tails.into_iter().map(|tail| std::iter::once(name.clone()).chain(tail).collect()).collect()
}

/// The items of a `{a, b::{c, d}, e}` group (the text after its `{`), split at its own commas.
fn group_items(group: &str) -> Vec<&str> {
    let (mut depth, mut start, mut items) = (1, 0, Vec::new());
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 1 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if depth == 0 {
            items.push(&group[start..i]);
            break;
        }
    }
    items
}

/// The import graph inside each folder below the top level (whose own test checks it), by the
/// folder's names from the crate root. In a folder each file `x.rs` and each subfolder `x/` (with
/// everything in it) is one node; a path from a file in one node that lands in a module of
/// another node is an edge between them. A path into the folder's own `mod.rs` is none.
fn folder_graphs(files: &[Source]) -> BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> {
    let library: Vec<&Source> = files.iter().filter(|f| f.path != "lib.rs" && !f.path.starts_with("bin/")).collect();
    let modules: BTreeSet<Vec<String>> = library.iter().map(|f| module_path(&f.path)).collect();
    let mut graphs: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for f in library {
        let from = module_path(&f.path);
        for path in crate_paths(&from, &f.bare) {
            let Some(to) = (1..=path.len()).rev().map(|n| &path[..n]).find(|p| modules.contains(*p)) else { continue };
            // The one folder where the two paths part, if both go on below it.
            let Some(depth) = (1..from.len().min(to.len())).find(|&d| from[d] != to[d]) else { continue };
            if from[..depth] == to[..depth] {
                graphs.entry(from[..depth].to_vec()).or_default().entry(from[depth].clone()).or_default().insert(to[depth].clone());
            }
        }
    }
    graphs
}

/// Import circles among the files of one folder, as `folder/: a -> b -> a`.
fn folder_circles(graphs: &BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>>) -> Vec<String> {
    let mut out = Vec::new();
    for (folder, graph) in graphs {
        out.extend(circles(graph).into_iter().map(|c| format!("{}/: {} -> {}", folder.join("/"), c.join(" -> "), c[0])));
    }
    out
}

fn made_up(files: &[(&str, &str)]) -> Vec<Source> {
    files
        .iter()
        .map(|(p, t)| {
            let (bare, literals) = lex(t);
            Source { path: p.to_string(), code: strip_comments(t), raw: t.to_string(), bare, literals }
        })
        .collect()
}

#[test]
fn no_import_circle_among_src_modules() {
    let files = sources();
    let graph = module_graph(&files);
    assert!(graph.len() >= 10, "only {} modules found under src/: the scan is broken", graph.len());
    assert!(graph["engine"].contains("sched") && graph["sched"].contains("kv"), "the scan missed imports: {graph:?}");
    let found = circles(&graph);
    assert!(found.is_empty(), "import circles among src/ modules: {found:?}");

    let loop_of_two = made_up(&[("a.rs", "use crate::b::X;"), ("b.rs", "use crate::{c, a::Y};"), ("c.rs", "// crate::a in a comment is no import")]);
    assert_eq!(circles(&module_graph(&loop_of_two)), vec![vec!["a".to_string(), "b".to_string()]]);
}

#[test]
fn layers_only_look_down() {
    let found = layer_violations(&sources());
    assert!(found.is_empty(), "layering rules broken:\n{}", found.join("\n"));

    let broken = made_up(&[
        ("kv/cache.rs", "use crate::model::ModelConfig;"),
        ("gguf.rs", "fn f() { crate::gpu::Context::new(); }"),
        ("time.rs", "fn now() -> f64 { js_sys::Date::now() }"),
        ("model/runner.rs", "use crate::{kv::KvCache, sched::Plan};"),
    ]);
    assert_eq!(layer_violations(&broken).len(), 4, "{:?}", layer_violations(&broken));
}

#[test]
fn only_the_context_creates_buffers_and_bind_groups_and_submits() {
    let found = uncounted_gpu_calls(&sources());
    assert!(found.is_empty(), "GPU calls the context's counters cannot see:\n{}", found.join("\n"));

    let broken = made_up(&[
        ("kv/cache.rs", "fn f(ctx: &Context) { ctx.queue.submit(Some(e.finish())); }"),
        ("model/graph.rs", "let b = ctx.device.create_buffer_init(&desc);"),
        ("gpu/kernel.rs", "// ctx.device.create_bind_group in a comment is no call"),
        ("gpu/context.rs", "self.device.create_bind_group(desc)"),
    ]);
    assert_eq!(uncounted_gpu_calls(&broken).len(), 2, "{:?}", uncounted_gpu_calls(&broken));
}

#[test]
fn no_function_runs_long_without_a_reason() {
    let found = long_functions(&sources());
    assert!(found.is_empty(), "functions over {MAX_FN_LINES} lines without a `// Long:` reason above them:\n{}", found.join("\n"));

    let body = "    let x = 1;\n".repeat(MAX_FN_LINES);
    let long = format!("fn long() {{\n{body}}}\n");
    let excused = format!("// Long: a table written out.\nfn excused() {{\n{body}}}\n");
    let files = made_up(&[("a.rs", &long), ("b.rs", &excused), ("c.rs", "trait T { fn f(&self); }")]);
    assert_eq!(long_functions(&files), vec![format!("a.rs:1 long ({} lines)", MAX_FN_LINES + 2)]);
}

#[test]
fn no_import_circle_among_the_files_of_a_folder() {
    let graphs = folder_graphs(&sources());
    let edge = |folder: &str, from: &str, to: &str| graphs.get(&vec![folder.to_string()]).and_then(|g| g.get(from)).is_some_and(|d| d.contains(to));
    assert!(edge("kv", "cache", "pool") && edge("cpu", "runner", "forward"), "the scan missed imports: {graphs:?}");
    let found = folder_circles(&graphs);
    assert!(found.is_empty(), "import circles among the files of a folder:\n{}", found.join("\n"));

    let broken = made_up(&[
        ("cpu/mod.rs", "mod kernels;\nmod qdot;\npub use kernels::matmul;"),
        ("cpu/kernels.rs", "use super::qdot::{self, dot};\nuse super::Weights;"),
        ("cpu/qdot.rs", "use crate::{cpu::kernels::Acts, gguf};\nconst S: &str = \"super::forward\";\nmod tests {\n    use super::forward;\n}"),
        ("cpu/forward.rs", "use super::{kernels, Weights}; // super::qdot in a comment is no import"),
        ("gpu/ops/norm.rs", "use crate::gpu::context::Context;\nuse super::Kernel;"),
        ("gpu/context.rs", "fn f() { super::ops::norm::rms_norm(); }"),
        ("gpu/ops/mod.rs", "mod norm;\npub use norm::rms_norm;"),
        ("gpu/shaders.rs", "use crate::gpu::{Kernel, ops};"),
        ("a.rs", "use crate::b::B;"),
        ("b.rs", "use crate::a::A;"),
    ]);
    let expected = ["cpu/: kernels -> qdot -> kernels", "gpu/: context -> ops -> context"];
    assert_eq!(folder_circles(&folder_graphs(&broken)), expected);
}

#[test]
fn the_model_imports_no_backend() {
    let found = model_imports_above(&sources());
    assert!(found.is_empty(), "model/ imports a layer above it:\n{}", found.join("\n"));

    let broken = made_up(&[
        ("model/config.rs", "use crate::gpu::Context;"),
        ("model/mod.rs", "use super::{cpu, webgpu::Weights};"),
        ("model/step.rs", "use crate::{kv::KvShape, sampler::RowParams};\nuse super::ModelConfig;"),
        ("model/reference.rs", "use crate::gguf::Gguf; // crate::engine in a comment is no import"),
        ("engine/load.rs", "use crate::{cpu, model, webgpu};"),
    ]);
    let expected = [
        "model/config.rs: model/ imports gpu/",
        "model/mod.rs: model/ imports cpu/",
        "model/mod.rs: model/ imports webgpu/",
        "model/step.rs: model/ imports kv/",
    ];
    assert_eq!(model_imports_above(&broken), expected);
}

#[test]
fn the_backends_stand_side_by_side_checker() {
    let broken = made_up(&[
        ("cpu/runner.rs", "use crate::gpu::Context;"),
        ("cpu/forward.rs", "fn f() { crate::webgpu::Weights::load(); }"),
        ("webgpu/graph.rs", "use crate::{cpu::kernels, gpu::Context};"),
        ("gpu/ops/norm.rs", "use crate::cpu::kernels::rms_norm;"),
        ("engine/load.rs", "use crate::{cpu, gpu, webgpu};"),
        ("cpu/kernels.rs", "use crate::model::RopePairing; // crate::gpu in a comment is no import"),
    ]);
    let expected = [
        "cpu/runner.rs: cpu/ imports gpu/",
        "cpu/forward.rs: cpu/ imports webgpu/",
        "webgpu/graph.rs: webgpu/ imports cpu/",
        "gpu/ops/norm.rs: gpu/ imports cpu/",
    ];
    assert_eq!(backend_crossings(&broken), expected);
}

#[test]
fn the_backends_stand_side_by_side() {
    let found = backend_crossings(&sources());
    assert!(found.is_empty(), "one backend imports the other:\n{}", found.join("\n"));
}

#[test]
fn only_the_description_spells_tensor_names_checker() {
    let broken = made_up(&[
        ("cpu/weights.rs", "let w = matrix(gguf, &format!(\"blk.{l}.attn_q.weight\"))?;"),
        ("webgpu/weights.rs", "let e = upload(\"token_embd\", t);\nlet (g, o) = (p(\"ffn_gate\"), gguf.tensor(\"output.weight\"));"),
        ("synth.rs", "let url = \"https://example.com // blk.0 is no comment\";\nlet n = \"x\\nffn_up\";"),
        ("model/reference.rs", "let m = r#\"attn_output.weight\"#;\nlet d = b\"post_ffw_norm\";"),
        ("model/arch.rs", "pub const EMBD: &str = \"token_embd.weight\";"),
        (
            "webgpu/graph.rs",
            concat!(
                "let a = int8(\"graph.attn_q\", n); let q = '\"'; // \"attn_q\" in a comment\n",
                "/* \"ffn_up\" in a block comment */ let k = \"attn_kv {output} rope.freq_base blk\";\n",
                "let e = (\"tensor {name}: {l}.ffn_upper\", \"graph.output.weights\", r\"\\\", \"ffn_gate_inp\");",
            ),
        ),
        ("cpu/forward.rs", "let l = \"graph.attn_k.weight\";"),
    ]);
    let expected = [
        "cpu/weights.rs:1 \"blk.{l}.attn_q.weight\"",
        "webgpu/weights.rs:1 \"token_embd\"",
        "webgpu/weights.rs:2 \"ffn_gate\"",
        "webgpu/weights.rs:2 \"output.weight\"",
        "synth.rs:1 \"https://example.com // blk.0 is no comment\"",
        "synth.rs:2 \"x\\nffn_up\"",
        "model/reference.rs:1 \"attn_output.weight\"",
        "model/reference.rs:2 \"post_ffw_norm\"",
        "cpu/forward.rs:1 \"graph.attn_k.weight\"",
    ];
    assert_eq!(tensor_names_outside_arch(&broken), expected);
}

#[test]
fn only_the_description_spells_tensor_names() {
    let found = tensor_names_outside_arch(&sources());
    assert!(found.is_empty(), "GGUF tensor names spelled outside {ARCH}:\n{}", found.join("\n"));
}

#[test]
fn no_file_runs_long_without_a_reason_checker() {
    let lines = |n: usize| "fn f() {}\n".repeat(n);
    let excused = format!("//! Tables.\n\n// Long: one table per weight type.\n#![allow(dead_code)]\n{}", lines(MAX_FILE_LINES));
    let late = format!("use std::fmt;\n// Long: too late, after the first item.\n{}", lines(MAX_FILE_LINES));
    let files = made_up(&[
        ("a.rs", &lines(MAX_FILE_LINES + 1)),
        ("b.rs", &lines(MAX_FILE_LINES)),
        ("c.rs", &excused),
        ("d.rs", &late),
        ("engine/mod.rs", &lines(MAX_ENGINE_LINES + 1)),
        ("engine/load.rs", &lines(MAX_ENGINE_LINES + 1)),
    ]);
    let expected = [
        format!("a.rs ({} lines, over {MAX_FILE_LINES})", MAX_FILE_LINES + 1),
        format!("d.rs ({} lines, over {MAX_FILE_LINES})", MAX_FILE_LINES + 2),
        format!("engine/mod.rs ({} lines, over {MAX_ENGINE_LINES})", MAX_ENGINE_LINES + 1),
    ];
    assert_eq!(long_files(&files), expected);
}

#[test]
fn no_file_runs_long_without_a_reason() {
    let found = long_files(&sources());
    assert!(found.is_empty(), "files over their length without a `// Long:` reason in their header:\n{}", found.join("\n"));
}
