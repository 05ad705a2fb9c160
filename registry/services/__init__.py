"""Writes to the registry, by subject. Each accepted change is a ledger entry written in the same
transaction as its projection rows; a rejected one raises before anything is written.

- ``organisations``: organisations, members, signing keys, the check of a signed request
- ``facilities``: facilities and chip models
- ``chips``: fabrication and lifecycle events
- ``epcis``: EPCIS 2.0 capture onto the lifecycle
- ``idempotency``: Idempotency-Key answers

The names other apps and the views use are re-exported here, so ``from registry import services``
keeps working.
"""

from rules.identifiers import COUNTRY, MAX_CHIPS, SERIAL, SLUG, SYSTEM

from .chips import CHIP_EVENTS, EVENT_FIELDS, chips_fabricate, chips_record_event, event_fields_table
from .epcis import epcis_capture, epcis_document_parse, epcis_query_serial
from .facilities import chip_model_register, facility_register
from .idempotency import IdempotencyConflict, idempotent_answer, idempotent_answer_record, idempotent_in_progress
from .licences import export_licence_grant
from .organisations import (
    member_add,
    member_remove,
    organisation_key_register,
    organisation_key_replace,
    organisation_key_revoke,
    organisation_register,
    signed_body_accept,
    signed_body_check,
    signed_key_current,
    signed_nonce_consume,
)

__all__ = [
    "CHIP_EVENTS",
    "COUNTRY",
    "EVENT_FIELDS",
    "MAX_CHIPS",
    "SERIAL",
    "SLUG",
    "SYSTEM",
    "IdempotencyConflict",
    "chip_model_register",
    "chips_fabricate",
    "chips_record_event",
    "epcis_capture",
    "epcis_document_parse",
    "epcis_query_serial",
    "event_fields_table",
    "export_licence_grant",
    "facility_register",
    "idempotent_answer",
    "idempotent_answer_record",
    "idempotent_in_progress",
    "member_add",
    "member_remove",
    "organisation_key_register",
    "organisation_key_replace",
    "organisation_key_revoke",
    "organisation_register",
    "signed_body_accept",
    "signed_body_check",
    "signed_key_current",
    "signed_nonce_consume",
]
