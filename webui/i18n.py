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
# The switch. Our texts are Gradio translation keys: changing Gradio's locale store re-translates them (its
# module is the already-loaded core-*.js asset: same URL, same instance). Gradio's own texts ("Drop Audio Here",
# "Record", the upload prompts, button titles) were written once, when each widget was made, in the language
# the page opened with, and the store does not reach them: they are re-worded from Gradio's own dictionaries
# (every language shown so far -> the chosen one), now and whenever Gradio writes them again.
SWITCH_JS = """(lang) => {
  lang = lang || '%s';
  document.documentElement.setAttribute('lang', lang);
  const core = performance.getEntriesByType('resource').map(e => e.name)
    .find(n => /\\/assets\\/core-[^/?]*\\.js$/.test(n));
  if (!core) return;
  import(core).then(async (m) => {
    if (m.changeLocale) m.changeLocale(lang);
    if (!m.process_langs) return;
    const langs = m.process_langs();
    const pick = (tag) => tag in langs ? tag : (tag.split('-')[0] in langs ? tag.split('-')[0] : 'en');
    const state = window.__sovitsGradioTexts = window.__sovitsGradioTexts ||
      {shown: new Set(['en', pick(navigator.language || (navigator.languages || ['en'])[0] || 'en')]), map: new Map()};
    const flat = async (code) => {
      const entry = langs[code];
      const data = !entry ? {} : entry.type === 'static' ? entry.data : (await entry.data()).default;
      const out = {}, first = ['common', 'upload_text', 'audio', 'file'];  // a text in several sections: these win
      const rank = ([section]) => (first.indexOf(section) + first.length + 1) %% (first.length + 1);
      for (const [section, texts] of Object.entries(data || {}).sort((x, y) => rank(x) - rank(y)))
        if (texts && typeof texts === 'object')
          for (const [key, text] of Object.entries(texts)) if (typeof text === 'string') out[section + '.' + key] = text;
      return out;
    };
    const target = pick(lang), to = await flat(target), wanted = new Set(Object.values(to)), map = new Map();
    for (const code of state.shown) {
      if (code === target) continue;
      for (const [key, text] of Object.entries(await flat(code)))
        if (to[key] && to[key] !== text && !text.includes('{') && !wanted.has(text) && !map.has(text)) map.set(text, to[key]);
    }
    state.shown.add(target);
    state.map = map;
    const word = (text) => {
      const bare = text.trim();
      if (!bare) return null;
      const or = /^- (.+) -$/.exec(bare);  // the upload prompt's "- or -"
      const now = state.map;  // the latest switch's (the observer outlives the switch that made it)
      const done = now.get(bare) || (or && now.has(or[1]) ? '- ' + now.get(or[1]) + ' -' : null);
      return done ? text.replace(bare, done) : null;
    };
    const own = (el) => !el || el.closest('textarea, input, .prose, [contenteditable], table, #ui-language');
    const fixText = (node) => {
      if (own(node.parentElement)) return;
      const text = word(node.nodeValue || '');
      if (text !== null && text !== node.nodeValue) node.nodeValue = text;
    };
    const fixAttrs = (el) => {
      for (const name of ['aria-label', 'title', 'placeholder']) {
        const value = el.getAttribute && el.getAttribute(name);
        const text = value && !own(el.parentElement) ? word(value) : null;
        if (text !== null && text !== value) el.setAttribute(name, text);
      }
    };
    const walk = (root) => {
      if (root.nodeType === Node.TEXT_NODE) return fixText(root);
      if (root.nodeType !== Node.ELEMENT_NODE) return;
      fixAttrs(root);
      const it = document.createTreeWalker(root, NodeFilter.SHOW_TEXT | NodeFilter.SHOW_ELEMENT);
      for (let n = it.nextNode(); n; n = it.nextNode()) n.nodeType === Node.TEXT_NODE ? fixText(n) : fixAttrs(n);
    };
    walk(document.body);
    if (!state.observer) {
      state.observer = new MutationObserver((changes) => {
        for (const c of changes) {
          if (c.type === 'characterData') fixText(c.target);
          else if (c.type === 'attributes') fixAttrs(c.target);
          else c.addedNodes.forEach(walk);
        }
      });
      state.observer.observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true,
                                             attributeFilter: ['aria-label', 'title', 'placeholder']});
    }
  }).catch((e) => console.warn('language switch:', e));
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
