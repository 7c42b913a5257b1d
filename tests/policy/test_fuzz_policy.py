"""Every field of a full policy (policies/default.yaml: providers of every kind, pools, classes,
aliases, degradation rules) replaced by values of the wrong type or size, or removed: the full
check (`check_policy_file`, as start-up, `gateway policy check` and every reload run it) never
raises; it accepts the document or refuses it, each error naming the field path and its line.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import yaml

from gateway.policy.loader import check_policy_file
from tests.fuzz import mutations

POLICY = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"
ENV = {"OPENAI_API_KEY": "sk-test", "ANTHROPIC_API_KEY": "ak-test"}


def test_every_field_mutated_is_accepted_or_refused_with_its_path_and_line(
    tmp_path: Path,
) -> None:
    doc = yaml.safe_load(POLICY.read_text())
    # The policy's rules folder (`../fallbacks`) beside the mutated copies, as in the repository.
    (tmp_path / "fallbacks").symlink_to(POLICY.parent.parent / "fallbacks")
    (tmp_path / "policies").mkdir()
    crashes, unplaced, refused = [], [], 0
    for i, (at, mutated) in enumerate(mutations(doc, per_path=1, seed=7)):
        path = tmp_path / "policies" / f"p{i}.yaml"
        path.write_text(yaml.safe_dump(mutated, sort_keys=False))
        try:
            report = check_policy_file(path, env=ENV)
        except Exception:  # noqa: BLE001 - every crash is listed
            crashes.append(f"{at}: {traceback.format_exc().splitlines()[-1]}")
            continue
        if report.policy is None:
            refused += 1
            # Errors of the rules files name their own file and line; the root's has no line.
            unplaced += [
                f"{at}: {e}"
                for e in report.errors
                if at and "(line " not in e and not e.startswith("degradation.rules: ")
            ]
    assert not crashes, "\n".join(crashes[:10])
    assert not unplaced, "\n".join(unplaced[:10])
    assert refused > 100  # the mutations reach the checks


def test_a_rules_path_the_os_cannot_take_is_refused(tmp_path: Path) -> None:
    for rules in ("r" * 300, "a/" + "b" * 5000, "bad\x00name"):
        path = tmp_path / "policy.yaml"
        doc = yaml.safe_load(POLICY.read_text())
        doc["degradation"] = {"rules": rules}
        path.write_text(yaml.safe_dump(doc))
        report = check_policy_file(path, env=ENV)
        assert report.policy is None and any("degradation.rules" in e for e in report.errors)
