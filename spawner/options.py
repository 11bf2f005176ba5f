"""The spawn page's GPU options: the form, reading it back, checking any ``user_options``, and the
queue's progress sentences. Pure functions over the portal's offers; no I/O.

``user_options`` of a gpuportal spawner are exactly ``{"tenant": <group>, "option": <key>}``
(keys as in ``/api/v1/tenants/{tenant}/offers``: ``gpu:H100-80GB:1``, ``mig:A100-80GB:3g.40gb``,
``share:T4:250``, ``cpu``). The form writes them; ``choose`` checks them the same way whether they
came from the form or straight from the hub's REST API, so the form cannot be bypassed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

from policies.errors import Forbidden, InvalidRequest
from portal.api.offers import OfferOut, OfferStateOut
from portal.waits import Wait, wait_of, wait_words, why_and_when

USER_OPTION_KEYS = ("tenant", "option")
CPU_OPTION = "cpu"  # the offer key of a server without GPUs
TENANT_FIELD = "tenant"
OPTION_FIELD_PREFIX = "option-"


@dataclass(frozen=True, slots=True)
class TenantOffers:
    """The offers the form shows for one of the user's tenants."""

    tenant: str
    offers: tuple[OfferOut, ...]


@dataclass(frozen=True, slots=True)
class Choice:
    """Checked ``user_options``: the tenant to charge and the offer picked in it."""

    tenant: str
    offer: OfferOut


def filter_offers(offers: Sequence[OfferOut], allowed: Sequence[str]) -> tuple[OfferOut, ...]:
    """The offers whose key is in ``allowed`` (in ``allowed``'s order); all when it is empty."""
    if not allowed:
        return tuple(offers)
    by_key = {o.key: o for o in offers}
    return tuple(by_key[k] for k in allowed if k in by_key)


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``22nd``..."""
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th') }"


def badge(offer: OfferOut) -> str:
    """The short state shown next to an option."""
    if offer.state is OfferStateOut.AVAILABLE:
        return "available now"
    if offer.state is OfferStateOut.QUEUED:
        return (
            f"will queue: position {offer.tenant_position} in the tenant "
            f"({offer.position} overall), {wait_words(offer.eta_s)}"
        )
    return "not allowed"


def status_line(offer: OfferOut) -> str:
    """The state and its reason in one sentence."""
    return f"{badge(offer)}: {offer.message}" if offer.message else badge(offer)


def queued_message(
    tenant: str,
    label: str,
    tenant_position: int | None,
    position: int | None,
    message: str,
    eta_s: float | None,
    wait: Wait | None = None,
) -> str:
    """The spawn page's sentence for a queued request, e.g. ``Queued 3rd in team-a for 1 ×
    H100-80GB: team-a quota for H100-80GB: 4/4 gpus in use, 1 requested (limit 4); estimated
    wait 12 min``."""
    where = f"{ordinal(tenant_position)} in {tenant}" if tenant_position else f"in {tenant}"
    overall = f" ({ordinal(position)} overall)" if position and position != tenant_position else ""
    # The dashboards and the CLI tell the same wait in the same words (portal.waits).
    if message:
        why = f": {why_and_when(message, eta_s, wait)}"
    else:
        why = f"; {wait_of(wait) if wait is not None else wait_words(eta_s)}"
    return f"Queued {where}{overall} for {label}{why}"


_BADGE = {
    OfferStateOut.AVAILABLE: "bg-success",
    OfferStateOut.QUEUED: "bg-warning text-dark",
    OfferStateOut.NOT_ALLOWED: "bg-secondary",
}


def render_form(tenants: Sequence[TenantOffers], last: Mapping[str, object] | None = None) -> str:
    """The options form: a tenant selector when there are several, then each tenant's options
    as radio buttons with their state. Not-allowed options are disabled. ``last`` is the
    ``user_options`` of the user's previous spawn (the hub keeps them): its tenant is selected
    and its option preselected while that tenant may still use it; otherwise CPU only is
    (never a GPU nobody asked for: one click on Start would hold it), or nothing when the
    operator offers no CPU-only option."""
    if not tenants:
        return (
            '<div class="alert alert-warning gpuportal-options">You are in no tenant (JupyterHub '
            "group) with GPU access; ask an administrator to add you to one.</div>"
        )
    names = [t.tenant for t in tenants]
    previous = _previous(last or {}, names)
    chosen_tenant = previous[0] if previous else names[0]
    parts = ['<div class="gpuportal-options">']
    if len(tenants) > 1:
        opts = "".join(
            f'<option value="{escape(n)}"{" selected" if n == chosen_tenant else ""}>'
            f"{escape(n)}</option>"
            for n in names
        )
        parts.append(
            '<div class="mb-3"><label class="form-label" for="gpuportal-tenant">Charge to tenant'
            f'</label><select class="form-select" id="gpuportal-tenant" name="{TENANT_FIELD}">'
            f"{opts}</select></div>"
        )
    else:
        parts.append(f'<input type="hidden" name="{TENANT_FIELD}" value="{escape(names[0])}">')
    for t in tenants:
        parts.append(_tenant_fieldset(t, previous, several=len(tenants) > 1))
    parts.append("</div>")
    if len(tenants) > 1:
        parts.append(_SWITCH_SCRIPT)
    return "".join(parts)


def _tenant_fieldset(t: TenantOffers, previous: tuple[str, str] | None, *, several: bool) -> str:
    field = OPTION_FIELD_PREFIX + t.tenant
    pick = _preselected(t, previous)
    rows = []
    for i, offer in enumerate(t.offers):
        ident = escape(f"gpuportal-{t.tenant}-{i}")
        disabled = offer.state is OfferStateOut.NOT_ALLOWED
        checked = offer.key == pick
        rows.append(
            f'<div class="form-check gpuportal-offer" data-state="{offer.state.value}">'
            f'<input class="form-check-input" type="radio" name="{escape(field)}" '
            f'id="{ident}" value="{escape(offer.key)}"'
            f"{' checked' if checked else ''}{' disabled' if disabled else ''}>"
            f'<label class="form-check-label" for="{ident}">{escape(offer.label)} '
            f'<span class="badge {_BADGE[offer.state]}">{escape(badge(offer))}</span>'
            f"{_reason(offer)}</label></div>"
        )
    legend = f"<legend>{escape(t.tenant)}</legend>" if several else ""
    return (
        f'<fieldset class="mb-3 gpuportal-tenant" data-tenant="{escape(t.tenant)}">'
        f"{legend}{''.join(rows)}</fieldset>"
    )


def _reason(offer: OfferOut) -> str:
    if not offer.message:
        return ""
    return f' <small class="text-muted gpuportal-reason">{escape(offer.message)}</small>'


def _previous(last: Mapping[str, object], tenants: Sequence[str]) -> tuple[str, str] | None:
    """(tenant, option key) of the previous spawn's ``user_options`` when they name one of
    ``tenants`` (or leave it out for a user in one tenant); None otherwise."""
    tenant, key = last.get("tenant") or "", last.get("option")
    if not tenant and len(tenants) == 1:
        tenant = tenants[0]
    if not isinstance(tenant, str) or tenant not in tenants or not isinstance(key, str):
        return None
    return tenant, key


def _preselected(t: TenantOffers, previous: tuple[str, str] | None) -> str | None:
    usable = {o.key for o in t.offers if o.state is not OfferStateOut.NOT_ALLOWED}
    if previous is not None and previous[0] == t.tenant and previous[1] in usable:
        return previous[1]
    return CPU_OPTION if CPU_OPTION in usable else None


# Shows only the selected tenant's options; without scripts every tenant's list shows and the
# option of the selected tenant is the one used.
_SWITCH_SCRIPT = """<script>
(function () {
  var select = document.getElementById("gpuportal-tenant");
  function show() {
    document.querySelectorAll(".gpuportal-tenant").forEach(function (fs) {
      fs.style.display = fs.dataset.tenant === select.value ? "" : "none";
    });
  }
  select.addEventListener("change", show);
  show();
})();
</script>"""


def options_from_form(form: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """``user_options`` from the posted form (values are lists of strings). Only reads the
    form; ``choose`` checks the result."""
    tenant = _single(form, TENANT_FIELD)
    out = {"tenant": tenant} if tenant else {}
    option = _single(form, OPTION_FIELD_PREFIX + tenant) if tenant else ""
    if option:
        out["option"] = option
    return out


def _single(form: Mapping[str, Sequence[str]], name: str) -> str:
    values = form.get(name) or []
    return values[0].strip() if values else ""


def choose(
    user_options: Mapping[str, object],
    tenants: Sequence[str],
    offers_of: Mapping[str, Sequence[OfferOut]],
    *,
    user: str,
) -> Choice:
    """Check ``user_options`` (from the form or the REST API) and return what they pick.

    ``tenants`` are the user's tenants (hub groups the portal knows), ``offers_of`` the offers
    of each (already restricted to what the operator offers).

    Raises:
        InvalidRequest: an unknown key, a value of the wrong type, a missing choice, or an
            option the tenant is not offered (the message lists what is valid).
        Forbidden: a tenant the user is not a member of, or an option the tenant may not use
            (the message says why: no quota, over its limit, not in its node pools).
    """
    unknown = sorted(set(user_options) - set(USER_OPTION_KEYS))
    if unknown:
        raise InvalidRequest(
            "user option", ", ".join(map(repr, unknown)), "only " + ", ".join(USER_OPTION_KEYS)
        )
    for key in USER_OPTION_KEYS:
        value = user_options.get(key)
        if value is not None and not isinstance(value, str):
            raise InvalidRequest(f"user option {key!r}", repr(value), "a string")
    tenant = str(user_options.get("tenant") or "")
    if not tenants:
        raise Forbidden(f"user {user} is in no tenant (JupyterHub group) the portal knows")
    if not tenant:
        if len(tenants) > 1:
            raise InvalidRequest("tenant", "none", "one of your tenants: " + ", ".join(tenants))
        tenant = tenants[0]
    if tenant not in tenants:
        raise Forbidden(
            f"user {user} may not charge tenant {tenant!r}; their tenants: {', '.join(tenants)}"
        )
    offers = offers_of.get(tenant, ())
    key = str(user_options.get("option") or "")
    valid = ", ".join(o.key for o in offers if o.state is not OfferStateOut.NOT_ALLOWED)
    if not key:
        raise InvalidRequest("option", "none", f"one of {valid or 'none'} (tenant {tenant})")
    offer = next((o for o in offers if o.key == key), None)
    if offer is None:
        raise InvalidRequest("option", repr(key), f"one of {valid or 'none'} (tenant {tenant})")
    if offer.state is OfferStateOut.NOT_ALLOWED:
        raise Forbidden(f"{offer.label} is not allowed for {tenant}: {offer.message}")
    return Choice(tenant, offer)
