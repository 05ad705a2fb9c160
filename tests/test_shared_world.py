"""tests/shared_world.py: a world seeded once per module is what each test that uses it starts from, whatever the
test before changed, and no other test sees it. They run in file order (pytest-django runs a module's
transactional tests after its others), which is the point."""

import pytest
from django.contrib.auth import get_user_model

from tests.shared_world import OPEN, seeded_once_per_module

SEEDED = []  # one item per seeding


def probe_world() -> int:
    SEEDED.append(1)
    return get_user_model().objects.create_user("seeded").pk


probe_world_fixture = seeded_once_per_module(probe_world)


def usernames() -> set:
    return set(get_user_model().objects.values_list("username", flat=True))


@pytest.mark.django_db
def test_a_test_may_change_the_world(probe_world):
    assert usernames() == {"seeded"} and len(SEEDED) == 1
    get_user_model().objects.filter(pk=probe_world).update(username="renamed")
    get_user_model().objects.create_user("added")


@pytest.mark.django_db
def test_the_next_starts_from_the_world_as_seeded_not_seeded_again(probe_world):
    assert usernames() == {"seeded"} and len(SEEDED) == 1
    assert OPEN.key == (__name__, "probe_world")


@pytest.mark.django_db
def test_a_test_without_the_world_sees_an_empty_database():
    assert OPEN.key is None
    assert usernames() == set()


@pytest.mark.django_db
def test_the_world_is_seeded_again_after_it_was_left(probe_world):
    assert usernames() == {"seeded"} and len(SEEDED) == 2


@pytest.mark.django_db(transaction=True)
def test_a_transactional_test_seeds_its_own_world_in_its_own_database(probe_world):
    assert OPEN.key is None
    assert usernames() == {"seeded"} and len(SEEDED) == 3
