"""An alert's case as a state machine (``inspections.case_states``): each step refused in plain words where it does
not apply, nothing written then; two people acting at once get one step and one refusal; many alerts at once are
each checked on their own; and a high alert is announced (email, signed webhook) after commit only."""

import threading

import pytest
from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from hypothesis import given, settings
from hypothesis import strategies as st

from inspections import case_states, queue
from inspections.models import Alert, AlertNotification
from inspections.rebuild_inspections import differences, rebuild
from inspections.services import alerts
from inspections.services.alerts import alert_act, alert_raise, alerts_act
from ledger import selectors as ledger
from registry.models import Organisation
from registry.services.roles import REGULATOR_STAFF, roles_sync
from tests.inspections.factories import make_provers
from tests.shared_world import seeded_once_per_module

S = Alert.State
pytestmark = pytest.mark.django_db


def alert_cases_world() -> int:
    """The provers' world and regulator staff ben and cleo: owner-a's key."""
    make_provers()
    roles_sync()
    for name in ("ben", "cleo"):
        User.objects.create_user(name, is_staff=True).groups.add(Group.objects.get(name=REGULATOR_STAFF))
    return Organisation.objects.get(slug="owner-a").pk


alert_cases_world_fixture = seeded_once_per_module(alert_cases_world)


@pytest.fixture
def prover(alert_cases_world):
    return Organisation.objects.get(pk=alert_cases_world)


def raised(prover, kind="refused") -> Alert:
    return alert_raise(kind, prover, "the owner refused entry")


def test_a_case_walks_open_acknowledged_investigating_resolved_and_back(prover):
    alert = raised(prover)
    steps = [
        ("acknowledge", "", S.ACKNOWLEDGED),
        ("investigate", "", S.INVESTIGATING),
        ("resolve", "second visit succeeded", S.RESOLVED),
        ("reopen", "the owner refused again", S.OPEN),
        ("dismiss", "duplicate of an earlier alert", S.DISMISSED),
    ]
    for action, reason, state in steps:
        alert = alert_act(alert, action=action, by="ana", reason=reason)
        assert alert.state == state
    entries = ledger.entries_of("alert.updated")
    assert [(e["payload"]["from"], e["payload"]["state"]) for e in entries] == [
        ("open", "acknowledged"),
        ("acknowledged", "investigating"),
        ("investigating", "resolved"),
        ("resolved", "open"),
        ("open", "dismissed"),
    ]
    assert differences(rebuild()) == []  # the rebuild replays the same machine from the ledger


@pytest.mark.parametrize(
    ("before", "action", "why"),
    [
        (["acknowledge"], "acknowledge", "already acknowledged; nothing was changed"),
        (["investigate"], "acknowledge", "already under investigation"),
        (["investigate"], "investigate", "already under investigation"),
        ([], "reopen", "still open (open); only a closed alert can be reopened"),
        (["resolve"], "resolve", "closed (resolved); reopen it first"),
        (["dismiss"], "assign", "closed (dismissed); reopen it first"),
    ],
)
def test_a_step_that_does_not_apply_is_refused_in_words_and_writes_nothing(prover, before, action, why):
    alert = raised(prover)
    for step in before:
        alert_act(alert, action=step, by="ana", reason="because")
    size, state = ledger.ledger_size(), Alert.objects.get(pk=alert.pk).state
    with pytest.raises(ValidationError) as refused:
        alert_act(alert, action=action, by="ana", reason="again", assignee="ben" if action == "assign" else "")
    assert why in refused.value.message_dict["action"][0]
    assert ledger.ledger_size() == size and Alert.objects.get(pk=alert.pk).state == state


def test_assigning_to_the_current_assignee_is_refused_and_to_someone_else_is_not(prover):
    alert = alert_act(raised(prover), action="assign", by="ana", assignee="ben")
    with pytest.raises(ValidationError, match="already assigned to ben"):
        alert_act(alert, action="assign", by="ana", assignee="ben")
    with pytest.raises(ValidationError, match="not an active staff user"):
        alert_act(alert, action="assign", by="ana", assignee="nosuchuser")
    assert alert_act(alert, action="assign", by="ana", assignee="cleo").state == S.OPEN


@settings(max_examples=200, deadline=None)
@given(state=st.sampled_from(list(S)), action=st.sampled_from(case_states.ACTIONS))
def test_every_refusal_names_the_state_and_every_allowed_step_lands_in_a_state(state, action):
    allowed, target = case_states.TRANSITIONS[action]
    if state in allowed:
        assert case_states.case_transition(state, action) == (target or state)
    else:
        with pytest.raises(ValidationError) as refused:
            case_states.case_transition(state, action)
        text = refused.value.message_dict["action"][0]
        assert S(state).label.lower() in text or "already" in text


def test_entries_from_before_the_state_machine_still_replay(prover):
    """An entry without ``from`` (written before the machine) replays by the rule it was written under."""
    assert case_states.legacy_next_state(S.ACKNOWLEDGED, "acknowledge") == S.ACKNOWLEDGED
    with pytest.raises(ValidationError):
        case_states.legacy_next_state(S.RESOLVED, "acknowledge")


def test_bulk_steps_check_each_alert_on_its_own(prover):
    fresh, seen, closed = raised(prover), raised(prover), raised(prover)
    alert_act(seen, action="acknowledge", by="ana")
    alert_act(closed, action="resolve", by="ana", reason="done")
    found = alerts_act(Alert.objects.order_by("pk"), action="acknowledge", by="ben")
    assert [a.pk for a in found["done"]] == [fresh.pk]
    refused = {alert.pk: why for alert, why in found["refused"]}
    assert set(refused) == {seen.pk, closed.pk}
    assert "already acknowledged" in refused[seen.pk] and "reopen it first" in refused[closed.pk]
    assert len(ledger.entries_of("alert.updated", action="acknowledge", by="ben")) == 1


@pytest.mark.django_db(transaction=True)
def test_two_people_acknowledging_at_once_get_one_step_and_one_refusal(prover, monkeypatch):
    """Both start together; the first, having read the state, waits for its twin before writing. Unless the row
    is locked the twin reads "open" too and both acknowledge; locked, the twin waits, reads "acknowledged" and is
    refused (the first gives up waiting for it after a few seconds)."""
    alert = raised(prover)
    start, twin_read = threading.Barrier(2, timeout=30), threading.Barrier(2, timeout=3)
    transition = case_states.case_transition

    def transition_then_wait_for_the_twin(current, action):
        state = transition(current, action)
        try:
            twin_read.wait()
        except threading.BrokenBarrierError:
            pass  # the twin is held by the lock: it cannot have read the state
        return state

    monkeypatch.setattr(alerts, "case_transition", transition_then_wait_for_the_twin)
    answers = []

    def acknowledge(by):
        start.wait()
        try:
            answers.append(alert_act(alert, action="acknowledge", by=by).state)
        except ValidationError as refused:
            answers.append(refused.message_dict["action"][0])
        finally:
            connection.close()

    threads = [threading.Thread(target=acknowledge, args=(by,)) for by in ("ana", "ben")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(answers) == ["acknowledged", "this alert is already acknowledged; nothing was changed"]
    assert len(ledger.entries_of("alert.updated")) == 1


def test_a_high_alert_queues_one_notice_per_channel_after_commit(
    prover, settings, monkeypatch, django_capture_on_commit_callbacks
):
    settings.ALERT_EMAILS, settings.ALERT_WEBHOOK_URL = ["desk@example.org"], "https://user:pw@hooks.example/x?t=1"
    sent = []
    app = type("App", (), {"send_task": lambda self, name, args: sent.append((name, args))})()
    monkeypatch.setattr(queue, "current_app", app)
    with django_capture_on_commit_callbacks(execute=True):
        high = raised(prover, "refused")
        raised(prover, "overdue")  # medium: no notice
    notices = list(AlertNotification.objects.order_by("pk"))
    assert [(n.alert_id, n.channel, n.state) for n in notices] == [
        (high.pk, "email", "queued"),
        (high.pk, "webhook", "queued"),
    ]
    assert notices[1].target == "https://hooks.example/x"  # no credentials or query on the desk
    assert sent == [(queue.DELIVER_ALERT_NOTICE, (n.pk,)) for n in notices]


def test_a_rolled_back_alert_sends_nothing(prover, settings, django_capture_on_commit_callbacks):
    settings.ALERT_EMAILS = ["desk@example.org"]
    with (
        django_capture_on_commit_callbacks(execute=False) as callbacks,
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        raised(prover)
        raise RuntimeError("the caller failed after raising")
    assert callbacks == [] and not AlertNotification.objects.exists()
