//! The house rules, checked on the source itself (no GPU needed):
//! - no import circle among the top-level modules of `src/` (a module is a file under `src/` or a
//!   folder with its files; an import is a `crate::x` or `super::x` path in code, comments
//!   excluded);
//! - `kv/` never imports `model/`; `gguf.rs` never imports `gpu/`; `quant/` imports neither
//!   `kv/`, `model/` nor `gpu/`;
//! - only `web.rs` touches wasm-bindgen (`wasm_bindgen`, `js_sys`, `web_sys`,
//!   `wasm_bindgen_futures`, `serde_wasm_bindgen`);
//! - only `engine/` sees the scheduler, the KV cache and the model together;
//! - no function in `src/` runs over 80 lines unless a comment just above it says why
//!   (`// Long: ...`);
//! - only `gpu/context.rs` creates buffers and bind groups or submits on the device and queue
//!   (everything else goes through its methods, so its counters see every one).
//!
//! Each checker is also run on a small made-up source that breaks its rule, so a checker that
//! stopped seeing anything would fail here too.

#![cfg(not(target_arch = "wasm32"))]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest function body allowed without a written reason.
const MAX_FN_LINES: usize = 80;
const WASM_CRATES: [&str; 5] = ["wasm_bindgen", "js_sys", "web_sys", "wasm_bindgen_futures", "serde_wasm_bindgen"];

/// A source file: its path under `src/` and its text without comments.
struct Source {
    path: String,
    code: String,
    raw: String,
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
            Source { path, code: strip_comments(&raw), raw }
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

fn made_up(files: &[(&str, &str)]) -> Vec<Source> {
    files.iter().map(|(p, t)| Source { path: p.to_string(), code: strip_comments(t), raw: t.to_string() }).collect()
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
