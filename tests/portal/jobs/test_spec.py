"""A job spec is checked on construction and stored as JSON without loss."""

from __future__ import annotations

import pytest

from policies.errors import InvalidRequest
from policies.jobs import TopologyMode
from policies.requests import TopologyRequirement
from portal.jobs.spec import Backend, ClusterFacts, JobSpec, fits_cluster
from tests.portal.jobs.conftest import H100, job

FACTS = ClusterFacts(capacity={H100: 32}, max_gpus_per_node={H100: 8}, models=frozenset({H100}))


def test_a_spec_survives_its_json() -> None:
    spec = job(members=3, gpus=4, topology=TopologyRequirement.SAME_RACK)
    again = JobSpec.from_dict(spec.tenant, spec.owner, spec.name, spec.to_dict())
    assert again == spec


def test_world_sizes_no_cluster_could_hold_are_refused_by_members() -> None:
    fits_cluster(job(members=4, gpus=8), FACTS)
    with pytest.raises(InvalidRequest) as err:
        fits_cluster(job(members=5, gpus=8), FACTS)
    assert err.value.field == "members" and "at most 4 members" in err.value.valid
    same_node = job(members=2, gpus=8, topology=TopologyRequirement.SAME_NODE)
    with pytest.raises(InvalidRequest):
        fits_cluster(same_node, FACTS)
    # Preferred may relax to any: it can run.
    fits_cluster(
        job(members=2, gpus=8, topology=TopologyRequirement.SAME_NODE, mode=TopologyMode.PREFERRED),
        FACTS,
    )


def test_each_backend_needs_what_it_runs() -> None:
    spec = job()
    spec.check_backend(Backend.LOCAL)
    with pytest.raises(InvalidRequest) as err:
        spec.check_backend(Backend.KUBERNETES)
    assert err.value.field == "image"


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ((("WORLD_SIZE", "2"),), "env.WORLD_SIZE"),
        ((("GPUPORTAL_ATTEMPT", "1"),), "env.GPUPORTAL_ATTEMPT"),
    ],
)
def test_the_portals_own_variables_cannot_be_set(
    env: tuple[tuple[str, str], ...], field: str
) -> None:
    from dataclasses import replace

    with pytest.raises(InvalidRequest) as err:
        replace(job(), env=env)
    assert err.value.field == field
