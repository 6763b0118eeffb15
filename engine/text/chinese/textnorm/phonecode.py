"""Mobile, landline and 400 service numbers read digit by digit (1 -> 幺), official zh normaliser patterns."""

from __future__ import annotations

import re

from .numbers import read_digits

RE_MOBILE_PHONE = re.compile(r"(?<!\d)((\+?86 ?)?1([38]\d|5[0-35-9]|7[678]|9[89])\d{8})(?!\d)")
RE_TELEPHONE = re.compile(r"(?<!\d)((0(10|2[1-3]|[3-9]\d{2})-?)?[1-9]\d{6,7})(?!\d)")
RE_NATIONAL_UNIFORM_NUMBER = re.compile(r"(400)(-)?\d{3}(-)?\d{4}")


def replace_mobile(m: re.Match) -> str:
    # "+86 138..." -> parts split on whitespace, joined with a comma pause
    return "，".join(read_digits(part, alt_one=True) for part in m.group(0).strip("+").split())


def replace_phone(m: re.Match) -> str:
    return "，".join(read_digits(part, alt_one=True) for part in m.group(0).split("-"))
