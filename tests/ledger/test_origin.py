"""The log's origin (docs/ledger.md, Origin): derived from LEDGER_PUBLIC_URL as tlog-tiles asks, and kept for
life once the log is opened, so a changed setting never renames a deployed log under its witnesses' and
verifiers' feet."""

from __future__ import annotations

import logging

import pytest

from config.settings import origin_from_public_url
from ledger import integrity, keys, selectors, services
from tests.factories import append_sample_entries
from tlog import note


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("https://example.org/chipledger", "example.org/chipledger/tlog"),
        ("https://example.org/chipledger/", "example.org/chipledger/tlog"),
        ("http://Ledger.Example.org:8443", "ledger.example.org:8443/tlog"),
        ("", ""),
    ],
)
def test_the_origin_is_the_tiles_prefix_without_its_scheme(url, origin):
    assert origin_from_public_url(url) == origin


@pytest.mark.parametrize(
    "url",
    [
        "example.org/chipledger",
        "ftp://example.org",
        "https://user:pw@example.org",
        "https://example.org/?x=1",
        "https://",
    ],
)
def test_a_public_url_that_names_no_plain_prefix_is_refused(url):
    with pytest.raises(ValueError, match="LEDGER_PUBLIC_URL"):
        origin_from_public_url(url)


@pytest.mark.django_db
def test_a_log_is_opened_under_the_configured_origin(settings):
    settings.LEDGER_ORIGIN = "example.org/chipledger/tlog"
    services.ledger_open()
    assert selectors.genesis_origin() == "example.org/chipledger/tlog"
    checkpoint = note.parse_checkpoint(note.split_note(selectors.checkpoint_latest().note)[0])
    assert checkpoint.origin == "example.org/chipledger/tlog"
    assert keys.verifier_key().startswith("example.org/chipledger/tlog+")


@pytest.mark.django_db
def test_an_opened_log_keeps_its_origin_when_the_setting_changes(settings, caplog):
    services.ledger_open()
    append_sample_entries(5)
    opened_as, key = settings.LEDGER_ORIGIN, keys.verifier_key()
    settings.LEDGER_ORIGIN = "example.org/renamed/tlog"
    with caplog.at_level(logging.WARNING, logger="ledger.keys"):
        append_sample_entries(5)
        checkpoint = services.checkpoint_sign()
    assert keys.verifier_key() == key  # what witnesses and verifiers pinned still verifies
    assert note.open_checkpoint(checkpoint.note, note.parse_verifier_key(key))[1].origin == opened_as
    assert integrity.verify_stored_ledger().entries == 11  # every checkpoint, old and new, under the one key
    assert "example.org/renamed/tlog" in caplog.text and f"opened as {opened_as!r}" in caplog.text
