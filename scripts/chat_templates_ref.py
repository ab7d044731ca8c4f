#!/usr/bin/env python3
"""Reference renderings of real chat templates, made the way Hugging Face's transformers makes
them (jinja2's ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols
extension, `raise_exception`, `strftime_now` and transformers' own `tojson`).

Reads tests/data/templates/cases.json (the templates with their BOS/EOS texts, the conversations,
the tools and the date `strftime_now` reports) and writes tests/data/templates/expected.json:
for each template and case, the rendered prompt, or the error it raised. tests/chat_templates.rs
renders the same cases with pagedlm's renderer and compares them exactly.

Run with a Python that has jinja2 (the reference venv has it):
    ~/.cache/pagedlm-ref/bin/python scripts/chat_templates_ref.py
"""

import json
import pathlib
from datetime import datetime, timezone

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

DATA = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "templates"


class TemplateRaised(Exception):
    pass


def environment(now):
    """transformers' `_compile_jinja_template` environment."""

    def raise_exception(message):
        raise TemplateRaised(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return now.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    spec = json.loads((DATA / "cases.json").read_text())
    now = datetime.strptime(spec["now"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert now.timestamp() == spec["now_unix"], "cases.json: now and now_unix disagree"
    env = environment(now)
    expected = {}
    for name, tokens in spec["templates"].items():
        template = env.from_string((DATA / name).read_text())
        results = {}
        for case, c in spec["cases"].items():
            variables = dict(c.get("kwargs", {}))
            variables.update(tokens)
            try:
                text = template.render(
                    messages=c["messages"],
                    tools=spec["tools"] if c.get("tools") else None,
                    add_generation_prompt=c["add_generation_prompt"],
                    **variables,
                )
                results[case] = {"text": text}
            except TemplateRaised as e:
                results[case] = {"raised": str(e)}
            except Exception as e:  # the template failed on these inputs (a type error, ...)
                results[case] = {"failed": f"{type(e).__name__}: {e}"}
        expected[name] = results
    out = DATA / "expected.json"
    out.write_text(json.dumps({"jinja2": jinja2.__version__, "templates": expected}, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
