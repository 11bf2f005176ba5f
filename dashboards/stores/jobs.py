"""The viewer's own training jobs for My work: the list, the selected job's attempts, what it
cost and the tail of rank 0's log, cancelling, and the Launch form's submission."""

from __future__ import annotations

import shlex

import param

from dashboards.sources import JobDraft
from dashboards.stores.base import Store, in_words, not_shown
from policies.errors import InvalidRequest, PortalError
from policies.flavors import Flavor, FlavorKind
from portal.api.jobs import AttemptOut, JobCostOut, JobOut

LOG_TAIL_CHARS = 16_384  # what the view keeps of rank 0's log (decoded): its tail
TOPOLOGY_LEVELS = ("any", "same-node", "nvlink", "same-rack")
TOPOLOGY_MODES = ("required", "preferred")


class LaunchError(ValueError):
    """A form value the client cannot even send (the command line does not split)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def command_of(line: str) -> tuple[str, ...]:
    """The form's single command line as the program and its arguments, split as a shell
    would (quotes kept together) but never run by one."""
    try:
        return tuple(shlex.split(line))
    except ValueError as exc:  # an unclosed quote
        raise LaunchError("command", f"{exc} in {line!r}") from None


def launchable(flavor: str) -> bool:
    """Whether the form can ask for ``flavor``: whole GPUs and MIG instances are counted per
    member; a share needs its milli and memory, set from the notebook or the CLI."""
    return Flavor.parse(flavor).kind in (FlavorKind.GPU, FlavorKind.MIG)


class JobsStore(Store):
    """Jobs the viewer owns; ``selected`` is the one whose attempts and log are read."""

    owner = param.String(default="", doc="The viewer: jobs they own are shown.")
    jobs = param.List(default=[], item_type=JobOut, doc="The owner's jobs, ended ones too.")
    selected = param.String(default="", doc="Id of the job whose history is shown.")
    attempts = param.List(default=[], item_type=AttemptOut, doc="The selected job's attempts.")
    cost = param.ClassSelector(
        class_=JobCostOut,
        default=None,
        allow_None=True,
        doc="What the selected job cost, in all and per attempt (the portal's answer).",
    )
    log_tail = param.String(default="", doc="The tail of rank 0's log of the selected job.")
    log_attempt = param.Integer(default=0, doc="The attempt ``log_tail`` was read from.")
    log_offset = param.Integer(default=0, doc="Where the next log read starts (bytes).")
    may_launch = param.List(
        default=None,
        allow_None=True,
        item_type=str,
        doc="Tenants the viewer's scopes let them start work in; None: every tenant listed.",
    )
    tenants = param.List(default=[], item_type=str, doc="The Launch form's tenants.")
    flavors = param.List(default=[], item_type=str, doc="Flavors the viewer's tenants have.")
    message = param.String(default="", doc="Result of the last cancel or launch.")
    form_error = param.String(
        default="", doc="Why the last launch was refused: the field and the portal's message."
    )
    note = param.String(default="", doc="Why a part of the section is not shown.")

    def _read(self) -> None:
        mine = [j for j in self.source.jobs() if j.owner == self.owner]
        notes = []
        tenants = self.source.tenants() if self.may_launch is None else list(self.may_launch)
        flavors: set[str] = set()
        try:
            for t in tenants:
                flavors.update(q.flavor for q in self.source.quotas(t) if launchable(q.flavor))
        except PortalError as exc:  # the list and the history still show; the form has none
            notes.append(not_shown("the Launch form's flavors", exc))
        selected = self.selected if any(j.id == self.selected for j in mine) else ""
        if not selected and mine:
            selected = mine[-1].id  # the newest
        self._set_changed(
            {
                "jobs": mine,
                "tenants": tenants,
                "flavors": sorted(flavors),
                "selected": selected,
                "note": "; ".join(notes),
            }
        )
        self._read_selected()

    def select(self, job_id: str) -> None:
        """Show ``job_id``'s attempts and log (one of the owner's jobs, or none)."""
        if job_id != self.selected:
            self.param.update(selected=job_id, log_tail="", log_attempt=0, log_offset=0)
        try:
            self._read_selected()
        except PortalError as exc:  # a widget's callback: say why instead of raising
            self.error = in_words(exc)

    def job(self) -> JobOut | None:
        return next((j for j in self.jobs if j.id == self.selected), None)

    def _read_selected(self) -> None:
        job = self.job()
        if job is None:
            self.param.update(attempts=[], cost=None, log_tail="", log_attempt=0, log_offset=0)
            return
        attempts = self.source.job_attempts(job.id)
        read: dict[str, object] = {"attempts": attempts, "cost": self.source.job_cost(job.id)}
        if job.attempt >= 1:
            # Offset-based: each refresh reads only what was written since the last one; a
            # new attempt's log starts again from 0.
            log, offset = self.log_tail, self.log_offset
            if job.attempt != self.log_attempt:
                log, offset = "", 0
            chunk = self.source.job_log(job.id, attempt=job.attempt, offset=offset)
            text = (log + chunk.text)[-LOG_TAIL_CHARS:]
            read |= {
                "log_tail": text,
                "log_attempt": chunk.attempt,
                "log_offset": chunk.next_offset,
            }
        self._set_changed(read)

    def cancel(self) -> bool:
        """Cancel the selected job (the portal refuses anyone but its tenant's members)."""
        job = self.job()
        if job is None:
            self.message = "no job selected"
            return False
        try:
            done = self.source.cancel_job(job.id)
        except PortalError as exc:
            self.message = f"not cancelled: {in_words(exc)}"
            return False
        self.message = f"{done.name} ({done.id}): {done.state.value}"
        self.refresh()
        return True

    def launch(
        self,
        *,
        tenant: str,
        flavor: str,
        members: int,
        count: int,
        command: str,
        cwd: str,
        checkpoint_dir: str,
        topology: str,
        topology_mode: str,
        max_restarts: int,
    ) -> JobOut | None:
        """Submit the form's job. A refusal is kept in ``form_error`` as the portal says it
        (its field and message) and nothing else changes; success selects the new job."""
        try:
            draft = JobDraft(
                tenant=tenant,
                flavor=flavor,
                members=members,
                count=count,
                command=command_of(command),
                cwd=cwd.strip() or None,
                checkpoint_dir=checkpoint_dir.strip() or None,
                topology=topology,
                topology_mode=topology_mode,
                max_restarts=max_restarts,
            )
            job = self.source.submit_job(draft)
        except LaunchError as exc:
            self.form_error = f"not launched: {exc.field}: {exc.message}"
            return None
        except InvalidRequest as exc:
            said = f"{exc.field}: {exc.message}" if exc.field else exc.message
            self.form_error = f"not launched: {said}"
            return None
        except PortalError as exc:
            self.form_error = f"not launched: {in_words(exc)}"
            return None
        self.form_error = ""
        self.message = f"launched {job.name} ({job.id}): {job.state.value}"
        self.selected = job.id
        self.refresh()
        return job
