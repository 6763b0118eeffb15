"""Optional G2PW polyphone disambiguation (the official default Mandarin path when its model is installed).

The user supplies the `G2PWModel` folder of the official install (G2PWModel_1.1: ``g2pW.onnx``, ``config.py``,
``POLYPHONIC_CHARS.txt``, ``MONOPHONIC_CHARS.txt``, ``bopomofo_to_pinyin_wo_tune_dict.json``,
``char_bopomofo_dict.json``) and the chinese-roberta-wwm-ext-large folder (its tokenizer). It needs the optional
packages ``onnxruntime`` and ``opencc`` (simplified -> Taiwan traditional, as the official converter does).

Per sentence: every character in the model's polyphonic set (minus a few) is predicted by the ONNX model on a
context window of 16 characters either side of the polyphonic span; monophonic characters come from the model's
table; everything else from pypinyin on the simplified sentence. Then `correct` applies the official
word/character correction dictionary, read from the user's install (``polyphonic.rep`` then
``polyphonic-fix.rep``; they sit in ``GPT_SoVITS/text/g2pw/``, beside the ``G2PWModel`` folder).
"""

from __future__ import annotations

import ast
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from pypinyin import Style, pinyin

from engine.data import load_json
from engine.errors import CheckpointError, TextError

from .textnorm import to_simplified

log = logging.getLogger(__name__)
_ONNX = "GPT_SoVITS/text/g2pw/onnx_api.py::_G2PWBaseOnnxConverter.__init__.self."
MAX_TOKENS = 512
REQUIRED_FILES = (
    "POLYPHONIC_CHARS.txt", "MONOPHONIC_CHARS.txt", "bopomofo_to_pinyin_wo_tune_dict.json", "char_bopomofo_dict.json",
)

# (batch inputs by name) -> class probabilities (batch, n_labels)
Predictor = Callable[[Mapping[str, np.ndarray]], np.ndarray]


CORRECTION_FILES = ("polyphonic.rep", "polyphonic-fix.rep")  # later files win


def correction_files(model_dir: str | Path) -> list[Path]:
    """The official correction files for a G2PWModel folder: in it, or in the sibling ``g2pw`` folder."""
    model_dir = Path(model_dir)
    for folder in (model_dir, model_dir.parent / "g2pw"):
        found = [folder / n for n in CORRECTION_FILES if (folder / n).is_file()]
        if found:
            return found
    return []


def read_corrections(paths: Sequence[str | Path]) -> Mapping[str, tuple[str, ...]]:
    """Parse official ``.rep`` lines ``word: ['pin1', 'yin1']`` (literals only; later files win)."""
    table: dict[str, tuple[str, ...]] = {}
    for path in paths:
        for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            word, sep, value = line.partition(":")
            try:
                readings = ast.literal_eval(value.strip()) if sep else None
            except (ValueError, SyntaxError):
                readings = None
            if not isinstance(readings, list) or not all(isinstance(r, str) for r in readings):
                raise CheckpointError(f"{path}:{n}: expected `word: ['pin1', ...]`, got {line!r}")
            table[word.strip()] = tuple(readings)
    return MappingProxyType(table)


def correct_pronunciation(word: str, pinyins: Sequence[str], table: Mapping[str, tuple[str, ...]]) -> list[str]:
    """Whole-word entry if there is one, else per-character entries (their first reading)."""
    if word in table:
        return list(table[word])
    out = list(pinyins)
    for i, ch in enumerate(word):
        if ch in table and i < len(out):
            out[i] = table[ch][0]
    return out


def _literal_config(path: Path) -> dict[str, Any]:
    # the model's config.py, read as literal assignments (never executed)
    config = {"use_mask": True, "use_char_phoneme": False}
    if path.is_file():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                try:
                    config[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    return config


@dataclass(frozen=True)
class G2PWTables:
    """The model folder's character tables and label set."""

    labels: tuple[str, ...]  # model output classes (bopomofo, or "char bopomofo" when use_char_phoneme)
    char_ids: Mapping[str, int]  # polyphonic character -> char id input
    phoneme_masks: Mapping[str, tuple[int, ...]] | None  # char -> allowed labels (use_mask)
    polyphonic: frozenset[str]  # characters sent to the model
    monophonic: Mapping[str, str]  # character -> bopomofo
    bopomofo_to_pinyin: Mapping[str, str]  # toneless bopomofo -> toneless pinyin
    use_char_phoneme: bool

    @classmethod
    def from_folder(cls, folder: Path) -> "G2PWTables":
        config = _literal_config(folder / "config.py")
        rows = [l.split("\t") for l in (folder / "POLYPHONIC_CHARS.txt").read_text(encoding="utf-8").strip().split("\n")]
        if config.get("use_char_phoneme"):
            labels = sorted({f"{c} {p}" for c, p in rows})
            key = lambda c, p: f"{c} {p}"  # noqa: E731
        else:
            labels = sorted({p for _, p in rows})
            key = lambda c, p: p  # noqa: E731
        index = {lab: i for i, lab in enumerate(labels)}
        char2labels: dict[str, list[int]] = {}
        for c, p in rows:
            char2labels.setdefault(c, []).append(index[key(c, p)])
        chars = sorted(char2labels)
        masks = None
        if config.get("use_mask", True):
            masks = {c: tuple(1 if i in set(ids) else 0 for i in range(len(labels))) for c, ids in char2labels.items()}
        c = load_json("frontend_constants.json")
        mono_rows = [l.split("\t") for l in (folder / "MONOPHONIC_CHARS.txt").read_text(encoding="utf-8").strip().split("\n")]
        monophonic = {ch: ph for ch, ph in mono_rows}
        for ch in c[_ONNX + "non_monophonic"]:
            monophonic.pop(ch, None)
        return cls(
            labels=tuple(labels),
            char_ids=MappingProxyType({ch: i for i, ch in enumerate(chars)}),
            phoneme_masks=None if masks is None else MappingProxyType(masks),
            polyphonic=frozenset(chars) - frozenset(c[_ONNX + "non_polyphonic"]),
            monophonic=MappingProxyType(monophonic),
            bopomofo_to_pinyin=MappingProxyType(
                json.loads((folder / "bopomofo_to_pinyin_wo_tune_dict.json").read_text(encoding="utf-8"))),
            use_char_phoneme=bool(config.get("use_char_phoneme")),
        )


def _words(text: str) -> tuple[list[str], list[int | None], list[tuple[int, int]]]:
    # spaces map to no word, runs of [a-zA-Z0-9] are one word, any other character is its own word
    words: list[str] = []
    text2word: list[int | None] = []
    word2text: list[tuple[int, int]] = []
    pos = 0
    for m in re.finditer(r" +|[a-zA-Z0-9]+|.", text, flags=re.S):
        piece = m.group(0)
        if piece[0] == " ":
            text2word += [None] * len(piece)
        else:
            word2text.append((pos, pos + len(piece)))
            text2word += [len(words)] * len(piece)
            words.append(piece)
        pos += len(piece)
    return words, text2word, word2text


def tokenize_and_map(tokenizer, text: str) -> tuple[list[str], list[int | None], list[tuple[int, int]]]:
    """BERT word pieces of ``text`` with character -> token and token -> character span maps."""
    words, text2token, word2text = _words(text)
    tokens: list[str] = []
    token2text: list[tuple[int, int]] = []
    for word, (start, end) in zip(words, word2text):
        pieces = tokenizer.tokenize(word)
        if not pieces or pieces == ["[UNK]"]:
            token2text.append((start, end))
            tokens.append("[UNK]")
            continue
        cur = start
        for piece in pieces:
            n = len(re.sub(r"^##", "", piece))
            token2text.append((cur, cur + n))
            cur += n
            tokens.append(piece)
    for i, (start, end) in enumerate(token2text):
        for p in range(start, end):
            text2token[p] = i
    return tokens, text2token, token2text


def _truncate(text: str, query: int, tokens, text2token, token2text, max_len: int = MAX_TOKENS):
    # a window of max_len - 2 tokens centred on the query character
    keep = max_len - 2
    if len(tokens) <= keep:
        return text, query, tokens, text2token
    start_tok = text2token[query] - keep // 2
    end_tok = start_tok + keep
    if start_tok < 0:
        start_tok, end_tok = 0, keep
    elif end_tok > len(tokens):
        start_tok, end_tok = len(tokens) - keep, len(tokens)
    start, end = token2text[start_tok][0], token2text[end_tok - 1][1]
    return (
        text[start:end],
        query - start,
        tokens[start_tok:end_tok],
        [i - start_tok if i is not None else None for i in text2token[start:end]],
    )


class G2PWConverter:
    """Polyphone-aware pinyin per character. ``predictor`` runs the model; ``to_traditional`` is OpenCC s2tw."""

    def __init__(
        self,
        tables: G2PWTables,
        tokenizer,
        predictor: Predictor,
        to_traditional: Callable[[str], str] | None,
        context_chars: int = 16,
        sentence_dedup: bool = True,
        corrections: Mapping[str, tuple[str, ...]] = MappingProxyType({}),
    ):
        self.corrections = corrections
        self.tables = tables
        self.tokenizer = tokenizer
        self.predictor = predictor
        self.to_traditional = to_traditional
        self.context_chars = max(0, int(context_chars))
        self.sentence_dedup = sentence_dedup

    @classmethod
    def from_folder(cls, model_dir: str | Path, tokenizer_dir: str | Path | None, **options) -> "G2PWConverter":
        """Load the official G2PWModel folder; ``tokenizer_dir`` is the chinese-roberta-wwm-ext-large folder."""
        model_dir = Path(model_dir)
        missing = [f for f in REQUIRED_FILES if not (model_dir / f).is_file()]
        onnx_path = next((p for p in (model_dir / "g2pW.onnx", model_dir / "g2pw.onnx") if p.is_file()), None)
        if not model_dir.is_dir() or missing or onnx_path is None:
            raise CheckpointError(
                f"{model_dir} is not a G2PW model folder (missing {', '.join(missing + ([] if onnx_path else ['g2pW.onnx']))}); "
                "unpack G2PWModel_1.1.zip of the official install (GPT_SoVITS/text/G2PWModel) and pass that folder"
            )
        if tokenizer_dir is None or not Path(tokenizer_dir).is_dir():
            raise CheckpointError(
                "G2PW needs the chinese-roberta-wwm-ext-large folder for its tokenizer; pass it as the BERT folder"
            )
        try:
            import onnxruntime
        except ImportError as e:
            raise CheckpointError("G2PW needs onnxruntime: pip install onnxruntime (or onnxruntime-gpu)") from e
        try:
            from opencc import OpenCC
        except ImportError as e:
            raise CheckpointError("G2PW needs OpenCC for s2tw conversion: pip install opencc") from e
        from transformers import AutoTokenizer

        opts = onnxruntime.SessionOptions()
        opts.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        opts.intra_op_num_threads = 2
        providers = ["CPUExecutionProvider"]
        if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        session = onnxruntime.InferenceSession(str(onnx_path), sess_options=opts, providers=providers)

        def predictor(inputs: Mapping[str, np.ndarray]) -> np.ndarray:
            return session.run([], dict(inputs))[0]

        cc = OpenCC("s2tw")
        files = correction_files(model_dir)
        if not files:
            log.warning("no polyphonic.rep beside %s: G2PW runs without the official correction dictionary "
                        "(copy GPT_SoVITS/text/g2pw/polyphonic*.rep of the official install next to it)", model_dir)
        options.setdefault("corrections", read_corrections(files))
        return cls(
            G2PWTables.from_folder(model_dir),
            AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True),
            predictor,
            cc.convert,
            **options,
        )

    def correct(self, word: str, pinyins: Sequence[str]) -> list[str]:
        return correct_pronunciation(word, pinyins, self.corrections)

    def _bopomofo_to_pinyin(self, bopomofo: str) -> str | None:
        tone = bopomofo[-1]
        if tone not in "12345":
            raise TextError(f"G2PW label {bopomofo!r} has no tone digit")
        base = self.tables.bopomofo_to_pinyin.get(bopomofo[:-1])
        return base + tone if base else None

    def predict(self, sentences: Sequence[str]) -> list[list[str | None]]:
        """Per sentence, one TONE3 pinyin (or the character itself for punctuation) per character."""
        if self.to_traditional is not None:
            converted = [self.to_traditional(s) for s in sentences]
            if any(len(a) != len(b) for a, b in zip(converted, sentences)):
                raise TextError("simplified -> traditional conversion changed the text length")
            sentences = converted
        queries: list[tuple[str, int, int, int]] = []  # (context text, query index in it, sentence, char index)
        results: list[list[str | None]] = []
        for sent_id, sent in enumerate(sentences):
            fallback = [p[0] for p in pinyin(to_simplified(sent), neutral_tone_with_five=True, style=Style.TONE3)]
            if len(fallback) != len(sent):
                raise TextError(f"cannot align pinyin with the characters of {sent!r}")
            row: list[str | None] = []
            poly = []
            for i, ch in enumerate(sent):
                if ch in self.tables.polyphonic:
                    poly.append(i)
                    row.append(None)
                elif ch in self.tables.monophonic:
                    row.append(self._bopomofo_to_pinyin(self.tables.monophonic[ch]))
                else:
                    row.append(fallback[i])
            if poly:
                if self.context_chars > 0:
                    left = max(0, poly[0] - self.context_chars)
                    right = min(len(sent), poly[-1] + self.context_chars + 1)
                else:
                    left, right = 0, len(sent)
                queries += [(sent[left:right], i - left, sent_id, i) for i in poly]
            results.append(row)
        if not queries:
            return results
        inputs = self._model_inputs([(t, q) for t, q, _, _ in queries])
        preds = self._run(inputs, [t for t, _, _, _ in queries])
        for (_, _, sent_id, i), label in zip(queries, preds):
            if self.tables.use_char_phoneme:
                label = label.split(" ")[1]
            results[sent_id][i] = self._bopomofo_to_pinyin(label)
        return results

    def _model_inputs(self, queries: Sequence[tuple[str, int]]) -> dict[str, np.ndarray]:
        t = self.tables
        cache: dict[str, tuple] = {}
        rows = {k: [] for k in ("input_ids", "token_type_ids", "attention_mask", "phoneme_mask", "char_ids",
                                "position_ids")}
        for text, query in queries:
            text = text.lower()
            if text not in cache:
                cache[text] = tokenize_and_map(self.tokenizer, text)
            tokens, text2token, token2text = cache[text]
            text_q, query_q, tokens_q, text2token_q = _truncate(text, query, tokens, text2token, token2text)
            ids = self.tokenizer.convert_tokens_to_ids(["[CLS]"] + tokens_q + ["[SEP]"])
            ch = text_q[query_q]
            rows["input_ids"].append(list(ids))
            rows["token_type_ids"].append([0] * len(ids))
            rows["attention_mask"].append([1] * len(ids))
            rows["phoneme_mask"].append(list(t.phoneme_masks[ch]) if t.phoneme_masks is not None else [1] * len(t.labels))
            rows["char_ids"].append(t.char_ids[ch])
            rows["position_ids"].append(text2token_q[query_q] + 1)  # +1 for [CLS]
        width = max(len(r) for r in rows["input_ids"])
        pad = lambda seqs: np.array([s + [0] * (width - len(s)) for s in seqs], dtype=np.int64)  # noqa: E731
        return {
            "input_ids": pad(rows["input_ids"]),  # (batch, width)
            "token_type_ids": pad(rows["token_type_ids"]),
            "attention_mask": pad(rows["attention_mask"]),
            "phoneme_mask": np.array(rows["phoneme_mask"], dtype=np.float32),  # (batch, n_labels)
            "char_ids": np.array(rows["char_ids"], dtype=np.int64),  # (batch,)
            "position_ids": np.array(rows["position_ids"], dtype=np.int64),  # (batch,)
        }

    def _predict_labels(self, inputs: Mapping[str, np.ndarray]) -> list[str]:
        probs = np.asarray(self.predictor(inputs))  # (batch, n_labels)
        return [self.tables.labels[i] for i in np.argmax(probs, axis=1).tolist()]

    def _run(self, inputs: dict[str, np.ndarray], texts: Sequence[str]) -> list[str]:
        # identical context texts share one BERT pass (official g2pw_sentence_dedup): the text inputs are sent
        # once (batch 1) with one row per query for the mask / char / position inputs
        groups: dict[str, list[int]] = {}
        for i, text in enumerate(texts):
            groups.setdefault(text, []).append(i)
        if not self.sentence_dedup or len(texts) <= 1 or all(len(g) == 1 for g in groups.values()):
            return self._predict_labels(inputs)
        labels: list[str] = [""] * len(texts)
        for idx in groups.values():
            group = {k: v[idx] for k, v in inputs.items()}
            if len(idx) > 1:
                for k in ("input_ids", "token_type_ids", "attention_mask"):
                    group[k] = group[k][:1]
            for i, lab in zip(idx, self._predict_labels(group)):
                labels[i] = lab
        return labels
