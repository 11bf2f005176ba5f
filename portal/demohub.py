"""The demo's JupyterHub: JupyterHub itself, stopping the users' servers before its services.

On shutdown JupyterHub stops its managed services first and the users' servers after them. In
the demo the portal is such a service, so every server's spawner then fails to release its GPUs
(the portal is gone) and the allocations leak into the next start. ``DemoHub`` stops the
servers first, while the portal still answers, then shuts down as JupyterHub does. The portal's
hub reconcile (``portal.service.hubsync``) remains the safety net for any hub that does not.

Run as ``python -m portal.demohub --config jupyterhub_config.py`` (``portal.demo.run_hub``).
"""

from __future__ import annotations

import asyncio

from jupyterhub.app import JupyterHub


class DemoHub(JupyterHub):  # type: ignore[misc]  # jupyterhub is untyped
    """JupyterHub whose shutdown stops the users' servers before its managed services."""

    async def cleanup(self) -> None:
        if self.cleanup_servers:
            stops = [
                (f"{user.name}/{name or 'default'}", user.stop(name))
                for user in list(self.users.values())
                for name, spawner in list(user.spawners.items())
                if spawner.active
            ]
            if stops:
                self.log.info("Stopping %i single-user server(s) before the services", len(stops))
                results = await asyncio.gather(*(s for _, s in stops), return_exceptions=True)
                for (server, _), result in zip(stops, results, strict=True):
                    if isinstance(result, BaseException):
                        self.log.error("Failed to stop %s: %s", server, result)
        await super().cleanup()


main = DemoHub.launch_instance

if __name__ == "__main__":
    main()
