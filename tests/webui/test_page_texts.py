"""Texts the server writes into the page follow the page's language: the device notice too."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from webui.app import UISettings, _notice


@pytest.mark.parametrize("locale,expected", [("en", "lacks"), ("zh-CN", "本机没有"), ("ja", "ありません"),
                                             ("ko", "없습니다")])
def test_the_device_notice_is_in_the_pages_language(locale, expected) -> None:
    studio = SimpleNamespace(runtime=SimpleNamespace(device="cpu"))
    notice = _notice(studio, UISettings(device_fallback="cuda"), locale)
    assert expected in notice and "`cuda`" in notice and "`cpu`" in notice and "--device" in notice
    assert "lacks" not in notice or locale == "en"
    assert "asks for" not in _notice(studio, UISettings(), locale)  # no fallback: no notice
