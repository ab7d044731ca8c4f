//! Split models (llama.cpp's `gguf-split`): each part a GGUF file of its own, every part carrying
//! `split.no`, `split.count` and `split.tensors.count`, the first part the model's metadata, the
//! tensors spread over the parts in order. Read together they are one model.

use super::{GgufError, MetaValue};

/// The part number key (0-based).
pub const SPLIT_NO: &str = "split.no";
/// How many parts the model has.
pub const SPLIT_COUNT: &str = "split.count";
/// How many tensors all parts hold together.
pub const SPLIT_TENSORS: &str = "split.tensors.count";

fn number(metadata: &[(String, MetaValue)], key: &str) -> Result<Option<u64>, GgufError> {
    match metadata.iter().find(|(k, _)| k == key) {
        None => Ok(None),
        Some((_, v)) => v.as_u64().map(Some).ok_or_else(|| GgufError::Split(format!("{key} is not a non-negative integer"))),
    }
}

/// Checks that the parts given (their metadata, in order) are a whole split model, or one file
/// that is not split.
pub(super) fn check_parts(parts: &[&[(String, MetaValue)]]) -> Result<(), GgufError> {
    let Some(first) = parts.first() else {
        return Err(GgufError::Split("no file given".into()));
    };
    let count = number(first, SPLIT_COUNT)?.unwrap_or(1);
    if count != parts.len() as u64 {
        return Err(GgufError::Split(match parts.len() {
            1 => format!("this file is one part of a model split in {count}: give every part (name-00001-of-{count:05}.gguf, ...)"),
            n => format!("{n} files were given, but the first says the model has {count} parts"),
        }));
    }
    for (i, part) in parts.iter().enumerate() {
        let no = number(part, SPLIT_NO)?.unwrap_or(0);
        if no != i as u64 || (count > 1 && number(part, SPLIT_COUNT)? != Some(count)) {
            return Err(GgufError::Split(format!(
                "file {} of {count} is part {} (of {:?}): give the parts in order",
                i + 1,
                no + 1,
                number(part, SPLIT_COUNT)?
            )));
        }
    }
    Ok(())
}

/// Checks that a split model's parts held every tensor its first part announces.
pub(super) fn check_tensor_count(metadata: &[(String, MetaValue)], found: usize) -> Result<(), GgufError> {
    match number(metadata, SPLIT_TENSORS)? {
        Some(n) if n != found as u64 => Err(GgufError::Split(format!("the parts hold {found} tensors, {SPLIT_TENSORS} says {n}"))),
        _ => Ok(()),
    }
}

/// The file name of part `index` (0-based) of `count` of a model named `prefix` (a path
/// without `.gguf`): llama.cpp's `llama_split_path`, `%s-%05d-of-%05d.gguf` numbered from 1.
pub fn split_part_name(prefix: &str, index: usize, count: usize) -> String {
    format!("{prefix}-{:05}-of-{count:05}.gguf", index + 1)
}

/// The file names of the parts of the split model whose first part is `first`
/// (`name-00001-of-00003.gguf` → the three names), or `None` when it is not named as one.
pub fn part_names(first: &str) -> Option<Vec<String>> {
    let stem = first.strip_suffix(".gguf")?;
    let (head, count) = stem.rsplit_once("-of-")?;
    let (base, no) = head.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) || no != "00001" {
        return None;
    }
    let n: usize = count.parse().ok()?;
    Some((0..n).map(|i| split_part_name(base, i, n)).collect())
}
