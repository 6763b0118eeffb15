"""`sovits-studio g2p`: print the phones, phone ids, word2ph and normalised text the engine reads for a text.

Output: one JSON object (a list of them with --sentences). ``word2ph`` is the concatenation over segments when
every segment has one (Mandarin / Cantonese), else null; ``segments`` shows each single-language piece.
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", nargs="?", help="the text to read (default: read stdin)")
    parser.add_argument(
        "--lang", required=True,
        help="language code: all_zh, en, all_ja, all_ko, all_yue, zh, ja, ko, yue, auto, auto_yue",
    )
    parser.add_argument("--version", default="v2", help="model version (v1 uses the 322-symbol table; default v2)")
    parser.add_argument("--g2pw", metavar="DIR", help="G2PW model folder for Mandarin polyphones (default: pypinyin)")
    parser.add_argument("--bert", metavar="DIR", help="G2PW's tokenizer folder (chinese-roberta-wwm-ext-large)")
    parser.add_argument("--sentences", metavar="METHOD",
                        help="split the text first with cut0..cut5 and print one result per sentence")


def _result(features) -> dict:
    return {
        "phones": list(features.phones),
        "phone_ids": list(features.phone_ids),
        "word2ph": None if features.word2ph is None else list(features.word2ph),
        "norm_text": features.norm_text,
        "segments": [
            {"language": s.language, "text": s.text, "phones": list(s.phones),
             "word2ph": None if s.word2ph is None else list(s.word2ph), "norm_text": s.norm_text}
            for s in features.segments
        ],
    }


def run(args: argparse.Namespace) -> int:
    import logging

    import jieba  # noqa: F401  (jieba sets its logger to DEBUG when imported; quiet it afterwards)

    from engine.text.chinese import make_g2p
    from engine.text.frontend import TextFrontend

    logging.getLogger("jieba").setLevel(logging.ERROR)  # no dictionary-loading chatter on stderr
    text = args.text if args.text is not None else sys.stdin.read().rstrip("\n")
    zh_g2p = make_g2p(args.version, args.g2pw, args.bert, require_g2pw=True) if args.g2pw else None
    frontend = TextFrontend(args.version, zh_g2p=zh_g2p)
    if args.sentences:
        out = [_result(frontend.phones_and_bert(s, args.lang, with_bert=False))
               for s in frontend.sentences(text, args.lang, args.sentences)]
    else:
        out = _result(frontend.phones_and_bert(text, args.lang, with_bert=False))
    json.dump(out, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0
