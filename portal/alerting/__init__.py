"""The alert service: rules of ``policies.alerts`` evaluated over stored samples and live
allocations, alerts persisted with their states, and actions (webhook, owner warning, culling)."""
