"""Dates and clock times read in Mandarin (official zh normaliser patterns, quirks included)."""

from __future__ import annotations

import re

from .numbers import read_cardinal, read_digits, read_number

RE_TIME = re.compile(r"([0-1]?[0-9]|2[0-3]):([0-5][0-9])(:([0-5][0-9]))?")
RE_TIME_RANGE = re.compile(
    r"([0-1]?[0-9]|2[0-3]):([0-5][0-9])(:([0-5][0-9]))?"
    r"(~|-)"
    r"([0-1]?[0-9]|2[0-3]):([0-5][0-9])(:([0-5][0-9]))?"
)
RE_DATE = re.compile(r"(\d{4}|\d{2})年((0?[1-9]|1[0-2])月)?(((0?[1-9])|((1|2)[0-9])|30|31)([日号]))?")
RE_DATE2 = re.compile(r"(\d{4})([- /.])(0[1-9]|1[012])\2(0[1-9]|[12][0-9]|3[01])")


def _clock_number(digits: str) -> str:
    # minutes and seconds keep a leading zero: "05" -> 零五
    reading = read_number(digits.lstrip("0"))
    return "零" + reading if digits.startswith("0") else reading


def _clock(hour: str, minute: str, second: str | None, half_from: str) -> str:
    out = f"{read_number(hour)}点"
    if minute.lstrip("0"):
        # The official range code tests the FIRST minute for "半" in both halves; `half_from` carries that.
        out += "半" if int(half_from) == 30 else f"{_clock_number(minute)}分"
    if second and second.lstrip("0"):
        out += f"{_clock_number(second)}秒"
    return out


def replace_time(m: re.Match) -> str:
    out = _clock(m.group(1), m.group(2), m.group(4), half_from=m.group(2))
    if m.re.groups > 5:  # a range "8:00-9:30"
        out += "至" + _clock(m.group(6), m.group(7), m.group(9), half_from=m.group(2))
    return out


def replace_date(m: re.Match) -> str:
    year, month, day = m.group(1), m.group(3), m.group(5)
    out = ""
    if year:
        out += f"{read_digits(year)}年"
    if month:
        out += f"{read_cardinal(month)}月"
    if day:
        out += f"{read_cardinal(day)}{m.group(9)}"
    return out


def replace_date2(m: re.Match) -> str:
    return f"{read_digits(m.group(1))}年{read_cardinal(m.group(3))}月{read_cardinal(m.group(4))}日"
