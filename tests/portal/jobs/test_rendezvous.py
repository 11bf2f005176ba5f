"""The rendezvous environment: what each rank of 1-, 2- and 3-node layouts is told, and the
layouts that are refused."""

from __future__ import annotations

import pytest

from policies.errors import InvalidRequest
from portal.jobs.rendezvous import RENDEZVOUS_VARIABLES, rendezvous_env


def _env(members: list[tuple[int, str]], **kw: object) -> list[dict[str, str]]:
    args: dict[str, object] = {
        "job_id": "job-7",
        "attempt": 2,
        "members": members,
        "master_addr": "10.0.0.1",
        "master_port": 29500,
        "checkpoint_dir": "/ckpt/job-7",
        "resume_from": "/ckpt/job-7/step-40",
    }
    args.update(kw)
    return rendezvous_env(**args)  # type: ignore[arg-type]


def _ranks(envs: list[dict[str, str]]) -> list[tuple[str, ...]]:
    keys = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES", "WORLD_SIZE")
    return [tuple(e[k] for k in keys) for e in envs]


def test_one_node_two_ranks() -> None:
    envs = _env([(0, "a"), (1, "a")])
    # (RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, NNODES, WORLD_SIZE)
    assert _ranks(envs) == [("0", "0", "2", "0", "1", "2"), ("1", "1", "2", "0", "1", "2")]


def test_two_nodes_of_two() -> None:
    envs = _env([(0, "a"), (1, "a"), (2, "b"), (3, "b")])
    assert _ranks(envs) == [
        ("0", "0", "2", "0", "2", "4"),
        ("1", "1", "2", "0", "2", "4"),
        ("2", "0", "2", "1", "2", "4"),  # rank 2 opens node b: local rank 0, node rank 1
        ("3", "1", "2", "1", "2", "4"),
    ]


def test_three_nodes_of_uneven_sizes() -> None:
    # Node c holds one rank, node a three, node b two: node order is the order ranks meet them.
    envs = _env([(0, "c"), (1, "a"), (2, "a"), (3, "a"), (4, "b"), (5, "b")])
    assert _ranks(envs) == [
        ("0", "0", "1", "0", "3", "6"),
        ("1", "0", "3", "1", "3", "6"),
        ("2", "1", "3", "1", "3", "6"),
        ("3", "2", "3", "1", "3", "6"),
        ("4", "0", "2", "2", "3", "6"),
        ("5", "1", "2", "2", "3", "6"),
    ]


def test_every_rank_gets_the_shared_variables() -> None:
    for env in _env([(0, "a"), (1, "b")]):
        assert set(env) == set(RENDEZVOUS_VARIABLES)
        assert env["MASTER_ADDR"] == "10.0.0.1"
        assert env["MASTER_PORT"] == "29500"
        assert env["TORCHELASTIC_RUN_ID"] == env["GPUPORTAL_JOB_ID"] == "job-7"
        assert env["GPUPORTAL_ATTEMPT"] == "2"
        assert env["GPUPORTAL_CHECKPOINT_DIR"] == "/ckpt/job-7"
        assert env["GPUPORTAL_RESUME_FROM"] == "/ckpt/job-7/step-40"


def test_no_checkpoint_and_no_resume_are_empty_not_absent() -> None:
    # Set but empty, so a value in the portal's own environment cannot leak into a member's.
    (env,) = _env([(0, "a")], checkpoint_dir=None, resume_from=None)
    assert env["GPUPORTAL_CHECKPOINT_DIR"] == ""
    assert env["GPUPORTAL_RESUME_FROM"] == ""


@pytest.mark.parametrize(
    ("members", "named"),
    [
        ([(0, "a"), (1, "b"), (2, "a")], "rank 2 on node 'a'"),  # node a's block is split
        ([(0, "a"), (1, "b"), (2, "b"), (3, "a")], "rank 3 on node 'a'"),
        ([(1, "a"), (0, "a")], "rank 1 at position 0"),  # not in rank order
        ([(0, "a"), (2, "a")], "rank 2 at position 1"),  # a gap
        ([(0, "a"), (0, "a")], "rank 0 at position 1"),  # a duplicate
        ([(0, "")], "rank 0 on node ''"),
        ([], "[]"),
    ],
)
def test_bad_layouts_are_refused_naming_the_rank(
    members: list[tuple[int, str]], named: str
) -> None:
    with pytest.raises(InvalidRequest, match="members") as e:
        _env(members)
    assert named in str(e.value)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"job_id": ""}, "job_id"),
        ({"attempt": 0}, "attempt"),
        ({"master_addr": ""}, "master_addr"),
        ({"master_port": 0}, "master_port"),
        ({"master_port": 65536}, "master_port"),
    ],
)
def test_bad_arguments_are_refused_naming_the_field(kw: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        _env([(0, "a")], **kw)
    assert e.value.field == field
