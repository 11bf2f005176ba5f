"""Ray clusters per tenant: a head and workers whose devices the allocator chose, under the
tenant's quota (``docs/ray.md``)."""
