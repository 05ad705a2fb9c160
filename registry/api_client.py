"""A small client for vendors and owners: signs each request body and sends it. No Django needed.

    python -m registry.api_client --url http://127.0.0.1:8000 --token TOKEN --key-file var/demo-keys/vendor-a.key \\
        event ship --chips A000100,A000101 --field consignee=owner-a --field reference=PO-2026-0042
    python -m registry.api_client ... chip A000100
    python -m registry.api_client ... chips --status in_stock --owner vendor-a
    python -m registry.api_client ... fabricate chips.json          # [{"serial", "model", "public_key", "facility"}]
    python -m registry.api_client ... post /api/inspections/claims claims.json     # any signed write: a JSON object
    python -m registry.api_client ... get /api/inspections/claims/7

The key file holds the base64 32-byte Ed25519 seed of a key registered to your organisation.
Exit status: 0 on success, 1 if the server refused (its JSON answer is printed), 2 on usage or network errors.
"""

from __future__ import annotations

import argparse
import base64
import json
import secrets
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from nacl.signing import SigningKey

from .signing import HEADER, sign


class ApiError(Exception):
    def __init__(self, status: int, answer):
        super().__init__(f"HTTP {status}: {answer}")
        self.status = status
        self.answer = answer


class RegistryClient:
    def __init__(self, url: str, token: str, key: SigningKey | None = None, timeout: float = 300):
        self.url = url.rstrip("/")
        self.token = token
        self.key = key
        self.timeout = timeout

    def post(self, path: str, data: dict, idempotency_key: str | None = None) -> dict:
        """POST data with a fresh timestamp and nonce, signed over the exact bytes sent."""
        if self.key is None:
            raise ValueError("writes need a signing key")
        body = json.dumps({"timestamp": int(time.time()), "nonce": secrets.token_hex(16), **data}).encode()
        headers = {"Content-Type": "application/json", HEADER: sign(self.key, body)}
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        return self._send("POST", path, body, headers)

    def get(self, path: str, **params) -> dict:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        return self._send("GET", f"{path}?{query}" if query else path, None, {})

    def fabricate(self, chips: list[dict], idempotency_key: str | None = None) -> dict:
        return self.post("/api/registry/chips/events/fabricate", {"chips": chips}, idempotency_key)

    def event(self, name: str, chips: list[str], idempotency_key: str | None = None, **fields) -> dict:
        return self.post(f"/api/registry/chips/events/{name}", {"chips": chips, **fields}, idempotency_key)

    def chip(self, serial: str) -> dict:
        return self.get(f"/api/registry/chips/{urllib.parse.quote(serial)}")

    def _send(self, method: str, path: str, body: bytes | None, headers: dict) -> dict:
        request = urllib.request.Request(
            self.url + path, data=body, method=method, headers={**headers, "Authorization": f"Token {self.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            raw = error.read()
            try:
                answer = json.loads(raw)
            except ValueError:
                answer = raw.decode(errors="replace")[:500]
            raise ApiError(error.code, answer) from None


def load_key(path: str) -> SigningKey:
    return SigningKey(base64.b64decode(Path(path).read_text().strip(), validate=True))


def _fields(pairs: list[str]) -> dict:
    fields = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--field takes name=value, got {pair!r}")
        fields[name] = value
    return fields


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="python -m registry.api_client", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    main.add_argument("--url", required=True)
    main.add_argument("--token", required=True, help="your API token")
    main.add_argument("--key-file", help="base64 Ed25519 seed of your organisation's registered key (writes)")
    main.add_argument("--idempotency-key", help="retry-safe: the same key and body return the first answer")
    commands = main.add_subparsers(dest="command", required=True)
    event = commands.add_parser("event", help="record a lifecycle event (ship, export, receive, install, ...)")
    event.add_argument("name")
    event.add_argument("--chips", required=True, help="comma-separated serials, or @FILE with one per line")
    event.add_argument("--field", action="append", default=[], help="name=value, e.g. consignee=owner-a")
    fabricate = commands.add_parser("fabricate", help="register fabricated chips from a JSON file")
    fabricate.add_argument("file")
    post = commands.add_parser(
        "post", help="a signed POST of a JSON file's object, e.g. claims to /api/inspections/claims"
    )
    post.add_argument("path")
    post.add_argument("file")
    commands.add_parser("get", help="GET a path, e.g. /api/inspections/claims/7").add_argument("path")
    commands.add_parser("chip", help="a chip with its history and proofs").add_argument("serial")
    chips = commands.add_parser("chips", help="list chips you may see")
    for name in ("owner", "possessor", "model", "status", "facility", "country"):
        chips.add_argument(f"--{name}")
    return main


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        client = RegistryClient(args.url, args.token, load_key(args.key_file) if args.key_file else None)
        if args.command == "event":
            serials = Path(args.chips[1:]).read_text().split() if args.chips.startswith("@") else args.chips.split(",")
            answer = client.event(args.name, serials, args.idempotency_key, **_fields(args.field))
        elif args.command == "fabricate":
            answer = client.fabricate(json.loads(Path(args.file).read_text()), args.idempotency_key)
        elif args.command == "post":
            answer = client.post(args.path, json.loads(Path(args.file).read_text()), args.idempotency_key)
        elif args.command == "get":
            answer = client.get(args.path)
        elif args.command == "chip":
            answer = client.chip(args.serial)
        else:
            filters = {k: getattr(args, k) for k in ("owner", "possessor", "model", "status", "facility", "country")}
            answer = client.get("/api/registry/chips", **filters)
    except ApiError as error:
        print(json.dumps(error.answer, indent=2), file=sys.stderr)
        return 1
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(answer, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
