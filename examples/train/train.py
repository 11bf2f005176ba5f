"""Data-parallel training of a tiny model with JAX, one process per member of a gpuportal job.

Every member trains the same replicated parameters on its own shard of each global batch; the
gradient is averaged across members by the all-reduce that ``jax.jit`` inserts for the sharded
batch (gloo on CPU, NCCL on GPUs). It follows gpuportal's training contract
(docs/training-contract.md) without importing anything of gpuportal:

* the gang meets at ``MASTER_ADDR:MASTER_PORT`` as ``RANK`` of ``WORLD_SIZE``;
* every ``--checkpoint-every`` steps rank 0 writes ``$GPUPORTAL_CHECKPOINT_DIR/step-<N>/`` and
  then its ``COMPLETE`` marker, by an atomic rename;
* it resumes from ``$GPUPORTAL_RESUME_FROM`` when that is set;
* on SIGTERM it finishes the step, checkpoints and exits with 143. The members vote on stopping
  inside the step's all-reduce, so all of them stop after the same step;
* when a collective fails (another member died) it exits at once with 1, rather than wait in
  ``jax.distributed``'s shutdown for a member that will never come: the portal restarts the
  whole gang from the newest complete checkpoint.

Run it as a job (``gpuportal jobs submit ... -- python examples/train/train.py``), or by hand
as two processes on one machine::

    for r in 0 1; do MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=$r \\
      GPUPORTAL_CHECKPOINT_DIR=/tmp/ckpt JAX_PLATFORMS=cpu python examples/train/train.py & done
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

FEATURES = 8
HIDDEN = 16
TERMINATED = 143  # 128 + SIGTERM: stopped before the end, never to be taken for success
PEER_LOST = 1

stop_requested = False


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Only a flag: the step in flight finishes, then every member stops after the same step.
    global stop_requested
    stop_requested = True


def log(message: str) -> None:
    print(f"rank {os.environ['RANK']}: {message}", flush=True)


def init_params(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w1": rng.normal(0, 0.5, (FEATURES, HIDDEN)).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "w2": rng.normal(0, 0.5, (HIDDEN, 1)).astype(np.float32),
        "b2": np.zeros(1, np.float32),
    }


def batch(seed: int, step: int, rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """This member's shard of the global batch of ``step``: the same after a resume."""
    rng = np.random.default_rng([seed, step, rank])
    x = rng.normal(size=(size, FEATURES)).astype(np.float32)
    y = np.sin(x.sum(axis=1, keepdims=True))
    return x, y.astype(np.float32)


def loss_fn(params: dict[str, Any], x: jax.Array, y: jax.Array) -> jax.Array:
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] + params["b2"] - y) ** 2)


def save(root: Path, step: int, params: dict[str, jax.Array], loss: float) -> None:
    """The contract: write the whole folder, then mark it complete by an atomic rename."""
    folder = root / f"step-{step}"
    if folder.exists():  # torn by an attempt that died writing it
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    local = {k: np.asarray(v.addressable_data(0)) for k, v in params.items()}
    with (folder / "params.npz").open("wb") as f:
        np.savez(f, **local)
        f.flush()
        os.fsync(f.fileno())
    (folder / "meta.json").write_text(json.dumps({"step": step, "loss": loss}))
    partial = folder / ".COMPLETE.partial"
    partial.write_text("complete\n")
    partial.replace(folder / "COMPLETE")
    log(f"checkpoint step {step} loss {loss:.5f}")


def prune(root: Path, keep: int) -> None:
    """Keep the newest ``keep`` complete checkpoints: the marker goes first, so a folder being
    deleted is never taken for a complete one."""
    complete = sorted(
        (int(p.name.split("-", 1)[1]), p)
        for p in root.glob("step-*")
        if p.name.split("-", 1)[1].isdigit() and (p / "COMPLETE").is_file()
    )
    for _, folder in complete[:-keep]:
        (folder / "COMPLETE").unlink()
        shutil.rmtree(folder)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--keep", type=int, default=3, help="complete checkpoints to keep")
    parser.add_argument("--batch", type=int, default=32, help="examples per member per step")
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="pause after each step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        num_processes=world,
        process_id=rank,
    )
    # After initialize: jax.distributed puts a SIGTERM handler of its own in place.
    signal.signal(signal.SIGTERM, on_sigterm)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    sharded = NamedSharding(mesh, PartitionSpec("data"))
    local_devices = len(jax.local_devices())

    params_np = init_params(args.seed)
    step = 0
    if resume := os.environ.get("GPUPORTAL_RESUME_FROM"):
        with np.load(Path(resume) / "params.npz") as saved:
            params_np = {k: saved[k] for k in params_np}
        step = json.loads((Path(resume) / "meta.json").read_text())["step"]
        log(f"pid {os.getpid()} resumed from step {step} ({resume})")
    else:
        log(f"pid {os.getpid()} starting from scratch")
    params = {
        k: jax.make_array_from_process_local_data(replicated, v) for k, v in params_np.items()
    }
    checkpoints = os.environ.get("GPUPORTAL_CHECKPOINT_DIR")
    root = Path(checkpoints) if checkpoints else None

    @jax.jit
    def train_step(
        params: dict[str, jax.Array], x: jax.Array, y: jax.Array, votes: jax.Array
    ) -> tuple[dict[str, jax.Array], jax.Array, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        new = jax.tree_util.tree_map(lambda p, g: p - args.learning_rate * g, params, grads)
        return new, loss, jnp.max(votes)

    loss = float("nan")
    stopping = False
    try:
        while step < args.steps and not stopping:
            x, y = batch(args.seed, step, rank, args.batch)
            votes = np.full(local_devices, int(stop_requested), np.int32)
            params, loss_arr, stop_vote = train_step(
                params,
                jax.make_array_from_process_local_data(sharded, x),
                jax.make_array_from_process_local_data(sharded, y),
                jax.make_array_from_process_local_data(sharded, votes),
            )
            step += 1
            loss = float(loss_arr.addressable_data(0))
            stopping = bool(stop_vote.addressable_data(0))
            due = step % args.checkpoint_every == 0 or step == args.steps or stopping
            if root is not None and rank == 0 and due:
                save(root, step, params, loss)
                prune(root, args.keep)
            if args.step_seconds:
                time.sleep(args.step_seconds)
    except jax.errors.JaxRuntimeError as e:
        log(f"lost the gang in step {step + 1}: {e}")
        os._exit(PEER_LOST)  # skips the shutdown barrier that would wait for the lost member
    if stopping:
        log(f"stopped by SIGTERM after step {step}")
        return TERMINATED
    log(f"done at step {step} loss {loss:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
