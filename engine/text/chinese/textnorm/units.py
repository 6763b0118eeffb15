"""Temperatures and measurement units (official zh normaliser; units are replaced as plain substrings)."""

from __future__ import annotations

import re

from .numbers import read_number

RE_TEMPERATURE = re.compile(r"(-?)(\d+(\.\d+)?)(°C|℃|度|摄氏度)")

# Applied in this order with str.replace wherever the notation occurs, so a stray Latin "m" or "s" in a zh
# sentence becomes 米 / 秒: that is the official behaviour (e.g. "it is fun." -> 秒).
MEASURES = (
    ("cm2", "平方厘米"),
    ("cm²", "平方厘米"),
    ("cm3", "立方厘米"),
    ("cm³", "立方厘米"),
    ("cm", "厘米"),
    ("db", "分贝"),
    ("ds", "毫秒"),
    ("kg", "千克"),
    ("km", "千米"),
    ("m2", "平方米"),
    ("m²", "平方米"),
    ("m³", "立方米"),
    ("m3", "立方米"),
    ("ml", "毫升"),
    ("m", "米"),
    ("mm", "毫米"),
    ("s", "秒"),
)


def replace_temperature(m: re.Match) -> str:
    sign = "零下" if m.group(1) else ""
    # The official code compares group 3 (the decimal part) with "摄氏度", so the unit is always read 度.
    return f"{sign}{read_number(m.group(2))}度"


def replace_measure(sentence: str) -> str:
    for notation, reading in MEASURES:
        sentence = sentence.replace(notation, reading)
    return sentence
