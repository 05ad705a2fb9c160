"""A claim's findings in words: what was measured, what it would mean, and that it decided nothing."""

from hypothesis import given
from hypothesis import strategies as st

from inspections.claim_explanations import RESULTS, finding_explained, findings_explained, result_explained
from inspections.models import Claim

SCREEN = {
    "kind": "screen",
    "detail": "no evidence in the losses that checkpoints [10, 12] trained on their declared batches",
    "evidence": {"flagged": [10, 12], "z": {"10": -2.1, "12": -1.9}},
}


def test_the_screens_flag_is_explained_with_its_steps_and_says_it_decided_nothing():
    words = finding_explained(SCREEN)
    assert "checkpoints of steps 10, 12" in words
    assert "Proof-of-Training-Data" in words and "decided nothing" in words


def test_every_result_a_claim_can_have_is_explained():
    assert set(Claim.Result.values) <= set(RESULTS)
    assert result_explained("verified").startswith("Verified")


def test_a_jump_names_its_size_and_the_limit_and_unknown_kinds_fall_back_to_the_detail():
    jump = {"kind": "update_jump", "detail": "d", "evidence": {"max_jump": 7.25, "allowed": 4.0}}
    assert "7.2x, more than the 4.0x allowed" in finding_explained(jump)
    assert finding_explained({"kind": "new_kind", "detail": "as the verifier says"}) == "as the verifier says"
    assert finding_explained({"kind": ["screen"], "detail": "odd"}) == "odd"


@given(
    st.recursive(
        st.none() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c) | st.dictionaries(st.text(max_size=5), c),
        max_leaves=20,
    )
)
def test_any_stored_report_explains_without_raising(report):
    for item in findings_explained(report if isinstance(report, dict) else {"findings": report}):
        assert isinstance(item["meaning"], str)
