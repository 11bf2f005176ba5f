"""Training jobs: gangs of member processes with a rendezvous environment and checkpoint-resume.

``runner`` runs the members of an attempt on this host, ``rendezvous`` builds their
environment, ``checkpoints`` is the checkpoint contract (``docs/training-contract.md``).
"""
