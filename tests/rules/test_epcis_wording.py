"""An EPCIS refusal names a value it cannot show by what it is, in words a reader expects ("an object")."""

import pytest

from rules import epcis_format


@pytest.mark.parametrize(
    "value, shown", [(10**70, "an integer of more than 60 digits"), ({}, "an object"), ([], "a list"), (5, "5")]
)
def test_a_document_type_that_is_not_a_string_is_named_grammatically(value, shown):
    with pytest.raises(epcis_format.EpcisInvalid) as refused:
        epcis_format.parse_document({"@context": [epcis_format.GS1_CONTEXT], "type": value})
    assert refused.value.message_dict == {"type": [f"must be 'EPCISDocument', not {shown}"]}
