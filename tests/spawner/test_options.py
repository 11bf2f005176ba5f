"""The options form, reading it back, and checking ``user_options`` from anywhere."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from policies.errors import Forbidden, InvalidRequest
from portal.api.offers import OfferOut, OfferStateOut
from portal.api.schemas import DevicesIn
from portal.waits import duration
from spawner.options import (
    Choice,
    TenantOffers,
    choose,
    filter_offers,
    options_from_form,
    ordinal,
    queued_message,
    render_form,
    status_line,
)


def offer(
    key: str,
    state: OfferStateOut = OfferStateOut.AVAILABLE,
    *,
    label: str | None = None,
    message: str = "",
    position: int | None = None,
    tenant_position: int | None = None,
    eta_s: float | None = None,
) -> OfferOut:
    return OfferOut(
        key=key,
        label=label or key,
        flavor=None,
        devices=DevicesIn(),
        state=state,
        reason="" if state is OfferStateOut.AVAILABLE else "quota",
        message=message,
        position=position,
        tenant_position=tenant_position,
        eta_s=eta_s,
    )


ONE = offer("gpu:H100-80GB:1", label="1 × H100-80GB")
QUEUED = offer(
    "gpu:H100-80GB:2",
    OfferStateOut.QUEUED,
    label="2 × H100-80GB",
    message="team-a quota for H100-80GB: 4/4 gpus in use",
    position=5,
    tenant_position=3,
    eta_s=700,
)
REFUSED = offer(
    "share:T4:250",
    OfferStateOut.NOT_ALLOWED,
    label="0.25 × T4",
    message="team-a has no quota for T4/share",
)
CPU = offer("cpu", label="CPU only")
TEAM_A = TenantOffers("team-a", (ONE, QUEUED, REFUSED, CPU))
TEAM_B = TenantOffers("team-b", (CPU,))


class Inputs(HTMLParser):
    """The form's inputs and selects, as a browser would see them."""

    def __init__(self) -> None:
        super().__init__()
        self.radios: list[dict[str, str | None]] = []
        self.selects: list[str] = []
        self.hidden: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "input" and a.get("type") == "radio":
            self.radios.append(a)
        elif tag == "input" and a.get("type") == "hidden":
            self.hidden[str(a["name"])] = str(a["value"])
        elif tag == "select":
            self.selects.append(str(a["name"]))


def parse(html: str) -> Inputs:
    p = Inputs()
    p.feed(html)
    return p


@pytest.mark.parametrize(
    ("n", "text"), [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (22, "22nd")]
)
def test_ordinals(n: int, text: str) -> None:
    assert ordinal(n) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "unknown"),
        (30, "under a minute"),
        (700, "12 min"),
        (7500, "2 h 5 min"),
        (3600, "1 h"),
    ],
)
def test_durations_in_words(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


def test_the_queue_sentence_names_position_tenant_option_reason_and_wait() -> None:
    said = queued_message("team-a", "1 × H100-80GB", 3, 3, "team quota 4/4 in use", 700)
    assert (
        said
        == "Queued 3rd in team-a for 1 × H100-80GB: team quota 4/4 in use; estimated wait 12 min"
    )
    assert queued_message("team-a", "x", 1, 4, "", None) == (
        "Queued 1st in team-a (4th overall) for x; waits for a release; no estimate"
    )


def test_one_tenant_form_shows_each_state_and_disables_the_refused() -> None:
    html = render_form([TEAM_A])
    form = parse(html)
    assert form.hidden == {"tenant": "team-a"} and form.selects == []
    values = [r["value"] for r in form.radios]
    assert values == ["gpu:H100-80GB:1", "gpu:H100-80GB:2", "share:T4:250", "cpu"]
    assert {r["name"] for r in form.radios} == {"option-team-a"}
    checked = [r["value"] for r in form.radios if "checked" in r]
    disabled = [r["value"] for r in form.radios if "disabled" in r]
    assert checked == ["cpu"] and disabled == ["share:T4:250"]  # no GPU nobody asked for
    assert "available now" in html
    assert "position 3 in the tenant (5 overall), estimated wait 12 min</span>" in html
    assert "team-a quota for H100-80GB: 4/4 gpus in use</small>" in html
    assert "not allowed</span>" in html and "team-a has no quota for T4/share</small>" in html
    assert status_line(QUEUED) == (
        "will queue: position 3 in the tenant (5 overall), estimated wait 12 min: "
        "team-a quota for H100-80GB: 4/4 gpus in use"
    )
    assert status_line(ONE) == "available now"


def checked(html: str) -> list[tuple[str | None, str | None]]:
    return [(r["name"], r["value"]) for r in parse(html).radios if "checked" in r]


@pytest.mark.parametrize(
    ("last", "expected"),
    [
        ({}, "cpu"),  # a first spawn
        ({"tenant": "team-a", "option": "gpu:H100-80GB:2"}, "gpu:H100-80GB:2"),  # queues: fine
        ({"option": "gpu:H100-80GB:1"}, "gpu:H100-80GB:1"),  # REST, one tenant: left out
        ({"tenant": "team-a", "option": "share:T4:250"}, "cpu"),  # not allowed any more
        ({"tenant": "team-a", "option": "gpu:B200:1"}, "cpu"),  # no longer offered
        ({"tenant": "team-c", "option": "gpu:H100-80GB:1"}, "cpu"),  # not their tenant now
        ({"tenant": "team-a", "option": 3}, "cpu"),  # whatever the REST API was sent
    ],
)
def test_the_form_preselects_the_last_choice_or_cpu_only(
    last: dict[str, object], expected: str
) -> None:
    assert checked(render_form([TEAM_A], last)) == [("option-team-a", expected)]


def test_with_several_tenants_the_last_ones_is_selected_and_the_others_get_cpu_only() -> None:
    html = render_form([TEAM_A, TEAM_B], {"tenant": "team-b", "option": "cpu"})
    assert '<option value="team-b" selected>' in html
    assert checked(html) == [("option-team-a", "cpu"), ("option-team-b", "cpu")]
    html = render_form([TEAM_A, TEAM_B], {"tenant": "team-a", "option": "gpu:H100-80GB:1"})
    assert '<option value="team-a" selected>' in html
    assert checked(html) == [("option-team-a", "gpu:H100-80GB:1"), ("option-team-b", "cpu")]


def test_without_a_cpu_only_option_nothing_is_preselected() -> None:
    gpus_only = TenantOffers("team-a", (ONE, QUEUED))
    assert checked(render_form([gpus_only])) == []


def test_several_tenants_get_a_selector_and_a_list_each() -> None:
    form = parse(render_form([TEAM_A, TEAM_B]))
    assert form.selects == ["tenant"] and form.hidden == {}
    assert {r["name"] for r in form.radios} == {"option-team-a", "option-team-b"}


def test_no_tenant_says_so() -> None:
    assert "in no tenant" in render_form([])


def test_labels_are_escaped() -> None:
    evil = TenantOffers("team-a", (offer("cpu", label="<script>x</script>"),))
    html = render_form([evil])
    assert "<script>x" not in html and "&lt;script&gt;x" in html


def test_the_form_reads_back_the_option_of_the_selected_tenant() -> None:
    form = {"tenant": ["team-b"], "option-team-a": ["gpu:H100-80GB:1"], "option-team-b": ["cpu"]}
    assert options_from_form(form) == {"tenant": "team-b", "option": "cpu"}
    assert options_from_form({}) == {}


def test_operators_restrict_and_order_the_options() -> None:
    got = filter_offers(TEAM_A.offers, ["cpu", "gpu:H100-80GB:1", "gpu:nope:1"])
    assert [o.key for o in got] == ["cpu", "gpu:H100-80GB:1"]
    assert filter_offers(TEAM_A.offers, []) == TEAM_A.offers


OFFERS = {"team-a": TEAM_A.offers, "team-b": TEAM_B.offers}


def test_a_valid_choice_names_tenant_and_offer() -> None:
    got = choose(
        {"tenant": "team-a", "option": "gpu:H100-80GB:2"},
        ["team-a", "team-b"],
        OFFERS,
        user="alice",
    )
    assert got == Choice("team-a", QUEUED)
    # One tenant: it may be left out.
    assert choose({"option": "cpu"}, ["team-b"], OFFERS, user="bob") == Choice("team-b", CPU)


@pytest.mark.parametrize(
    ("user_options", "error", "message"),
    [
        ({"option": "cpu", "image": "evil"}, InvalidRequest, r"'image'.*only tenant, option"),
        ({"tenant": "team-a", "option": 3}, InvalidRequest, r"'option'.*a string"),
        ({"option": "cpu"}, InvalidRequest, r"tenant none.*team-a, team-b"),
        ({"tenant": "team-c", "option": "cpu"}, Forbidden, r"may not charge tenant 'team-c'"),
        (
            {"tenant": "team-a"},
            InvalidRequest,
            r"option none.*H100-80GB:1, gpu:H100-80GB:2, cpu",
        ),
        ({"tenant": "team-a", "option": "gpu:B200:1"}, InvalidRequest, r"'gpu:B200:1'.*one of"),
        (
            {"tenant": "team-a", "option": "share:T4:250"},
            Forbidden,
            r"0.25 × T4 is not allowed for team-a: team-a has no",
        ),
    ],
)
def test_bad_user_options_are_refused_with_what_is_valid(
    user_options: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        choose(user_options, ["team-a", "team-b"], OFFERS, user="alice")


def test_a_user_in_no_tenant_is_refused() -> None:
    with pytest.raises(Forbidden, match="in no tenant"):
        choose({"option": "cpu"}, [], {}, user="eve")


def test_the_form_has_no_unbalanced_markup() -> None:
    html = render_form([TEAM_A, TEAM_B])
    for tag in ("div", "fieldset", "label", "select", "span", "small"):
        opened = len(re.findall(rf"<{tag}[ >]", html))
        assert opened == html.count(f"</{tag}>"), tag
