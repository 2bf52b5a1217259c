"""The ways of planning a search can turn on (pipeline/search/features.py): each declared once, with what it needs
and what it cannot go with, and every conflict refused in one line naming both settings."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from pipeline.errors import ConfigError
from pipeline.search.features import BY_SETTING, FEATURES, Choices, check_features

PLAIN = Choices(objective="max_rate", sampler="tpe", workload="azure_code", budget=False, kv_transfer=False,
                aggregated=False, arrivals="poisson", trace=True, slo=True, spare_hosts=0, from_plan=False,
                robust=False, calibrated=True)  # fmt: skip
# a choice that turns each feature on (and nothing else)
TURNS_ON = {
    "search.objective=thesis": {"objective": "thesis"},
    "search.objective=goodput": {"objective": "goodput"},
    "search.objective=rate_per_dollar": {"objective": "rate_per_dollar"},
    "search.objective=min_cost": {"objective": "min_cost"},
    "search.arrivals=workload": {"arrivals": "workload"},
    "search.spare_hosts={spare_hosts}": {"spare_hosts": 2},
    "search.robust=true": {"robust": True},
    "search.from_plan": {"from_plan": True},
    "search.sampler=exact": {"sampler": "exact"},
    "search.budget_per_hour": {"budget": True},
    "search.kv_transfer=true": {"kv_transfer": True},
    "costmodel.aggregated=true": {"aggregated": True},
}


def test_every_feature_is_declared_once_and_turned_on_by_its_own_setting_only() -> None:
    assert sorted(TURNS_ON) == sorted(BY_SETTING) and len(BY_SETTING) == len(FEATURES)
    for setting, change in TURNS_ON.items():
        c = dataclasses.replace(PLAIN, **change)
        assert [f.setting for f in FEATURES if f.on(c)] == [setting]
    check_features(PLAIN)  # the default search has none of them on, and nothing to refuse


def test_every_pair_a_feature_excludes_is_refused_in_one_line_naming_both_and_the_rest_go_together() -> None:
    excluded = {frozenset((f.setting, g)) for f in FEATURES for g in f.excludes}
    assert all(g in BY_SETTING for f in FEATURES for g in f.excludes)
    for a, b in itertools.combinations(TURNS_ON, 2):
        if set(TURNS_ON[a]) & set(TURNS_ON[b]):
            continue  # two values of one setting (two objectives)
        c = dataclasses.replace(PLAIN, **TURNS_ON[a], **TURNS_ON[b])
        if frozenset((a, b)) in excluded:
            with pytest.raises(ConfigError) as err:
                check_features(c)
            line = str(err.value)
            assert "\n" not in line and line.endswith(": drop one of the two")
            assert all(s.format(spare_hosts=2).split("=")[0] in line for s in (a, b)), line
        elif not any(not holds(c) for f in FEATURES if f.on(c) for holds, _ in f.needs):
            check_features(c)  # no conflict declared: they go together


def test_a_feature_without_what_it_needs_says_how_to_get_it() -> None:
    with pytest.raises(ConfigError, match=r"^search.robust=true plans for the pessimistic end .*: add costmodel"):
        check_features(dataclasses.replace(PLAIN, robust=True, calibrated=False))
    with pytest.raises(ConfigError, match="workload synth has no trace's arrival model"):
        check_features(dataclasses.replace(PLAIN, arrivals="workload", trace=False, workload="synth"))
