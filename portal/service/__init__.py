"""The portal service process (``gpuportal serve``): the API, the allocator, its store, the
inventory follower and the periodic loops, with structured logs and a graceful shutdown."""
