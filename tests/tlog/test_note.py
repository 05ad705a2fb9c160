"""tlog.note: signed notes, checkpoints and cosignatures, against fixed vectors."""

import base64
import hashlib

import nacl.exceptions
import nacl.signing
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tlog import note

# --- the canonical known answer: golang.org/x/mod/sumdb/note note_test.go ----------

GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_SKEY_B64 = "AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"  # from PRIVATE+KEY+PeterNeumann+c74f20a3+…
GO_TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
GO_SIG = "— PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
GO_NOTE = GO_TEXT + "\n" + GO_SIG
ENOCH_VKEY = "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop"
ENOCH_SIG = "— EnochRoot rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTGwnWLox33WWd1RvMc+QQ=\n"


def test_go_reference_note_verifies():
    verifier = note.parse_verifier_key(GO_VKEY)
    assert verifier.name == "PeterNeumann"
    assert (verifier.sig_type, verifier.key_id) == (note.ED25519, bytes.fromhex("c74f20a3"))
    assert note.verify_note(GO_NOTE, verifier) == GO_TEXT
    # A second, unknown signer is ignored; with its key, either signature suffices.
    both = GO_NOTE + ENOCH_SIG
    assert note.verify_note(both, verifier) == GO_TEXT
    assert note.verify_note(both, note.parse_verifier_key(ENOCH_VKEY)) == GO_TEXT


def test_go_reference_note_is_reproduced_byte_for_byte():
    raw = base64.b64decode(GO_SKEY_B64)
    assert raw[0] == note.ED25519
    key = nacl.signing.SigningKey(raw[1:])
    assert note.verifier_key("PeterNeumann", bytes(key.verify_key)) == GO_VKEY
    assert note.sign_note(GO_TEXT, "PeterNeumann", key) == GO_NOTE


def test_go_reference_manglings_of_the_key_are_rejected():
    # As note_test.go's TestNewVerifier: every proper substring and every single-byte bump.
    for i in range(len(GO_VKEY) + 1):
        for j in range(i + 1, len(GO_VKEY) + 1):
            if (i, j) != (0, len(GO_VKEY)):
                with pytest.raises(note.NoteError):
                    note.parse_verifier_key(GO_VKEY[i:j])
    for i in range(len(GO_VKEY)):
        bumped = GO_VKEY[:i] + chr(ord(GO_VKEY[i]) + 1) + GO_VKEY[i + 1 :]
        with pytest.raises(note.NoteError):
            note.parse_verifier_key(bumped)
    with pytest.raises(note.NoteError):  # wrong length key, with adjusted key hash
        note.parse_verifier_key("PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY==")
    with pytest.raises(note.NoteError):  # unknown algorithm, with adjusted key hash
        note.parse_verifier_key("PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW")


@pytest.mark.parametrize(
    "text",
    [
        GO_TEXT,
        GO_TEXT + "\n",
        GO_TEXT + "\n" + GO_SIG[:-1],
        "\x01" + GO_TEXT + "\n" + GO_SIG,
        GO_TEXT + "\n" + GO_SIG.replace("PeterNeumann", "Bad Name")[:-1],
        GO_TEXT + "\n" + GO_SIG + "Unexpected line.\n",
        GO_TEXT + "\n" + GO_SIG.replace("— ", "-- "),
        GO_TEXT + "\n" + GO_SIG.replace("— ", "—"),
        GO_TEXT + "\n" + GO_SIG.replace("=\n", "\n"),
        GO_TEXT + "\n" + GO_SIG.replace("x08go", "x08g*"),
        GO_TEXT + "\n" + GO_SIG + "\n",
        GO_TEXT + "\n" + "— PeterNeumann AAAA\n",  # 3 bytes: no room for a key id and signature
        GO_TEXT + "\n" + "— PeterNeumann\n",
        "\ud800" + GO_TEXT + "\n" + GO_SIG,
    ],
)
def test_malformed_notes_are_rejected(text):
    with pytest.raises(note.NoteError):
        note.split_note(text)
    with pytest.raises(note.NoteError):
        note.verify_note(text, note.parse_verifier_key(GO_VKEY))


def test_body_may_contain_blank_lines():
    # The C2SP example: the signatures start after the *last* blank line.
    poem = "Ognuno sta solo sul cuor della terra\ntrafitto da un raggio di sole:\n\ned è subito sera.\n"
    key = nacl.signing.SigningKey(bytes(32))
    signed = note.sign_note(poem, "quasimodo.example/salvatore", key)
    body, sigs = note.split_note(signed)
    assert body == poem and len(sigs) == 1
    verifier = note.parse_verifier_key(note.verifier_key("quasimodo.example/salvatore", bytes(key.verify_key)))
    assert note.verify_note(signed, verifier) == poem


def test_signature_limits():
    many = GO_TEXT + "\n" + GO_SIG * 100
    assert note.verify_note(many, note.parse_verifier_key(GO_VKEY)) == GO_TEXT
    with pytest.raises(note.NoteError):
        note.split_note(GO_TEXT + "\n" + GO_SIG * 101)
    big = "x" * (1 << 20) + "\n"
    with pytest.raises(note.NoteError):
        note.split_note(big + "\n" + GO_SIG)
    with pytest.raises(note.NoteError):  # 1 MiB counted in bytes, not characters
        note.split_note("é" * (1 << 19) + "\n\n" + GO_SIG)


# --- our own vector, checked by hand --------------------------------------------------

SEED = bytes(range(32))
KEY = nacl.signing.SigningKey(SEED)
PUB = bytes(KEY.verify_key)
ORIGIN = "chipledger.example/log"
ROOT = hashlib.sha256(b"root").digest()
BODY = "chipledger.example/log\n42\nSBNJTRN+FjG7owHVrKtue7eqdM4RhdRWVl71HXN2d7I=\n"
SIG_HEX = (
    "66933dad64966061bc5d8cced2df6e8e6f7bdaea7af26cef267c9b8e1fc687e8"
    "9125b907d0c8fff9f211b73203f77c9d90ca73fadde8784b5556b75d9aed7e0c"
)
NOTE = (
    BODY + "\n— chipledger.example/log "
    "0ETEM2aTPa1klmBhvF2MztLfbo5ve9rqevJs7yZ8m44fxofokSW5B9DI//nyEbcyA/d8nZDKc/rd6HhLVVa3XZrtfgw=\n"
)
VKEY = "chipledger.example/log+d044c433+AQOhB7/zzhC+HXDdGOdLwJln5NYwm6UNXx3chmQSVTG4"


def test_key_id_and_verifier_key_by_hand():
    assert PUB.hex() == "03a107bff3ce10be1d70dd18e74bc09967e4d6309ba50d5f1ddc8664125531b8"
    want = hashlib.sha256(b"chipledger.example/log" + b"\n" + b"\x01" + PUB).digest()[:4]
    assert want == bytes.fromhex("d044c433")
    assert note.key_id(ORIGIN, note.ED25519, PUB) == want
    assert note.key_id(ORIGIN, note.COSIGNATURE_V1, PUB) != want  # the type byte is hashed in
    material = base64.b64encode(b"\x01" + PUB).decode()
    assert note.verifier_key(ORIGIN, PUB) == VKEY == f"{ORIGIN}+d044c433+{material}"
    assert note.parse_verifier_key(VKEY) == note.Verifier(ORIGIN, note.ED25519, PUB, want)


def test_checkpoint_note_by_hand():
    assert note.checkpoint_body(ORIGIN, 42, ROOT) == BODY
    signature = bytes.fromhex(SIG_HEX)
    nacl.signing.VerifyKey(PUB).verify(BODY.encode(), signature)  # independent of tlog.note
    line = "— " + ORIGIN + " " + base64.b64encode(bytes.fromhex("d044c433") + signature).decode() + "\n"
    assert BODY + "\n" + line == NOTE
    assert note.sign_note(BODY, ORIGIN, KEY) == NOTE
    assert note.verify_note(NOTE, note.parse_verifier_key(VKEY)) == BODY
    assert note.parse_checkpoint(BODY) == note.Checkpoint(ORIGIN, 42, ROOT)
    body, sigs = note.split_note(NOTE)
    assert body == BODY
    assert sigs == [note.Signature(ORIGIN, bytes.fromhex("d044c433"), signature)]
    assert note.signature_line(ORIGIN, sigs[0].key_id, sigs[0].signature) == line


def test_wrong_key_or_name_is_rejected():
    other = nacl.signing.SigningKey(bytes(range(1, 33)))
    wrong_key = note.Verifier(ORIGIN, note.ED25519, bytes(other.verify_key), note.key_id(ORIGIN, 1, PUB))
    with pytest.raises(note.NoteError):  # right name and id, wrong public key: a failing known key
        note.verify_note(NOTE, wrong_key)
    with pytest.raises(note.NoteError):  # signed by someone else entirely
        note.verify_note(note.sign_note(BODY, ORIGIN, other), note.parse_verifier_key(VKEY))
    renamed = note.parse_verifier_key(note.verifier_key("chipledger.example/other", PUB))
    with pytest.raises(note.NoteError):
        note.verify_note(NOTE, renamed)
    with pytest.raises(note.NoteError):  # the line renamed to match: key id and signature no longer do
        note.verify_note(NOTE.replace("— chipledger.example/log", "— chipledger.example/other"), renamed)


def test_every_single_byte_change_of_the_body_is_rejected():
    verifier = note.parse_verifier_key(VKEY)
    for i in range(len(BODY) - 1):  # the final newline is structural; see split tests
        for replacement in {"A", "0", "\n", "/"} - {BODY[i]}:
            tampered = BODY[:i] + replacement + BODY[i + 1 :] + NOTE[len(BODY) :]
            with pytest.raises(note.NoteError):
                note.verify_note(tampered, verifier)


def test_every_single_character_change_of_the_signature_line_is_rejected():
    verifier = note.parse_verifier_key(VKEY)
    for i in range(len(BODY), len(NOTE) - 1):
        for replacement in {"A", "B", "+", "=", " "} - {NOTE[i]}:
            tampered = NOTE[:i] + replacement + NOTE[i + 1 :]
            with pytest.raises(note.NoteError):
                note.verify_note(tampered, verifier)


def test_missing_blank_line_and_bad_base64_are_rejected():
    verifier = note.parse_verifier_key(VKEY)
    for bad in [
        NOTE.replace("\n\n", "\n"),  # no blank line
        NOTE.replace("— ", "- "),  # hyphen, not em dash
        NOTE.replace("— ", ""),
        NOTE.replace("0ETEM2", "0ETEM!"),  # not base64
        NOTE.replace("fgw=", "fgw"),  # padding missing
        NOTE.replace("fgw=", "fgx="),  # non-zero padding bits: same bytes, different text
        NOTE.replace("fgw=\n", "fgw=\r\n"),
    ]:
        with pytest.raises(note.NoteError):
            note.verify_note(bad, verifier)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**64 - 1), st.binary(min_size=32, max_size=32), st.text(min_size=1, max_size=30))
def test_checkpoint_round_trip(size, root, origin):
    if "\n" in origin or any(ord(c) < 0x20 for c in origin) or any(0xD800 <= ord(c) <= 0xDFFF for c in origin):
        with pytest.raises(note.NoteError):
            note.parse_checkpoint(note.checkpoint_body(origin, size, root))
        return
    body = note.checkpoint_body(origin, size, root)
    assert note.parse_checkpoint(body) == note.Checkpoint(origin, size, root)


def test_checkpoint_parsing_is_strict():
    r64 = base64.b64encode(ROOT).decode()
    assert note.parse_checkpoint(f"o\n0\n{r64}\n").size == 0
    assert note.parse_checkpoint(f"o\n7\n{r64}\next one\next two\n").extensions == ("ext one", "ext two")
    for bad in [
        f"o\n007\n{r64}\n",  # leading zeros
        f"o\n-1\n{r64}\n",
        f"o\n+1\n{r64}\n",
        f"o\n1.0\n{r64}\n",
        f"o\n\u0661\n{r64}\n",  # a non-ASCII digit
        f"o\n{2**64}\n{r64}\n",
        f"o\n 1\n{r64}\n",
        f"\n1\n{r64}\n",  # empty origin
        f"o\n1\n{base64.b64encode(ROOT[:31]).decode()}\n",
        f"o\n1\n{r64[:-1]}\n",
        f"o\n1\n{r64}",  # no final newline
        f"o\n1\n{r64}\n\n",  # empty extension line
        "o\n1\n",
    ]:
        with pytest.raises(note.NoteError):
            note.parse_checkpoint(bad)
    with pytest.raises(note.NoteError):
        note.checkpoint_body("", 1, ROOT)
    with pytest.raises(note.NoteError):
        note.checkpoint_body("o", -1, ROOT)
    with pytest.raises(note.NoteError):
        note.checkpoint_body("o", 1, ROOT[:31])


@pytest.mark.parametrize("material", [b"\x01" + bytes(31), b"\x01" + bytes(33), b"\x01", b"\x02" + bytes(32)])
def test_verifier_keys_with_a_correct_id_but_wrong_material_are_rejected(material):
    kid = hashlib.sha256(b"name\n" + material).digest()[:4]
    with pytest.raises(note.NoteError):
        note.parse_verifier_key(f"name+{kid.hex()}+{base64.b64encode(material).decode()}")


@pytest.mark.parametrize("name", ["", "a b", "a+b", "a\tb", "a\u00a0b", "a\u2003b"])
def test_invalid_key_names(name):
    with pytest.raises(note.NoteError):
        note.verifier_key(name, PUB)
    with pytest.raises(note.NoteError):
        note.sign_note(BODY, name, KEY)


def test_sign_rejects_text_without_final_newline():
    with pytest.raises(note.NoteError):
        note.sign_note(BODY[:-1], ORIGIN, KEY)


# --- cosignature/v1 ------------------------------------------------------------------

W_KEY = nacl.signing.SigningKey(bytes(range(32, 64)))
W_PUB = bytes(W_KEY.verify_key)
W_NAME = "witness.example/w1"
W_VKEY = "witness.example/w1+20324abe+BCmsuuFBvMrwsi4alNNNC8c2HlJtC/4SyJeUvJMilm3X"
W_LINE = (
    "— witness.example/w1 IDJKvgAAAABlU/EAXyF8yJGncffZ23L4ML2kAnQZIzVNaIk39FLqzfJG"
    "QztE8h0UoiKmzXH9W5AZnXq45swqWBBmDDZXhfBpvhdjDw==\n"
)
TS = 1_700_000_000


def test_cosignature_by_hand():
    kid = hashlib.sha256(W_NAME.encode() + b"\n\x04" + W_PUB).digest()[:4]
    assert kid.hex() == "20324abe"
    assert note.verifier_key(W_NAME, W_PUB, note.COSIGNATURE_V1) == W_VKEY
    line = note.cosign(BODY, W_NAME, W_KEY, TS)
    assert line == W_LINE
    raw = base64.b64decode(line.split(" ")[2])
    assert raw[:4] == kid
    assert raw[4:12] == TS.to_bytes(8, "big")
    message = b"cosignature/v1\ntime 1700000000\n" + BODY.encode()
    nacl.signing.VerifyKey(W_PUB).verify(message, raw[12:])  # the exact signed message
    with pytest.raises(nacl.exceptions.BadSignatureError):  # not a plain note signature
        nacl.signing.VerifyKey(W_PUB).verify(BODY.encode(), raw[12:])


def test_cosignature_round_trip_and_rejections():
    verifier = note.parse_verifier_key(W_VKEY)
    assert verifier.sig_type == note.COSIGNATURE_V1
    cosigned = note.add_signature_lines(NOTE, [W_LINE])
    body, sigs = note.split_note(cosigned)
    assert body == BODY and len(sigs) == 2
    assert note.verify_cosignature(body, sigs[1], verifier) == TS
    assert note.verify_note(cosigned, note.parse_verifier_key(VKEY)) == BODY  # the log's signature still holds
    assert note.verify_note(cosigned, verifier) == BODY
    for ts in (0, 1, 2**63 - 1):
        _, (sig,) = note.split_note(BODY + "\n" + note.cosign(BODY, W_NAME, W_KEY, ts))
        assert note.verify_cosignature(BODY, sig, verifier) == ts
    sig = sigs[1]
    as_ed25519 = note.Verifier(W_NAME, note.ED25519, W_PUB, verifier.key_id)
    with pytest.raises(note.NoteError):  # a type-0x01 verifier does not accept cosignatures
        note.verify_cosignature(body, sig, as_ed25519)
    with pytest.raises(note.NoteError):  # nor does the vkey with the type byte changed
        note.parse_verifier_key(W_VKEY.replace("+BCms", "+ASms"))
    with pytest.raises(note.NoteError):
        note.verify_cosignature(body.replace("42", "43"), sig, verifier)
    for i in range(4, 12):  # the timestamp is signed
        changed = bytearray(sig.signature)
        changed[i - 4] ^= 1
        with pytest.raises(note.NoteError):
            note.verify_cosignature(body, note.Signature(sig.name, sig.key_id, bytes(changed)), verifier)
    with pytest.raises(note.NoteError):
        note.verify_cosignature(body, note.Signature(sig.name, sig.key_id, sig.signature[:-1]), verifier)
    with pytest.raises(note.NoteError):
        note.verify_cosignature(body, note.Signature("other", sig.key_id, sig.signature), verifier)
    too_late = 2**63  # signed correctly, but beyond the spec's range
    raw_sig = W_KEY.sign(b"cosignature/v1\ntime %d\n" % too_late + BODY.encode()).signature
    with pytest.raises(note.NoteError):
        late = note.Signature(W_NAME, sig.key_id, too_late.to_bytes(8, "big") + raw_sig)
        note.verify_cosignature(body, late, verifier)
    with pytest.raises(note.NoteError):
        note.cosign(BODY, W_NAME, W_KEY, 2**63)
    with pytest.raises(note.NoteError):
        note.cosign(BODY, W_NAME, W_KEY, -1)
    with pytest.raises(note.NoteError):  # cosigners vouch for checkpoints only
        note.cosign(GO_TEXT, W_NAME, W_KEY, TS)


def test_add_signature_lines_replaces_same_key():
    newer = note.cosign(BODY, W_NAME, W_KEY, TS + 60)
    once = note.add_signature_lines(NOTE, [W_LINE])
    twice = note.add_signature_lines(once, [newer])
    _, sigs = note.split_note(twice)
    assert len(sigs) == 2
    assert note.verify_cosignature(BODY, sigs[1], note.parse_verifier_key(W_VKEY)) == TS + 60
    assert note.add_signature_lines(NOTE, [W_LINE.rstrip("\n")]) == once
    with pytest.raises(note.NoteError):
        note.add_signature_lines(NOTE, ["not a signature line"])
    with pytest.raises(note.NoteError):
        note.add_signature_lines(GO_TEXT, [W_LINE])
