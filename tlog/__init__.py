"""A transparency log's pure code: no Django, no database (docs/ledger.md).

``merkle`` (RFC 9162 tree, compact ranges, inclusion and consistency proofs), ``note`` (C2SP signed notes,
checkpoints, cosignatures), ``chain`` (leaf bytes and the streaming ``ChainVerifier``), ``logclient`` (the
HTTP client of the public API), and the two outside tools: ``python -m tlog.log_verifier`` and
``python -m tlog.log_witness`` (also run as ``python -m ledger.verify`` / ``ledger.witness``).
Imports only the standard library, PyNaCl, rfc8785 and orjson, so a third party runs it from a bare copy.
"""
