"""Inference services: OpenAI-compatible engines as replicas admitted by the allocator, and the
portal's gateway in front of them (``docs/services.md``)."""
