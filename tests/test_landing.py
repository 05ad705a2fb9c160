"""`/` tells a new user what the system is and where each kind of user goes."""

import pytest


@pytest.mark.django_db
def test_the_landing_page_points_each_user_to_their_place(client):
    response = client.get("/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "compute regulator" in page
    for link in (
        "/admin/",
        "/portal/",
        "/api/docs/",
        "/api/ledger/checkpoint",
        "/api/ledger/key",
        "python -m ledger.verify",
    ):
        assert link in page, link
