"""`provider_key_env_prefixes` restricts the variables whose values go upstream: the providers'
api_key_env (enforced before) and, as documented, the variables read in their headers, which any
variable name passed (a header could send AWS_SECRET_ACCESS_KEY to a provider)."""

from __future__ import annotations

import pytest

from gateway.policy.loader import check_policy

TEMPLATE = """\
provider_key_env_prefixes: [LLM_KEY_, VENDOR_]
providers:
  a:
    base_url: "http://127.0.0.1:9/v1"
    api_key_env: LLM_KEY_A
    headers: {X-Extra: "HEADER"}
pools:
  p: {members: [a]}
models:
  m: {pool: p}
"""
ENV = {"LLM_KEY_A": "ka", "LLM_KEY_B": "kb", "VENDOR_ORG": "org", "AWS_SECRET_ACCESS_KEY": "aws"}


@pytest.mark.parametrize(
    "header", ["${AWS_SECRET_ACCESS_KEY}", "Bearer ${HOME}", "${LLM_KEY_B}-${PATH}", "${llm_key_b}"]
)
def test_a_header_variable_outside_the_prefixes_is_refused(header: str) -> None:
    report = check_policy(TEMPLATE.replace("HEADER", header), "p.yaml", ENV)
    assert report.policy is None
    assert len(report.errors) == 1, report.errors
    assert report.errors[0].startswith("providers.a.headers.X-Extra: ${")
    assert "does not start with an allowed prefix (LLM_KEY_, VENDOR_)" in report.errors[0]
    assert report.errors[0].endswith("(line 6)")
    assert "aws" not in report.errors[0]  # the name, never the value


@pytest.mark.parametrize(
    "header, sent",
    [
        ("Bearer ${LLM_KEY_B}", "Bearer kb"),
        ("${VENDOR_ORG}/${LLM_KEY_A}", "org/ka"),
        ("${LLM_KEY_UNSET:-none}", "none"),
        ("static", "static"),
    ],
)
def test_variables_with_an_allowed_prefix_pass(header: str, sent: str) -> None:
    report = check_policy(TEMPLATE.replace("HEADER", header), "p.yaml", ENV)
    assert report.errors == [], report.errors
    assert report.policy is not None
    assert report.policy.providers["a"].headers["X-Extra"] == sent


def test_without_prefixes_any_variable_but_gateway_ones_may_be_used() -> None:
    text = TEMPLATE.replace("provider_key_env_prefixes: [LLM_KEY_, VENDOR_]\n", "")
    report = check_policy(text.replace("HEADER", "${AWS_SECRET_ACCESS_KEY}"), "p.yaml", ENV)
    assert report.errors == [], report.errors
