"""Writes tests/data/gemma3/tokens.json from ../shared/reference/gemma3-270m-q4_k_m/llamacpp_public.json:
the llama.cpp token ids of the tokenizer strings (add_bos=False, special=True), every public
prompt's text and ids (BOS included), and llama.cpp's end-of-generation set.

Run: .cache/py/bin/python scripts/gemma3-tokens.py (from the repository root)."""
import json
import pathlib
import sys

root = pathlib.Path(__file__).resolve().parent.parent
source = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else root.parent / "shared/reference/gemma3-270m-q4_k_m/llamacpp_public.json"
ref = json.loads(source.read_text(encoding="utf-8"))
out = {
    "source": "llamacpp_public.json of ../shared/reference/gemma3-270m-q4_k_m (" + ref["oracle"] + ")",
    "add_bos": ref["model"]["add_bos"],
    "eog_ids": ref["settings"]["eog_ids"],
    "strings": [{"text": t["text"], "ids": t["ids"]} for t in ref["tokenizer"]],
    "prompts": [{"id": r["id"], "text": r["prompt_text"], "ids": r["prompt_ids"]} for r in ref["results"]],
}
target = root / "tests/data/gemma3/tokens.json"
target.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
print(f"wrote {target}: {len(out['strings'])} strings, {len(out['prompts'])} prompts")
