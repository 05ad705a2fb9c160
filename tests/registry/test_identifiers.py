"""Identifiers are matched whole and in ASCII: a trailing newline, a NUL or a Unicode look-alike never passes."""

import pytest
from django.core.exceptions import ValidationError

from inspections.services.validation import country_clean
from ledger.services import ACTOR_PATTERN, KIND_PATTERN
from registry import signing
from rules import epcis_format
from rules.identifiers import COUNTRY, SERIAL, SLUG

GOOD = {
    SERIAL: "H100-000001",
    COUNTRY: "NL",
    SLUG: "owner-a",
    signing.NONCE_PATTERN: "3f2b9c0e5a7d4e11",
    KIND_PATTERN: "chip.shipped",
    ACTOR_PATTERN: "vendor-a",
    epcis_format.TZ_OFFSET: "+01:00",
    epcis_format.EVENT_ID: "urn:uuid:1f0b5b7e-2c43-4a8e-9c1e-7a3d52f0e001",
}


def hostile(value: str) -> list[str]:
    return [
        value + "\n",
        value + "\x00",
        "\n" + value,
        value[:-1] + "\u0421" if value[-1] == "C" else value + "\u0430",  # Cyrillic es / a
        value.replace("1", "\uff11").replace("0", "\uff10").replace("4", "\uff14")
        + ("\uff11" if "1" not in value else ""),
        value + "\u200b",  # zero-width space
    ]


@pytest.mark.parametrize("pattern", list(GOOD), ids=lambda p: p.pattern[:30])
def test_patterns_match_whole_ascii_values_only(pattern):
    good = GOOD[pattern]
    assert pattern.fullmatch(good)
    for bad in hostile(good):
        assert not pattern.fullmatch(bad), repr(bad)


@pytest.mark.parametrize(
    "value", ["N\x00", "\u041d\u041b", "\uff2e\uff2c", "\ufb00", " n\u200bl", "NLD"]
)  # Cyrillic, fullwidth, the ff ligature ("ﬀ".upper() == "FF"); surrounding blanks are stripped by design
def test_country_clean_refuses_look_alikes(value):
    with pytest.raises(ValidationError):
        country_clean(value)


@pytest.mark.parametrize(
    "epc",
    [
        "urn:epc:id:sgtin:0614141.812345.H100-1\n",
        "urn:epc:id:sgtin:\uff10614141.812345.H100-1",  # a fullwidth digit in the company prefix
        "urn:epc:id:sgtin:0614141.812345.H100-1\u00a0",
        "https://id.gs1.org/01/09506000134352/21/H100-1\n",
        "https://id.gs1.org/01/0950600013435\uff12/21/H100-1",
        "urn:epc:id:sgtin:0614141.812345.H100%0A",  # an encoded newline in the serial
        "H100-1\n",
    ],
)
def test_epc_with_newline_nul_or_look_alike_is_refused(epc):
    with pytest.raises(ValueError):
        epcis_format.chip_serial(epc, bare=True)


def test_epc_forms_still_parse():
    assert epcis_format.chip_serial("urn:epc:id:sgtin:0614141.812345.H100-1") == "H100-1"
    assert epcis_format.chip_serial("https://id.gs1.org/01/09506000134352/21/H100-1") == "H100-1"
    assert epcis_format.chip_serial("H100-1", bare=True) == "H100-1"


@pytest.mark.parametrize("nonce", ["3f2b9c0e5a7d4e11\n", "3f2b9c0e5a7d4e1\x00", "3f2b9c0e5a7d4e1\uff11"])
def test_nonce_with_newline_nul_or_look_alike_is_refused(nonce):
    with pytest.raises(signing.SignatureProblem) as problem:
        signing.check_freshness({"timestamp": 1_000, "nonce": nonce}, now=1_000)
    assert problem.value.field == "nonce"


@pytest.mark.parametrize(
    "stamp", [10**5000, -(10**400), 2**53 + 1, 2**64], ids=["10^5000", "-10^400", "2^53+1", "2^64"]
)
def test_a_huge_timestamp_is_refused_naming_the_field_never_a_crash(stamp):
    with pytest.raises(signing.SignatureProblem) as problem:
        signing.check_freshness({"timestamp": stamp, "nonce": "3f2b9c0e5a7d4e11"})
    assert problem.value.field == "timestamp"


@pytest.mark.parametrize("key_id", ["0123456789abcdef\n", "0123456789abcde\uff11"])
def test_key_id_with_newline_or_look_alike_is_refused(key_id):
    with pytest.raises(signing.SignatureProblem):
        signing.parse_header(f"{key_id}:{'A' * 86}==")


@pytest.mark.django_db
@pytest.mark.parametrize("slug", ["owner-x\n", "owner-x\x00", "\u043ewner-x", "owner-\uff58"])
def test_services_refuse_slugs_with_newline_nul_or_look_alike(slug):
    from registry import services

    with pytest.raises(ValidationError) as error:
        services.organisation_register(slug=slug, legal_name="X", country="NL", roles=["owner"], actor="regulator")
    assert "slug" in error.value.message_dict


@pytest.mark.django_db
@pytest.mark.parametrize("serial", ["SN-1\n", "SN-1\x00", "SN-\uff11", "S\u041d-1"])
def test_services_refuse_serials_with_newline_nul_or_look_alike(serial):
    from tests.registry.factories import chip_model, chip_public_key, organisation

    fab, _ = organisation("fab-x", ["fab"], "TW")
    model = chip_model(fab)
    with pytest.raises(ValidationError) as error:
        from registry import services

        services.chips_fabricate(
            organisation=fab, chips=[{"serial": serial, "model": model.slug, "public_key": chip_public_key()}]
        )
    assert "chips[0].serial" in error.value.message_dict
