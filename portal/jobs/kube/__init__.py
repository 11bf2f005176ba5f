"""The Kubernetes backend of training jobs (``docs/jobs.md``).

An attempt is an indexed ``batch/v1`` Job with a headless Service in the tenant's namespace
(``manifests``), run and watched by ``runner.KubeRunner``; the portal's binder binds each
indexed pod to the node the allocator chose for its rank (``portal.kube.jobpods``). Jobs that
users create with kubectl are admitted by ``admission``; ``service`` wires it into
``gpuportal serve``.
"""
