"""Reading numbers aloud in Mandarin: cardinals, digit strings, decimals, fractions, percentages, ranges.

The patterns and readings follow the official zh normaliser (a PaddleSpeech port) exactly, including its quirks,
because the models were trained on its output.
"""

from __future__ import annotations

import re
import unicodedata

_DIGIT_READINGS = "零一二三四五六七八九"

# place value (number of trailing digits) -> unit character; searched from the largest
_UNITS = ((8, "亿"), (4, "万"), (3, "千"), (2, "百"), (1, "十"))


def digit_reading(ch: str) -> str:
    """One decimal digit -> its character. Non-ASCII decimal digits (which Python's \\d also matches) are read by
    value; the official code raises KeyError on them."""
    value = unicodedata.decimal(ch, None)
    if value is None:
        raise ValueError(f"not a decimal digit: {ch!r}")
    return _DIGIT_READINGS[value]


def read_digits(digits: str, alt_one: bool = False) -> str:
    """Digit by digit ("110" -> 一一零); ``alt_one`` reads 1 as 幺 (phone numbers)."""
    out = "".join(digit_reading(d) for d in digits)
    return out.replace("一", "幺") if alt_one else out


def _place_value_symbols(digits: str, use_zero: bool = True) -> list[str]:
    stripped = digits.lstrip("0")
    if not stripped:
        return []
    if len(stripped) == 1:
        if use_zero and len(stripped) < len(digits):
            return [_DIGIT_READINGS[0], digit_reading(stripped)]
        return [digit_reading(stripped)]
    power, unit = next((p, u) for p, u in _UNITS if p < len(stripped))
    head, tail = digits[:-power], digits[-power:]
    return _place_value_symbols(head) + [unit] + _place_value_symbols(tail)


def read_cardinal(digits: str) -> str:
    """An integer digit string read as a quantity ("1203" -> 一千二百零三, "12" -> 十二)."""
    if not digits:
        return ""
    digits = digits.lstrip("0")
    if not digits:
        return _DIGIT_READINGS[0]
    symbols = _place_value_symbols(digits)
    if len(symbols) >= 2 and symbols[0] == "一" and symbols[1] == "十":
        symbols = symbols[1:]  # 一十二 -> 十二
    return "".join(symbols)


def read_number(value: str) -> str:
    """An unsigned decimal number string ("95.5" -> 九十五点五, ".22" -> 零点二二, "3.20" -> 三点二零)."""
    parts = value.split(".")
    if len(parts) > 2:
        raise ValueError(f"number {value!r} has more than one decimal point")
    integer, decimal = (parts[0], "") if len(parts) == 1 else parts
    result = read_cardinal(integer)
    # trailing zeros collapse to one zero: "3.200" -> 三点二零, "3.5" stays
    decimal = decimal.rstrip("0") + "0" if decimal.endswith("0") else decimal
    if decimal:
        result = (result or "零") + "点" + read_digits(decimal)
    return result


# --- patterns (identical to the official ones) and their readings -----------------------------------------

# measure words after which an integer is read as a quantity (2 -> 两)
QUANTIFIERS = (
    "(处|台|架|枚|趟|幅|平|方|堵|间|床|株|批|项|例|列|篇|栋|注|亩|封|艘|把|目|套|段|人|所|朵|匹|张|座|回|场|尾|条|个|首|阙|阵|网|"
    "炮|顶|丘|棵|只|支|袭|辆|挑|担|颗|壳|窠|曲|墙|群|腔|砣|座|客|贯|扎|捆|刀|令|打|手|罗|坡|山|岭|江|溪|钟|队|单|双|对|出|口|头|"
    "脚|板|跳|枝|件|贴|针|线|管|名|位|身|堂|课|本|页|家|户|层|丝|毫|厘|分|钱|两|斤|担|铢|石|钧|锱|忽|(千|毫|微)克|毫|厘|(公)分|分|"
    "寸|尺|丈|里|寻|常|铺|程|(千|分|厘|毫|微)米|米|撮|勺|合|升|斗|石|盘|碗|碟|叠|桶|笼|盆|盒|杯|钟|斛|锅|簋|篮|盘|桶|罐|瓶|壶|卮|"
    "盏|箩|箱|煲|啖|袋|钵|年|月|日|季|刻|时|周|天|秒|分|小时|旬|纪|岁|世|更|夜|春|夏|秋|冬|代|伏|辈|丸|泡|粒|颗|幢|堆|条|根|支|"
    "道|面|片|张|颗|块|元|(亿|千万|百万|万|千|百)|(亿|千万|百万|万|千|百|美|)元|(亿|千万|百万|万|千|百|十|)吨|"
    "(亿|千万|百万|万|千|百|)块|角|毛|分)"
)

RE_FRAC = re.compile(r"(-?)(\d+)/(\d+)")
RE_PERCENTAGE = re.compile(r"(-?)(\d+(\.\d+)?)%")
RE_NEGATIVE_INTEGER = re.compile(r"(-)(\d+)")
RE_DEFAULT_NUM = re.compile(r"\d{3}\d*")
RE_DECIMAL_NUM = re.compile(r"(-?)((\d+)(\.\d+))|(\.(\d+))")
RE_POSITIVE_QUANTIFIERS = re.compile(r"(\d+)([多余几\+])?" + QUANTIFIERS)
RE_NUMBER = re.compile(r"(-?)((\d+)(\.\d+)?)|(\.(\d+))")
RE_VERSION_NUM = re.compile(r"((\d+)(\.\d+)(\.\d+)?(\.\d+)+)")
RE_RANGE = re.compile(
    r"(?<![\d\+\-\×÷=])"  # nothing numeric or an operator before the range
    r"((-?)((\d+)(\.\d+)?))"
    r"[-~]"
    r"((-?)((\d+)(\.\d+)?))"
    r"(?![\d\+\-\×÷=])"
)
_TO_RANGE_UNITS = "(%|°C|℃|度|摄氏度|cm2|cm²|cm3|cm³|cm|db|ds|kg|km|m2|m²|m³|m3|ml|m|mm|s)"
RE_TO_RANGE = re.compile(
    r"((-?)((\d+)(\.\d+)?)|(\.(\d+)))" + _TO_RANGE_UNITS + r"[~]((-?)((\d+)(\.\d+)?)|(\.(\d+)))" + _TO_RANGE_UNITS
)
_POWER_CHARS = "⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ"
_OPERAND = rf"((-?)((\d+)(\.\d+)?[{_POWER_CHARS}]*)|(\.\d+[{_POWER_CHARS}]*)|([A-Za-z][{_POWER_CHARS}]*))"
RE_ASMD = re.compile(_OPERAND + r"([\+\-\×÷=])" + _OPERAND)  # groups: 1 left, 8 operator, 9 right
RE_POWER = re.compile(rf"[{_POWER_CHARS}]+")

_OPERATOR_READINGS = {"+": "加", "-": "减", "×": "乘", "÷": "除", "=": "等于"}
_POWER_DIGITS = dict(zip(_POWER_CHARS, "0123456789xyn"))


def _sign(s: str | None) -> str:
    return "负" if s else ""


def replace_frac(m: re.Match) -> str:
    return f"{_sign(m.group(1))}{read_number(m.group(3))}分之{read_number(m.group(2))}"


def replace_percentage(m: re.Match) -> str:
    return f"{_sign(m.group(1))}百分之{read_number(m.group(2))}"


def replace_negative_num(m: re.Match) -> str:
    return f"{_sign(m.group(1))}{read_number(m.group(2))}"


def replace_default_num(m: re.Match) -> str:
    return read_digits(m.group(0), alt_one=True)


def replace_asmd(m: re.Match) -> str:
    return m.group(1) + _OPERATOR_READINGS[m.group(8)] + m.group(9)


def replace_power(m: re.Match) -> str:
    return "的" + "".join(_POWER_DIGITS[c] for c in m.group(0)) + "次方"


def replace_positive_quantifier(m: re.Match) -> str:
    number = read_number(m.group(1))
    if number == "二":
        number = "两"
    more = "多" if m.group(2) == "+" else (m.group(2) or "")
    return f"{number}{more}{m.group(3)}"


def replace_number(m: re.Match) -> str:
    if m.group(5):  # ".5" alone
        return read_number(m.group(5))
    return f"{_sign(m.group(1))}{read_number(m.group(2))}"


def replace_range(m: re.Match) -> str:
    first = RE_NUMBER.sub(replace_number, m.group(1))
    second = RE_NUMBER.sub(replace_number, m.group(6))
    return f"{first}到{second}"


def replace_to_range(m: re.Match) -> str:
    return m.group(0).replace("~", "至")


def replace_version_num(m: re.Match) -> str:
    return "".join("点" if c == "." else read_number(c) for c in m.group(1))
