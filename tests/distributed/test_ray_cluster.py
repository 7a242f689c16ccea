"""A simulated two-node Ray cluster on one machine: each model is pinned to its own node.

Ray's ``cluster_utils.Cluster`` starts a head and a worker node as separate raylets; each
advertises a custom resource (``node_a`` / ``node_b``) that ``models.<name>.placement.resources``
asks for. The verifier's model also runs its engine in its own actor (``colocate: false``), so
its weights travel learner → object store → engine after every update.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from teamrl.config.schema import load_config
from teamrl.train.trainer import Trainer

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install 'teamrl[ray]')"),
]


@pytest.fixture(scope="module")
def two_nodes():
    import ray
    from ray.cluster_utils import Cluster

    from teamrl.runtime.distributed import backend

    cluster = Cluster()
    try:  # a node that fails to start must not leave the other one running
        head = cluster.add_node(num_cpus=2, resources={"node_a": 1})
        worker = cluster.add_node(num_cpus=2, resources={"node_b": 1})
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        yield ray, head.node_id, worker.node_id
    finally:
        if ray.is_initialized():
            backend.shutdown()
            ray.shutdown()
        cluster.shutdown()


def test_two_models_on_two_nodes(two_nodes, tmp_path, tiny_model_dir):
    ray, head, worker = two_nodes
    cfg = load_config(None, [
        f"run_dir={tmp_path / 'run'}", "backend=ray", "ray.timeout_s=300",
        f"models={{a: {{path: {tiny_model_dir}}}, b: {{path: {tiny_model_dir}}}}}",
        "models.a.placement.resources={node_a: 0.1}", "models.b.placement.resources={node_b: 0.1}",
        "models.b.placement.colocate=false",
        "agents.solver.model=a", "agents.verifier.model=b", "agents.solver.max_new_tokens=6",
        "agents.verifier.max_new_tokens=4", "rollout.batch_size=2", "rollout.group_size=2", "train.steps=2",
        "train.threads=1", "loss.entropy_coef=0.01", "models.b.optim.lr=0.01", "eval.before=false", "eval.after=false",
    ])
    tr = Trainer(cfg, progress=False)
    nodes = {m: {ray.get(a.where.remote())["node_id"] for a in tr.engines[m].actors} for m in ("a", "b")}
    assert nodes == {"a": {head}, "b": {worker}}
    assert len(tr.engines["b"].actors) == 2  # learner + its own engine
    tr.train()
    learner, engine = tr.engines["b"].actors
    trained, served = ray.get(learner.weights.remote()), ray.get(engine.weights.remote())
    assert all(torch.equal(served[k], v) for k, v in trained.items())  # synced after the last update
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    assert any(not torch.equal(trained[k], start[k]) for k in start)
