"""The verifiers v1 adapter's pure parts, which need no verifiers install: a PEP 723 script's declared packages,
which of them this interpreter lacks, and which Step gets which trace's reward."""

from __future__ import annotations

from teamrl.domains.hubs.verifiers_v1 import assign_rewards, missing_packages, script_requirements


def test_a_scripts_dependencies_are_read_from_its_pep_723_block():
    src = ('#!/usr/bin/env python\n# /// script\n# requires-python = ">=3.10"\n'
           '# dependencies = [\n#   "openai",\n#   "mcp==2.0.0",\n# ]\n# ///\nimport openai\n')
    assert script_requirements(src) == ["openai", "mcp==2.0.0"]
    assert script_requirements("# /// script\n# requires-python = '>=3'\n# ///\n") == []
    assert script_requirements("import os\n# dependencies = ['x']\n") == []  # outside a script block: not declared


def test_missing_packages_names_what_is_absent_or_at_another_version():
    import pytest as installed

    assert missing_packages(["pytest", f"pytest=={installed.__version__}"]) == []
    assert missing_packages(["pytest<1"]) == [f"pytest<1 (installed: {installed.__version__})"]
    assert missing_packages(["no-such-distribution-abc"]) == ["no-such-distribution-abc (not installed)"]
    assert missing_packages(['no-such-distribution-abc; python_version < "3"']) == []  # its marker excludes it


def test_each_trace_rewards_the_steps_that_made_its_replies():
    # two traces of one agent (best-of-n), a second agent's trace, a reply no Step made (dropped), repeated texts
    traces = [("a", 1.0, ["7", "7"]), ("a", 0.5, ["8"]), ("b", 0.0, ["ok", "never sent"])]
    steps = [("a", "8"), ("b", "ok"), ("a", " 7 "), ("a", "7"), ("a", "9")]
    assert assign_rewards(traces, steps) == {2: 1.0, 3: 1.0, 0: 0.5, 1: 0.0}  # step 4 matches no reply: unset
    assert assign_rewards([], steps) == {}
