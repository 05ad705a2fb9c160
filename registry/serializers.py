"""Explicit output serializers of the registry API (writes are validated in services)."""

import base64

from rest_framework import serializers

from .models import Chip, ChipModel, Organisation


class OrganisationOut(serializers.ModelSerializer):
    parent = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)

    class Meta:
        model = Organisation
        fields = ["slug", "legal_name", "country", "roles", "parent", "registered_seq"]


class ChipModelOut(serializers.ModelSerializer):
    vendor = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = ChipModel
        fields = ["slug", "name", "vendor", "export_class", "peak_flops_16bit", "memory_bytes", "registered_seq"]


class ChipOut(serializers.ModelSerializer):
    model = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    fab = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    owner = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    possessor = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    consignee = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    pending_owner = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    facility = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    public_key = serializers.SerializerMethodField()

    class Meta:
        model = Chip
        fields = [
            "serial",
            "model",
            "fab",
            "owner",
            "possessor",
            "consignee",
            "pending_owner",
            "facility",
            "country",
            "status",
            "public_key",
            "fabricated_seq",
            "updated_seq",
        ]

    def get_public_key(self, chip) -> str:
        return base64.b64encode(bytes(chip.public_key)).decode()


class HistoryEventOut(serializers.Serializer):
    seq = serializers.IntegerField()
    kind = serializers.CharField()
    actor = serializers.CharField()
    tree_size = serializers.IntegerField(help_text="size of the checkpoint the proof is for")
    proof = serializers.SerializerMethodField(help_text="base64 inclusion proof hashes; null until checkpointed")

    def get_proof(self, event) -> list[str] | None:
        if event["proof"] is None:
            return None
        return [base64.b64encode(h).decode() for h in event["proof"]]


class ChipDetailOut(ChipOut):
    history = serializers.SerializerMethodField()

    class Meta(ChipOut.Meta):
        fields = [*ChipOut.Meta.fields, "history"]

    def get_history(self, chip) -> list[dict]:
        return HistoryEventOut(self.context["history"], many=True).data


class ChipSoldOut(serializers.Serializer):
    """A chip the caller sold: what it was, and its history up to the sale (nothing after it)."""

    serial = serializers.CharField()
    model = serializers.CharField(source="model.slug")
    fab = serializers.CharField(source="fab.slug")
    fabricated_seq = serializers.IntegerField()
    sold_to = serializers.SerializerMethodField(help_text="the buyer who accepted the transfer")
    sold_seq = serializers.SerializerMethodField(help_text="the ledger entry of the sale; the history ends there")
    history = serializers.SerializerMethodField()

    def get_sold_to(self, chip) -> str:
        return self.context["sale"]["actor"]

    def get_sold_seq(self, chip) -> int:
        return self.context["sale"]["seq"]

    def get_history(self, chip) -> list[dict]:
        return HistoryEventOut(self.context["history"], many=True).data


class WriteOut(serializers.Serializer):
    seq = serializers.IntegerField(help_text="the ledger entry that recorded the request")
    kind = serializers.CharField()
    count = serializers.IntegerField(required=False)
