"""CHIPLEDGER_PURE_TESTS splits the tests that touch no database or broker between CI's legs: each runs in
exactly one leg, and a rule that is not understood stops the run rather than running nothing."""

from types import SimpleNamespace

import pytest

from tests.conftest import _pure_tests_kept

FILES = ["tests/replay/protocol/test_fetch.py", "tests/replay/test_cli.py", "tests/ledger/test_merkle.py"]


def item(path: str) -> SimpleNamespace:
    return SimpleNamespace(nodeid=f"{path}::test_x[a/b::c]")


@pytest.mark.parametrize(
    "listed, only",
    [
        ("tests/replay/protocol/test_fetch.py", {0}),
        ("tests/replay/protocol tests/ledger/", {0, 2}),
        ("tests/replay", {0, 1}),
        ("tests/replay/test", set()),  # a prefix of a name, not a folder or file: names none
        ("tests/replay/protocol/test_fetch.py::test_x", set()),  # a test, not a path
    ],
)
def test_only_and_except_part_the_tests_between_two_legs(listed, only):
    for n, path in enumerate(FILES):
        assert _pure_tests_kept(item(path), f"only:{listed}") == (n in only)
        assert _pure_tests_kept(item(path), f"except:{listed}") == (n not in only)


def test_unset_or_all_keeps_every_test_and_skip_none():
    assert all(_pure_tests_kept(item(path), rule) for path in FILES for rule in ("", "all"))
    assert not any(_pure_tests_kept(item(path), "skip") for path in FILES)


@pytest.mark.parametrize("rule", ["only:", "except: ", "some:tests/replay", "tests/replay", "Skip"])
def test_a_rule_not_understood_stops_the_run(rule):
    with pytest.raises(pytest.UsageError, match="CHIPLEDGER_PURE_TESTS"):
        _pure_tests_kept(item(FILES[0]), rule)
