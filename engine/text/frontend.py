"""User text -> phones, phone ids, normalised text and BERT features: the official language routing of
`TextPreprocessor.get_phones_and_bert` and the sentence preparation of `TextPreprocessor.preprocess` (official
`GPT_SoVITS/TTS_infer_pack/TextPreprocessor.py`).

`TextFrontend` owns what this needs (the model version, the optional BERT feature extractor, the Mandarin
g2p state); it holds no per-request state, so one instance can serve every request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Iterable

from engine.data import load_json
from engine.errors import TextError, UnsupportedLanguageError
from engine.text.cleaner import clean_text
from engine.text.symbols import cleaned_text_to_sequence, table_name

if TYPE_CHECKING:
    import torch

    from engine.text.bert import BertFeatureExtractor
    from engine.text.chinese import ChineseG2P

_TTS = "GPT_SoVITS/TTS_infer_pack/TTS.py::TTS_Config."

_SPACES = re.compile(r" {2,}")  # compiled once here: re's own cache overflows during warm-up
MIN_PHONES = 6  # fewer phones than this: the whole text is re-read once with a leading "."


def languages(version: str = "v2") -> tuple[str, ...]:
    """The language codes a model version accepts (v1: no Korean / Cantonese)."""
    key = "v1_languages" if table_name(version) == "v1" else "v2_languages"
    return tuple(load_json("frontend_constants.json")[_TTS + key])


@dataclass(frozen=True)
class Segment:
    """One single-language piece of the text, as `clean_text` read it."""

    language: str  # zh, en, ja, ko or yue
    text: str  # the piece as segmented (before normalisation)
    phones: tuple[str, ...]
    phone_ids: tuple[int, ...]
    word2ph: tuple[int, ...] | None  # phones per character of norm_text (zh / yue only)
    norm_text: str


@dataclass(frozen=True)
class TextFeatures:
    """The frontend's result for one sentence: what the T2S and SoVITS models read."""

    phones: tuple[str, ...]
    phone_ids: tuple[int, ...]
    norm_text: str
    segments: tuple[Segment, ...]
    bert: "torch.Tensor | None" = field(default=None, compare=False)  # (hidden, n_phones) float32, or None

    @property
    def word2ph(self) -> tuple[int, ...] | None:
        """Phones per character of ``norm_text`` when every segment has word2ph (all zh / yue), else None."""
        if any(s.word2ph is None for s in self.segments):
            return None
        return tuple(n for s in self.segments for n in s.word2ph)


def _pair(item: Any) -> tuple[str, str]:
    # (lang, text) from a langsegment Segment (.lang / .text), an official-style {"lang", "text"} dict,
    # or a plain (lang, text) tuple
    if hasattr(item, "lang") and hasattr(item, "text"):
        return item.lang, item.text
    if isinstance(item, dict):
        return item["lang"], item["text"]
    return item[0], item[1]


def _get_texts(text: str, default_lang: str | None) -> list[tuple[str, str]]:
    try:
        from engine.text import langsegment
    except ModuleNotFoundError as e:
        if e.name != "engine.text.langsegment":
            raise
        raise UnsupportedLanguageError(
            "language segmentation (engine.text.langsegment) is not available; only 'en' can be read"
        ) from e
    return [_pair(x) for x in langsegment.get_texts(text, default_lang)]


def route(text: str, language: str) -> list[tuple[str, str]]:
    """(language, text) segments for a routing code, as the official `get_phones_and_bert` builds them."""
    if language == "en":
        return [("en", text)]
    if language in ("all_zh", "all_yue", "all_ja", "all_ko"):
        base = language[4:]
        segs = _get_texts(text, "zh" if base == "yue" else base)
        return [("yue" if base == "yue" and lang == "zh" else lang, t) for lang, t in segs]
    if language in ("auto", "auto_yue"):
        segs = _get_texts(text, None)
        return [("yue" if language == "auto_yue" and lang == "zh" else lang, t) for lang, t in segs]
    # "zh" / "ja" / "ko" / "yue": runs of English vs non-English; non-English runs take the user's language
    out: list[list[str]] = []
    for lang, t in _get_texts(text, None):
        is_en = lang == "en"
        if out and (out[-1][0] == "en") == is_en:
            out[-1][1] += t
        else:
            out.append(["en" if is_en else language, t])
    return [(lang, t) for lang, t in out]


class TextFrontend:
    """Turns user text into phones (+ BERT features) for one model version.

    Responsibilities: language routing, per-language cleaning, the short-text retry, sentence splitting. The BERT
    extractor is optional: without it `TextFeatures.bert` is None."""

    def __init__(
        self,
        version: str = "v2",
        bert: "BertFeatureExtractor | None" = None,
        zh_g2p: "ChineseG2P | None" = None,
    ):
        table_name(version)  # validates the version
        self.version = version
        self.bert = bert
        self.zh_g2p = zh_g2p

    def check_language(self, language: str) -> None:
        valid = languages(self.version)
        if language not in valid:
            raise UnsupportedLanguageError(
                f"language {language!r} is not supported by {self.version} models; use one of {', '.join(valid)}"
            )

    def clean(self, text: str, language: str) -> Segment:
        """One single-language piece (zh, en, ja, ko, yue) -> Segment."""
        phones, word2ph, norm_text = clean_text(text, language, self.version, zh_g2p=self.zh_g2p)
        return Segment(
            language=language,
            text=text,
            phones=tuple(phones),
            phone_ids=tuple(cleaned_text_to_sequence(phones, self.version)),
            word2ph=None if word2ph is None else tuple(word2ph),
            norm_text=norm_text,
        )

    def phones_and_bert(self, text: str, language: str, with_bert: bool = True) -> TextFeatures:
        """One sentence -> TextFeatures (the official `get_phones_and_bert`, including its retry with a leading
        "." when fewer than 6 phones come out)."""
        if not isinstance(text, str):
            raise TextError(f"text must be a str, not {type(text).__name__}")
        self.check_language(language)
        text = _SPACES.sub(" ", text)
        if not text.strip():
            raise TextError("the text is empty: enter something to read")
        features = self._read(text, language, with_bert)
        if len(features.phones) < MIN_PHONES:
            features = self._read("." + text, language, with_bert)
        return features

    def add_bert(self, features: TextFeatures) -> TextFeatures:
        """``features`` read without BERT (by a text worker process, engine.text.workers) with the BERT features
        computed here: the same as ``phones_and_bert`` with BERT."""
        if self.bert is None or features.bert is not None:
            return features
        return replace(features, bert=self._bert(features.segments))

    def _read(self, text: str, language: str, with_bert: bool) -> TextFeatures:
        segments = tuple(self.clean(t, lang) for lang, t in route(text, language))
        if not segments:
            raise TextError(f"nothing to read in {text[:50]!r}")
        bert = self._bert(segments) if with_bert and self.bert is not None else None
        return TextFeatures(
            phones=tuple(p for s in segments for p in s.phones),
            phone_ids=tuple(i for s in segments for i in s.phone_ids),
            norm_text="".join(s.norm_text for s in segments),
            segments=segments,
            bert=bert,
        )

    def _bert(self, segments: Iterable[Segment]) -> "torch.Tensor":
        import torch

        parts = [
            self.bert(s.norm_text, s.word2ph) if s.language == "zh" else self.bert.zeros(len(s.phones))
            for s in segments
        ]
        return torch.cat(parts, dim=1)  # (hidden, n_phones)

    def sentences(self, text: str, language: str, method: str = "cut1") -> list[str]:
        """Target text -> the sentences `phones_and_bert` is called on (TTS.run's non-streaming preprocessing)."""
        from engine.text.segment import preprocess

        self.check_language(language)
        return preprocess(text, language, method)


def get_phones_and_bert(
    text: str, language: str, version: str = "v2", bert: "BertFeatureExtractor | None" = None
) -> TextFeatures:
    """Convenience: `TextFrontend(version, bert).phones_and_bert(text, language)` with the default Mandarin g2p."""
    return TextFrontend(version, bert).phones_and_bert(text, language)
