"""The four processing stages as plain classes over table state (no Faust, no Kafka).

Stage 1 (`TraceStage`, input topics keyed by trace): decode, dead-letter, evidence, synthesis, and
forwarding of responses (to the agent-history stage), claims (to the claim stage) and outcomes (to the
calibration stage), without logprobs.
Stage 2 (`AgentStage`, keyed by tenant + agent): composite with agent history -> RESPONSE_SCORED.
Stage 3 (`ClaimStage`, keyed by tenant): each tenant's claim graph, in sequence -> CLAIM_SCORED.
Stage 4 (`CalibrationStage`, keyed by tenant): outcomes joined with scores -> CALIBRATION_UPDATED.
Stages 1-3 also send each score they emit to stage 4 (numbers and labels only).
Each stage returns `Record`s for the agent to send; the agent owns tables and the producer.
"""

from streams.stages.calibration import CalibrationStage
from streams.stages.claims import ClaimStage
from streams.stages.common import InputRecord, Record
from streams.stages.history import AgentStage
from streams.stages.trace import TraceStage

__all__ = ["AgentStage", "CalibrationStage", "ClaimStage", "InputRecord", "Record", "TraceStage"]
