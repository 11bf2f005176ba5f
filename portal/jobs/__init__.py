"""Training jobs: gangs of member processes with a rendezvous environment and checkpoint-resume.

``controller`` runs each job as attempts, one allocator workload of kind ``job`` each
(``docs/jobs.md``); ``spec`` is what a job is; ``backend`` what the controller needs of a
backend. ``runner`` runs the members of an attempt on this host, ``rendezvous`` builds their
environment, ``checkpoints`` is the checkpoint contract (``docs/training-contract.md``).
"""
