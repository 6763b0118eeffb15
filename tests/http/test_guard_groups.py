"""studio.http.guard finds a client's disconnect inside the exception groups a task group raises: Python 3.11's
groups, and on Python 3.10 (which pyproject allows) the exceptiongroup backport's, which is no builtin there."""

from __future__ import annotations

import sys

from studio.http.guard import _holds


class Gone(Exception):
    pass


class BackportGroup(Exception):
    """Shaped as the exceptiongroup backport's groups: an ``exceptions`` tuple, no builtin base."""

    def __init__(self, message: str, exceptions: list[BaseException]) -> None:
        super().__init__(message)
        self.exceptions = tuple(exceptions)


def test_a_kind_is_found_alone_and_nested_in_groups() -> None:
    assert _holds(Gone(), Gone)
    assert not _holds(ValueError(), Gone)
    if sys.version_info >= (3, 11):  # the builtin groups
        nested = BaseExceptionGroup("outer", [ValueError(), ExceptionGroup("inner", [Gone()])])  # noqa: F821
        assert _holds(nested, Gone) and not _holds(nested, KeyError)
    assert _holds(BackportGroup("outer", [ValueError(), BackportGroup("inner", [Gone()])]), Gone)
    assert not _holds(BackportGroup("outer", [ValueError()]), Gone)
