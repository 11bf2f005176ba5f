"""Inventory sources: where the allocator learns which nodes and GPUs exist.

Every source produces immutable ``policies.inventory.Node`` values and reports changes as
``InventoryEvent``s (``portal.inventory.events``):

- ``simulated``: a declarative YAML inventory for demos, tests and benchmarks;
- ``kubernetes``: Kubernetes Nodes labelled by GPU Feature Discovery and our node agent;
- ``nvml``: the local host's GPUs, discovered with NVML.
"""
