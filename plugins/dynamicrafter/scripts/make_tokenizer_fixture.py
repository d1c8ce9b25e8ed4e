"""Tokenize a corpus of prompts with open_clip's own ``tokenize`` and save the ids as the tokenizer fixture.

Not needed at test time: ``tests/test_plugin_dynamicrafter.py`` reads the file this writes
(``plugins/dynamicrafter/tests/fixtures/open_clip_tokens.json``) and checks that the plugin's
``tokenize`` (open_clip's text cleaning and pre-tokenizing, transformers' CLIP BPE) yields the same
ids. It runs in an environment of its own that holds open_clip (not a dependency of the project):

```bash
python -m venv /tmp/openclip && /tmp/openclip/bin/pip install -c constraints.txt torch==2.13.0 ftfy regex
/tmp/openclip/bin/pip install --no-deps "open_clip_torch==2.22.0"      # the version DynamiCrafter pins
/tmp/openclip/bin/python plugins/dynamicrafter/scripts/make_tokenizer_fixture.py
```

open_clip ships OpenAI CLIP's BPE vocabulary in its wheel, so nothing is downloaded. Only open_clip's
``tokenizer`` module is imported (its package imports torchvision). Besides the corpus and its ids,
the fixture holds the part of the vocabulary the corpus needs: the 512 byte tokens, every merge the
BPE applies to the corpus (in its rank order) and its result with its id, and the special tokens.
BPE always applies the lowest-ranked merge present, and every merge it applied is kept, so a
tokenizer built from this part tokenizes the corpus exactly as one built from the whole vocabulary
(the script checks that too). The provenance (open_clip's version, the vocabulary file's digest,
the date) is written beside the ids.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.metadata
import importlib.util
import json
import platform
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "tests" / "fixtures" / "open_clip_tokens.json"

LONG = ("a robot arm reaches for the red block on the left side of the table, lifts it slowly, carries it "
        "over the wooden bowl, lowers it until it touches the bottom, opens the gripper, moves back to its "
        "starting position and waits while the camera keeps recording every joint of the arm in detail "
        "until the scene is still and the next episode of the benchmark begins")
CORPUS = [
    "",
    "a robot arm pushes a puck",
    "a Sawyer robot arm doing the reach-v3 task",
    "A ROBOT Arm PuShEs A pUcK",
    "   leading and trailing spaces   ",
    "tabs\tand\nnew lines\r\nand    runs     of spaces",
    "\u00a0no-break\u2003em\u2009thin spaces\u3000ideographic",
    ("punctuation!!! ... ??? -- (parens) [brackets] {braces} <angles> "
     "\"quotes\" 'single' a/b\\c @#$%^&*_+=|~`"),
    "contractions: it's, don't, they're, we've, I'm, you'll, he'd, IT'S, O'Neill's",
    "numbers 12345 and 3.14159, 1e-6, -42, 7th, 2024-07-02, 1,000,000",
    "unicode: café, naïve, Ærøskøbing, straße, İstanbul, ÅNGSTRÖM, façade, señor",
    "cjk: 机器人手臂推动冰球 ロボットアームがパックを押す 로봇 팔이 퍽을 민다",
    "emoji: 🤖🦾 ✨👍🏽 👨‍👩‍👧 🇫🇷",
    "mojibake: cafÃ© naÃ¯ve donâ€™t",
    "curly “quotes” and ‘apostrophes’ — em dash – en dash … ellipsis",
    "ligatures: ﬁne ﬂow ﬀ",
    "fullwidth: ＡＢＣ　ｄｅｆ　１２３！",
    "html: &amp; &lt;b&gt;bold&lt;/b&gt; &quot;x&quot; &amp;amp; &#39;quote&#39; &eacute;",
    "combining: e\u0301 versus é, a\u0308 versus ä",
    "controls: a\u0000b\u200bc\u200dd\ufeffe\x7ff",
    "greek and cyrillic: Σίσυφος ΟΔΥΣΣΕΥΣ, Москва ПРИВЕТ",
    "arabic and hebrew: مرحبا بالعالم שלום עולם",
    "<start_of_text> in the middle <end_of_text> of a prompt",
    "<|startoftext|> and <|endoftext|> spelled out",
    "x<start_of_text>y !!<end_of_text>",
    LONG,
    "a" * 300,
    " ".join(str(i) for i in range(120)),
    "word " * 80,
    "supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis " * 4,
]


def load_tokenizer_module():
    """open_clip's ``tokenizer`` module on its own (the package's ``__init__`` imports torchvision)."""
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("open_clip is not installed in this environment; see this script's docstring.")
    file = Path(next(iter(spec.submodule_search_locations))) / "tokenizer.py"
    module_spec = importlib.util.spec_from_file_location("open_clip_tokenizer", file)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module, file.parent


def traced_bpe(word: tuple[str, ...],
               ranks: dict[tuple[str, str], int]) -> tuple[list[str], list[tuple[str, str]]]:
    """open_clip's BPE loop on ``word`` (symbols, the last one ending in ``</w>``), recording the merges
    applied."""
    applied = []
    while len(word) > 1:
        pairs = {(a, b) for a, b in zip(word, word[1:])}
        best = min(pairs, key=lambda pair: ranks.get(pair, float("inf")))
        if best not in ranks:
            break
        applied.append(best)
        merged, i = [], 0
        while i < len(word):
            if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                merged.append(word[i] + word[i + 1])
                i += 2
            else:
                merged.append(word[i])
                i += 1
        word = tuple(merged)
    return list(word), applied


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    oc, package = load_tokenizer_module()
    tok = oc._tokenizer
    ids = oc.tokenize(CORPUS, context_length=77).tolist()
    specials = {"<start_of_text>": "<|startoftext|>", "<end_of_text>": "<|endoftext|>"}

    # the byte tokens, with and without </w>
    vocab = {token: tok.encoder[token] for token in list(tok.encoder)[:512]}
    vocab.update({hf: tok.encoder[name] for name, hf in specials.items()})
    merges: dict[tuple[str, str], int] = {}
    for text in CORPUS:
        cleaned = oc.whitespace_clean(oc.basic_clean(text)).lower()
        for piece in oc.re.findall(tok.pat, cleaned):
            if piece in specials:
                continue
            symbols = "".join(tok.byte_encoder[b] for b in piece.encode("utf-8"))
            word = (*symbols[:-1], symbols[-1] + "</w>")
            pieces, applied = traced_bpe(word, tok.bpe_ranks)
            assert " ".join(pieces) == tok.bpe(symbols), f"BPE trace differs from open_clip's on {piece!r}"
            for pair in applied:
                merges[pair] = tok.bpe_ranks[pair]
                vocab["".join(pair)] = tok.encoder["".join(pair)]
            for p in pieces:
                vocab[p] = tok.encoder[p]
    ordered = sorted(merges, key=merges.get)
    subset = {pair: rank for rank, pair in enumerate(ordered)}
    for text in CORPUS:  # the merges kept tokenize the corpus as the whole table does
        for piece in oc.re.findall(tok.pat, oc.whitespace_clean(oc.basic_clean(text)).lower()):
            if piece not in specials:
                symbols = "".join(tok.byte_encoder[b] for b in piece.encode("utf-8"))
                word = (*symbols[:-1], symbols[-1] + "</w>")
                assert " ".join(traced_bpe(word, subset)[0]) == tok.bpe(symbols), piece

    vocab_file = package / "bpe_simple_vocab_16e6.txt.gz"
    fixture = {
        "provenance": {
            "made_by": "plugins/dynamicrafter/scripts/make_tokenizer_fixture.py",
            "tokenizer": "open_clip.tokenizer.tokenize(texts, context_length=77)",
            "open_clip_torch": importlib.metadata.version("open_clip_torch"),
            "ftfy": importlib.metadata.version("ftfy"),
            "regex": importlib.metadata.version("regex"),
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "vocabulary": f"{vocab_file.name} (bundled with open_clip), sha256 "
                          f"{hashlib.sha256(vocab_file.read_bytes()).hexdigest()}",
        },
        "context_length": 77,
        "corpus": CORPUS,
        "ids": [[i for i in row if i] for row in ids],  # zeros after the end token are left out
        "vocab": dict(sorted(vocab.items(), key=lambda kv: kv[1])),
        "merges": [f"{a} {b}" for a, b in ordered],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(fixture, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB): {len(CORPUS)} prompts, {len(vocab)} tokens, "
          f"{len(ordered)} merges")


if __name__ == "__main__":
    main()
