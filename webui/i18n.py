"""The page's languages: English, Chinese, Japanese and Korean, one JSON file each in ``webui/locale``.

Fixed texts (labels, help texts, headings) travel as Gradio translation keys (``gr.I18n``) and are
translated in the browser, which picks the language of the browser; the page's language switch
changes it. Texts made by a handler (messages, the reference clip's length, errors) are written on
the server with :func:`text`, in the language the switch shows (an input of each handler).
No gradio import here: ``webui.app`` wraps :func:`translations` in ``gr.I18n``.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

LOCALE_DIR = Path(__file__).resolve().parent / "locale"
LOCALES = ("zh-CN", "en", "ja", "ko")  # the switch's order; the official UI is zh_CN first
DEFAULT = "en"
NAMES = {"zh-CN": "中文", "en": "English", "ja": "日本語", "ko": "한국어"}

# Browser side. Pick the first of the browser's languages the page has (any zh-* reads the Chinese page).
DETECT_JS = """() => {
  const have = %s;
  for (const tag of (navigator.languages || [navigator.language || ''])) {
    if (have.includes(tag)) return tag;
    const base = tag.split('-')[0];
    if (base === 'zh') return 'zh-CN';
    if (have.includes(base)) return base;
  }
  return '%s';
}""" % (json.dumps(list(LOCALES)), DEFAULT)
# Switch Gradio's own locale store: its module is the already-loaded core-*.js asset (same URL, same instance).
SWITCH_JS = """(lang) => {
  const core = performance.getEntriesByType('resource').map(e => e.name)
    .find(n => /\\/assets\\/core-[^/?]*\\.js$/.test(n));
  if (core && lang) import(core).then(m => m.changeLocale && m.changeLocale(lang)).catch(() => {});
  document.documentElement.setAttribute('lang', lang || '%s');
}""" % DEFAULT


@lru_cache(maxsize=1)
def translations() -> dict[str, dict[str, str]]:
    """{locale: {key: text}}, read once from the package's JSON files."""
    return {loc: json.loads((LOCALE_DIR / f"{loc}.json").read_text(encoding="utf-8")) for loc in LOCALES}


def normalize(locale: str | None) -> str:
    """Any language tag -> one of :data:`LOCALES` (zh-TW, zh-HK... read the Chinese page)."""
    tag = (locale or "").strip()
    if tag in LOCALES:
        return tag
    base = tag.split("-")[0].lower()
    if base == "zh":
        return "zh-CN"
    return base if base in LOCALES else DEFAULT


def text(key: str, locale: str | None = None, **values) -> str:
    """The text of ``key`` in ``locale`` (English when that locale lacks it), with ``values`` filled in."""
    table = translations()
    template = table[normalize(locale)].get(key) or table[DEFAULT][key]
    return template.format(**values) if values else template
