"""Golden numbers: this file pins current numbers so that refactors and speedups can prove they
change none.

Each case of ``bench/golden.py`` (presets of every family, one and many nodes, TP/PP/CP, pinned
knobs, offload, stacks, a CPU device with a calibrated profile) is run again and compared with
``tests/data/golden_search.json`` at rtol 1e-12: the full ``simulate --json --top 10`` output and a
fingerprint of every strategy the search evaluates (step time and its parts, memory, feasibility);
and the whole output of the validation figures, a catalog sweep and a budget.
A deliberate physics change regenerates the file with ``python bench/golden.py --write`` in its
own commit that says which numbers moved and why.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("golden", Path(__file__).resolve().parents[1] / "bench" / "golden.py")
golden = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(golden)
RECORDED = json.loads(golden.GOLDEN.read_text(encoding="utf-8"))


def test_every_case_is_recorded():
    assert sorted(RECORDED) == sorted([*golden.CASES, "reports"])
    assert sorted(RECORDED["reports"]) == sorted(golden.REPORTS)


@pytest.mark.parametrize("name", sorted(golden.CASES))
def test_case_unchanged(name):
    argv = golden.CASES[name]
    old = RECORDED[name]
    assert old["argv"] == argv
    diffs = golden.differences(old["plan"], golden.plan_json(argv), "plan") \
        + golden.differences(old["table"], golden.table_print(argv), "table")
    assert not diffs, "\n".join(diffs[:20])


@pytest.mark.parametrize("name", sorted(golden.REPORTS))
def test_report_unchanged(name):
    """Validation figures (published runs, parallel layouts), a catalog sweep and a budget."""
    old = RECORDED["reports"][name]
    assert old["argv"] == golden.REPORTS[name][0]
    diffs = golden.differences(old["output"], golden.report_output(name), name)
    assert not diffs, "\n".join(diffs[:20])


def test_differences_sees_a_change_beyond_rtol():
    """The comparison itself can fail: a relative change of 1e-11 in a float, a flipped flag."""
    assert golden.differences({"a": 1.0}, {"a": 1.0 + 1e-11})
    assert not golden.differences({"a": 1.0}, {"a": 1.0 + 1e-13})
    assert golden.differences({"a": [True]}, {"a": [False]})
