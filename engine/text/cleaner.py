"""`clean_text`: one language's text -> (phones, word2ph, norm_text), dispatching to the per-language frontends
exactly as the official `GPT_SoVITS/text/cleaner.py` `clean_text` does.

Each language module `engine.text.<name>` provides ``normalize(text) -> str`` and
``g2p(norm_text) -> (phones, word2ph | None)``; Mandarin is `engine.text.chinese` (its g2p also takes the version).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from engine.data import load_json
from engine.errors import TextError, UnsupportedLanguageError
from engine.text.symbols import UNKNOWN, symbol_to_id, table_name

if TYPE_CHECKING:
    from engine.text.chinese import ChineseG2P

# language code -> module under engine.text, per symbol table (official `language_module_map`)
LANGUAGE_MODULES = {
    "v1": {"zh": "chinese", "ja": "japanese", "en": "english"},
    "v2": {"zh": "chinese", "ja": "japanese", "en": "english", "ko": "korean", "yue": "cantonese"},
}



def _special_pauses() -> list[tuple[str, str, str]]:
    """(character, language, pause symbol): "￥" -> SP2 and "^" -> SP3 in Mandarin text."""
    return [tuple(x) for x in load_json("frontend_constants.json")["GPT_SoVITS/text/cleaner.py::special"]]


def language_module(name: str):
    """Import `engine.text.<name>` (a per-language frontend), with a clear error if it is not installed."""
    qualified = f"engine.text.{name}"
    try:
        return importlib.import_module(qualified)
    except ModuleNotFoundError as e:
        if e.name == qualified:
            raise UnsupportedLanguageError(f"the {name} text frontend ({qualified}) is not available") from e
        raise


def clean_text(
    text: str, language: str, version: str = "v2", zh_g2p: "ChineseG2P | None" = None
) -> tuple[list[str], list[int] | None, str]:
    """Text of one language -> (phones, word2ph, norm_text).

    A language the version has no frontend for (ko / yue under v1, or a segmenter label such as
    "punctuation") is read as the official code does: the English frontend on a single space, i.e. a pause.
    User-facing language codes are checked earlier, by `TextFrontend.check_language`.

    ``word2ph`` (phones per character of ``norm_text``) exists for zh and yue and is None otherwise. Phones
    missing from the version's table become "UNK". In Mandarin, "￥" and "^" mark pauses: the text is read
    with "," in their place and every "," phone becomes SP2 / SP3. ``zh_g2p`` overrides the default Mandarin
    converter (for example one with G2PW).
    """
    if not isinstance(text, str):
        raise TextError(f"text must be a str, not {type(text).__name__}")
    table = table_name(version)
    modules = LANGUAGE_MODULES[table]
    if language not in modules:
        language, text = "en", " "  # official: a language this version lacks is read as a pause
    ids = symbol_to_id(version)

    if language == "zh":
        from engine.text import chinese

        for mark, lang, pause in _special_pauses():
            if mark in text and lang == language:
                norm_text = chinese.normalize(text.replace(mark, ","))
                phones, word2ph = chinese.g2p(norm_text, version, zh_g2p)
                return [pause if p == "," else p for p in phones], word2ph, norm_text
        norm_text = chinese.normalize(text)
        phones, word2ph = chinese.g2p(norm_text, version, zh_g2p)
    else:
        module = language_module(modules[language])
        norm_text = module.normalize(text)
        phones, word2ph = module.g2p(norm_text)
        phones = list(phones)
        if language == "en":
            if len(phones) < 4:
                phones = [","] + phones  # official: very short English gets a leading pause
            word2ph = None
        elif language != "yue":
            word2ph = None

    if language in ("zh", "yue"):
        word2ph = list(word2ph)
        if len(phones) != sum(word2ph) or len(norm_text) != len(word2ph):
            raise TextError(
                f"internal g2p mismatch for {language} text {norm_text!r}: {len(phones)} phones, "
                f"word2ph sum {sum(word2ph)}, {len(word2ph)} entries for {len(norm_text)} characters"
            )
    return [p if p in ids else UNKNOWN for p in phones], word2ph, norm_text
