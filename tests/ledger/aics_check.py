"""Runs inside var/aics-venv (Python >= 3.12) with only aics-tlog: never imports our code.

    aics_check.py URL LOG_VKEY [--witness VKEY ... --quorum K] [--proofs INDEX,SIZE,OLD ...]

Reads the checkpoint from URL (a tlog-tiles prefix), verifies its signature and cosignatures, audits
every tile and entry bundle of its tree, and computes inclusion and consistency proofs from tiles
alone. Prints one JSON report; exit 0 if everything verified, 1 otherwise.
"""

import argparse
import base64
import json
import sys

import aics_tlog as t


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("log_key")
    parser.add_argument("--witness", action="append", default=[])
    parser.add_argument("--quorum", type=int, default=0)
    parser.add_argument("--proofs", action="append", default=[], help="INDEX,SIZE,OLD")
    args = parser.parse_args()
    report = {"ok": False}
    try:
        reader = t.HttpTileReader([args.url], proxies={})
        note = t.parse_note(reader.read_checkpoint())
        checked = t.verify_checkpoint(
            note, t.parse_vkey(args.log_key), [t.parse_vkey(w) for w in args.witness], args.quorum
        )
        report.update(checkpoint_ok=checked.ok, cosignatures=checked.cosignature_count, error=checked.error)
        if not checked.ok:
            print(json.dumps(report))
            return 1
        size, root = checked.size, checked.root
        report.update(size=size, root=root.hex())
        audit = t.audit_tiles(reader, size, root)
        report.update(tiles=audit.tiles, bundles=audit.bundles)
        verified = t.VerifiedTileReader(reader, size, root)
        proofs = []
        for spec in args.proofs:
            index, proof_size, old = (int(x) for x in spec.split(","))
            inclusion = t.inclusion_proof_from_tiles(verified, index, proof_size, tile_size=size)
            consistency = t.consistency_proof_from_tiles(verified, old, proof_size, tile_size=size)
            proofs.append(
                {
                    "index": index,
                    "size": proof_size,
                    "old": old,
                    "entry": base64.b64encode(t.read_entry(verified, index, size)).decode(),
                    "inclusion": [base64.b64encode(h).decode() for h in inclusion],
                    "consistency": [base64.b64encode(h).decode() for h in consistency],
                }
            )
        report["proofs"] = proofs
    except Exception as error:  # report what the client refused, and why
        report["error"] = f"{type(error).__name__}: {error}"
        print(json.dumps(report))
        return 1
    report["ok"] = True
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
