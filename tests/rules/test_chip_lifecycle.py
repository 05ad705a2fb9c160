"""The pure chip state machine: every transition allowed, and refused for the wrong state or actor."""

import pytest

from rules.chip_lifecycle import RULES, ChipState, Facts, LifecycleError, Status, apply_chip_event, fabricate

FAB, VENDOR, OWNER, OTHER = "fab-1", "vendor-a", "owner-a", "owner-b"


def chip(status: Status, owner=VENDOR, possessor=VENDOR, **extra) -> ChipState:
    return ChipState("SN-1", "h100", FAB, owner, possessor, status, country="US", **extra)


PAYLOADS = {
    "packaged": {},
    "shipped": {"consignee": OWNER, "destination_country": "US", "reference": "PO-1"},
    "exported": {"consignee": OWNER, "destination_country": "NL", "reference": "PO-1", "export_licence": "L-1"},
    "received": {},
    "transfer_offered": {"to_owner": OTHER},
    "transfer_accepted": {},
    "transfer_cancelled": {},
    "installed": {"facility": "dc-1"},
    "removed": {},
    "decommissioned": {"reason": "failed", "evidence": "RMA-1"},
    "destroyed": {"reason": "end_of_life", "evidence": "sha256:" + "ab" * 32},
    "reported_lost": {},
    "reported_stolen": {},
    "found": {},
}


def actor_for(event: str, state: ChipState) -> str:
    party = RULES[event][1]
    return {
        "owner": state.owner,
        "possessor": state.possessor,
        "consignee": state.consignee,
        "pending_owner": state.pending_owner,
        "holder": state.owner,
    }[party]


def prepared(event: str, status: Status) -> ChipState:
    extra = {}
    if event == "received":
        extra["consignee"] = OWNER
    if event in {"transfer_accepted", "transfer_cancelled"}:
        extra["pending_owner"] = OTHER
    if event == "found":
        extra["status_before_missing"] = Status.INSTALLED
    return chip(status, **extra)


def facts(actor: str) -> Facts:
    return Facts(actor=actor, facility_owner=actor, facility_country="US", facility_kind="datacentre")


CASES = [(event, status) for event in RULES for status in Status]


@pytest.mark.parametrize("event, status", CASES)
def test_each_event_is_allowed_exactly_in_its_states(event, status):
    state = prepared(event, status)
    allowed = status in RULES[event][0]
    if allowed:
        after = apply_chip_event(state, event, facts(actor_for(event, state)), PAYLOADS[event])
        assert after != state
    else:
        with pytest.raises(LifecycleError, match="cannot be") as refused:
            apply_chip_event(state, event, facts(actor_for(event, state)), PAYLOADS[event])
        # Plain words: "a chip that is in stock cannot be installed", never "a in_stock chip".
        assert str(refused.value).startswith(f"a chip that is {status.replace('_', ' ')} cannot be ")
        assert "_" not in str(refused.value)


@pytest.mark.parametrize("event", list(RULES))
def test_each_event_is_refused_to_a_stranger(event):
    status = sorted(RULES[event][0])[0]
    state = prepared(event, Status(status))
    with pytest.raises(LifecycleError, match="only the chip's"):
        apply_chip_event(state, event, facts("stranger"), PAYLOADS[event])


def test_fabricated_chip_belongs_to_its_fab():
    state = fabricate("SN-9", "h100", Facts(actor=FAB, facility_owner=FAB, facility_country="TW"), "fab-tw")
    assert (state.owner, state.possessor, state.status, state.country) == (FAB, FAB, Status.FABRICATED, "TW")
    with pytest.raises(LifecycleError):
        fabricate("SN-9", "h100", Facts(actor=FAB, facility_owner="someone-else"), "their-fab")


def test_shipment_and_receipt_move_possession_not_ownership():
    shipped = apply_chip_event(chip(Status.IN_STOCK), "shipped", facts(VENDOR), PAYLOADS["shipped"])
    assert (shipped.status, shipped.consignee, shipped.possessor) == (Status.IN_TRANSIT, OWNER, VENDOR)
    received = apply_chip_event(shipped, "received", facts(OWNER), {"facility": "dc-1"})
    assert (received.possessor, received.owner, received.consignee, received.facility) == (OWNER, VENDOR, None, "dc-1")


def test_a_border_needs_an_export_with_a_licence():
    state = chip(Status.IN_STOCK)
    with pytest.raises(LifecycleError, match="crosses a border"):
        apply_chip_event(state, "shipped", facts(VENDOR), {**PAYLOADS["shipped"], "destination_country": "NL"})
    with pytest.raises(LifecycleError, match="export licence"):
        apply_chip_event(state, "exported", facts(VENDOR), {**PAYLOADS["exported"], "export_licence": None})
    with pytest.raises(LifecycleError, match="own country"):
        apply_chip_event(state, "exported", facts(VENDOR), {**PAYLOADS["exported"], "destination_country": "US"})
    exported = apply_chip_event(state, "exported", facts(VENDOR), PAYLOADS["exported"])
    assert exported.country == "NL" and exported.status == Status.IN_TRANSIT


def test_transfer_needs_the_offer_and_the_acceptance():
    state = chip(Status.INSTALLED, owner=OWNER, possessor=OWNER)
    offered = apply_chip_event(state, "transfer_offered", facts(OWNER), {"to_owner": OTHER})
    assert offered.owner == OWNER and offered.pending_owner == OTHER  # pending, not done
    with pytest.raises(LifecycleError, match="already pending"):
        apply_chip_event(offered, "transfer_offered", facts(OWNER), {"to_owner": "owner-c"})
    with pytest.raises(LifecycleError, match="pending owner"):
        apply_chip_event(offered, "transfer_accepted", facts("owner-c"), {})
    accepted = apply_chip_event(offered, "transfer_accepted", facts(OTHER), {})
    assert accepted.owner == OTHER and accepted.pending_owner is None and accepted.possessor == OWNER


def test_lost_and_found_restores_the_earlier_status():
    lost = apply_chip_event(chip(Status.INSTALLED), "reported_lost", facts(VENDOR), {})
    assert lost.status == Status.LOST
    found = apply_chip_event(lost, "found", facts(VENDOR), {})
    assert found.status == Status.INSTALLED and found.status_before_missing is None


def test_install_needs_a_facility_of_the_possessor():
    with pytest.raises(LifecycleError, match="needs a facility"):
        apply_chip_event(chip(Status.IN_STOCK), "installed", facts(VENDOR), {})
    with pytest.raises(LifecycleError, match="does not belong"):
        apply_chip_event(
            chip(Status.IN_STOCK),
            "installed",
            Facts(actor=VENDOR, facility_owner=OTHER, facility_kind="datacentre"),
            {"facility": "x"},
        )


@pytest.mark.parametrize("kind", ["warehouse", "fab", "packaging", None])
def test_chips_are_installed_only_in_a_data_centre(kind):
    where = Facts(actor=VENDOR, facility_owner=VENDOR, facility_country="US", facility_kind=kind)
    with pytest.raises(LifecycleError, match="only in a data centre"):
        apply_chip_event(chip(Status.IN_STOCK), "installed", where, {"facility": "wh-1"})


@pytest.mark.parametrize("event", ["decommissioned", "destroyed"])
@pytest.mark.parametrize("missing", ["reason", "evidence"])
def test_taking_a_chip_out_of_use_needs_a_reason_and_evidence(event, missing):
    state = chip(Status.INSTALLED)
    payload = {k: v for k, v in PAYLOADS[event].items() if k != missing}
    with pytest.raises(LifecycleError, match="reason and an evidence reference"):
        apply_chip_event(state, event, facts(VENDOR), payload)


def test_a_chip_is_packaged_once():
    packaged = apply_chip_event(chip(Status.IN_STOCK), "packaged", facts(VENDOR), {})
    assert packaged.packaged and packaged.status == Status.PACKAGED
    back_in_stock = apply_chip_event(
        apply_chip_event(packaged, "shipped", facts(VENDOR), PAYLOADS["shipped"]), "received", facts(OWNER), {}
    )
    with pytest.raises(LifecycleError, match="already packaged"):
        apply_chip_event(back_in_stock, "packaged", facts(OWNER), {})


@pytest.mark.parametrize("event", ["installed", "packaged"])
def test_a_facility_abroad_is_a_border_crossing_not_an_install(event):
    """Install and package put a held chip at a facility; one in another country needs an export first."""
    state = prepared(event, Status.IN_STOCK)
    actor = actor_for(event, state)
    abroad = Facts(actor=actor, facility_owner=actor, facility_country="CN", facility_kind="datacentre")
    with pytest.raises(LifecycleError, match=r"US to CN .*crosses a border: record an export"):
        apply_chip_event(state, event, abroad, {"facility": "dc-cn"})
    at_home = apply_chip_event(state, event, facts(actor), {"facility": "dc-1"})
    assert (at_home.facility, at_home.country) == ("dc-1", "US")


def test_a_receipt_abroad_is_recorded_where_it_happened():
    """A chip in transit arrives where it arrives: the registry records it there and alerts the diversion."""
    state = prepared("received", Status.IN_TRANSIT)
    abroad = Facts(actor=OWNER, facility_owner=OWNER, facility_country="NL", facility_kind="datacentre")
    assert apply_chip_event(state, "received", abroad, {"facility": "dc-nl"}).country == "NL"
