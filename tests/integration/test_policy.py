"""Through a real broker: RESPONSE_SCORED's `policy_input` is seed 003's OPA input, and the seed's example
policy (deploy/opa/confidence.rego) denies exactly the responses below 0.3.

The policy runs twice: in rego-cpp (regopy, a real Rego engine; this machine has no OPA binary) and in
a small evaluator of its one rule written here from the seed's text, and both must agree.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from streams.harness import RunningBroker
from tests.deploy_files import rego_denials
from tests.integration.fixtures import EventFactory, count_of, deploy

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "deploy" / "opa" / "confidence.rego"
SEED_003 = sorted((ROOT.parent / "shared" / "seeds").glob("003_*.txt"))
# Seed 003, component 6 ("OPA input structure"), without `user`: the service never sees a user.
FIELDS = {
    "confidence": (float, type(None)),
    "confidence_enabled": (bool,),
    "request_id": (str,),
    "tenant_id": (str,),
    "endpoint": (str,),
    "model": (str,),
}


def seed_fields() -> set[str] | None:
    """The keys of seed 003's OPA input example, when the seeds are beside the repository."""
    if not SEED_003:
        return None
    text = SEED_003[0].read_text()
    block = re.search(r"OPA input structure:\s*```json\s*(\{.*?\})\s*```", text, re.S)
    assert block, "seed 003 no longer shows an OPA input structure"
    return set(json.loads(block.group(1)))


def rule_denies(policy_input: dict[str, Any]) -> set[str]:
    """The seed's rule by hand: enabled, confidence not null and below 0.3 -> one message."""
    confidence = policy_input["confidence"]
    if policy_input["confidence_enabled"] and confidence is not None and confidence < 0.3:
        return {f"Confidence {confidence} below minimum threshold 0.3"}
    return set()


def test_policy_input_and_the_seed_policy_on_real_outputs(kafka: RunningBroker) -> None:
    seed = seed_fields()
    if seed is not None:
        assert set(FIELDS) == seed - {"user"}
    d = deploy(kafka, partitions=2)
    f = EventFactory(tenant="policy")
    confidences = [0.05, 0.25, 0.299, 0.3, 0.301, 0.5, 0.95]
    responses = [f.response(f"p-{i}", i, token_logprobs=[math.log(c)]) for i, c in enumerate(confidences)]
    responses.append(f.response("p-null", 9, token_logprobs=None))  # no logprobs: confidence null
    d.start_worker()
    try:
        d.produce(responses)
        records = d.collect(count_of("RESPONSE_SCORED", len(responses), d.settings.scored_topic))
    finally:
        d.stop()
    scored = {o["source_event_id"]: o for o in d.outputs(records) if o["event_type"] == "RESPONSE_SCORED"}
    policy = POLICY.read_text()
    denied = set()
    for event in responses:
        output = scored[event["event_id"]]
        policy_input = output["policy_input"]
        assert set(policy_input) == set(FIELDS)
        for name, types in FIELDS.items():
            assert isinstance(policy_input[name], types), (name, policy_input[name])
        assert policy_input == {
            "confidence": output["confidence"],
            "confidence_enabled": True,
            "request_id": event["request_id"],
            "tenant_id": "policy",
            "endpoint": event["endpoint"],
            "model": event["model"],
        }
        denials = rego_denials(policy, policy_input)
        assert denials == rule_denies(policy_input), policy_input
        if denials:
            denied.add(output["confidence"])
    # Exactly the three below 0.3 (0.299 included, 0.3 not), not the one without logprobs.
    assert denied == {0.05, 0.25, 0.299}
