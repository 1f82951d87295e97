"""The seed's example ModelBackfill spec (seed 000, "Example"), as both manifest tests expect it."""

SEED_SPEC = {
    "modelRef": "gemma4-26b-a4b-gptq-5930k",
    "templateRef": "model-eval-gauntlet",
    "idleFor": "30m",
    "maxRunDuration": "15m",
    "repeatAfter": "24h",
    "env": {"MODELS": "gemma4-26b-a4b-gptq-5930k=vllm", "GAUNTLET_API": "chat"},
}
