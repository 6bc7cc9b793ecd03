# Seed 003 (SomaStack), "Component 6: OPA Integration": its example policy, verbatim.
# It is written in Rego v0 syntax, so the compose `opa` service runs OPA 1.x with --v0-compatible.
package somaagent.confidence

default allow = true

deny[msg] {
    input.confidence_enabled
    input.confidence != null
    input.confidence < 0.3
    msg := sprintf("Confidence %v below minimum threshold 0.3", [input.confidence])
}
