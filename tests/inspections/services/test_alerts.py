"""Alert triage: each action is an ``alert.updated`` entry with who, and a salted commitment to why and to whom
(the text itself is private case text, staff only); closed alerts take comments (and a reopen) only."""

import hashlib
import json

import pytest
from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError

from inspections import selectors
from inspections.models import Alert, CaseText
from inspections.services.alerts import alert_act, alert_raise
from ledger import selectors as ledger
from registry.models import Organisation
from registry.services.roles import REGULATOR_STAFF, roles_sync
from tests.inspections.factories import make_provers
from tests.shared_world import seeded_once_per_module

pytestmark = pytest.mark.django_db


def alerts_world() -> int:
    """The provers' world, regulator staff ben, and one alert: its key."""
    make_provers()
    roles_sync()
    ben = User.objects.create_user("ben", is_staff=True)
    ben.groups.add(Group.objects.get(name=REGULATOR_STAFF))
    return alert_raise("refused", Organisation.objects.get(slug="owner-a"), "the owner refused entry").pk


alerts_world_fixture = seeded_once_per_module(alerts_world)


@pytest.fixture
def alert(alerts_world):
    return Alert.objects.get(pk=alerts_world)


def test_each_action_is_a_ledger_entry_naming_who_and_why(alert):
    alert_act(alert, action="acknowledge", by="ana")
    alert_act(alert, action="assign", by="ana", assignee="ben")
    alert_act(alert, action="comment", by="ben", reason="called the owner")
    done = alert_act(alert, action="resolve", by="ben", reason="second visit succeeded")
    assert done.state == "resolved" and done.assignee.startswith("sha256:")
    entry = ledger.first_entry("alert.updated", action="resolve")
    reason = entry["payload"]["reason"]
    assert entry["payload"] == {
        "alert": alert.raised_seq,
        "action": "resolve",
        "by": "ben",
        "reason": reason,
        "assignee": "",
        "from": "acknowledged",
        "state": "resolved",
    }
    private = CaseText.objects.get(commitment=reason)
    assert reason == "sha256:" + hashlib.sha256(bytes(private.salt) + b"second visit succeeded").hexdigest()
    assert list(done.actions.values_list("action", "state")) == [
        ("acknowledge", "acknowledged"),
        ("assign", "acknowledged"),
        ("comment", "acknowledged"),
        ("resolve", "resolved"),
    ]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"action": "resolve", "by": "ana"}, "reason"),
        ({"action": "resolve", "by": "ana", "reason": "  "}, "reason"),
        ({"action": "assign", "by": "ana"}, "assignee"),
        ({"action": "comment", "by": "ana", "reason": "x", "assignee": "ben"}, "assignee"),
        ({"action": "delete", "by": "ana", "reason": "x"}, "action"),
        ({"action": "comment", "by": "", "reason": "x"}, "by"),
        ({"action": "comment", "by": "ana", "reason": "a\x00b"}, "reason"),
        ({"action": "comment", "by": "ana", "reason": ["x"]}, "reason"),
        ({"action": "comment", "by": "ana", "reason": "x" * 2001}, "reason"),
        ({"action": "assign", "by": "ana", "assignee": "lab-cheat"}, "assignee"),  # not a staff user
    ],
)
def test_bad_actions_name_the_field_and_write_nothing(alert, kwargs, field):
    size = ledger.ledger_size()
    with pytest.raises(ValidationError) as error:
        alert_act(alert, **kwargs)
    assert field in error.value.message_dict
    assert ledger.ledger_size() == size and Alert.objects.get(pk=alert.pk).state == "open"


@pytest.mark.parametrize("closing", ["resolve", "false_positive", "supersede"])
def test_a_closed_alert_takes_comments_only(alert, closing):
    alert_act(alert, action=closing, by="ana", reason="done")
    with pytest.raises(ValidationError, match=r"is closed .*reopen it first"):
        alert_act(alert, action="acknowledge", by="ana")
    assert alert_act(alert, action="comment", by="ana", reason="for the record").state != "open"


def test_the_public_ledger_carries_no_case_text_and_only_staff_read_it(alert):
    secret, who = "Asked lab-cheat for the original transcript, deadline Friday", "ben"
    alert_act(alert, action="assign", by="ana", assignee=who)
    alert_act(alert, action="comment", by="ana", reason=secret)
    public = json.dumps(ledger.entries_of("alert.updated"), default=str)
    assert secret not in public and '"ben"' not in public
    commitments = [a.reason for a in alert.actions.all()] + [alert.actions.first().assignee]
    auditor = User.objects.create_user("aud", is_staff=True)
    auditor.groups.add(Group.objects.get(name="auditor"))
    assert set(selectors.case_texts(User.objects.get(username="ben"), commitments).values()) == {secret, who}
    assert selectors.case_texts(auditor, commitments) == {}
