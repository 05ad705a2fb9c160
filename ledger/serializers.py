"""Explicit input/output serializers of the ledger API (the shapes of docs/ledger.md, Endpoints)."""

import base64

from django.conf import settings
from rest_framework import serializers

from .services import format_time

MAX_INDEX = 2**62  # beyond any real log; keeps absurd integers a clean 400


class EntriesQuery(serializers.Serializer):
    start = serializers.IntegerField(min_value=0, max_value=MAX_INDEX, default=0)
    end = serializers.IntegerField(min_value=0, max_value=MAX_INDEX, required=False)

    def validate(self, attrs):
        end = attrs.get("end")
        if end is not None and end - attrs["start"] > settings.LEDGER_MAX_PAGE:
            raise serializers.ValidationError(
                {"end": f"page too large: at most {settings.LEDGER_MAX_PAGE} entries per request"}
            )
        return attrs


class InclusionQuery(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, max_value=MAX_INDEX)
    size = serializers.IntegerField(min_value=1, max_value=MAX_INDEX)


class ConsistencyQuery(serializers.Serializer):
    first = serializers.IntegerField(min_value=0, max_value=MAX_INDEX)
    second = serializers.IntegerField(min_value=0, max_value=MAX_INDEX)


class EntryOut(serializers.Serializer):
    seq = serializers.IntegerField()
    leaf = serializers.SerializerMethodField(help_text="base64 of the exact leaf bytes")
    hash = serializers.SerializerMethodField(help_text="hex SHA-256(0x00 || leaf)")
    kind = serializers.CharField()
    actor = serializers.CharField()
    time = serializers.SerializerMethodField()

    def get_leaf(self, row) -> str:
        return base64.b64encode(bytes(row["leaf"])).decode()

    def get_hash(self, row) -> str:
        return bytes(row["hash"]).hex()

    def get_time(self, row) -> str:
        return format_time(row["time"])


class EntriesOut(serializers.Serializer):
    entries = EntryOut(many=True)


class ProofHashes(serializers.ListField):
    child = serializers.CharField(help_text="base64 node hash")


class InclusionOut(serializers.Serializer):
    index = serializers.IntegerField()
    size = serializers.IntegerField()
    hashes = ProofHashes()


class ConsistencyOut(serializers.Serializer):
    first = serializers.IntegerField()
    second = serializers.IntegerField()
    hashes = ProofHashes()


class CosignatureIn(serializers.Serializer):
    checkpoint = serializers.CharField(max_length=65536, trim_whitespace=False)
    cosignature = serializers.CharField(max_length=4096, trim_whitespace=False)


class CosignatureOut(serializers.Serializer):
    size = serializers.IntegerField(source="checkpoint.size")
    witness = serializers.CharField(source="witness.name")
    timestamp = serializers.IntegerField()


def b64(values) -> list[str]:
    return [base64.b64encode(value).decode() for value in values]


class Detail(serializers.Serializer):
    detail = serializers.CharField()
