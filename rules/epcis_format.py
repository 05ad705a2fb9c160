"""GS1 EPCIS 2.0 over the chip lifecycle: capture an EPCISDocument as ledger entries, answer a chip's
history as EPCIS ObjectEvents. This module is the pure part, no Django: parsing a document into
``CaptureEvent``s and rendering ledger entries as ObjectEvents, no ORM, no ledger writes. A refusal is
``EpcisInvalid`` naming each bad path; ``registry.services.epcis.epcis_document_parse`` turns it into the
``ValidationError`` the API answers with a 400. Applying the events is ``registry.services.epcis.epcis_capture``;
reading a chip's history is ``registry.selectors.chip_object_events``.

Capture (``POST /api/epcis/capture``)

- The body is a JSON-LD ``EPCISDocument``: ``@context`` including the GS1 EPCIS 2.0 context,
  ``type: "EPCISDocument"``, ``schemaVersion: "2.0"``, ``creationDate`` and ``epcisBody.eventList``
  (1 to 100 events, at most 10,000 EPCs in all). Like every write it is signed over its exact bytes
  (docs/security.md, Signed writes), so the document carries the replay fields as top-level extension members:
  ``timestamp`` (Unix seconds) and ``nonce``.
- Only ObjectEvents. Each event is one lifecycle event, so one ledger entry carrying the whole signed
  document; a document is applied in order, all or nothing::

      bizStep          action   lifecycle
      commissioning    ADD      fabricated     ilmd: chipledger:model, chipledger:publicKeys {epc: base64}
      shipping         OBSERVE  shipped, or exported when it crosses a border (needs chipledger:exportLicence)
      receiving        OBSERVE  received       into the facility of bizLocation (else readPoint): required
      decommissioning  DELETE   decommissioned
      destroying       DELETE   destroyed

  bizStep and source/destination types are accepted as bare words, ``https://ref.gs1.org/cbv/BizStep-<w>``
  / ``SDT-<w>`` or ``urn:epcglobal:cbv:bizstep:<w>`` / ``urn:epcglobal:cbv:sdt:<w>``.
- Chips: SGTIN ``urn:epc:id:sgtin:<CompanyPrefix>.<ItemRef>.<Serial>``, GS1 Digital Link
  ``https://<host>/01/<GTIN-14>/21/<Serial>`` or ``https://chipledger.example/chip/<Serial>``. The
  percent-decoded serial component is the chip serial; prefix and GTIN are checked for form (and
  the GTIN's check digit) only, as chipledger keeps no GTIN registry.
- Organisations: ``https://chipledger.example/org/<slug>`` or a bare slug. Facilities (readPoint,
  bizLocation, a ``location`` source/destination): ``https://chipledger.example/facility/<slug>`` or
  a bare slug. SGLN/PGLN are refused for the same reason as GTINs.
- Shipping: the consignee is the destination ``possessing_party``, else its ``owning_party`` (an owner
  changes only by a transfer both parties sign, so owning_party never makes anyone owner); the
  reference is the first ``bizTransactionList`` entry; the destination country is that of the
  destination ``location`` facility, else the consignee's. It is an export when that country differs
  from a chip's, or when ``chipledger:exportLicence`` is given; an export without a licence is refused.
  The acting side must be the signer: a source possessing_party when shipping, a destination
  possessing_party when receiving. Other steps refuse source/destination lists: they hand nothing over.
  Chips the caller may not see are reported as unknown, as the reads answer 404 for them.
- Members not listed above: ``recordTime``, ``disposition``, ``persistentDisposition``,
  ``certificationInfo`` and ``bizTransactionList`` off shipping are informational (the signed document
  stays on the ledger verbatim). Any other member (``errorDeclaration``, ``quantityList``,
  ``sensorElementList`` ...), an unknown ``chipledger:`` member, and every member of another extension
  namespace (``acme:note``) is refused, as is everything malformed, with a 400 naming its path: the signed
  document is published on the ledger for ever, so free text a capture does not need never reaches it.
  For the same reason the document takes only ``@context`` (the GS1 EPCIS 2.0 context and
  ``{"chipledger": "https://chipledger.example/epcis/"}``), ``type``, ``schemaVersion``, ``creationDate``,
  ``epcisBody`` (only ``eventList``), ``timestamp`` and ``nonce`` at the top (no ``epcisHeader``, ``sender``
  ...), and an ``ilmd`` only ``chipledger:model`` and ``chipledger:publicKeys``.
- Dedupe on ``eventID``, any URI taken as given (GS1's ``ni:///sha-256;<hex>?ver=CBV2.0`` hash ids are
  not recomputed). Without one the id is ``ni:///sha-256;<hex>?ver=chipledger-jcs-1``: SHA-256 of the
  RFC 8785 (JCS) canonical JSON of the event object as sent. The id is kept in the entry's payload
  (``"epcis": {"event_id": ...}``), so dedupe needs no table and survives a rebuild from the ledger.
  An event whose id is on an earlier entry of one of its chips that the caller may see (or earlier in
  the same document) is skipped and reported as ``duplicate``; nothing is written for it.

Query (``GET /api/epcis/events?epc=``): see ``registry.selectors.chip_object_events`` and ``object_event``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace
from datetime import datetime
from urllib.parse import unquote

import rfc8785

from rules.identifiers import MAX_CHIPS, SERIAL, SLUG, is_chip_public_key
from tlog.chain import format_time

BASE = "https://chipledger.example/"
ORG_URI, FACILITY_URI, CHIP_URI = BASE + "org/", BASE + "facility/", BASE + "chip/"
EXTENSION = "chipledger"
GS1_CONTEXT = "https://ref.gs1.org/standards/epcis/2.0.0/epcis-context.jsonld"
GS1_CONTEXTS = {GS1_CONTEXT, "https://ref.gs1.org/standards/epcis/epcis-context.jsonld"}
CONTEXT = [GS1_CONTEXT, {EXTENSION: BASE + "epcis/"}]
CBV = "https://ref.gs1.org/cbv/"
# Every entry carries the whole signed document (docs/ledger.md, Entries: submission): bound events x body size.
MAX_EVENTS = 100
MAX_EPCS = MAX_CHIPS

STEPS = {  # bizStep -> the action CBV pairs it with
    "commissioning": "ADD",
    "shipping": "OBSERVE",
    "receiving": "OBSERVE",
    "decommissioning": "DELETE",
    "destroying": "DELETE",
}
HANDOVER_STEPS = {"shipping", "receiving"}
PARTY_TYPES = {"owning_party", "possessing_party"}
APPLIED = {
    "type",
    "eventTime",
    "eventTimeZoneOffset",
    "eventID",
    "action",
    "bizStep",
    "epcList",
    "readPoint",
    "bizLocation",
    "sourceList",
    "destinationList",
    "bizTransactionList",
    "ilmd",
    "chipledger:exportLicence",
    "chipledger:reason",
    "chipledger:evidence",
}
INFORMATIONAL = {"recordTime", "disposition", "persistentDisposition", "certificationInfo"}
DOCUMENT_MEMBERS = {"@context", "type", "schemaVersion", "creationDate", "epcisBody", "timestamp", "nonce"}
ILMD_MEMBERS = {f"{EXTENSION}:model", f"{EXTENSION}:publicKeys"}
PUBLISHED = "the signed document is published on the ledger, so it carries only what a capture applies"

SGTIN = re.compile(r"urn:epc:id:sgtin:([0-9]{6,12})\.([0-9]{1,7})\.([!-~]+)")
DIGITAL_LINK = re.compile(r"https://[A-Za-z0-9.-]+(?::[0-9]+)?/01/([0-9]{14})/21/([!-\"$-.0->@-~]+)")
EVENT_ID = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[!-~]{1,250}")
TZ_OFFSET = re.compile(r"[+-](0[0-9]|1[0-4]):[0-5][0-9]")


class EpcisInvalid(Exception):
    """A document or query the mapping refuses: ``message_dict`` is {path: [reason, ...]} (the shape of
    Django's ValidationError, which the registry raises from it)."""

    def __init__(self, errors: dict[str, str | list[str]]):
        self.message_dict = {path: [r] if isinstance(r, str) else list(r) for path, r in errors.items()}
        super().__init__(self.message_dict)

    @property
    def messages(self) -> list[str]:
        return [reason for reasons in self.message_dict.values() for reason in reasons]


def _fail(path: str, reason: str):
    raise EpcisInvalid({path: reason})


@dataclass(frozen=True)
class CaptureEvent:
    """One ObjectEvent, checked and reduced to what the lifecycle needs."""

    path: str
    event_id: str
    step: str
    serials: tuple[str, ...]
    facility: str | None = None
    source: dict = field(default_factory=dict)  # type -> organisation or facility slug
    destination: dict = field(default_factory=dict)
    reference: str | None = None
    export_licence: str | None = None
    reason: str | None = None  # decommissioning / destroying: why, and a reference to the evidence
    evidence: str | None = None
    model: str | None = None
    public_keys: tuple[str, ...] = ()


# --- identifiers (pure) ---------------------------------------------------------------


def chip_serial(epc, *, bare: bool = False) -> str:
    """The chip serial an EPC names; ValueError saying why not. ``bare`` also takes a plain serial."""
    if not isinstance(epc, str):
        raise ValueError("must be an EPC URI string")
    if sgtin := SGTIN.fullmatch(epc):
        if len(sgtin[1]) + len(sgtin[2]) != 13:
            raise ValueError("SGTIN company prefix and item reference must have 13 digits together")
        serial = unquote(sgtin[3])
    elif link := DIGITAL_LINK.fullmatch(epc):
        if not _gtin_check_digit_ok(link[1]):
            raise ValueError(f"GTIN {link[1]} has a wrong check digit")
        serial = unquote(link[2])
    elif epc.startswith(CHIP_URI):
        serial = unquote(epc[len(CHIP_URI) :])
    elif bare and SERIAL.fullmatch(epc):
        serial = epc
    else:
        raise ValueError(
            f"unsupported EPC {epc[:80]!r}: use urn:epc:id:sgtin:<prefix>.<item>.<serial>, "
            f"https://id.gs1.org/01/<GTIN-14>/21/<serial> or {CHIP_URI}<serial>"
        )
    if not SERIAL.fullmatch(serial):
        raise ValueError(f"serial {serial[:80]!r} is not a chip serial (letters, digits, '.', '_', '-')")
    return serial


def _gtin_check_digit_ok(gtin: str) -> bool:
    """GS1 mod-10: weights 3, 1, 3 ... from the digit left of the check digit."""
    total = sum(int(d) * (3 if i % 2 == 0 else 1) for i, d in enumerate(reversed(gtin[:-1])))
    return (10 - total % 10) % 10 == int(gtin[-1])


def _slug(value, prefix: str, what: str, path: str) -> str:
    """An organisation or facility named by chipledger URI or bare slug."""
    slug = value[len(prefix) :] if isinstance(value, str) and value.startswith(prefix) else value
    if not isinstance(slug, str) or not SLUG.fullmatch(slug):
        _fail(path, f"unsupported {what} id {_shown(value)}: use {prefix}<slug> or a bare {what} slug")
    return slug


def _shown(value) -> str:
    """A sender's value in an error message, at most 80 characters: a 5,000-digit number or a list nested
    10,000 deep has no repr (ValueError, RecursionError), so such values are named by their type."""
    if isinstance(value, str):
        return repr(value[:80])
    if value is None or isinstance(value, bool | float) or (isinstance(value, int) and abs(value) < 10**60):
        return repr(value)
    return {"int": "an integer of more than 60 digits", "dict": "an object", "list": "a list"}.get(
        type(value).__name__, "a value"
    )


def _cbv_word(value, vocabulary: str, path: str) -> str:
    """A CBV term as its bare word, from any of its three spellings."""
    if not isinstance(value, str) or not value:
        _fail(path, "required")
    for prefix in (f"{CBV}{vocabulary}-", f"urn:epcglobal:cbv:{vocabulary.lower()}:"):
        if value.startswith(prefix):
            return value[len(prefix) :]
    return value


def event_hash_id(raw: dict) -> str:
    """chipledger's stable id for an event sent without ``eventID`` (see the module docstring)."""
    return f"ni:///sha-256;{hashlib.sha256(rfc8785.dumps(raw)).hexdigest()}?ver=chipledger-jcs-1"


# --- capture: parsing (pure) ------------------------------------------------------------


def parse_document(data: dict) -> list[CaptureEvent]:
    """The document's events, or EpcisInvalid naming every bad path (one per bad event)."""
    raw_events = _check_header(data)
    events, errors = [], {}
    for index, raw in enumerate(raw_events):
        try:
            events.append(parse_event(raw, f"epcisBody.eventList[{index}]"))
        except EpcisInvalid as error:
            errors.update(error.message_dict)
    if errors:
        raise EpcisInvalid(errors)
    if sum(len(event.serials) for event in events) > MAX_EPCS:
        _fail("epcisBody.eventList", f"at most {MAX_EPCS} EPCs per document")
    return events


def _check_header(data: dict) -> list:
    for name in data:
        if name not in DOCUMENT_MEMBERS:
            _fail(name[:64], f"unsupported document member: {PUBLISHED}")
    contexts = data.get("@context") if isinstance(data.get("@context"), list) else [data.get("@context")]
    if not GS1_CONTEXTS & {c for c in contexts if isinstance(c, str)}:
        _fail("@context", f"must include the EPCIS 2.0 JSON-LD context {GS1_CONTEXT}")
    for index, context in enumerate(contexts):
        if not (isinstance(context, str) and context in GS1_CONTEXTS) and context != CONTEXT[1]:
            _fail(f"@context[{index}]", f"only {GS1_CONTEXT} and {CONTEXT[1]}: {PUBLISHED}")
    if data.get("type") != "EPCISDocument":
        _fail("type", f"must be 'EPCISDocument', not {_shown(data.get('type'))}")
    if data.get("schemaVersion") != "2.0":
        _fail("schemaVersion", f"must be '2.0' (EPCIS 2.0), not {_shown(data.get('schemaVersion'))}")
    _datetime(data.get("creationDate"), "creationDate")
    body = data.get("epcisBody")
    for name in body if isinstance(body, dict) else ():
        if name != "eventList":
            _fail(f"epcisBody.{name[:64]}", f"unsupported member: {PUBLISHED}")
    events = body.get("eventList") if isinstance(body, dict) else None
    if not isinstance(events, list) or not 1 <= len(events) <= MAX_EVENTS:
        _fail("epcisBody.eventList", f"required: a list of 1 to {MAX_EVENTS} events")
    return events


def _datetime(value, path: str) -> None:
    try:
        parsed = datetime.fromisoformat(value) if isinstance(value, str) and "T" in value else None
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        _fail(path, "required: an RFC 3339 date-time with offset, e.g. 2026-03-01T12:00:00Z")


def parse_event(raw, path: str) -> CaptureEvent:
    if not isinstance(raw, dict):
        _fail(path, "must be an event object")
    if raw.get("type") != "ObjectEvent":
        _fail(f"{path}.type", f"unsupported: {_shown(raw.get('type'))}; only ObjectEvent maps onto the chip lifecycle")
    _check_members(raw, path)
    _datetime(raw.get("eventTime"), f"{path}.eventTime")
    if not isinstance(raw.get("eventTimeZoneOffset"), str) or not TZ_OFFSET.fullmatch(raw["eventTimeZoneOffset"]):
        _fail(f"{path}.eventTimeZoneOffset", "required: e.g. '+01:00'")
    step = _cbv_word(raw.get("bizStep"), "BizStep", f"{path}.bizStep")
    if step not in STEPS:
        _fail(f"{path}.bizStep", f"unsupported: {raw['bizStep']!r}; one of {sorted(STEPS)}")
    if raw.get("action") != STEPS[step]:
        _fail(f"{path}.action", f"{step} is captured with action {STEPS[step]}, not {_shown(raw.get('action'))}")
    epcs = _epc_list(raw.get("epcList"), f"{path}.epcList")
    event = CaptureEvent(
        path=path,
        event_id=_event_id(raw, path),
        step=step,
        serials=tuple(epcs.values()),
        facility=_facility(raw, path),
        source=_parties(raw, "sourceList", "source", path, step),
        destination=_parties(raw, "destinationList", "destination", path, step),
        export_licence=_text(raw.get("chipledger:exportLicence"), f"{path}.chipledger:exportLicence", required=False),
    )
    if step in ("decommissioning", "destroying"):
        event = replace(
            event,
            reason=_text(raw.get("chipledger:reason"), f"{path}.chipledger:reason"),
            evidence=_text(raw.get("chipledger:evidence"), f"{path}.chipledger:evidence"),
        )
    elif "chipledger:reason" in raw or "chipledger:evidence" in raw:
        _fail(path, "chipledger:reason and chipledger:evidence belong to decommissioning and destroying events")
    if event.export_licence and step != "shipping":
        _fail(f"{path}.chipledger:exportLicence", "only a shipping event is an export")
    if step == "commissioning":
        return _with_ilmd(event, raw, epcs, path)
    if "ilmd" in raw:
        _fail(f"{path}.ilmd", "only commissioning (ADD) events carry ILMD")
    if step == "shipping":
        return _shipment(event, raw, path)
    return event


def _check_members(raw: dict, path: str) -> None:
    for name in raw:
        if name in APPLIED or name in INFORMATIONAL:
            continue
        if ":" in name and not name.startswith(f"{EXTENSION}:"):
            _fail(f"{path}.{name[:64]}", f"a member of another namespace (only {EXTENSION}: is taken): {PUBLISHED}")
        _fail(f"{path}.{name}", "unsupported member: chipledger cannot apply it to the chip lifecycle")


def _event_id(raw: dict, path: str) -> str:
    if "eventID" not in raw:
        try:
            return event_hash_id(raw)
        except RecursionError:
            _fail(path, "nests too deeply to hash an eventID; send an eventID")
        except (rfc8785.CanonicalizationError, TypeError, ValueError) as error:  # a giant int: ValueError
            reason = (
                str(error)[:120] if not isinstance(error, rfc8785.IntegerDomainError) else "an integer beyond ±2^53"
            )
            _fail(path, f"cannot be canonicalised to hash an eventID: {reason}; send an eventID")
    if not isinstance(raw["eventID"], str) or not EVENT_ID.fullmatch(raw["eventID"]):
        _fail(f"{path}.eventID", "must be a URI, e.g. ni:///sha-256;<hex>?ver=CBV2.0 or urn:uuid:<uuid>")
    return raw["eventID"]


def _epc_list(value, path: str) -> dict[str, str]:
    """EPC -> serial, in order."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_EPCS:
        _fail(path, f"required: a list of 1 to {MAX_EPCS} EPC URIs")
    epcs, seen = {}, set()
    for index, epc in enumerate(value):
        try:
            serial = chip_serial(epc)
        except ValueError as error:
            _fail(f"{path}[{index}]", str(error))
        if serial in seen:  # the same chip as SGTIN and as Digital Link counts twice too
            _fail(f"{path}[{index}]", f"chip {serial} appears twice in this event")
        epcs[epc] = serial
        seen.add(serial)
    return epcs


def _facility(raw: dict, path: str) -> str | None:
    """bizLocation (where the chips now are), else readPoint (where they were seen)."""
    found = None
    for name in ("readPoint", "bizLocation"):
        if name in raw:
            where = raw[name].get("id") if isinstance(raw[name], dict) else None
            found = _slug(where, FACILITY_URI, "facility", f"{path}.{name}.id")
    return found


def _parties(raw: dict, name: str, role: str, path: str, step: str) -> dict:
    entries = raw.get(name)
    if entries is None:
        return {}
    where = f"{path}.{name}"
    if step not in HANDOVER_STEPS:
        _fail(where, f"unsupported on {step}: only shipping and receiving hand chips over")
    if not isinstance(entries, list):
        _fail(where, f"must be a list of {{type, {role}}}")
    parties = {}
    for index, item in enumerate(entries):
        at = f"{where}[{index}]"
        kind = _cbv_word(item.get("type") if isinstance(item, dict) else None, "SDT", f"{at}.type")
        if kind not in PARTY_TYPES | {"location"} or kind in parties:
            _fail(f"{at}.type", f"one each of owning_party, possessing_party, location; not {item['type']!r}")
        prefix, what = (FACILITY_URI, "facility") if kind == "location" else (ORG_URI, "organisation")
        parties[kind] = _slug(item.get(role), prefix, what, f"{at}.{role}")
    return parties


def _text(value, path: str, *, required: bool = True) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= 128:
        _fail(path, "required: a string of 1 to 128 characters")
    return value


def _shipment(event: CaptureEvent, raw: dict, path: str) -> CaptureEvent:
    if not PARTY_TYPES & set(event.destination):
        _fail(f"{path}.destinationList", "required on shipping: a possessing_party (or owning_party), the consignee")
    transactions = raw.get("bizTransactionList")
    if not isinstance(transactions, list) or not transactions or not isinstance(transactions[0], dict):
        _fail(f"{path}.bizTransactionList", "required on shipping: [{type, bizTransaction}], the reference")
    reference = _text(transactions[0].get("bizTransaction"), f"{path}.bizTransactionList[0].bizTransaction")
    return replace(event, reference=reference)


def _with_ilmd(event: CaptureEvent, raw: dict, epcs: dict[str, str], path: str) -> CaptureEvent:
    ilmd = raw.get("ilmd")
    if not isinstance(ilmd, dict):
        _fail(f"{path}.ilmd", "required on commissioning: {chipledger:model, chipledger:publicKeys: {epc: key}}")
    for name in ilmd:
        if name not in ILMD_MEMBERS:
            _fail(f"{path}.ilmd.{name[:64]}", f"unsupported member (only {sorted(ILMD_MEMBERS)}): {PUBLISHED}")
    model = ilmd.get(f"{EXTENSION}:model")
    if not isinstance(model, str) or not SLUG.fullmatch(model):
        _fail(f"{path}.ilmd.{EXTENSION}:model", "required: the chip model's slug, e.g. 'h100-sxm'")
    keys = ilmd.get(f"{EXTENSION}:publicKeys")
    where = f"{path}.ilmd.{EXTENSION}:publicKeys"
    if not isinstance(keys, dict) or set(keys) != set(epcs):
        _fail(where, "required: one entry per EPC of epcList, {epc: base64 of the chip's 32-byte Ed25519 key}")
    for epc in epcs:
        if not is_chip_public_key(keys[epc]):
            _fail(
                f"{where}[{epc}]",
                "base64 of the chip's 32-byte Ed25519 public key (canonical: padded, spare bits zero)",
            )
    return replace(event, model=model, public_keys=tuple(keys[epc] for epc in epcs))


# --- query: rendering (pure) ------------------------------------------------------------

# ledger kind -> (bizStep, action, disposition); steps CBV lacks get chipledger URIs.
KIND_STEPS = {
    "chip.fabricated": ("commissioning", "ADD", "active"),
    "chip.packaged": ("packing", "OBSERVE", None),
    "chip.shipped": ("shipping", "OBSERVE", "in_transit"),
    "chip.exported": ("shipping", "OBSERVE", "in_transit"),
    "chip.received": ("receiving", "OBSERVE", "in_progress"),
    "chip.installed": ("installing", "OBSERVE", "active"),
    "chip.removed": ("removing", "OBSERVE", None),
    "chip.decommissioned": ("decommissioning", "DELETE", "inactive"),
    "chip.destroyed": ("destroying", "DELETE", "destroyed"),
    "chip.reported_stolen": (f"{BASE}epcis/BizStep-reported_stolen", "OBSERVE", "stolen"),
    "chip.reported_lost": (f"{BASE}epcis/BizStep-reported_lost", "OBSERVE", "unknown"),
}
EXTENSION_FIELDS = {
    "destination_country": "destinationCountry",
    "export_licence": "exportLicence",
    "to_owner": "toOwner",
    "note": "note",
}


def query_serial(epc) -> str:
    """The serial of ``?epc=`` (SGTIN, Digital Link, chipledger chip URI or bare serial)."""
    try:
        return chip_serial(epc, bare=True)
    except ValueError as error:
        reason = str(error) if epc else "required: the chip's SGTIN, Digital Link or serial"
        raise EpcisInvalid({"epc": reason}) from None


def object_event(entry: dict, serial: str, epc: str) -> dict:
    """One ledger entry as an EPCIS 2.0 ObjectEvent (pure): eventTime is the ledger time."""
    kind, payload = entry["kind"], entry["payload"]
    unmapped = (f"{BASE}epcis/BizStep-{kind.removeprefix('chip.')}", "OBSERVE", None)  # transfers, found
    step, action, disposition = KIND_STEPS.get(kind, unmapped)
    when = format_time(entry["time"])
    event = {"type": "ObjectEvent", "eventTime": when, "eventTimeZoneOffset": "+00:00", "recordTime": when}
    if payload.get("epcis"):
        event["eventID"] = payload["epcis"]["event_id"]
    event.update(epcList=[epc], action=action, bizStep=step, **({"disposition": disposition} if disposition else {}))
    if payload.get("facility"):
        event["bizLocation"] = {"id": FACILITY_URI + payload["facility"]}
    if payload.get("reference"):
        event["bizTransactionList"] = [{"bizTransaction": payload["reference"]}]
    if payload.get("consignee"):
        event["sourceList"] = [{"type": "possessing_party", "source": ORG_URI + entry["actor"]}]
        event["destinationList"] = [{"type": "possessing_party", "destination": ORG_URI + payload["consignee"]}]
    if kind == "chip.received":
        event["destinationList"] = [{"type": "possessing_party", "destination": ORG_URI + entry["actor"]}]
    if kind == "chip.fabricated":
        event.update(_fabricated(payload, serial, epc))
    for name, extension in EXTENSION_FIELDS.items():
        if payload.get(name):
            event[f"{EXTENSION}:{extension}"] = payload[name]
    event.update({f"{EXTENSION}:seq": entry["seq"], f"{EXTENSION}:kind": kind, f"{EXTENSION}:actor": entry["actor"]})
    return event


def _fabricated(payload: dict, serial: str, epc: str) -> dict:
    item = next(chip for chip in payload["chips"] if chip["serial"] == serial)
    extra = {"ilmd": {f"{EXTENSION}:model": item["model"], f"{EXTENSION}:publicKeys": {epc: item["public_key"]}}}
    if item.get("facility"):
        extra["bizLocation"] = {"id": FACILITY_URI + item["facility"]}
    return extra


def query_document(events: list[dict], now: datetime) -> dict:
    return {
        "@context": CONTEXT,
        "type": "EPCISQueryDocument",
        "schemaVersion": "2.0",
        "creationDate": format_time(now),
        "epcisBody": {"queryResults": {"queryName": "SimpleEventQuery", "resultsBody": {"eventList": events}}},
    }
