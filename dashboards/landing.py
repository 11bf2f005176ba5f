"""Landing page: sends each person to the views their scopes open."""

from __future__ import annotations

import html

import panel as pn
from panel.viewable import Viewer

from dashboards.stores import views_for
from portal.api.auth import Caller


class LandingView(Viewer):
    """Links to the views ``viewer`` may open; ``query`` is kept on every link (``?token=``
    in the development setting, empty behind the hub)."""

    def __init__(self, viewer: Caller, query: str = "", **params: object) -> None:
        super().__init__(**params)
        self.viewer = viewer
        self.query = query
        self.links = views_for(viewer)

    def __panel__(self) -> pn.viewable.Viewable:
        if not self.links:
            return pn.pane.Markdown(
                f"## Hello {self.viewer.name}\n\nYour JupyterHub roles grant no gpuportal "
                "scopes; ask your tenant admin for the gpu-user role."
            )
        items = "".join(
            f'<li><a class="gp-link" href="./{link.name}{html.escape(self.query)}">'
            f"{html.escape(link.title)}</a> — {html.escape(link.why)}</li>"
            for link in self.links
        )
        return pn.Column(
            f"## Hello {self.viewer.name}",
            pn.pane.HTML(f"<ul>{items}</ul>"),
        )
