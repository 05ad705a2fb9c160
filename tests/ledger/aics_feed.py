"""Runs inside var/aics-venv with only aics-witness: its log-side client (WitnessClient) feeds our witness.

    aics_feed.py SPEC.json

SPEC: {"url", "vkey", "steps": [{"note": signed checkpoint, "proofs": {"<old>": [base64...]}, "fresh": bool}]};
"fresh" starts a new client that remembers nothing (it must learn the witness's size from a 409).
Prints [{"ok", "lines" or "error"}] per step.
"""

import base64
import json
import sys

from aics_witness.feeder import WitnessClient


def main() -> int:
    with open(sys.argv[1]) as file:
        spec = json.load(file)
    client = None
    out = []
    for step in spec["steps"]:
        if client is None or step.get("fresh"):
            client = WitnessClient(spec["url"], spec["vkey"], max_attempts=1)
        proofs = {int(old): [base64.b64decode(h) for h in hashes] for old, hashes in step["proofs"].items()}
        try:
            lines = client.submit(step["note"], lambda old, new, proofs=proofs: proofs[old])
            out.append({"ok": True, "lines": lines})
        except Exception as error:  # what the independent client refused, and why
            out.append({"ok": False, "error": f"{type(error).__name__}: {error}"})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
