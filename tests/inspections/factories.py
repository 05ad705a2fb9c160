"""An inspections world: two provers with installed chips and three inspection bodies."""

from inspections.services.bodies import inspection_body_register
from tests.registry.factories import chip_model, event, fabricate, facility, organisation

H100 = 989.4e12
YEAR = 86_400 * 365


def make_provers() -> None:
    """owner-a (US) holds 200 chips, owner-b (NL) 50; inspectorates for the US (capacity 3) and the EU."""
    fab, _ = organisation("fab-tw", ["fab"], "TW")
    model = chip_model(fab, "h100-sxm")
    for slug, country, count in (("owner-a", "US", 200), ("owner-b", "NL", 50)):
        owner, _ = organisation(slug, ["owner"], country)
        facility(owner, f"dc-{slug}")
        serials = fabricate(fab, model, count)
        event(fab, "exported", serials, consignee=slug, reference="PO", export_licence="EL")
        event(owner, "received", serials, facility=f"dc-{slug}")
        event(owner, "installed", serials, facility=f"dc-{slug}")
        event(fab, "transfer_offered", serials, to_owner=slug)
        event(owner, "transfer_accepted", serials)
    for slug, countries, capacity in (
        ("inspect-us", ["US"], 3),
        ("inspect-us-2", ["US"], 1),
        ("inspect-eu", ["NL", "DE"], 50),
    ):
        organisation(slug, ["inspection_body"], countries[0])
        inspection_body_register(organisation=slug, countries=countries, capacity_per_period=capacity)


def accepted(task):
    """The task accepted by its body (on the ledger), as it must be before the work at the chip; returned."""
    from inspections.models import InspectionTask
    from inspections.services.inspectors import task_accept

    if task.status == InspectionTask.Status.ASSIGNED:
        task_accept(task, task.inspection_body)
    return task
