//! Typed command-line options. Every command declares its options and their types in
//! [`COMMANDS`]; [`parse`] refuses anything else (an unknown or misspelt option, a missing value,
//! a value of the wrong type or outside its set) before the command reads a file, so a typo never
//! runs silently with the defaults.

use std::collections::HashMap;

/// What an option takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    /// No value: present or not.
    Flag,
    /// Any text (a path, a prompt).
    Text,
    /// A whole number that fits in 32 bits.
    Count,
    /// A whole number that fits in 64 bits.
    Seed,
    /// A decimal number.
    Number,
    /// One of these words.
    Choice(&'static [&'static str]),
    /// Whole numbers separated by commas.
    Counts,
}

#[derive(Debug)]
pub struct Opt {
    pub name: &'static str,
    pub kind: Kind,
}

const fn opt(name: &'static str, kind: Kind) -> Opt {
    Opt { name, kind }
}

pub const KV_LAYOUTS: &[&str] = &["contiguous", "paged"];
pub const KV_DTYPES: &[&str] = &["f32", "int8"];
pub const ADAPTER_CLASSES: &[&str] = &["cpu", "integrated", "discrete"];
/// `--backend`'s values ([`pagedlm::engine::BackendChoice::parse`]).
pub const BACKENDS: &[&str] = &["auto", "webgpu", "cpu"];
pub const ACTIVATIONS: &[&str] = &["auto", "f32", "int8"];
pub const DEVICE_LIMITS: &[&str] = &["adapter", "phone"];
pub const SCORE_MODES: &[&str] = &["decode", "prefill"];
/// `--speculative`'s values ([`pagedlm::engine::Speculative::parse`]).
pub const SPECULATIVE: &[&str] = &["auto", "off"];

/// The engine's options, which every command takes (the README's Command line section calls them
/// common; `tokenize`
/// reads only `--model` and checks the others without using them).
const ENGINE: &[Opt] = &[
    opt("model", Kind::Text),
    opt("kv-layout", Kind::Choice(KV_LAYOUTS)),
    opt("kv-dtype", Kind::Choice(KV_DTYPES)),
    opt("block-size", Kind::Count),
    opt("pool-tokens", Kind::Count),
    opt("max-context", Kind::Count),
    opt("prefill-chunk", Kind::Count),
    opt("max-batch", Kind::Count),
    opt("step-tokens", Kind::Count),
    opt("no-prefix-cache", Kind::Flag),
    opt("no-cache-aware", Kind::Flag),
    opt("no-lookahead", Kind::Flag),
    opt("max-binding-mib", Kind::Count),
    opt("device-limits", Kind::Choice(DEVICE_LIMITS)),
    opt("max-memory-mib", Kind::Count),
    opt("adapter-class", Kind::Choice(ADAPTER_CLASSES)),
    opt("no-optional-features", Kind::Flag),
    opt("activations", Kind::Choice(ACTIVATIONS)),
    opt("backend", Kind::Choice(BACKENDS)),
    opt("speculative", Kind::Choice(SPECULATIVE)),
    opt("max-draft", Kind::Count),
];

/// The commands, for dispatching without matching on names.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Cmd {
    Tokenize,
    Score,
    Generate,
    Bench,
    Trace,
    Profile,
}

#[derive(Debug)]
pub struct Command {
    pub name: &'static str,
    pub what: Cmd,
    /// The command's own options; [`ENGINE`]'s come with every command.
    pub options: &'static [Opt],
}

pub const COMMANDS: &[Command] = &[
    Command { name: "tokenize", what: Cmd::Tokenize, options: &[opt("texts", Kind::Text)] },
    Command { name: "score", what: Cmd::Score, options: &[opt("input", Kind::Text), opt("mode", Kind::Choice(SCORE_MODES))] },
    Command {
        name: "generate",
        what: Cmd::Generate,
        options: &[
            opt("input", Kind::Text),
            opt("prompt", Kind::Text),
            opt("max-tokens", Kind::Count),
            opt("temperature", Kind::Number),
            opt("top-k", Kind::Count),
            opt("top-p", Kind::Number),
            opt("seed", Kind::Seed),
            opt("repetition-penalty", Kind::Number),
            opt("json-schema", Kind::Text),
            opt("grammar", Kind::Text),
            opt("chat-template-kwargs", Kind::Text),
        ],
    },
    Command {
        name: "bench",
        what: Cmd::Bench,
        options: &[
            opt("prompt-tokens", Kind::Count),
            opt("gen-tokens", Kind::Count),
            opt("context", Kind::Count),
            opt("batch", Kind::Count),
            opt("transfer", Kind::Flag),
            opt("lengths", Kind::Counts),
            opt("interference", Kind::Flag),
            opt("json-schema", Kind::Text),
            opt("grammar", Kind::Text),
        ],
    },
    Command { name: "trace", what: Cmd::Trace, options: &[opt("input", Kind::Text), opt("disaggregate", Kind::Flag)] },
    Command {
        name: "profile",
        what: Cmd::Profile,
        options: &[opt("prompt-tokens", Kind::Count), opt("json", Kind::Flag), opt("table", Kind::Flag), opt("no-timestamps", Kind::Flag)],
    },
];

impl Command {
    fn find(&self, name: &str) -> Option<&'static Opt> {
        ENGINE.iter().chain(self.options).find(|o| o.name == name)
    }

    fn names(&self) -> impl Iterator<Item = &'static str> {
        ENGINE.iter().chain(self.options).map(|o| o.name)
    }
}

/// A refused command line. Each message names the option and what it takes.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ArgError {
    #[error("unknown command '{got}'{}", hint(.suggestion))]
    UnknownCommand { got: String, suggestion: Option<&'static str> },
    #[error("the {command} command has no option --{got}{}", unknown_hint(.suggestion, .owners))]
    UnknownOption { command: &'static str, got: String, suggestion: Option<&'static str>, owners: Vec<&'static str> },
    #[error("--{0} needs a value")]
    MissingValue(&'static str),
    #[error("--{0} takes no value")]
    UnexpectedValue(&'static str),
    #[error("--{option} expects {expected}, got '{got}'")]
    BadValue { option: &'static str, expected: &'static str, got: String },
    #[error("--{option} must be {}, got '{got}'", choices.join(" or "))]
    BadChoice { option: &'static str, choices: &'static [&'static str], got: String },
    #[error("--{0} is given twice")]
    Repeated(&'static str),
    #[error("unexpected argument '{0}' (options start with --)")]
    Positional(String),
}

fn hint(suggestion: &Option<&'static str>) -> String {
    suggestion.map(|s| format!("; did you mean {s}?")).unwrap_or_default()
}

fn unknown_hint(suggestion: &Option<&'static str>, owners: &[&'static str]) -> String {
    match (suggestion, owners) {
        (Some(s), _) => format!("; did you mean --{s}?"),
        (None, []) => " (`pagedlm help` lists the options)".to_string(),
        (None, [only]) => format!(" (pagedlm {only} takes it)"),
        (None, [first @ .., last]) => format!(" (pagedlm {} and {last} take it)", first.join(", ")),
    }
}

/// A value, already of its option's type.
#[derive(Clone, Debug, PartialEq)]
enum Value {
    Flag,
    Text(String),
    Count(u32),
    Seed(u64),
    Number(f32),
    Counts(Vec<u32>),
}

/// A parsed command line: the command and its options' values.
#[derive(Debug)]
pub struct Args {
    pub command: &'static Command,
    values: HashMap<&'static str, Value>,
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Parsed {
    Run(Args),
    Help,
}

/// Parses `argv` (without the program name): a command, then `--name value`, `--name=value` or
/// `--flag` options. `help`, `--help` or `-h` anywhere an option may stand asks for the usage.
pub fn parse(argv: &[String]) -> Result<Parsed, ArgError> {
    let Some(first) = argv.first() else { return Ok(Parsed::Help) };
    if matches!(first.as_str(), "help" | "--help" | "-h") {
        return Ok(Parsed::Help);
    }
    let command = COMMANDS
        .iter()
        .find(|c| c.name == first)
        .ok_or_else(|| ArgError::UnknownCommand { got: first.clone(), suggestion: closest(first, COMMANDS.iter().map(|c| c.name)) })?;
    let mut values = HashMap::new();
    let mut rest = argv[1..].iter();
    while let Some(arg) = rest.next() {
        if arg == "--help" || arg == "-h" {
            return Ok(Parsed::Help);
        }
        let Some(body) = arg.strip_prefix("--") else { return Err(ArgError::Positional(arg.clone())) };
        let (name, inline) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (body, None),
        };
        let opt = command.find(name).ok_or_else(|| unknown_option(command, name))?;
        let value = match (opt.kind, inline) {
            (Kind::Flag, None) => Value::Flag,
            (Kind::Flag, Some(_)) => return Err(ArgError::UnexpectedValue(opt.name)),
            (kind, Some(text)) => typed(opt.name, kind, text)?,
            // A following `--option` means this one's value was left out (a value that really
            // starts with "--" can be given as `--name=--value`).
            (kind, None) => match rest.next() {
                Some(text) if !text.starts_with("--") => typed(opt.name, kind, text.clone())?,
                _ => return Err(ArgError::MissingValue(opt.name)),
            },
        };
        if values.insert(opt.name, value).is_some() {
            return Err(ArgError::Repeated(opt.name));
        }
    }
    Ok(Parsed::Run(Args { command, values }))
}

fn unknown_option(command: &'static Command, name: &str) -> ArgError {
    let suggestion = closest(name, command.names());
    let owners = COMMANDS.iter().filter(|c| c.options.iter().any(|o| o.name == name)).map(|c| c.name).collect();
    ArgError::UnknownOption { command: command.name, got: name.to_string(), suggestion, owners }
}

fn typed(option: &'static str, kind: Kind, text: String) -> Result<Value, ArgError> {
    let bad = |expected: &'static str| ArgError::BadValue { option, expected, got: text.clone() };
    Ok(match kind {
        Kind::Flag => Value::Flag,
        Kind::Text => Value::Text(text),
        Kind::Count => Value::Count(text.parse().map_err(|_| bad("a whole number from 0 to 4294967295"))?),
        Kind::Seed => Value::Seed(text.parse().map_err(|_| bad("a whole number from 0 to 2^64 - 1"))?),
        Kind::Number => Value::Number(text.parse().map_err(|_| bad("a number"))?),
        Kind::Choice(choices) if choices.contains(&text.as_str()) => Value::Text(text),
        Kind::Choice(choices) => return Err(ArgError::BadChoice { option, choices, got: text }),
        Kind::Counts => {
            Value::Counts(text.split(',').map(|x| x.trim().parse()).collect::<Result<_, _>>().map_err(|_| bad("whole numbers separated by commas"))?)
        }
    })
}

/// The known name closest to `got`: one it starts (at least 3 letters typed), or one within two
/// edits (insert, delete, replace, swap two neighbours).
fn closest(got: &str, known: impl Iterator<Item = &'static str>) -> Option<&'static str> {
    let known: Vec<&'static str> = known.collect();
    if got.len() >= 3 {
        let mut starting = known.iter().filter(|k| k.starts_with(got));
        if let (Some(only), None) = (starting.next(), starting.next()) {
            return Some(only);
        }
    }
    known.iter().map(|k| (edit_distance(got, k), *k)).filter(|&(d, _)| d <= 2 && d < got.len()).min_by_key(|&(d, _)| d).map(|(_, k)| k)
}

/// Optimal-string-alignment distance: Levenshtein plus swaps of adjacent characters, so
/// "dtpye" is one edit from "dtype".
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

/// Typed reads. Asking for an option the command does not declare, or with another type, is a
/// bug in the CLI, caught in debug builds (the CLI tests run one).
impl Args {
    fn get(&self, name: &str, kind: fn(Kind) -> bool) -> Option<&Value> {
        debug_assert!(
            self.command.find(name).is_some_and(|o| kind(o.kind)),
            "pagedlm {} reads --{name}, which it does not declare with that type",
            self.command.name
        );
        self.values.get(name)
    }

    pub fn flag(&self, name: &str) -> bool {
        self.get(name, |k| k == Kind::Flag).is_some()
    }

    /// Whether the option was given at all.
    pub fn given(&self, name: &str) -> bool {
        self.get(name, |_| true).is_some()
    }

    /// A text or choice option.
    pub fn text(&self, name: &str) -> Option<&str> {
        match self.get(name, |k| matches!(k, Kind::Text | Kind::Choice(_))) {
            Some(Value::Text(s)) => Some(s),
            _ => None,
        }
    }

    /// A count, or `default` (the library's, or a named constant of the command's) when absent.
    pub fn count(&self, name: &str, default: u32) -> u32 {
        self.given_count(name).unwrap_or(default)
    }

    /// A count, if given (for options whose absence means "no value" rather than a default).
    pub fn given_count(&self, name: &str) -> Option<u32> {
        match self.get(name, |k| k == Kind::Count) {
            Some(Value::Count(n)) => Some(*n),
            _ => None,
        }
    }

    pub fn seed(&self, name: &str, default: u64) -> u64 {
        match self.get(name, |k| k == Kind::Seed) {
            Some(Value::Seed(n)) => *n,
            _ => default,
        }
    }

    pub fn number(&self, name: &str, default: f32) -> f32 {
        match self.get(name, |k| k == Kind::Number) {
            Some(Value::Number(x)) => *x,
            _ => default,
        }
    }

    pub fn counts(&self, name: &str) -> Option<&[u32]> {
        match self.get(name, |k| k == Kind::Counts) {
            Some(Value::Counts(v)) => Some(v),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn err(s: &str) -> ArgError {
        parse(&argv(s)).unwrap_err()
    }

    fn args(s: &str) -> Args {
        match parse(&argv(s)).unwrap() {
            Parsed::Run(a) => a,
            Parsed::Help => panic!("{s}: help"),
        }
    }

    #[test]
    fn values_come_typed() {
        let a = args("generate --prompt hi --max-tokens 5 --temperature 0.7 --seed 18446744073709551615 --kv-dtype=int8");
        assert_eq!(a.text("prompt"), Some("hi"));
        assert_eq!(a.count("max-tokens", 128), 5);
        assert_eq!(a.count("top-k", 7), 7);
        assert_eq!(a.number("temperature", 0.0), 0.7);
        assert_eq!(a.seed("seed", 0), u64::MAX);
        assert_eq!(a.text("kv-dtype"), Some("int8"));
        assert!(!a.flag("no-prefix-cache"));
        let a = args("bench --transfer --lengths 20,50 --no-prefix-cache");
        assert!(a.flag("transfer") && a.flag("no-prefix-cache") && !a.given("batch"));
        assert_eq!(a.counts("lengths"), Some(&[20, 50][..]));
        // A negative number is a value, not an option.
        assert_eq!(args("generate --temperature -2").number("temperature", 0.0), -2.0);
    }

    #[test]
    fn mistakes_are_refused_with_the_option_named() {
        assert_eq!(
            err("generate --kv-dtpye int8"),
            ArgError::UnknownOption { command: "generate", got: "kv-dtpye".into(), suggestion: Some("kv-dtype"), owners: vec![] }
        );
        assert_eq!(err("generate --temp 1").to_string(), "the generate command has no option --temp; did you mean --temperature?");
        assert_eq!(err("score --texts a.json").to_string(), "the score command has no option --texts (pagedlm tokenize takes it)");
        assert_eq!(err("tokenize --input a.json").to_string(), "the tokenize command has no option --input (pagedlm score, generate and trace take it)");
        assert_eq!(err("score --quantum 3").to_string(), "the score command has no option --quantum (`pagedlm help` lists the options)");
        assert!(err("score --backend gpu").to_string().contains("--backend must be auto or webgpu or cpu, got 'gpu'"), "{}", err("score --backend gpu"));
        assert_eq!(err("generate --kv-dtype fp16").to_string(), "--kv-dtype must be f32 or int8, got 'fp16'");
        assert_eq!(err("generate --max-tokens"), ArgError::MissingValue("max-tokens"));
        assert_eq!(err("generate --max-tokens --seed 1"), ArgError::MissingValue("max-tokens"));
        assert!(matches!(err("generate --top-k 1.5"), ArgError::BadValue { option: "top-k", .. }));
        assert!(matches!(err("bench --lengths 1,,2"), ArgError::BadValue { option: "lengths", .. }));
        assert_eq!(err("bench --transfer=1"), ArgError::UnexpectedValue("transfer"));
        assert_eq!(err("trace --input a --input b"), ArgError::Repeated("input"));
        assert_eq!(err("trace a.jsonl"), ArgError::Positional("a.jsonl".into()));
        assert_eq!(err("scor"), ArgError::UnknownCommand { got: "scor".into(), suggestion: Some("score") });
        assert!(matches!(parse(&argv("profile -h")), Ok(Parsed::Help)));
    }

    #[test]
    fn near_misses_find_their_option() {
        let names = || ENGINE.iter().map(|o| o.name);
        assert_eq!(closest("kv-dtpye", names()), Some("kv-dtype"));
        assert_eq!(closest("blocksize", names()), Some("block-size"));
        assert_eq!(closest("max-ctx", names()), None);
        assert_eq!(closest("kv", names()), None, "an ambiguous or too short prefix suggests nothing");
        assert_eq!(edit_distance("dtpye", "dtype"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
    }

    /// The usage text lists every option each command takes, and no other.
    #[test]
    fn usage_lists_every_option() {
        let usage = crate::USAGE;
        let listed: std::collections::HashSet<&str> =
            usage.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).filter_map(|w| w.strip_prefix("--")).collect();
        for c in COMMANDS {
            assert!(usage.contains(&format!("\n  {} ", c.name)), "usage lacks {}", c.name);
            for o in ENGINE.iter().chain(c.options) {
                assert!(listed.contains(o.name), "usage lacks --{}", o.name);
            }
        }
        for name in listed {
            assert!(COMMANDS.iter().any(|c| c.find(name).is_some()), "usage lists --{name}, which no command takes");
        }
    }
}
