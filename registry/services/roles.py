"""The regulator's admin roles as explicit permission sets (Django groups), kept in step after every migrate.

Nothing is granted by pattern ("every view permission"): a model added later is in no role until it is listed
here. Secrets are in no read role: API tokens, request nonces and idempotency answers, identity-challenge nonces,
campaign seeds before their reveal, users, groups and sessions.
"""

from __future__ import annotations

from django.contrib.auth.models import Group, Permission
from django.core.exceptions import ValidationError
from django.db import transaction

from ledger import services as ledger

AUDITOR = "auditor"
REGULATOR_STAFF = "regulator staff"

WORLD = {  # app label -> models whose rows are world state (mostly on the public ledger anyway)
    "ledger": ["entry", "checkpoint", "witness", "cosignature"],
    "registry": ["organisation", "organisationkey", "facility", "chipmodel", "chip", "chipevent", "exportlicence"],
    "inspections": [
        "campaign",
        "draw",
        "inspectiontask",
        "inspectionbody",
        "alert",
        "finding",
        "snapshotlog",
        "snapshot",
        "claim",
    ],
    "desk": ["job"],  # long work started from the desk and its result (no secret: a draw or claim id, a verdict)
}
AUDITOR_PERMISSIONS = [(app, f"view_{model}") for app, models in WORLD.items() for model in models]
REGULATOR_STAFF_PERMISSIONS = [
    *AUDITOR_PERMISSIONS,
    ("registry", "add_organisation"),
    ("registry", "view_member"),
    ("registry", "add_member"),
    ("registry", "change_member"),
    ("registry", "view_apitoken"),  # the admin lists prefixes and owners, never a token
    ("registry", "change_apitoken"),  # revoke
    ("inspections", "add_campaign"),
    ("inspections", "change_campaign"),  # amend or stop (each a superseding ledger entry, never an edit in place)
    ("inspections", "add_inspectionbody"),
    ("ledger", "add_witness"),
    ("inspections", "view_casetext"),  # private case text (triage reasons, assignees, finding notes): staff only
    ("inspections", "change_alert"),  # triage on the desk (each action a ledger entry through alert_act)
    ("desk", "add_job"),  # draw audits, integrity sweeps and claim re-verifications
]
ROLES = {AUDITOR: AUDITOR_PERMISSIONS, REGULATOR_STAFF: REGULATOR_STAFF_PERMISSIONS}


def roles_sync(**_signal) -> None:
    """Create or reset each role's group to exactly its listed permissions (those that exist yet)."""
    for name, wanted in ROLES.items():
        group, _ = Group.objects.get_or_create(name=name)
        found = [
            p
            for p in Permission.objects.filter(codename__in={code for _, code in wanted}).select_related("content_type")
            if (p.content_type.app_label, p.codename) in set(wanted)
        ]
        group.permissions.set(found)


@transaction.atomic
def role_grant(user, role: str, actor: str = "regulator") -> None:
    """Give a staff user one role (and only that one): a ``regulator.role_granted`` entry names the user by id."""
    if role not in ROLES:
        raise ValidationError({"role": f"one of {sorted(ROLES)}"})
    if not user.is_staff:
        raise ValidationError({"user": "roles are for staff users"})
    ledger.append_entry("regulator.role_granted", {"user": user.pk, "role": role}, actor)
    user.groups.set([Group.objects.get(name=role)])
    user.user_permissions.clear()
