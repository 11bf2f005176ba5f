"""Pure rules of gpuportal: no I/O, no clock, no imports from the rest of the project.

Everything here takes its inputs (inventory, requests, quotas, time) as arguments and returns
decisions, so the allocator, the benchmarks and the tests all drive exactly the same code.
"""
