"""My work's Jobs section: the viewer's training jobs, the selected one's attempt history with
what each attempt cost, the tail of rank 0's log, a Cancel button, and the Launch form
(``docs/dashboards.md``)."""

from __future__ import annotations

import html
from collections.abc import Mapping
from datetime import datetime

import panel as pn
from panel.viewable import Viewer

from dashboards import components as c
from dashboards.stores.jobs import TOPOLOGY_LEVELS, TOPOLOGY_MODES, JobsStore
from policies.jobs import MAX_RESTARTS
from policies.requests import MAX_GANG_SIZE
from portal.api.jobs import AttemptOut, JobCostOut, JobOut
from portal.waits import duration, queue_line

LOG_CSS = "pre { max-height: 24em; overflow: auto; font-size: 0.85em; margin: 0; }"


def _when(at: datetime | None) -> str:
    return "—" if at is None else at.strftime("%Y-%m-%d %H:%M:%S")


def standing(j: JobOut) -> str:
    """Where a job stands beyond its state: the queue line while its attempt waits (the
    wording of ``portal.waits``), when a restart is due in backoff, its portal message
    otherwise."""
    w = j.workload
    if w is not None and w.state == "queued":
        return queue_line(w.position, w.reason, w.message, w.eta_s, w)
    if j.next_start_at is not None and not j.state.terminal:
        return f"restarts at {_when(j.next_start_at)}"
    if w is not None and w.allocations:
        return c.devices(w)
    return j.message


def per_member(devices: Mapping[str, object]) -> str:
    """What each member holds, from the job's spec: ``4 H100-80GB``, ``1 A100-80GB/3g.40gb``,
    ``250 milli T4``, ``CPU only``."""
    models = devices.get("models")
    model = ", ".join(map(str, models)) if isinstance(models, list) and models else "any"
    kind = devices.get("kind")
    if kind == "mig":
        return f"{devices.get('count', 1)} {model}/{devices.get('mig_profile')}"
    if kind == "share":
        return f"{devices.get('milli', 0)} milli {model}"
    if kind is None:
        return "CPU only"
    return f"{devices.get('count', 1)} {model}"


def job_row(j: JobOut) -> tuple[str, ...]:
    """Name, id, tenant, state, members × devices per member, attempt, restarts and
    preemptions, where it stands."""
    devices = j.spec.get("devices")
    return (
        j.name,
        j.id,
        j.tenant,
        j.state.value + (" (topology relaxed)" if j.topology_relaxed else ""),
        f"{j.members} × {per_member(devices if isinstance(devices, dict) else {})}",
        str(j.attempt),
        f"{j.restarts} / {j.preemptions}",
        standing(j),
    )


def money(amount: str, currency: str) -> str:
    return f"{amount} {currency}"


def cost_line(cost: JobCostOut | None) -> str:
    """What the selected job cost so far, priced as the Cost view prices its tenant."""
    if cost is None:
        return ""
    line = f"**Cost so far:** {money(cost.cost, cost.currency)} for {cost.gpu_hours:.2f} GPU-hours"
    if cost.unpriced_models:
        line += f" (no price configured for {', '.join(cost.unpriced_models)}: counted at 0)"
    return line


def attempt_row(a: AttemptOut, cost: JobCostOut | None = None) -> tuple[str, ...]:
    """Number, start, end, nodes, exit reason, resume step, queue wait and cost of one
    attempt."""
    priced = next((x for x in cost.attempts if x.number == a.number), None) if cost else None
    return (
        str(a.number),
        _when(a.started_at),
        _when(a.ended_at),
        ", ".join(a.nodes) or "—",
        a.exit_reason or ("running" if a.started_at else "waiting"),
        "—" if a.resume_step is None else str(a.resume_step),
        "—" if a.queue_wait_s is None else duration(a.queue_wait_s),
        "—" if priced is None or cost is None else money(priced.cost, cost.currency),
    )


class JobsView(Viewer):
    def __init__(self, store: JobsStore, **params: object) -> None:
        super().__init__(**params)
        self.store = store
        self.choose = pn.widgets.Select(label="job", options={}, width=320)
        self.choose.param.watch(self._chosen, "value")
        self.cancel_button = pn.widgets.Button(label="Cancel job", color="danger", width=140)
        self.cancel_button.on_click(self._cancel)
        self.tenant = pn.widgets.Select(label="tenant", options=[], width=160)
        self.flavor = pn.widgets.Select(label="flavor", options=[], width=200)
        self.members = pn.widgets.IntInput(
            label="members", value=1, start=1, end=MAX_GANG_SIZE, width=100
        )
        self.count = pn.widgets.IntInput(label="devices per member", value=1, start=0, width=140)
        self.level = pn.widgets.Select(label="topology", options=list(TOPOLOGY_LEVELS), width=130)
        self.mode = pn.widgets.Select(label="topology is", options=list(TOPOLOGY_MODES), width=120)
        self.command = pn.widgets.TextInput(
            label="command", placeholder="python train.py --epochs 10", width=420
        )
        self.cwd = pn.widgets.TextInput(
            label="working directory", placeholder="/home/me", width=260
        )
        self.checkpoint_dir = pn.widgets.TextInput(
            label="checkpoint directory", placeholder="/data/ckpt/run1", width=260
        )
        self.max_restarts = pn.widgets.IntInput(
            label="max restarts", value=3, start=0, end=MAX_RESTARTS, width=110
        )
        self.launch_button = pn.widgets.Button(label="Launch", color="primary", width=120)
        self.launch_button.on_click(self._launch)
        store.param.watch(self._choices, ["jobs", "selected"])
        store.param.watch(self._form_choices, ["tenants", "flavors"])
        self._choices()
        self._form_choices()

    def launch(self) -> JobOut | None:
        """Submit the form as it is filled in."""
        return self.store.launch(
            tenant=self.tenant.value or "",
            flavor=self.flavor.value or "",
            members=int(self.members.value or 0),
            count=int(self.count.value or 0),
            command=self.command.value or "",
            cwd=self.cwd.value or "",
            checkpoint_dir=self.checkpoint_dir.value or "",
            topology=self.level.value,
            topology_mode=self.mode.value,
            max_restarts=int(self.max_restarts.value or 0),
        )

    def rows(self, *_: object) -> str:
        return c.table_html(
            [job_row(j) for j in reversed(self.store.jobs)],  # newest first
            [
                "job",
                "id",
                "tenant",
                "state",
                "members × devices",
                "attempt",
                "restarts / preemptions",
                "devices / queue",
            ],
            empty="You have no training jobs.",
        )

    def read_error(self, error: str) -> str:
        """Why the jobs could not be read (My work's status line is about its workloads)."""
        return f"**Could not read jobs from the portal:** {error}" if error else ""

    def attempt_table(self, *_: object) -> str:
        return c.table_html(
            [attempt_row(a, self.store.cost) for a in self.store.attempts],
            [
                "attempt",
                "started",
                "ended",
                "nodes",
                "exit reason",
                "resume step",
                "queue wait",
                "cost",
            ],
            empty="no attempts yet",
        )

    def log_html(self, log: str, attempt: int) -> str:
        if not attempt:
            return "<p><em>no log yet</em></p>"
        body = html.escape(log) or "(empty so far)"
        return f"<p>rank 0, attempt {attempt}:</p><pre>{body}</pre>"

    def _choices(self, *_: object) -> None:
        options = {f"{j.name} ({j.id}, {j.state.value})": j.id for j in reversed(self.store.jobs)}
        self.choose.options = options
        self.choose.value = self.store.selected or None
        job = self.store.job()
        self.cancel_button.disabled = job is None or job.state.terminal

    def _form_choices(self, *_: object) -> None:
        for widget, options in (
            (self.tenant, self.store.tenants),
            (self.flavor, self.store.flavors),
        ):
            widget.options = list(options)
            if widget.value not in options:
                widget.value = options[0] if options else None

    def _cancel(self, _event: object) -> None:
        self.store.cancel()

    def _launch(self, _event: object) -> None:
        self.launch()

    def _chosen(self, event: object) -> None:
        value = getattr(event, "new", None)
        if value and value != self.store.selected:
            self.store.select(value)

    def __panel__(self) -> pn.viewable.Viewable:
        st = self.store.param
        return pn.Column(
            "### Jobs",
            pn.pane.Markdown(pn.bind(self.read_error, st.error)),
            c.live(self.rows, st.jobs),
            pn.Row(self.choose, self.cancel_button),
            c.message(self.store),
            "#### Attempts",
            pn.pane.Markdown(pn.bind(cost_line, st.cost)),
            c.live(self.attempt_table, st.attempts, st.cost),
            c.live(self.log_html, st.log_tail, st.log_attempt, css=LOG_CSS),
            "#### Launch a job",
            pn.Row(self.tenant, self.flavor, self.members, self.count),
            pn.Row(self.level, self.mode, self.max_restarts),
            pn.Row(self.command, self.cwd, self.checkpoint_dir),
            self.launch_button,
            c.message(self.store, "form_error"),
            c.message(self.store, "note"),
            sizing_mode="stretch_width",
        )
