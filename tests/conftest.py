"""Shared pytest wiring. Each service fixture lives in its own module under tests/support."""

pytest_plugins: list[str] = [
    "tests.support.postgres",
    "tests.support.k8s",
    "tests.support.kuberay",
    "tests.support.hub",
]
