"""Celery tasks of the ledger: thin wrappers over services."""

from celery import shared_task

from . import services


@shared_task(name="ledger.tasks.checkpoint_if_grown")
def checkpoint_if_grown() -> int | None:
    """Beat: sign a checkpoint when the log has grown since the last one."""
    checkpoint = services.checkpoint_if_grown()
    return None if checkpoint is None else checkpoint.size


@shared_task(name="ledger.tasks.witnesses_cosign_latest")
def witnesses_cosign_latest() -> dict:
    """Beat: ask the witnesses (C2SP tlog-witness) to cosign the latest checkpoint; {witness: HTTP status}."""
    return {answer.witness: answer.status for answer in services.witnesses_cosign_latest()}
